"""The demo's tools, which the examples serve too (one definition for both).

- ``get_customer(customer_id)``: the lookup from OpenAI's function-tools guide;
- ``create_refund(order_id, amount_cents, delay_ms=0)``: a side effect, written to an
  append-only JSON lines ledger (``EXAMPLE_LEDGER``, default ``ledger.jsonl``) after an
  optional wait, with a reconcile hook that reads the ledger to tell whether an in-doubt
  call already ran (``delay_ms`` makes it slower than a lease: the crash matrix uses it);
- ``slow_echo(text, delay_ms)``: waits without blocking other calls, then echoes;
- ``close_account(account_id)``: a side effect that needs a person's approval
  (``approval=True``): each real execution appends ``{"call_id", "account_id", "tool":
  "close_account"}`` to the same ledger, and its reconcile hook reads it back.
- ``flaky_lookup(key, fail_times)``: fails with a transient error on its first
  ``fail_times`` executions of a call, counted in the ledger, and is retried (4 attempts,
  0.2 s backoff doubling): the flow-control tests use it.
- ``limited_echo(text, delay_ms)``: at most two at a time across every replica
  (``concurrency=2``; ``EXAMPLE_RATE``, e.g. ``5/s``, adds that rate with a burst of 1):
  waits without blocking other calls, appends ``{"call_id", "tool": "limited_echo",
  "start", "end"}`` (Unix times: the handler's start and end) to the ledger, echoes.
- ``capped_lookup(key)``: at most three calls per session (``max_calls_per_session=3``),
  counted across every replica; each execution appends ``{"call_id", "tool":
  "capped_lookup"}`` to the ledger and returns ``{"key": key}``; a call past the budget
  does not run and fails with a message naming it.

They ship in the package so that ``agentfn-asgi demo`` runs them after ``pip install``;
the examples (``examples/``) import them from here rather than keep a copy. It is user code:
it uses only the public API.

Handlers reach host resources through ``ctx.resources`` (no module globals): each app
hands its webhook app an object with a ``ledger`` attribute, created at start-up. When the
host never ran its start-up (no lifespan, or ``agentfn-asgi recover``), the ledger falls
back to the environment.

Print the definitions to paste into ``agent.tools``::

    agentfn-asgi tools agentfn_asgi.demo.tools:tools
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from agentfn_asgi import FunctionTools, NotRun, Ran, RetryPolicy, ToolContext, ToolError

__all__ = [
    "CAPPED_CALLS",
    "CUSTOMERS",
    "FLAKY_RETRY",
    "LIMITED_CONCURRENCY",
    "ExampleResources",
    "Ledger",
    "build_tools",
    "example_rate",
    "tools",
]

#: flaky_lookup's retry policy: 4 attempts, 0.2 s then 0.4 s then 0.8 s (no jitter).
FLAKY_RETRY = RetryPolicy(attempts=4, initial_backoff=0.2, multiplier=2.0, max_backoff=5.0)

#: How many limited_echo calls run at once, across every replica sharing the store.
LIMITED_CONCURRENCY = 2


def example_rate() -> str | None:
    """limited_echo's rate from ``EXAMPLE_RATE`` (``"5/s"``...), or None when unset."""
    return os.environ.get("EXAMPLE_RATE", "").strip() or None


#: How many capped_lookup calls run per session (max_calls_per_session), across every
#: replica sharing the store.
CAPPED_CALLS = 3


#: The one customer of the guide's example.
CUSTOMERS: dict[str, dict[str, str]] = {"123": {"name": "Example Customer", "plan": "pro"}}


