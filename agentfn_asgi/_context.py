"""What a handler and a reconcile hook deal in: the call's context, and the three answers a
reconcile hook can give. Exported by :mod:`agentfn_asgi.tools`, their home in the API."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

__all__ = [
    "Cancellation",
    "NotRun",
    "Ran",
    "ReconcileHook",
    "ReconcileOutcome",
    "ToolContext",
    "Unknown",
    "derive_idempotency_key",
]


class Cancellation:
    """Set once the call's answer is no longer wanted: its turn was cancelled or failed, its
    session deleted, or this process lost the call's lease. ``ctx.cancelled`` of every call.

    An async handler is cancelled outright (``asyncio.CancelledError`` at its next
    ``await``); a synchronous one cannot be stopped in its thread, so it looks at this flag:
    ``if ctx.cancelled: ...`` polls it, ``ctx.cancelled.wait(0.05)`` sleeps until it is set
    (True) or the time is up (False), and async code can ``await ctx.cancelled.until()``.
    Whatever a handler returns after it was set is never submitted. ``reason`` says why.
    """

    __slots__ = ("_event", "_waiters", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: Why it was set (None while it is not).
        self.reason: str | None = None

    def __bool__(self) -> bool:
        return self._event.is_set()

    def __repr__(self) -> str:
        return f"Cancellation(set={bool(self)}, reason={self.reason!r})"

    def is_set(self) -> bool:
        """Has the call been cancelled?"""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block this thread until the call is cancelled or ``timeout`` seconds passed;
        whether it is cancelled. For synchronous handlers (never on the event loop)."""
        return self._event.wait(timeout)

    async def until(self) -> None:
        """Return once the call is cancelled (for async code that races it with work)."""
        if self._event.is_set():
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append((loop, waiter))
        if self._event.is_set():  # set while we registered
            return
        await waiter

    def set(self, reason: str) -> None:
        """Cancel (the dispatcher does this; the first reason stands)."""
        if self._event.is_set():
            return
        self.reason = reason
        self._event.set()
        for loop, waiter in self._waiters:
            loop.call_soon_threadsafe(_resolve, waiter)
        self._waiters.clear()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler knows about the call it is running. Declare a parameter of this type
    (any name) to receive it; it never appears in the tool's schema.

    ``attempt`` counts executions of this call (1 for the first). ``deadline`` is the Unix
    time by which the dispatcher abandons the handler (None: no timeout). Pass
    ``idempotency_key`` to downstream APIs that support one: it is the same on every attempt,
    replica and restart for this call, which closes the "ran but crashed before saving"
    window. ``resources`` is whatever the host handed to the app (a db pool, settings...).
    ``cancelled`` is set when the answer is no longer wanted (:class:`Cancellation`): a
    synchronous handler that can take long should look at it.
    """

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    attempt: int
    deadline: float | None
    idempotency_key: str
    resources: Any = None
    cancelled: Cancellation = field(default_factory=Cancellation)

    def remaining(self, *, clock: Callable[[], float] = time.time) -> float | None:
        """Seconds left until ``deadline`` (never negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - clock())


def derive_idempotency_key(session_id: str, turn_id: str, call_id: str) -> str:
    """The stable idempotency key of one call: ``"afn_"`` + the first 40 hex digits of
    SHA-256 over ``session_id``, ``turn_id`` and ``call_id`` joined with ``"\\x1f"``.

    The unit separator cannot occur in the API's ids, so distinct triples never collide by
    concatenation. 160 bits keep collisions negligible while fitting the 64-character limits
    common in payment and messaging APIs.
    """
    digest = hashlib.sha256("\x1f".join((session_id, turn_id, call_id)).encode()).hexdigest()
    return "afn_" + digest[:40]


@dataclass(frozen=True, slots=True)
class Ran:
    """Reconcile outcome: the call's side effect already happened; ``result`` is sent as its
    output (encoded like a handler's return value)."""

    result: Any


@dataclass(frozen=True, slots=True)
class NotRun:
    """Reconcile outcome: the side effect did not happen, so the handler may run now."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """Reconcile outcome: it cannot be told whether the side effect happened; the call is
    quarantined by policy instead of being run again."""

    reason: str = ""


ReconcileOutcome: TypeAlias = Ran | NotRun | Unknown
#: ``reconcile(context, arguments)``, sync or async. ``arguments`` are the validated keyword
#: arguments the handler would receive (without the context).
ReconcileHook: TypeAlias = Callable[
    [ToolContext, dict[str, Any]], ReconcileOutcome | Awaitable[ReconcileOutcome]
]
