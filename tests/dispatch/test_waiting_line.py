"""A waiting line costs per admission, not per waiter (dispatch/limits.py): over a real
SQLite store (its own methods counted, nothing mocked) and the package's fake API, only the
head of a process's line asks its limiter, a freed slot makes one request (the head's), the
waiters behind the head keep their place in batches (their leases renewed, the limiter not
asked), and calls still start in the order they arrived."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.dispatch import Dispatcher, DispatchSettings
from agentfn_asgi.messages import MAX_WAIT_MESSAGE
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tools import FunctionTools

from .conftest import API
from .test_limits import answered, session_of

pytestmark = pytest.mark.anyio

WAITERS = 12


class Counted:
    """The store's ``admit_call`` and ``keep_places`` requests, as they are made."""

    def __init__(self, store: Store) -> None:
        self.asked: list[tuple[float, str]] = []  # (monotonic, call id)
        self.kept: list[list[str]] = []
        admit, keep = store.admit_call, store.keep_places

        async def admit_call(key: CallKey, **kwargs: Any) -> Any:
            self.asked.append((time.monotonic(), key.call_id))
            return await admit(key, **kwargs)

        async def keep_places(waiters: list[tuple[CallKey, int]], **kwargs: Any) -> Any:
            self.kept.append([key.call_id for key, _ in waiters])
            return await keep(waiters, **kwargs)

        store.admit_call = admit_call  # type: ignore[method-assign]
        store.keep_places = keep_places  # type: ignore[method-assign,assignment]

    def since(self, at: float) -> list[str]:
        return [call_id for when, call_id in self.asked if when >= at]


class Gate:
    """A ``concurrency=1`` tool whose runs wait until the test lets each one end."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release: dict[str, anyio.Event] = {}
        self.tools = FunctionTools()

        @self.tools.function(concurrency=1)
        async def hold(n: str) -> str:
            """Hold the only slot until released."""
            self.started.append(n)
            await self.release.setdefault(n, anyio.Event()).wait()
            return n

    def let_end(self, n: str) -> None:
        self.release.setdefault(n, anyio.Event()).set()

    async def started_count(self, count: int) -> None:
        with anyio.fail_after(10):
            while len(self.started) < count:
                await anyio.sleep(0.005)


@asynccontextmanager
async def dispatching(
    api: API, tmp_path: Path, tools: FunctionTools, settings: DispatchSettings
) -> AsyncIterator[tuple[Dispatcher, Store, Counted]]:
    store = open_store(f"sqlite:///{tmp_path / 'line.sqlite3'}")
    counted = Counted(store)
    dispatcher = Dispatcher(tools, api.client, store, settings=settings, owner="replica-a")
    await dispatcher.start(recover=False)
    try:
        yield dispatcher, store, counted
    finally:
        await dispatcher.stop(drain_timeout=1.0)
        await store.close()


def _calls(n: int) -> list[FakeCall]:
    return [FakeCall("hold", {"n": f"c{i:02d}"}, call_id=f"c{i:02d}") for i in range(n)]


async def test_only_the_head_of_the_line_asks_and_a_freed_slot_makes_one_request(
    api: API, tmp_path: Path
) -> None:
    """Twelve calls of a ``concurrency=1`` tool wait behind a running one: for a second,
    every admission request is the head's (the earliest waiter), a handful of them (a
    backoff), never one per waiter. When the running call ends, exactly one request follows
    (the head's, admitted) before the head starts; the calls run in the order they arrived."""
    gate = Gate()
    keys = session_of(api, _calls(1 + WAITERS))
    async with dispatching(api, tmp_path, gate.tools, DispatchSettings()) as (
        dispatcher,
        _,
        counted,
    ):
        await dispatcher.resolve(keys[0].session_id)
        await gate.started_count(1)
        began = time.monotonic()
        await anyio.sleep(1.2)
        asked = counted.since(began)
        assert set(asked) == {"c01"}, asked  # the head only
        assert len(asked) <= 6, asked  # 50 ms doubling: a handful, not a poll per waiter

        freed = time.monotonic()
        gate.let_end("c00")
        await gate.started_count(2)
        assert counted.since(freed) == ["c01"]  # one wake, one request
        for n in range(1, 1 + WAITERS):
            gate.let_end(f"c{n:02d}")
        await answered(api, keys)
        await dispatcher.wait_for(keys)
    assert gate.started == [f"c{n:02d}" for n in range(1 + WAITERS)]
    # Every call asked only while it was the head: about one request per start.
    assert len(counted.asked) <= 3 * (1 + WAITERS), counted.asked


async def test_the_waiters_behind_the_head_keep_their_place_in_one_batch(
    api: API, tmp_path: Path
) -> None:
    """With a short lease, the waiters behind the head never ask their limiter but their
    leases are renewed together (one ``keep_places`` naming all of them, every third of the
    lease), so none lapses and no other replica could adopt one; the head renews its own by
    asking."""
    gate = Gate()
    keys = session_of(api, _calls(1 + WAITERS))
    settings = DispatchSettings(lease_seconds=0.9, lease_margin=0.1)
    async with dispatching(api, tmp_path, gate.tools, settings) as (dispatcher, store, counted):
        await dispatcher.resolve(keys[0].session_id)
        await gate.started_count(1)
        await anyio.sleep(2.0)  # more than two leases
        behind = {f"c{n:02d}" for n in range(2, 1 + WAITERS)}
        assert counted.kept and all(set(batch) == behind for batch in counted.kept)
        assert {call_id for _, call_id in counted.asked} == {"c01"}
        now = time.time()
        for key in keys[1:]:
            record = await store.get_call(key)
            assert record is not None and record.state is CallState.WAITING
            assert record.lease_expires_at > now, key  # alive: nobody may adopt it
        for n in range(1 + WAITERS):
            gate.let_end(f"c{n:02d}")
        await answered(api, keys)
        await dispatcher.wait_for(keys)
    assert gate.started == [f"c{n:02d}" for n in range(1 + WAITERS)]


async def test_waiters_behind_the_head_fail_once_their_max_wait_passed(
    api: API, tmp_path: Path
) -> None:
    """``max_wait`` reaches the waiters behind the head too (the head calls them), and each
    tells the model the tool is busy; the call holding the slot ends normally."""
    tools = FunctionTools()
    release = anyio.Event()

    @tools.function(concurrency=1, max_wait=0.5)
    async def hold(n: str) -> str:
        """Hold the only slot until released."""
        await release.wait()
        return n

    keys = session_of(api, _calls(4))
    async with dispatching(api, tmp_path, tools, DispatchSettings()) as (dispatcher, _, _c):
        await dispatcher.resolve(keys[0].session_id)
        with anyio.fail_after(10):
            while len(api.fake.submissions) < 3:
                await anyio.sleep(0.02)
        release.set()
        found = await answered(api, keys)
        await dispatcher.wait_for(keys)
    assert found["c00"].success
    busy = MAX_WAIT_MESSAGE.format(name="hold", seconds=0.5)
    assert [found[f"c{n:02d}"].error for n in (1, 2, 3)] == [busy] * 3
