"""Keeping a claimed call's lease alive while work on it runs, and fencing ourselves.

A claim is a lease in the store: when this process stalls past it, another replica may take
the call over. While a handler, a reconcile hook or a job hand-off runs, a heartbeat renews
the lease every third of its length. The holder also *fences itself*: if it has not renewed
the lease by ``margin`` seconds before the lease would expire (a store outage, a stalled
event loop, a store that answers too slowly), it cancels the work it holds and the caller
saves nothing (:class:`LeaseLostError`). Another replica takes over only after the lease plus
the same margin (the stores' rule), so the two never overlap as long as clocks disagree by
less than the margin. A synchronous handler cannot be stopped in its thread: its result is
dropped, and its ``ctx.cancelled`` is set (:attr:`Lease.cancelled`) so that it can stop
itself; otherwise the thread runs to the end (docs/guarantees.md states this limit).

A renewal is also how a holder hears that its call was cancelled elsewhere (its turn ended,
noticed by another replica): the store refuses it, and the work stops the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import anyio

from .._context import Cancellation
from ..calls.records import CallKey
from ..errors import StoreError
from ..store.base import Store

__all__ = ["Lease", "LeaseKeeper", "LeaseLostError"]

logger = logging.getLogger("agentfn_asgi.dispatch.leases")


class LeaseLostError(Exception):
    """The work under a lease was stopped: the lease could not be kept. Nothing it produced
    may be saved (another replica may hold the call by now)."""

    def __init__(self, key: CallKey, reason: str) -> None:
        super().__init__(f"lost the lease of {key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(slots=True, eq=False)
class Lease:
    """One claim's lease, as its holder sees it (monotonic time, never the store's clock).

    ``fence_at`` is when the holder must stop: the last renewal's *send* time plus the lease
    minus the margin. :meth:`check` raises once that moment has passed or the lease was lost.
    """

    key: CallKey
    attempt: int
    fence_at: float
    lost: str | None = field(default=None, init=False)
    #: The cancel scope of the block running under the lease, if one is running.
    scope: anyio.CancelScope | None = field(default=None, init=False)
    #: The handler's ``ctx.cancelled``: set when the lease is lost.
    cancelled: Cancellation = field(default_factory=Cancellation, init=False)

    def lose(self, reason: str) -> None:
        """Stop the work held under this lease (the running block is cancelled, a
        synchronous handler sees ``ctx.cancelled``)."""
        if self.lost is None:
            self.lost = reason
        self.cancelled.set(self.lost)
        if self.scope is not None:
            self.scope.cancel()

    def check(self, now: float) -> None:
        """Raise LeaseLostError if the lease is lost or past its fence at ``now``."""
        if self.lost is None and now >= self.fence_at:
            self.lost = "not renewed in time"
            self.cancelled.set(self.lost)
        if self.lost is not None:
            raise LeaseLostError(self.key, self.lost)


@dataclass(slots=True, eq=False)
class LeaseKeeper:
    """Renews the leases this owner holds, one heartbeat task per :meth:`kept` block.

    ``spawn`` starts the heartbeat as a task of the dispatcher (a fresh context, cancelled
    when the dispatcher stops). ``margin`` is the clock-skew allowance (see the module
    docstring).
    """

    store: Store
    _: KW_ONLY
    owner: str
    lease_seconds: float
    margin: float
    spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]]
    monotonic: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        if not 0 <= self.margin < self.lease_seconds:
            raise ValueError("the lease margin must be shorter than the lease")

    def lease(self, key: CallKey, *, attempt: int, claimed_at: float) -> Lease:
        """The lease of ``attempt``'s claim, sent at monotonic time ``claimed_at`` (counted
        from the request, never from its answer)."""
        return Lease(key, attempt, claimed_at + self.lease_seconds - self.margin)

    def check(self, lease: Lease) -> None:
        """Raise LeaseLostError if ``lease`` is lost or past its fence now: call it before
        saving anything produced under the lease."""
        lease.check(self.monotonic())

    async def extend(self, lease: Lease, seconds: float) -> None:
        """Extend ``lease`` to ``seconds`` from now in the store (a job hand-off holds its call
        until the job's deadline). Raises LeaseLostError when the claim is no longer ours,
        StoreError when the store cannot say."""
        self.check(lease)
        sent = self.monotonic()
        renewed = await self.store.renew_lease(
            lease.key, owner=self.owner, attempt=lease.attempt, lease_seconds=seconds
        )
        if not renewed:
            lease.lose("taken over")
            raise LeaseLostError(lease.key, "taken over")
        lease.fence_at = sent + seconds - self.margin

    @contextlib.asynccontextmanager
    async def kept(self, lease: Lease) -> AsyncIterator[None]:
        """Renew the lease every third of it while the block runs.

        Raises LeaseLostError before the block if the lease is already lost, and after it
        if it was lost meanwhile (the block was cancelled at that moment).
        """
        self.check(lease)
        # Most blocks end long before the first renewal is due: a timer starts the
        # heartbeat task only then (a task per call measured ~7x the cost of a timer).
        heartbeat: asyncio.Task[Any] | None = None

        scope = anyio.CancelScope()

        def start() -> None:
            nonlocal heartbeat
            heartbeat = self.spawn(self._heartbeat(lease, due=True, block=scope))

        timer = asyncio.get_running_loop().call_later(self._first_wait(lease), start)
        with scope:
            lease.scope = scope
            try:
                yield
            finally:
                lease.scope = None
                timer.cancel()
                if heartbeat is not None:
                    heartbeat.cancel()
                    # A renewal in flight must land before anything the caller does next
                    # (the job hand-off sets a longer lease), not after it.
                    await asyncio.gather(heartbeat, return_exceptions=True)
        self.check(lease)

    def _first_wait(self, lease: Lease) -> float:
        interval = max(self.lease_seconds / 3, 0.05)
        return max(min(interval, lease.fence_at - self.monotonic()), 0)

    async def _heartbeat(
        self, lease: Lease, *, due: bool = False, block: anyio.CancelScope | None = None
    ) -> None:
        """Renew every third of the lease (``due``: the first renewal is due now) while
        ``block`` (the :meth:`kept` block it serves) runs.

        The block's end cancels this task, and also ends the loop by itself: a store driver
        that swallows a cancellation (redis-py's ``asyncio.wait_for`` on Python 3.11 can)
        must never leave a heartbeat renewing a finished call's lease forever, with the
        block's exit waiting for it.
        """
        while block is None or lease.scope is block:
            if due:
                due = False
            else:
                await asyncio.sleep(self._first_wait(lease))
            if self.monotonic() >= lease.fence_at:
                logger.error(
                    "could not renew the lease of %s in time: stopping its work (fenced)",
                    lease.key,
                )
                lease.lose("not renewed in time")
                return
            sent = self.monotonic()
            try:
                # Never wait on the store past the fence: a paused store must not hold it.
                async with asyncio.timeout(max(lease.fence_at - sent, 0.001)):
                    kept = await self.store.renew_lease(
                        lease.key,
                        owner=self.owner,
                        attempt=lease.attempt,
                        lease_seconds=self.lease_seconds,
                    )
            except (StoreError, TimeoutError) as exc:
                logger.warning("could not renew the lease of %s (will retry): %s", lease.key, exc)
                continue
            if not kept:
                # Another replica took the call over (this one stalled past its lease).
                logger.warning("lost the lease of %s to another replica: stopping", lease.key)
                lease.lose("taken over")
                return
            lease.fence_at = sent + self.lease_seconds - self.margin
            if block is not None and lease.scope is not block:
                return  # the block ended while this renewal was in flight
