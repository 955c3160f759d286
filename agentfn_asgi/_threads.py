"""A bounded pool of threads for synchronous handlers, reconcile hooks and ``enqueue`` callables.

Python cannot stop a thread. A synchronous handler that hangs keeps its thread until it
returns, so a pool that hands out a new thread whenever an old one is abandoned (what
``anyio.to_thread`` with ``abandon_on_cancel`` does: it releases the capacity token when the
*caller* gives up) grows without bound. This pool never runs more than ``size`` threads: work
beyond that waits in line. A ``time_limit`` counts the time the function *runs*, not the time it
waited for a thread; the wait for a thread is bounded separately (``wait_limit``) and fails
with :class:`ThreadPoolBusyError`, whose message says how many threads are busy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["ThreadPool", "ThreadPoolBusyError"]

T = TypeVar("T")


class ThreadPoolBusyError(TimeoutError):
    """No thread became free in time: every thread is running (possibly a hung function)."""


class ThreadPool:
    """At most ``size`` threads, created on demand, shared by every caller of :meth:`run`."""

    def __init__(self, size: int, *, name: str = "agentfn-sync") -> None:
        if size < 1:
            raise ValueError("a thread pool needs at least one thread")
        self.size = size
        self._name = name
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._running = 0

    @property
    def busy(self) -> int:
        """Threads running a function right now (hung ones included)."""
        return self._running

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.size, thread_name_prefix=self._name
                )
            return self._executor

    async def run(
        self,
        fn: Callable[..., T],
        /,
        *args: Any,
        time_limit: float | None = None,
        wait_limit: float | None = None,
    ) -> T:
        """Run ``fn(*args)`` in a thread of the pool and return its result.

        Raises TimeoutError when it runs longer than ``time_limit`` seconds (it keeps running
        in its thread; its result is dropped) and ThreadPoolBusyError when no thread was free
        within ``wait_limit`` seconds. Cancelling the caller before the function started
        removes it from the line; after, the function is abandoned like on a timeout.
        """
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        context = contextvars.copy_context()

        def call() -> T:
            with self._lock:
                self._running += 1
            loop.call_soon_threadsafe(started.set)
            try:
                return context.run(fn, *args)
            finally:
                with self._lock:
                    self._running -= 1

        future = self._pool().submit(call)
        wrapped = asyncio.wrap_future(future)
        try:
            try:
                await asyncio.wait_for(started.wait(), wait_limit)
            except TimeoutError:
                if future.cancel():  # still in line: it will never run
                    raise ThreadPoolBusyError(
                        f"no thread became free within {wait_limit:g} s "
                        f"(all {self.size} threads are busy)"
                    ) from None
                # It started at the last moment: fall through and time its run.
            return await asyncio.wait_for(asyncio.shield(wrapped), time_limit)
        except BaseException:
            future.cancel()  # a no-op once it runs: the thread cannot be stopped
            wrapped.cancel()
            raise

    def shutdown(self) -> None:
        """Stop taking work; threads still running finish in the background."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
