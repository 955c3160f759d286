"""dispatch.leases: renewing a claim's lease while its work runs, and fencing the holder."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import CallKey
from agentfn_asgi.dispatch.leases import LeaseKeeper, LeaseLostError
from agentfn_asgi.store.memory import MemoryStore

from ..support.clock import FakeClock

pytestmark = pytest.mark.anyio

KEY = CallKey("sess", "turn", "call")
LEASE = 0.3  # a heartbeat every 0.1 s of real time
MARGIN = 0.05


def _spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[Any]:
    return asyncio.get_running_loop().create_task(coro)


def keeper(store: MemoryStore, monotonic: FakeClock, owner: str = "a") -> LeaseKeeper:
    return LeaseKeeper(
        store,
        owner=owner,
        lease_seconds=LEASE,
        margin=MARGIN,
        spawn=_spawn,
        monotonic=monotonic,
    )


async def take_over(store: MemoryStore, clock: FakeClock) -> None:
    """Replica ``b`` takes the call over once ``a``'s lease (and the margin) ran out."""
    clock.advance(LEASE + MARGIN + 0.01)
    outcome = await store.claim_call(KEY, tool_name="t", owner="b", lease_seconds=LEASE)
    assert outcome.record.owner == "b"


async def test_the_holder_fences_itself_at_lease_minus_margin() -> None:
    """Past ``claimed_at + lease - margin`` on its own clock the holder may save nothing."""
    monotonic = FakeClock(100.0)
    leases = keeper(MemoryStore(), monotonic)
    lease = leases.lease(KEY, attempt=1, claimed_at=monotonic())
    monotonic.advance(LEASE - MARGIN - 0.01)
    leases.check(lease)
    monotonic.advance(0.01)
    with pytest.raises(LeaseLostError, match="not renewed in time"):
        leases.check(lease)


async def test_extend_moves_the_fence_and_the_stores_lease() -> None:
    clock, monotonic = FakeClock(), FakeClock(100.0)
    store = MemoryStore(clock=clock)
    await store.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    leases = keeper(store, monotonic)
    lease = leases.lease(KEY, attempt=1, claimed_at=monotonic())
    await leases.extend(lease, 3600.0)
    assert lease.fence_at == monotonic() + 3600.0 - MARGIN
    record = await store.get_call(KEY)
    assert record is not None and record.lease_expires_at == clock() + 3600.0


async def test_extending_a_lease_taken_over_raises_and_marks_it_lost() -> None:
    clock, monotonic = FakeClock(), FakeClock(100.0)
    store = MemoryStore(clock=clock)
    await store.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    leases = keeper(store, monotonic)
    lease = leases.lease(KEY, attempt=1, claimed_at=monotonic())
    await take_over(store, clock)
    with pytest.raises(LeaseLostError, match="taken over"):
        await leases.extend(lease, 3600.0)
    assert lease.lost == "taken over"


async def test_work_whose_lease_is_taken_over_is_cancelled() -> None:
    """The heartbeat finds the claim held by another replica: the block under the lease is
    cancelled there and then, and ``kept`` raises LeaseLostError after it."""
    clock, monotonic = FakeClock(), FakeClock(100.0)
    store = MemoryStore(clock=clock)
    await store.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    leases = keeper(store, monotonic)
    lease = leases.lease(KEY, attempt=1, claimed_at=monotonic())
    await take_over(store, clock)
    finished: list[str] = []

    async def work() -> None:
        async with leases.kept(lease):
            await asyncio.sleep(3600)  # only the lost lease ends this
            finished.append("work")

    async with asyncio.timeout(10):
        with pytest.raises(LeaseLostError, match="taken over"):
            await work()
    assert finished == []


def test_a_margin_as_long_as_the_lease_is_refused() -> None:
    with pytest.raises(ValueError, match="shorter than the lease"):
        LeaseKeeper(MemoryStore(), owner="a", lease_seconds=1.0, margin=1.0, spawn=_spawn)


class _SwallowingStore(MemoryStore):
    """A store whose lease renewal swallows a cancellation that lands while it is in flight,
    as redis-py's ``asyncio.wait_for`` can on Python 3.11 (a fault no real server can be made
    to cause on demand)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.renewals = 0
        self.in_flight = asyncio.Event()

    async def renew_lease(
        self, key: CallKey, *, owner: str, attempt: int, lease_seconds: float
    ) -> bool:
        self.renewals += 1
        self.in_flight.set()
        with contextlib.suppress(asyncio.CancelledError):  # lost, as the driver loses it
            await asyncio.sleep(0.05)
        return await super().renew_lease(
            key, owner=owner, attempt=attempt, lease_seconds=lease_seconds
        )


async def test_a_renewal_that_swallows_its_cancellation_still_ends_the_heartbeat() -> None:
    """The block's end stops its heartbeat even when the store swallows the cancellation of
    the renewal in flight: the block exits, and no renewal follows (a finished call's lease
    is never renewed forever)."""
    store = _SwallowingStore()
    await store.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    leases = LeaseKeeper(store, owner="a", lease_seconds=LEASE, margin=MARGIN, spawn=_spawn)
    lease = leases.lease(KEY, attempt=1, claimed_at=asyncio.get_running_loop().time())
    with anyio.fail_after(5):
        async with leases.kept(lease):
            await store.in_flight.wait()  # a renewal is in flight as the block ends
    after = store.renewals
    await asyncio.sleep(LEASE)
    assert store.renewals == after
