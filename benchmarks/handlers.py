"""The function tools every target runs, written once so all targets do the same work.

They are ``async def`` on purpose: the inline baseline awaits them on the event loop, and so
does agentfn-asgi (a plain ``def`` would go to its bounded thread pool, a cost the
hand-written baseline would not pay).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["BIG_RESULT_SIZE", "HANDLERS", "big_report", "get_customer", "slow_lookup"]

#: The largest plain-text output that fits the 4 MiB tool-result budget with the package's
#: default safety margin (16 KiB) and the event's JSON envelope: "a 4 MiB result".
BIG_RESULT_SIZE = 4 * 1024 * 1024 - 16 * 1024 - 1024


async def get_customer(customer_id: str) -> dict[str, Any]:
    """Look up a customer by ID (the seed document's example)."""
    return {
        "found": True,
        "customer": {"id": customer_id, "name": "Example Customer", "plan": "pro"},
    }


async def slow_lookup(customer_id: str, seconds: float = 1.0) -> dict[str, Any]:
    """A lookup that waits on a slow downstream service for ``seconds``."""
    await asyncio.sleep(seconds)
    return {"found": True, "customer": {"id": customer_id}}


async def big_report(size: int) -> str:
    """A plain-text report of ``size`` bytes."""
    return "r" * size


HANDLERS: dict[str, Callable[..., Awaitable[Any]]] = {
    "get_customer": get_customer,
    "slow_lookup": slow_lookup,
    "big_report": big_report,
}
