"""Waiting for a condition instead of sleeping a fixed time.

A fixed sleep before a positive assertion fails whenever the machine stalls for longer
than the sleep (a loaded CI box does); polling under a deadline passes as soon as the
condition holds and fails only when it never does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio

__all__ = ["until"]


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` every 20 ms until it returns true; ``TimeoutError`` after 5 s."""
    with anyio.fail_after(5):
        while not await check():
            await anyio.sleep(0.02)