@dataclass(frozen=True, slots=True)
class Ledger:
    """An append-only JSON lines file of refunds: the example's "payment provider"."""

    path: Path

    @classmethod
    def from_env(cls) -> Ledger:
        """The ledger named by ``EXAMPLE_LEDGER`` (default ``ledger.jsonl``)."""
        return cls(Path(os.environ.get("EXAMPLE_LEDGER", "ledger.jsonl")))

    def append(self, entry: dict[str, Any]) -> None:
        """Append one line durably.

        One ``os.write`` on an ``O_APPEND`` descriptor is atomic with respect to other
        appenders, so lines from concurrent processes never interleave; ``fsync`` makes the
        line survive a crash before the result is saved (what reconcile relies on).
        """
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)

    def entries(self) -> list[dict[str, Any]]:
        """Every complete line; a torn last line (a crash mid-write) is skipped."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        found: list[dict[str, Any]] = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    found.append(entry)
        return found

    def find(self, call_id: str) -> dict[str, Any] | None:
        """The refund recorded for ``call_id``, if the call already ran."""
        return next((e for e in self.entries() if e.get("call_id") == call_id), None)


@dataclass(frozen=True, slots=True)
class ExampleResources:
    """What an app hands its webhook app as ``resources`` when it has no ``app.state``."""

    ledger: Ledger


def _ledger(ctx: ToolContext) -> Ledger:
    ledger = getattr(ctx.resources, "ledger", None)
    return ledger if isinstance(ledger, Ledger) else Ledger.from_env()


def _refund_result(ctx: ToolContext, order_id: str, amount_cents: int) -> dict[str, Any]:
    # Derived from the call's idempotency key: the same call always names the same refund,
    # whether it just ran or was reconciled from the ledger after a crash.
    refund_id = "re_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:16]
    return {"refund_id": refund_id, "order_id": order_id, "amount_cents": amount_cents}


def build_tools() -> FunctionTools:
    """A fresh registry holding the example tools."""
    registry = FunctionTools()

    @registry.function
    async def get_customer(customer_id: str) -> dict[str, Any]:
        """Look up a customer by ID.

        Args:
            customer_id: The customer's ID.
        """
        customer = CUSTOMERS.get(customer_id)
        return {"found": customer is not None, "customer": customer}

    def reconcile_refund(ctx: ToolContext, arguments: dict[str, Any]) -> Ran | NotRun:
        entry = _ledger(ctx).find(ctx.call_id)
        if entry is None:
            return NotRun()
        return Ran(_refund_result(ctx, entry["order_id"], entry["amount_cents"]))

    @registry.function(side_effects=True, reconcile=reconcile_refund, timeout=30)
    async def create_refund(
        ctx: ToolContext, order_id: str, amount_cents: int, delay_ms: int = 0
    ) -> dict[str, Any]:
        """Refund part of an order.

        Args:
            order_id: The order to refund.
            amount_cents: How much to refund, in cents (positive).
            delay_ms: How long to wait before refunding, in milliseconds (tests: a refund
                slower than the lease).
        """
        if amount_cents <= 0:
            raise ToolError(f"amount_cents must be positive, got {amount_cents}")
        # Async, so a holder that lost its lease can stop the refund during the wait
        # (a thread cannot be stopped).
        await anyio.sleep(max(delay_ms, 0) / 1000)
        entry = {"call_id": ctx.call_id, "order_id": order_id, "amount_cents": amount_cents}
        # The fsync would block the event loop. Once started, the append finishes even if
        # the call is cancelled meanwhile: the line is whole, and reconcile finds it.
        await anyio.to_thread.run_sync(_ledger(ctx).append, entry)
        return _refund_result(ctx, order_id, amount_cents)

    @registry.function
    async def slow_echo(text: str, delay_ms: int) -> str:
        """Wait, then echo the text back.

        Args:
            text: What to echo.
            delay_ms: How long to wait first, in milliseconds.
        """
        await anyio.sleep(max(delay_ms, 0) / 1000)
        return text

    def reconcile_close(ctx: ToolContext, arguments: dict[str, Any]) -> Ran | NotRun:
        entry = _ledger(ctx).find(ctx.call_id)
        if entry is None or entry.get("tool") != "close_account":
            return NotRun()
        return Ran({"closed": True, "account_id": entry["account_id"]})

    @registry.function(side_effects=True, reconcile=reconcile_close, approval=True, timeout=30)
    async def close_account(ctx: ToolContext, account_id: str) -> dict[str, Any]:
        """Close a customer's account. A person approves each call before it runs.

        Args:
            account_id: The account to close.
        """
        entry = {"call_id": ctx.call_id, "account_id": account_id, "tool": "close_account"}
        await anyio.to_thread.run_sync(_ledger(ctx).append, entry)
        return {"closed": True, "account_id": account_id}

    @registry.function(retry=FLAKY_RETRY, timeout=10)
    async def flaky_lookup(ctx: ToolContext, key: str, fail_times: int) -> dict[str, Any]:
        """Look a key up from a flaky upstream (fails the first fail_times tries).

        Args:
            key: The key to look up.
            fail_times: How many executions of this call fail before one succeeds.
        """
        ledger = _ledger(ctx)
        earlier = await anyio.to_thread.run_sync(ledger.entries)
        k = sum(
            1
            for e in earlier
            if e.get("call_id") == ctx.call_id and e.get("tool") == "flaky_lookup"
        )
        entry = {"call_id": ctx.call_id, "tool": "flaky_lookup", "attempt": k + 1}
        await anyio.to_thread.run_sync(ledger.append, entry)
        if k + 1 <= fail_times:
            raise ConnectionError(f"upstream unavailable (attempt {k + 1})")  # transient
        return {"key": key, "attempts": k + 1}

    rate = example_rate()
    # burst= is refused without rate=: a burst of 1 keeps every second within the rate.
    limits = (
        registry.function(concurrency=LIMITED_CONCURRENCY, rate=rate, burst=1)
        if rate is not None
        else registry.function(concurrency=LIMITED_CONCURRENCY)
    )

    @limits
    async def limited_echo(ctx: ToolContext, text: str, delay_ms: int) -> str:
        """Wait, then echo the text back; at most two run at once.

        Args:
            text: What to echo.
            delay_ms: How long to wait first, in milliseconds.
        """
        start = time.time()
        await anyio.sleep(max(delay_ms, 0) / 1000)
        # Taken before the append: the line's interval lies within the handler's run, so
        # overlapping lines prove overlapping runs.
        end = time.time()
        entry = {"call_id": ctx.call_id, "tool": "limited_echo", "start": start, "end": end}
        await anyio.to_thread.run_sync(_ledger(ctx).append, entry)
        return text

    @registry.function(max_calls_per_session=CAPPED_CALLS)
    async def capped_lookup(ctx: ToolContext, key: str) -> dict[str, Any]:
        """Look a key up; at most three calls per session.

        Args:
            key: The key to look up.
        """
        entry = {"call_id": ctx.call_id, "tool": "capped_lookup"}
        await anyio.to_thread.run_sync(_ledger(ctx).append, entry)
        return {"key": key}

    @registry.function
    async def long_task(ctx: ToolContext, seconds: float) -> dict[str, Any]:
        """Work for a while; a cancelled turn stops it.

        Args:
            seconds: How long to work, in seconds.
        """
        ledger = _ledger(ctx)
        line = {"call_id": ctx.call_id, "tool": "long_task"}
        await anyio.to_thread.run_sync(ledger.append, {**line, "phase": "start"})
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            # Its turn ended (or its lease was lost): say so, then let the cancellation go on.
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(ledger.append, {**line, "phase": "cancelled"})
            raise
        # It slept to the end: say so even if a cancellation comes due right now (the thread
        # hop would otherwise take it, and leave a run with a start and nothing else).
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(ledger.append, {**line, "phase": "end"})
        return {"slept": seconds}

    @registry.function
    def long_task_sync(ctx: ToolContext, seconds: float) -> dict[str, Any]:
        """Work for a while in a thread; a cancelled turn stops it.

        Args:
            seconds: How long to work, in seconds.
        """
        ledger = _ledger(ctx)
        line = {"call_id": ctx.call_id, "tool": "long_task_sync"}
        ledger.append({**line, "phase": "start"})
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            # A thread cannot be stopped from outside: it looks every 50 ms.
            if ctx.cancelled.wait(min(0.05, left)):
                ledger.append({**line, "phase": "cancelled"})
                return {"cancelled": True}  # never submitted: the call was cancelled
        ledger.append({**line, "phase": "end"})
        return {"slept": seconds}

    return registry


#: The registry the demo and the examples serve
#: (``agentfn-asgi tools agentfn_asgi.demo.tools:tools``).
tools = build_tools()
