"""Several replicas of one example app as real uvicorn processes on one store, for the
tests that prove what replicas sharing a store guarantee."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

from agentfn_asgi.demo import RunningExample, run_example
from agentfn_asgi.store import open_store

__all__ = ["replicas", "taken_over_calls"]


@contextlib.asynccontextmanager
async def replicas(
    env: Mapping[str, str],
    tmp_path: Path,
    ports: Sequence[int],
    *,
    target: str = "examples.starlette_app:app",
) -> AsyncIterator[list[RunningExample]]:
    """One process of ``target`` per port, each logging to ``tmp_path/replicaN.log``;
    all stopped on exit."""
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                run_example(target, env=dict(env), log_path=tmp_path / f"replica{n}.log", port=port)
            )
            for n, port in enumerate(ports)
        ]


async def taken_over_calls(url: str, session_ids: Sequence[str]) -> int:
    """How many calls of these sessions needed a second attempt (a killed replica's,
    finished by the others), read from the store at ``url``."""
    store = open_store(url)
    try:
        records = [r for sid in session_ids for r in await store.calls_for_session(sid)]
    finally:
        await store.close()
    return sum(1 for r in records if r.attempt > 1)
