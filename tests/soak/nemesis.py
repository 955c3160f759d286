"""The nemesis: a fault schedule drawn from the seed, and its execution.

:func:`schedule` turns a seed into a list of :class:`Fault` (when, what, on which replica,
for how long): the same seed always gives the same schedule. :class:`Nemesis` runs it
against the replicas, the store connections and the fake, and records what it did (counts
by kind, and when each replica was down, which excuses a webhook that failed then; which
turns it cancelled or failed, and when).

A fault kind is one entry of :data:`FAULT_KINDS`: its weight, how its parameters are drawn
and how it is applied.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agentfn_asgi.testing import FakeAgentsAPI

from .cluster import Replica, StoreCutter
from .workload import LONG_TOOLS

__all__ = ["FAULT_KINDS", "Cancellation", "Fault", "FaultKind", "Nemesis", "Outage", "schedule"]


@dataclass(frozen=True, slots=True)
class Fault:
    """One planned fault: ``at`` seconds after the start; ``replica`` -1 means all (or none);
    ``duration`` how long it lasts; ``route``, ``n`` and ``status`` as the kind uses them."""

    index: int
    at: float
    kind: str
    replica: int = -1
    duration: float = 0.0
    route: str = ""
    n: int = 1
    status: int = 0

    def describe(self) -> str:
        """One short line (``schedule.txt`` and ``faults.txt`` in the run's folder)."""
        return (
            f"{self.at:7.2f}s {self.kind} replica={self.replica} duration={self.duration:.2f} "
            f"route={self.route or '-'} n={self.n} status={self.status}"
        )


@dataclass(frozen=True, slots=True)
class Outage:
    """A replica down (killed or stopped) from ``start`` to ``end`` (wall-clock seconds)."""

    replica: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Cancellation:
    """A turn the nemesis ended through the fake at ``at`` (wall clock): cancelled, or
    failed with the turn error ``code``; ``calls`` were pending then."""

    session_id: str
    at: float
    calls: tuple[str, ...]
    code: str = ""


@dataclass(slots=True)
class Nemesis:
    """Applies faults to the replicas, the store connections and the fake."""

    fake: FakeAgentsAPI
    replicas: list[Replica]
    cutter: StoreCutter
    lease_seconds: float
    seed: int
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    outages: list[Outage] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    """One line per fault: when it began (wall clock), what, and whether it applied."""
    cancellations: list[Cancellation] = field(default_factory=list)
    """The turns it cancelled or failed, in order."""
    _locks: dict[int, asyncio.Lock] = field(default_factory=dict)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, faults: list[Fault], started: float) -> None:
        """Apply each fault at its time (each in its own task: faults overlap)."""
        for fault in faults:
            delay = started + fault.at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(self._apply(fault), name=f"fault-{fault.index}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Let running faults end, then undo every lasting one: all replicas up, the fake
        well-behaved again."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for route in ("list", "retrieve", "submit", "stream", "delete"):
            self.fake.set_latency(route, 0)
            self.fake.faults.failures[route].clear()
            self.fake.faults.drops[route].clear()
        self.fake.races.clear()
        self.fake.duplicate_webhooks(False)

    async def _apply(self, fault: Fault) -> None:
        began = time.time()
        try:
            applied = await FAULT_KINDS[fault.kind].apply(self, fault)
        except Exception as exc:  # a nemesis failure is reported, not a reason to stop
            self.errors.append(f"fault {fault.describe()}: {type(exc).__name__}: {exc}")
            self.log.append(f"{began:.3f} {fault.describe()} FAILED {exc!r}")
            return
        self.log.append(f"{began:.3f} {fault.describe()} {'applied' if applied else 'skipped'}")
        if applied:
            self.injected[fault.kind] += 1

    def _lock(self, replica: int) -> asyncio.Lock:
        return self._locks.setdefault(replica, asyncio.Lock())

    def _rng(self, fault: Fault) -> random.Random:
        # Choices that depend on the state at the time (which calls are pending) are drawn
        # from the seed too, so a replay makes the same choice when it meets the same state.
        return random.Random(f"nemesis-{self.seed}-{fault.index}")

    def _pending_calls(self) -> list[tuple[str, str]]:
        return sorted(
            (session_id, action["call_id"])
            for session_id in list(self.fake.sessions)
            for action in self.fake.required_actions(session_id)
        )


# -- the fault kinds ---------------------------------------------------------------------------


async def _kill(nemesis: Nemesis, fault: Fault) -> bool:
    replica = nemesis.replicas[fault.replica]
    async with nemesis._lock(fault.replica):
        start = time.time()
        await replica.kill()
        await asyncio.sleep(fault.duration)
        await replica.start()
        nemesis.outages.append(Outage(fault.replica, start, time.time()))
    return True


async def _pause(nemesis: Nemesis, fault: Fault) -> bool:
    replica = nemesis.replicas[fault.replica]
    async with nemesis._lock(fault.replica):
        start = time.time()
        replica.pause()
        try:
            await asyncio.sleep(fault.duration)
        finally:
            replica.resume()
        nemesis.outages.append(Outage(fault.replica, start, time.time()))
    return True


async def _store_cut(nemesis: Nemesis, fault: Fault) -> bool:
    indexes = list(range(len(nemesis.replicas))) if fault.replica < 0 else [fault.replica]
    await nemesis.cutter.cut(indexes)
    return True


async def _api_error(nemesis: Nemesis, fault: Fault) -> bool:
    retry_after = fault.duration if fault.status == 429 else None
    nemesis.fake.fail_next(fault.route, fault.n, fault.status, retry_after=retry_after)  # type: ignore[arg-type]
    return True


async def _race(nemesis: Nemesis, fault: Fault) -> bool:
    pending = nemesis._pending_calls()
    if not pending:
        return False
    for _, call_id in nemesis._rng(fault).sample(pending, min(fault.n, len(pending))):
        nemesis.fake.race_once(call_id)
    return True


async def _slow(nemesis: Nemesis, fault: Fault) -> bool:
    route = fault.route
    nemesis.fake.set_latency(route, fault.status / 1000)  # type: ignore[arg-type]
    try:
        await asyncio.sleep(fault.duration)
    finally:
        nemesis.fake.set_latency(route, 0)  # type: ignore[arg-type]
    return True


async def _applied_then_failed(nemesis: Nemesis, fault: Fault) -> bool:
    if fault.status == 0:  # the answer lost on the way back: a dropped connection
        nemesis.fake.drop_next("submit", fault.n, after_processing=True)
    else:
        nemesis.fake.fail_next("submit", fault.n, fault.status, after_processing=True)
    return True


async def _redeliver_same(nemesis: Nemesis, fault: Fault) -> bool:
    nemesis.fake.duplicate_webhooks(True)
    try:
        await asyncio.sleep(fault.duration)
    finally:
        nemesis.fake.duplicate_webhooks(False)
    return True


async def _redeliver_new(nemesis: Nemesis, fault: Fault) -> bool:
    sessions = sorted({session_id for session_id, _ in nemesis._pending_calls()})
    if not sessions:
        return False
    chosen = nemesis._rng(fault).sample(sessions, min(fault.n, len(sessions)))
    webhook_ids = [nemesis.fake.redeliver(session_id) for session_id in chosen]  # all of them
    return any(webhook_id is not None for webhook_id in webhook_ids)


#: The turn error codes a failed turn gets (``fail_turn``).
TURN_ERROR_CODES = ["session_budget_exceeded", "project_spend_limit_exceeded", "internal_error"]


async def _end_turn(nemesis: Nemesis, fault: Fault) -> bool:
    # A session with a pending call, most often one whose long task may be running: that is
    # what a cancellation must stop. ``route`` carries a failed turn's error code.
    rng = nemesis._rng(fault)
    pending = [
        (session_id, action["name"] in LONG_TOOLS)
        for session_id in list(nemesis.fake.sessions)
        for action in nemesis.fake.required_actions(session_id)
    ]
    long = sorted({session_id for session_id, is_long in pending if is_long})
    sessions = long if long and rng.random() < 0.7 else sorted({sid for sid, _ in pending})
    if not sessions:
        return False
    session_id = rng.choice(sessions)
    calls = tuple(a["call_id"] for a in nemesis.fake.required_actions(session_id))
    at = time.time()
    if fault.kind == "fail_turn":
        message = f"soak fails the turn: {fault.route}"
        ended = nemesis.fake.fail_turn(session_id, fault.route, message)
    else:
        ended = nemesis.fake.cancel_turn(session_id)
    if ended:
        nemesis.cancellations.append(Cancellation(session_id, at, calls, fault.route))
    return ended


@dataclass(frozen=True, slots=True)
class FaultKind:
    """How often a fault is drawn, how its parameters are drawn, how it is applied; whether
    it needs store connections (not on SQLite)."""

    weight: int
    draw: Callable[[random.Random, Fault, int, float], Fault]
    apply: Callable[[Nemesis, Fault], Awaitable[bool]]
    needs_connections: bool = False


def _replace(fault: Fault, **changes: object) -> Fault:
    return dataclasses.replace(fault, **changes)  # type: ignore[arg-type]


_API_ROUTES = ["submit", "retrieve"]

#: Every fault the nemesis knows, by name.
FAULT_KINDS: dict[str, FaultKind] = {
    "kill": FaultKind(
        3,
        lambda rng, f, replicas, lease: _replace(
            f, replica=rng.randrange(replicas), duration=rng.uniform(0.2, 3.0)
        ),
        _kill,
    ),
    "pause": FaultKind(
        2,
        lambda rng, f, replicas, lease: _replace(
            f, replica=rng.randrange(replicas), duration=lease + rng.uniform(0.5, 3.0)
        ),
        _pause,
    ),
    "store_cut": FaultKind(
        3,
        lambda rng, f, replicas, lease: _replace(f, replica=rng.randrange(-1, replicas)),
        _store_cut,
        needs_connections=True,
    ),
    "api_5xx": FaultKind(
        3,
        lambda rng, f, replicas, lease: _replace(
            f,
            route=rng.choice(_API_ROUTES),
            n=rng.randint(1, 3),
            status=rng.choice([500, 502, 503]),
        ),
        _api_error,
    ),
    "api_429": FaultKind(
        2,
        lambda rng, f, replicas, lease: _replace(
            f,
            route=rng.choice(_API_ROUTES),
            n=rng.randint(1, 2),
            status=429,
            duration=rng.choice([1.0, 2.0]),
        ),
        _api_error,
    ),
    "race_400": FaultKind(
        2, lambda rng, f, replicas, lease: _replace(f, n=rng.randint(1, 2)), _race
    ),
    "api_slow": FaultKind(
        2,
        lambda rng, f, replicas, lease: _replace(
            f,
            route=rng.choice(_API_ROUTES),
            status=rng.randrange(500, 3000),
            duration=rng.uniform(2.0, 8.0),
        ),
        _slow,
    ),
    "applied_then_failed": FaultKind(
        3,
        lambda rng, f, replicas, lease: _replace(
            f, n=rng.randint(1, 2), status=rng.choice([0, 500, 502])
        ),
        _applied_then_failed,
    ),
    "redeliver_same": FaultKind(
        2,
        lambda rng, f, replicas, lease: _replace(f, duration=rng.uniform(1.0, 4.0)),
        _redeliver_same,
    ),
    "redeliver_new": FaultKind(
        2, lambda rng, f, replicas, lease: _replace(f, n=rng.randint(1, 3)), _redeliver_new
    ),
    "cancel_turn": FaultKind(3, lambda rng, f, replicas, lease: f, _end_turn),
    "fail_turn": FaultKind(
        2,
        lambda rng, f, replicas, lease: _replace(f, route=rng.choice(TURN_ERROR_CODES)),
        _end_turn,
    ),
}


def schedule(
    seed: int,
    seconds: float,
    *,
    replicas: int,
    lease_seconds: float,
    mean_interval: float,
    connections: bool,
) -> list[Fault]:
    """The faults of a run: exponential gaps of ``mean_interval`` on average from 2 s after
    the start to ``seconds``; kinds by weight (store cuts only with ``connections``). The
    same arguments always give the same list."""
    rng = random.Random(f"nemesis-schedule-{seed}")
    kinds = [k for k, kind in FAULT_KINDS.items() if connections or not kind.needs_connections]
    weights = [FAULT_KINDS[k].weight for k in kinds]
    faults: list[Fault] = []
    at = 2.0
    while True:
        at += rng.expovariate(1 / mean_interval)
        if at >= seconds:
            return faults
        kind = rng.choices(kinds, weights)[0]
        blank = Fault(len(faults), round(at, 3), kind)
        faults.append(FAULT_KINDS[kind].draw(rng, blank, replicas, lease_seconds))
