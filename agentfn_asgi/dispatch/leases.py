"""Keeping a claimed call's lease alive while work on it runs.

A claim is a lease in the store: when this process stalls past it, another replica takes the
call over. While a handler, a reconcile hook or a job hand-off runs, a heartbeat renews the
lease every third of its length.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from ..errors import StoreError
from ..records import CallKey
from ..store.base import Store

__all__ = ["LeaseKeeper"]

logger = logging.getLogger("agentfn_asgi.dispatch.leases")


class LeaseKeeper:
    """Renews the leases this owner holds, one heartbeat task per :meth:`kept` block.

    ``spawn`` starts the heartbeat as a task of the dispatcher (a fresh context, cancelled
    when the dispatcher stops).
    """

    def __init__(
        self,
        store: Store,
        *,
        owner: str,
        lease_seconds: float,
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]],
    ) -> None:
        self._store = store
        self._owner = owner
        self._lease_seconds = lease_seconds
        self._spawn = spawn

    @contextlib.asynccontextmanager
    async def kept(self, key: CallKey) -> AsyncIterator[None]:
        """Renew the call's lease every third of it while the block runs."""
        heartbeat = self._spawn(self._heartbeat(key))
        try:
            yield
        finally:
            heartbeat.cancel()
            # A renewal in flight must land before anything the caller does next (the job
            # hand-off sets a longer lease), not after it.
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _heartbeat(self, key: CallKey) -> None:
        interval = max(self._lease_seconds / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                kept = await self._store.renew_lease(
                    key, owner=self._owner, lease_seconds=self._lease_seconds
                )
            except StoreError as exc:
                logger.warning("could not renew the lease of %s (will retry): %s", key, exc)
                continue
            if not kept:
                # Another replica took the call over (this one stalled past its lease):
                # whatever it saves first wins; say so, as the handler may run twice.
                logger.warning("lost the lease of %s to another replica", key)
                return
