"""Generated histories (issue 22): every backend agrees with the reference on every step.

A hypothesis state machine drives random sequences of every :class:`Store` operation through
two namespaces (two store instances over the same data) and two owners, on the backend under
test and, in lockstep, on a fresh :class:`MemoryStore` (the reference) reading the same fake
clock. Both must agree on everything observable:

- every step's answer (a raised error by its class; listings page by page);
- after every step, what it may have changed, in both namespaces (isolation): the call it
  worked on with its history, or every delivery, or (after ``prune``) everything;
- at the end of every example, every call with its history, every delivery and the counts
  of each namespace.

Keys, owners and delivery ids come from small pools, and the steps on calls mostly pick a
call that exists, in a state where the step does something (sometimes through the other
namespace), so that steps collide: claims race, leases run out and are taken over,
superseded holders try to save, operators settle and release, holders leave calls
unanswered and others take them up, turn-less ones retire, refused submissions run a
history past its bound, results are pruned, listed and paged. Flow control: claims of
limited tools (a few fixed limits sharing two limiters: one or two slots, a rate with a
burst of 1) take slots or wait, their holders poll (``admit_call``), waiters die and are
adopted, and every record's ``limiter`` is compared with the rest. Call budgets: holders have
their calls counted against a budget of one or two per session and tool (``count_call``),
and every record's ``counted`` is compared.

Times are compared exactly: both stores read the one clock, which only the ``advance`` rule
moves. ``AGENTFN_HISTORY_EXAMPLES`` sets the examples per backend (120 by default, the same
ones on every run; 2,000, new ones each run, in ``make histories-long``);
``AGENTFN_HISTORY_STEPS`` the steps per example (30). A failure prints the shrunk sequence
of steps (``AGENTFN_HISTORY_SHRINK=0``: the first one found, at once).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from collections.abc import Awaitable, Callable, Collection, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from agentfn_asgi.calls.records import (
    CallEvent,
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    ClaimOutcome,
    DeliveryRecord,
    Limit,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.calls.states import in_doubt
from agentfn_asgi.errors import AgentFnError, StoreUnavailableError
from agentfn_asgi.store import MemoryStore, SQLiteStore, Store
from tests.store.conftest import FakeClock, _postgres_backend, _redis_backend, require_service

T = TypeVar("T")

#: Examples per backend: 120 in ``make test`` (about a minute on the four backends);
#: ``make histories-long`` runs 2,000.
EXAMPLES = int(os.environ.get("AGENTFN_HISTORY_EXAMPLES", "120"))
#: Steps per example (hypothesis shrinks a failing sequence to the steps that matter).
STEPS = int(os.environ.get("AGENTFN_HISTORY_STEPS", "30"))
#: ``AGENTFN_HISTORY_SHRINK=0`` reports the first failing sequence as found: seconds instead
#: of the minutes shrinking may take on a slow backend (while fixing a store).
SHRINK = os.environ.get("AGENTFN_HISTORY_SHRINK", "1") != "0"

START = 1_700_000_000.0
NAMESPACES = ("", "proj_b")
OWNERS = ("replica-1", "replica-2")
SESSIONS = ("s1", "s2")
TURNS = ("t1", "t1", "t1", "t2")  # mostly one turn: more collisions
CALL_IDS = ("c1", "c2")
DELIVERY_IDS = ("d1", "d2", "d3")
TOOLS = ("lookup", "refund")
STATES = (*(state.value for state in CallState), "in_doubt")

namespaces = st.sampled_from(NAMESPACES)
owners = st.sampled_from(OWNERS)
keys = st.builds(
    CallKey, st.sampled_from(SESSIONS), st.sampled_from(TURNS), st.sampled_from(CALL_IDS)
)
delivery_ids = st.sampled_from(DELIVERY_IDS)
leases = st.sampled_from([10.0, 30.0])
margins = st.sampled_from([0.0, 5.0])
#: Offsets from now of the times an operation is given (retry_at, due_before, prune's...).
offsets = st.sampled_from([-30.0, -0.5, 0.0, 0.5, 30.0, 120.0])
limits = st.sampled_from([1, 2, 100])
#: Who a fenced step (renew, save, quarantine) claims to be: the claim's current holder,
#: the holder of the attempt before (superseded by a takeover or a release), or anyone.
whos = st.sampled_from(["holder", "holder", "previous", "anyone"])
attempts = st.integers(min_value=1, max_value=3)
results = st.builds(
    SavedResult,
    success=st.booleans(),
    event_json=st.sampled_from(['{"output":"ok"}', '{"output":"other"}']),
    idempotency_key=st.sampled_from(["idem-1", "idem-2"]),
    error_type=st.sampled_from([None, "handler_error", "timeout"]),
    source=st.sampled_from(["ran", "reconciled", "worker", "operator"]),
    full_output=st.sampled_from([None, "a long output"]),
)
durations = st.sampled_from([None, 0.25, 1.5])
#: Flow control: the limits a limited tool's claim and its holder's polls ask with. Two
#: limiters (a limit's name), one of them asked with two concurrencies; the rate gives a
#: token every 10 s (the ``advance`` steps cross that), from a bucket of one.
LIMITS = (
    Limit(name="lookup", concurrency=1),
    Limit(name="lookup", concurrency=2),
    Limit(name="refund", rate=0.1, burst=1),
)
flow_limits = st.sampled_from(LIMITS)
#: Call budgets: a session's calls of a tool (up to four in the pools) counted up to one or
#: two, so that counts are refused as well as made.
budgets = st.sampled_from([1, 2])
#: Where time goes relative to a claim's lease end before a step that compares with it:
#: exactly at it, just past it, at the end of a 5 s margin and past that; None: stays.
lease_ends = st.sampled_from([None, 0.0, 0.5, 5.0, 5.5])


# -- what is compared ----------------------------------------------------------------------


def event_view(event: CallEvent) -> tuple[object, ...]:
    return (event.at, event.kind, event.attempt, event.owner, event.detail)


def call_view(record: CallRecord | None, *, history: bool = False) -> object:
    """Everything observable of a record; its history only where it was asked for."""
    if record is None:
        return None
    view: dict[str, object] = {
        f.name: getattr(record, f.name)
        for f in dataclasses.fields(record)
        if f.name not in ("history", "history_dropped")
    }
    view["state"] = record.state.value
    # A claim's own nonce is random (one per claim_call): the row it names is what counts.
    if isinstance(record.nonce, str) and record.nonce.endswith((":retry", ":adopt")):
        view["nonce"] = "<claim>" + record.nonce.rsplit(":", 1)[1]
    if history:
        view["history"] = [event_view(event) for event in record.history]
        view["history_dropped"] = record.history_dropped
    return view


def calls_view(records: list[CallRecord], *, history: bool = False) -> object:
    return [call_view(record, history=history) for record in records]


def claim_view(outcome: ClaimOutcome) -> object:
    return (outcome.status.value, call_view(outcome.record))


def admission_view(outcome: ClaimOutcome | None) -> object:
    return None if outcome is None else claim_view(outcome)


def deliveries_view(records: list[DeliveryRecord]) -> object:
    return records  # compared as they are: every field is observable


def stats_view(stats: StoreStats) -> object:
    return stats


def same(value: object) -> object:
    return value


async def outcome(step: Awaitable[T], view: Callable[[T], object]) -> object:
    """The answer of one step as compared: its view, or the class of the error it raised."""
    try:
        return ("returned", view(await step))
    except AgentFnError as exc:
        return ("raised", type(exc).__name__)


class DivergenceError(AssertionError):
    """The backend answered or holds something other than the reference."""


# -- the backend under test ----------------------------------------------------------------


@dataclasses.dataclass
class Backend:
    """The stores under test (one per namespace, over the same data) and how to empty them
    between examples; memory gets fresh instances instead."""

    name: str
    clock: FakeClock
    stores: dict[str, Store]
    reset: Callable[[Backend], Coroutine[Any, Any, None]]
    cleanup: Callable[[], Awaitable[None]] | None = None
    runner: asyncio.Runner | None = None

    def run(self, step: Awaitable[T]) -> T:
        """Run ``step`` to its end on the test's event loop (where the stores connected)."""
        assert self.runner is not None
        # Not runner.run(): it installs a SIGINT handler on every call, which costs more
        # than most steps.
        return self.runner.get_loop().run_until_complete(_awaited(step))

    async def close(self) -> None:
        for store in self.stores.values():
            await store.close()
        if self.cleanup is not None:
            await self.cleanup()


async def _awaited(step: Awaitable[T]) -> T:
    return await step


async def _reset_memory(backend: Backend) -> None:
    fresh = MemoryStore(clock=backend.clock)
    backend.stores = {ns: fresh.sharing(ns) for ns in NAMESPACES}


async def _reset_sqlite(backend: Backend) -> None:
    import sqlite3

    path = backend.stores[NAMESPACES[0]].path  # type: ignore[attr-defined]
    with sqlite3.connect(path) as conn:  # the stores' writers are idle between steps
        conn.execute("DELETE FROM calls")
        conn.execute("DELETE FROM deliveries")
        conn.execute("DELETE FROM buckets")
    conn.close()


async def _reset_postgres(backend: Backend) -> None:
    store = backend.stores[NAMESPACES[0]]
    schema = store._s  # type: ignore[attr-defined]  # the quoted schema name
    await store._execute(  # type: ignore[attr-defined]
        "reset",
        f"DELETE FROM {schema}.calls; DELETE FROM {schema}.deliveries;"  # noqa: S608
        f" DELETE FROM {schema}.buckets",
    )


async def _reset_redis(backend: Backend) -> None:
    store = backend.stores[NAMESPACES[0]]
    prefix: str = store._prefix  # type: ignore[attr-defined]
    client = store._redis()  # type: ignore[attr-defined]
    layout = prefix + "layout"  # kept: every instance checked it once and trusts it
    doomed = [
        key
        async for key in client.scan_iter(match=prefix.replace("*", r"\*") + "*", count=1000)
        if (key.decode() if isinstance(key, bytes) else key) != layout
    ]
    if doomed:
        await client.delete(*doomed)


RESETS: dict[str, Callable[[Backend], Coroutine[Any, Any, None]]] = {
    "memory": _reset_memory,
    "sqlite": _reset_sqlite,
    "postgres": _reset_postgres,
    "redis": _reset_redis,
}


async def open_backend(name: str, clock: FakeClock, tmp_path: Path) -> Backend:
    """The stores of backend ``name``, one per namespace, as the contract suite makes them
    (``conftest``: own file, schema or key prefix; a missing service skips, or fails under
    ``CI=true``); ``backend.cleanup`` removes the data."""
    cleanup: Callable[[], Awaitable[None]] | None = None
    make: Callable[[str], Store]
    if name == "sqlite":
        path = tmp_path / "store.sqlite3"
        make = lambda namespace: SQLiteStore(path, clock=clock, namespace=namespace)  # noqa: E731
    elif name == "redis":
        make, cleanup = _redis_backend(clock)
    elif name == "postgres":
        make, cleanup = _postgres_backend(clock)
    else:
        make = lambda namespace: MemoryStore(clock=clock, namespace=namespace)  # noqa: E731
    backend = Backend(name, clock, {}, RESETS[name], cleanup)
    for ns in NAMESPACES:
        store = backend.stores[ns] = make(ns)
        try:
            await store.open()
        except StoreUnavailableError as exc:
            await backend.close()
            require_service(name, f"cannot open the store: {exc}")
    await backend.reset(backend)
    return backend


# -- the state machine ---------------------------------------------------------------------

pages = st.sampled_from([1, 3])
#: The reads, by name: the strategies of their arguments (``Histories.read_<name>``).
READS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "get_call": {"ns": namespaces, "key": keys, "history": st.booleans()},
    "find_calls": {"ns": namespaces, "call_id": st.sampled_from(CALL_IDS)},
    "calls_for_session": {"ns": namespaces, "session_id": st.sampled_from(SESSIONS)},
    "list_calls": {
        "ns": namespaces,
        "state": st.sampled_from([None, *STATES]),
        "session_id": st.sampled_from([None, *SESSIONS]),
        "tool_name": st.sampled_from([None, *TOOLS]),
        "since": st.sampled_from([None, "start", "now"]),
        "limit": limits,
        "pages": pages,
    },
    "unsubmitted_results": {"ns": namespaces, "offset": offsets, "limit": limits, "pages": pages},
    "unresolved_deliveries": {
        "ns": namespaces,
        "offset": offsets,
        "limit": limits,
        "pages": pages,
    },
    "list_deliveries": {"ns": namespaces, "unresolved_only": st.booleans(), "limit": limits},
    "expired_claims": {"ns": namespaces, "margin": margins, "limit": limits},
    "due_retries": {"ns": namespaces, "limit": limits},
    "stats": {"ns": namespaces},
}


class Histories(RuleBasedStateMachine):
    """Every store operation as a rule, on the backend and the reference in lockstep.

    Hypothesis is synchronous: each step runs its coroutines to their end on the test's
    event loop (``Backend.run``), where the stores' connections live.
    """

    backend: Backend  # set on the subclass made per test

    def __init__(self) -> None:
        super().__init__()
        self.clock = self.backend.clock
        self.clock.now = START
        self.backend.run(self.backend.reset(self.backend))
        reference = MemoryStore(clock=self.clock)
        self.reference = {ns: reference.sharing(ns) for ns in NAMESPACES}
        # What the steps since the last comparison may have changed (``both``'s touches).
        self.touched: set[str] = set()
        self.touched_keys: set[CallKey] = set()
        self.failed = False
        # Steps on calls wait for one to exist (most draws would find none otherwise).
        self.calls_exist = False

    # -- plumbing ------------------------------------------------------------------------
    def both(
        self,
        what: str,
        ns: str,
        step: Callable[[Store], Awaitable[T]],
        view: Callable[[T], object] = same,
        *,
        touches: str = "calls",
        key: CallKey | None = None,
    ) -> object:
        """Run ``step`` on the reference, then on the backend; their views must agree.

        ``touches`` says which records the step may change, in either namespace (``calls``,
        ``deliveries``, ``all``, or ``""`` for reads): they are compared after it. A step on
        one call (``key``) is followed by a look at that call only, in both namespaces (and
        at what ``touches`` names besides its calls: a claim that resolves its delivery
        touches ``deliveries``); every record is compared again at the end of the example
        (``teardown``).
        """
        if key is not None:
            self.touched_keys.add(key)
        if touches != "calls" or key is None:
            self.touched.update({"all": ("calls", "deliveries")}.get(touches, (touches,)))
            self.touched.discard("")

        async def run() -> tuple[object, object]:
            expected = await outcome(step(self.reference[ns]), view)
            actual = await outcome(step(self.backend.stores[ns]), view)
            return expected, actual

        expected, actual = self.backend.run(run())
        self.agree(f"{what} in namespace {ns!r}", expected, actual)
        if "calls" in self.touched or self.touched_keys:
            self.calls_exist = bool(self.existing())
        event(f"{what.split('(')[0]}: {_summary(expected)}")
        return expected

    def agree(self, what: str, expected: object, actual: object) -> None:
        if expected != actual:
            self.failed = True
            raise DivergenceError(
                f"{self.backend.name} diverges from the reference on {what} "
                f"at t=START+{self.clock.now - START:g}:\n"
                f"  reference: {expected!r}\n  {self.backend.name}: {actual!r}"
            )

    def now(self) -> float:
        return self.clock.now

    def existing(self) -> list[tuple[str, CallKey, str]]:
        """The calls the reference holds, as ``(namespace, key, state)``; a claim whose lease
        ran out is in state ``lapsed`` here (in doubt, whatever the margin)."""

        def state(record: CallRecord) -> str:
            return "lapsed" if in_doubt(record, now=self.clock.now) else record.state.value

        async def listed() -> list[tuple[str, CallKey, str]]:
            found = []
            for ns in NAMESPACES:
                records = await self.reference[ns].list_calls(CallQuery(limit=1000))
                found += [(ns, record.key, state(record)) for record in records]
            return sorted(found, key=lambda item: (item[0], *_key_tuple(item[1])))

        return self.backend.run(listed())

    def target(self, data: st.DataObject, *prefer: str) -> tuple[str, CallKey]:
        """The call a step works on: mostly one that exists, in a state of ``prefer`` when
        there is one (sometimes through the other namespace: isolation), else any key of
        the pool (unknown calls)."""
        existing = self.existing()
        if existing and data.draw(st.integers(0, 4), label="existing (0: any key)") > 0:
            preferred = [item for item in existing if item[2] in prefer]
            if preferred and data.draw(st.integers(0, 3), label="preferred (0: any)") > 0:
                existing = preferred
            ns, key, _ = data.draw(st.sampled_from(existing), label="call")
            if data.draw(st.integers(0, 3), label="other namespace (0)") == 0:
                ns = NAMESPACES[1 - NAMESPACES.index(ns)]
            return ns, key
        return data.draw(namespaces, label="namespace"), data.draw(keys, label="key")

    def fenced(self, ns: str, key: CallKey, who: str, owner: str, attempt: int) -> tuple[str, int]:
        """The ``(owner, attempt)`` a fenced step is made with (see ``whos``)."""
        if who == "anyone":
            return owner, attempt
        record = self.backend.run(self.reference[ns].get_call(key, history=True))
        if record is None or record.owner is None:
            return owner, attempt
        if who == "holder":
            return record.owner, record.attempt
        earlier = [e for e in record.history if e.attempt == record.attempt - 1 and e.owner]
        if not earlier:
            return owner, max(1, record.attempt - 1)
        return str(earlier[-1].owner), record.attempt - 1

    # -- time ----------------------------------------------------------------------------
    @initialize()
    def start(self) -> None:
        """Every example starts from empty stores at START (see __init__)."""

    # Leases are 10 or 30 s and margins 0 or 5 s: these land a claim's expiry exactly on,
    # just after and past its lease end and its margin's end, where guards compare.
    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 10.0, 10.5, 15.0, 30.0, 30.5, 35.0, 60.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)  # changes no record: the reads compare what time changes

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), offset=lease_ends)
    def advance_to_lease_end(self, data: st.DataObject, offset: float | None) -> None:
        """Move time to a live claim's (or waiter's) lease end plus ``offset`` (see
        ``lease_ends``)."""
        ns, key = self.target(data, "claimed", "waiting")
        self.wait_for_lease_end(ns, key, offset)

    def wait_for_lease_end(self, ns: str, key: CallKey, offset: float | None) -> None:
        """If ``key`` is claimed, waits for a slot or waits for a retry, move time (forward
        only) to its lease end (the retry's time) plus ``offset``."""
        if offset is None:
            return
        record = self.backend.run(self.reference[ns].get_call(key))
        if record is not None and record.state.value in ("claimed", "waiting", "retry_scheduled"):
            self.clock.now = max(self.clock.now, record.lease_expires_at + offset)

    # -- deliveries ----------------------------------------------------------------------
    @rule(
        ns=namespaces,
        delivery_id=delivery_ids,
        session_id=st.sampled_from(SESSIONS),
        nonce=st.sampled_from([None, "", "nonce-1", "nonce-2"]),
    )
    def record_delivery(
        self, ns: str, delivery_id: str, session_id: str, nonce: str | None
    ) -> None:
        self.both(
            f"record_delivery({delivery_id!r}, {session_id!r}, nonce={nonce!r})",
            ns,
            lambda s: s.record_delivery(delivery_id, session_id, nonce=nonce),
            touches="deliveries",
        )

    @rule(ns=namespaces, delivery_id=delivery_ids)
    def mark_delivery_resolved(self, ns: str, delivery_id: str) -> None:
        self.both(
            f"mark_delivery_resolved({delivery_id!r})",
            ns,
            lambda s: s.mark_delivery_resolved(delivery_id),
            touches="deliveries",
        )

    @rule(
        ns=namespaces,
        delivery_id=delivery_ids,
        error=st.sampled_from(["timeout", "404"]),
        offset=offsets,
    )
    def delivery_failed(self, ns: str, delivery_id: str, error: str, offset: float) -> None:
        retry_at = self.now() + offset
        self.both(
            f"delivery_failed({delivery_id!r}, error={error!r}, retry_at=now{offset:+g})",
            ns,
            lambda s: s.delivery_failed(delivery_id, error=error, retry_at=retry_at),
            touches="deliveries",
        )

    @rule(ns=namespaces, deliveries=offsets, calls=offsets)
    def prune(self, ns: str, deliveries: float, calls: float) -> None:
        deliveries_before, calls_before = self.now() + deliveries, self.now() + calls
        self.both(
            f"prune(deliveries_before=now{deliveries:+g}, calls_before=now{calls:+g})",
            ns,
            lambda s: s.prune(deliveries_before=deliveries_before, calls_before=calls_before),
            touches="all",
        )

    # -- calls ---------------------------------------------------------------------------
    @rule(
        data=st.data(),
        tool_name=st.sampled_from(TOOLS),
        owner=owners,
        lease=leases,
        delivery_id=st.sampled_from([None, "d1"]),
        margin=margins,
        wait=lease_ends,
        resolves=st.booleans(),
    )
    def claim_call(
        self,
        data: st.DataObject,
        tool_name: str,
        owner: str,
        lease: float,
        delivery_id: str | None,
        margin: float,
        wait: float | None,
        resolves: bool,
    ) -> None:
        ns, key = self.target(data, "lapsed", "retry_scheduled", "waiting")
        self.wait_for_lease_end(ns, key, wait)
        self.both(
            f"claim_call({key}, tool_name={tool_name!r}, owner={owner!r}, lease_seconds={lease},"
            f" delivery_id={delivery_id!r}, margin={margin}, resolves_delivery={resolves})",
            ns,
            lambda s: s.claim_call(
                key,
                tool_name=tool_name,
                owner=owner,
                lease_seconds=lease,
                delivery_id=delivery_id,
                margin=margin,
                resolves_delivery=resolves,
            ),
            claim_view,
            key=key,
            touches="deliveries" if resolves else "calls",
        )

    # -- flow control ----------------------------------------------------------------------
    @rule(
        data=st.data(),
        limit=flow_limits,
        lease=leases,
        delivery_id=st.sampled_from([None, "d1"]),
        margin=margins,
        wait=lease_ends,
        more=st.sampled_from([0, 1, 2]),
        resolves=st.booleans(),
    )
    def claim_limited(
        self,
        data: st.DataObject,
        limit: Limit,
        lease: float,
        delivery_id: str | None,
        margin: float,
        wait: float | None,
        more: int,
        resolves: bool,
    ) -> None:
        """A limited tool's claim: a new call takes a slot or waits; our own claim without
        a slot asks for one; a due retry, a dead waiter (adopted) or a call in doubt (taken
        over only with a slot) likewise. Then ``more`` claims of any key in the same
        namespace, at the same time, so that calls contend for the slots."""
        ns, key = self.target(data, "lapsed", "retry_scheduled", "waiting", "claimed")
        self.wait_for_lease_end(ns, key, wait)
        for n in range(1 + more):
            if n:
                key = data.draw(keys, label="another key")
            owner = data.draw(owners, label="owner")
            self.both(
                f"claim_call({key}, tool_name={limit.name!r}, owner={owner!r}, "
                f"lease_seconds={lease}, delivery_id={delivery_id!r}, margin={margin}, "
                f"limit={limit!r}, resolves_delivery={resolves})",
                ns,
                lambda s, key=key, owner=owner: s.claim_call(  # type: ignore[misc]
                    key,
                    tool_name=limit.name,
                    owner=owner,
                    lease_seconds=lease,
                    delivery_id=delivery_id,
                    margin=margin,
                    limit=limit,
                    resolves_delivery=resolves,
                ),
                claim_view,
                key=key,
                touches="deliveries" if resolves else "calls",
            )

    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        limit=flow_limits,
        who=whos,
        owner=owners,
        attempt=attempts,
        lease=leases,
        margin=margins,
    )
    def admit_call(
        self,
        data: st.DataObject,
        limit: Limit,
        who: str,
        owner: str,
        attempt: int,
        lease: float,
        margin: float,
    ) -> None:
        """A holder's poll of its limiter (or a superseded holder's, or anyone's), mostly
        with a limit of the limiter the call waits for (or holds)."""
        ns, key = self.target(data, "waiting", "claimed", "lapsed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        record = self.backend.run(self.reference[ns].get_call(key))
        own = [known for known in LIMITS if record is not None and known.name == record.limiter]
        if own and data.draw(st.integers(0, 3), label="its own limiter (else: any)") > 0:
            limit = data.draw(st.sampled_from(own), label="its limit")
        self.both(
            f"admit_call({key}, owner={owner!r}, attempt={attempt}, limit={limit!r},"
            f" lease_seconds={lease}, margin={margin})",
            ns,
            lambda s: s.admit_call(
                key,
                owner=owner,
                attempt=attempt,
                limit=limit,
                lease_seconds=lease,
                margin=margin,
            ),
            admission_view,
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), who=whos, owner=owners, attempt=attempts, budget=budgets)
    def count_call(
        self, data: st.DataObject, who: str, owner: str, attempt: int, budget: int
    ) -> None:
        """A holder has its call counted against its session's budget of its tool (or a
        superseded holder, or anyone, tries): counted in its place, refused once the
        session's calls of the tool fill the budget, never counted twice."""
        ns, key = self.target(data, "claimed", "lapsed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        self.both(
            f"count_call({key}, owner={owner!r}, attempt={attempt}, budget={budget})",
            ns,
            lambda s: s.count_call(key, owner=owner, attempt=attempt, budget=budget),
            lambda record: call_view(record),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), who=whos, owner=owners, attempt=attempts, lease=leases)
    def keep_places(
        self, data: st.DataObject, who: str, owner: str, attempt: int, lease: float
    ) -> None:
        """Waiters behind the head of a line keep their place, one to three in one batch
        (the holder's, a superseded holder's, anyone's)."""
        ns, key = self.target(data, "waiting", "lapsed", "claimed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        waiters = [(key, attempt)]
        for _ in range(data.draw(st.integers(0, 2), label="more waiters")):
            waiters.append((data.draw(keys, label="another key"), attempt))
        self.both(
            f"keep_places({waiters}, owner={owner!r}, lease_seconds={lease})",
            ns,
            lambda s: s.keep_places(waiters, owner=owner, lease_seconds=lease),
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), who=whos, owner=owners, attempt=attempts, lease=leases)
    def renew_lease(
        self, data: st.DataObject, who: str, owner: str, attempt: int, lease: float
    ) -> None:
        ns, key = self.target(data, "claimed", "lapsed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        self.both(
            f"renew_lease({key}, owner={owner!r}, attempt={attempt}, lease_seconds={lease})",
            ns,
            lambda s: s.renew_lease(key, owner=owner, attempt=attempt, lease_seconds=lease),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        who=whos,
        owner=owners,
        attempt=attempts,
        result=results,
        duration=durations,
    )
    def save_result(
        self,
        data: st.DataObject,
        who: str,
        owner: str,
        attempt: int,
        result: SavedResult,
        duration: float | None,
    ) -> None:
        ns, key = self.target(data, "claimed", "lapsed", "waiting")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        self.both(
            f"save_result({key}, owner={owner!r}, attempt={attempt}, result={result!r}, "
            f"duration={duration!r})",
            ns,
            lambda s: s.save_result(
                key, owner=owner, attempt=attempt, result=result, duration=duration
            ),
            call_view,
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), detail=st.sampled_from(["", "200 after 1 request"]))
    def mark_submitted(self, data: st.DataObject, detail: str) -> None:
        ns, key = self.target(data, "succeeded", "failed")
        self.both(
            f"mark_submitted({key}, detail={detail!r})",
            ns,
            lambda s: s.mark_submitted(key, detail=detail),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), detail=st.sampled_from(["503", "404 not found"]), offset=offsets)
    def submission_failed(self, data: st.DataObject, detail: str, offset: float) -> None:
        self.refuse(data, detail, offset, 1)

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), offset=offsets, times=st.sampled_from([2, 49, 55]))
    def submissions_refused(self, data: st.DataObject, offset: float, times: int) -> None:
        """Refusals in a row: 49 or 55 run a saved call's history (claimed, saved, ...) past
        its bound of 50 events, by one or more."""
        self.refuse(data, "404 not found", offset, times)

    def refuse(self, data: st.DataObject, detail: str, offset: float, times: int) -> None:
        ns, key = self.target(data, "succeeded", "failed")
        retry_at = self.now() + offset

        async def refuse(store: Store) -> None:
            for i in range(times):
                # Each its own detail: which events a bounded history keeps is then seen.
                text = detail if times == 1 else f"{detail} (refusal {i + 1})"
                await store.submission_failed(key, detail=text, retry_at=retry_at)

        self.both(
            f"submission_failed({key}, detail={detail!r}, retry_at=now{offset:+g}) x{times}",
            ns,
            refuse,
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        since=st.sampled_from([None, "now", "now-1", "updated_at", "updated_at-0.5"]),
    )
    def mark_stale(self, data: st.DataObject, since: str | None) -> None:
        ns, key = self.target(
            data,
            "claimed",
            "lapsed",
            "waiting",
            "retry_scheduled",
            "succeeded",
            "failed",
            "unanswered",
        )
        unchanged_since: float | None = None
        if since is not None:
            base = self.now()
            if since.startswith("updated_at"):
                record = self.backend.run(self.reference[ns].get_call(key))
                base = record.updated_at if record is not None else base
            unchanged_since = base - (0.5 if since.endswith("-0.5") else 0.0)
            unchanged_since -= 1.0 if since == "now-1" else 0.0
        self.both(
            f"mark_stale({key}, unchanged_since={since!r} = {unchanged_since!r})",
            ns,
            lambda s: s.mark_stale(key, unchanged_since=unchanged_since),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        before=st.sampled_from(["now", "created_at", "created_at-0.5"]),
        owner=owners,
    )
    def cancel(self, data: st.DataObject, before: str, owner: str) -> None:
        ns, key = self.target(
            data,
            "claimed",
            "lapsed",
            "waiting",
            "retry_scheduled",
            "awaiting_approval",
            "approved",
            "succeeded",
            "unanswered",
        )
        known_before = self.now()
        if before.startswith("created_at"):
            record = self.backend.run(self.reference[ns].get_call(key))
            known_before = record.created_at if record is not None else known_before
            known_before -= 0.5 if before.endswith("-0.5") else 0.0
        self.both(
            f"cancel({key}, owner={owner!r}, known_before={before!r} = {known_before!r})",
            ns,
            lambda s: s.cancel(
                key, owner=owner, reason="the turn was cancelled", known_before=known_before
            ),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        who=whos,
        owner=owners,
        attempt=attempts,
        reason=st.sampled_from(["reconcile: unknown", "hook raised"]),
    )
    def quarantine(
        self, data: st.DataObject, who: str, owner: str, attempt: int, reason: str
    ) -> None:
        ns, key = self.target(data, "claimed", "lapsed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        self.both(
            f"quarantine({key}, owner={owner!r}, attempt={attempt}, reason={reason!r})",
            ns,
            lambda s: s.quarantine(key, owner=owner, attempt=attempt, reason=reason),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        who=whos,
        owner=owners,
        attempt=attempts,
        offset=offsets,
        reason=st.sampled_from(["rate limited", "503"]),
    )
    def schedule_retry(
        self, data: st.DataObject, who: str, owner: str, attempt: int, offset: float, reason: str
    ) -> None:
        ns, key = self.target(data, "claimed", "lapsed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        at = self.now() + offset
        self.both(
            f"schedule_retry({key}, owner={owner!r}, attempt={attempt}, at=now{offset:+g}, "
            f"reason={reason!r})",
            ns,
            lambda s: s.schedule_retry(key, owner=owner, attempt=attempt, at=at, reason=reason),
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), result=results, margin=margins, wait=lease_ends)
    def settle(
        self, data: st.DataObject, result: SavedResult, margin: float, wait: float | None
    ) -> None:
        ns, key = self.target(data, "quarantined", "lapsed", "claimed")
        self.wait_for_lease_end(ns, key, wait)
        self.both(
            f"settle({key}, result={result!r}, margin={margin})",
            ns,
            lambda s: s.settle(key, result=result, margin=margin, nonce="n-settle"),
            call_view,
            key=key,
        )

    @precondition(lambda self: self.calls_exist)
    @rule(data=st.data(), owner=owners, lease=leases, margin=margins, wait=lease_ends)
    def release(
        self, data: st.DataObject, owner: str, lease: float, margin: float, wait: float | None
    ) -> None:
        ns, key = self.target(data, "quarantined", "lapsed", "claimed")
        self.wait_for_lease_end(ns, key, wait)
        self.both(
            f"release({key}, owner={owner!r}, lease_seconds={lease}, margin={margin})",
            ns,
            # One nonce for both: it is kept on the record, which is compared.
            lambda s: s.release(
                key, owner=owner, lease_seconds=lease, margin=margin, nonce="n-" + owner
            ),
            call_view,
            key=key,
        )

    # -- actions nobody here answers ----------------------------------------------------
    @precondition(lambda self: self.calls_exist)
    @rule(
        data=st.data(),
        who=whos,
        owner=owners,
        attempt=attempts,
        reason=st.sampled_from(["no actions= policy", "no connect_environment hook"]),
    )
    def leave(self, data: st.DataObject, who: str, owner: str, attempt: int, reason: str) -> None:
        ns, key = self.target(data, "claimed", "lapsed")
        owner, attempt = self.fenced(ns, key, who, owner, attempt)
        self.both(
            f"leave({key}, owner={owner!r}, attempt={attempt}, reason={reason!r})",
            ns,
            lambda s: s.leave(key, owner=owner, attempt=attempt, reason=reason),
            key=key,
        )

    def some_in(self, *states: str) -> bool:
        """Is a call of the reference in one of ``states`` (rare ones: their rows would
        seldom meet a call they apply to)?"""
        return self.calls_exist and any(state in states for _, _, state in self.existing())

    def rare_target(self, data: st.DataObject, *states: str) -> tuple[str, CallKey]:
        """Mostly a call in one of ``states`` (see :meth:`some_in`), else :meth:`target`."""
        found = [(ns, key) for ns, key, state in self.existing() if state in states]
        if found and data.draw(st.integers(0, 3), label="rare state (0: any)") > 0:
            return data.draw(st.sampled_from(found), label="call")
        return self.target(data, *states)

    @precondition(lambda self: self.some_in("unanswered", "retired"))
    @rule(data=st.data(), owner=owners, lease=leases)
    def take_up(self, data: st.DataObject, owner: str, lease: float) -> None:
        ns, key = self.rare_target(data, "unanswered", "retired")
        self.both(
            f"take_up({key}, owner={owner!r}, lease_seconds={lease})",
            ns,
            # One nonce for both: it is kept on the record, which is compared.
            lambda s: s.take_up(key, owner=owner, lease_seconds=lease, nonce="n-up-" + owner),
            call_view,
            key=key,
        )

    @precondition(lambda self: self.some_in("unanswered", "submitted", "stale", "cancelled"))
    @rule(data=st.data(), before=st.sampled_from(["now", "created_at", "created_at-0.5"]))
    def retire(self, data: st.DataObject, before: str) -> None:
        ns, key = self.rare_target(data, "unanswered", "submitted", "stale", "cancelled")
        known_before = self.now()
        if before.startswith("created_at"):
            record = self.backend.run(self.reference[ns].get_call(key))
            known_before = record.created_at if record is not None else known_before
            known_before -= 0.5 if before.endswith("-0.5") else 0.0
        self.both(
            f"retire({key}, known_before={before!r} = {known_before!r})",
            ns,
            lambda s: s.retire(key, known_before=known_before),
            key=key,
        )

    # -- reads: one rule (drawing which), so that steps that change records are most --------
    @rule(data=st.data(), which=st.sampled_from(sorted(READS)))
    def read(self, data: st.DataObject, which: str) -> None:
        arguments = data.draw(st.fixed_dictionaries(READS[which]), label=which)
        getattr(self, "read_" + which)(**arguments)

    def read_get_call(self, ns: str, key: CallKey, history: bool) -> None:
        self.both(
            f"get_call({key}, history={history})",
            ns,
            lambda s: s.get_call(key, history=history),
            lambda record: call_view(record, history=history),
            touches="",
        )

    def read_find_calls(self, ns: str, call_id: str) -> None:
        self.both(
            f"find_calls({call_id!r})",
            ns,
            lambda s: s.find_calls(call_id),
            lambda records: calls_view(records, history=True),
            touches="",
        )

    def read_calls_for_session(self, ns: str, session_id: str) -> None:
        self.both(
            f"calls_for_session({session_id!r})",
            ns,
            lambda s: s.calls_for_session(session_id),
            calls_view,
            touches="",
        )

    def read_list_calls(
        self,
        ns: str,
        state: str | None,
        session_id: str | None,
        tool_name: str | None,
        since: str | None,
        limit: int,
        pages: int,
    ) -> None:
        since_at = {None: None, "start": START + 0.5, "now": self.now()}[since]
        before: tuple[float, str, str, str] | None = None
        for page in range(pages):
            query = CallQuery(
                state=state,
                session_id=session_id,
                tool_name=tool_name,
                since=since_at,
                limit=limit,
                before=before,
            )
            found = self.both(
                f"list_calls({query!r}) page {page + 1}",
                ns,
                lambda s, query=query: s.list_calls(query),  # type: ignore[misc]
                calls_view,
                touches="",
            )
            records = _returned(found)
            if len(records) < limit:
                break
            last = records[-1]
            before = (last["created_at"], *_key_tuple(last["key"]))

    def read_unsubmitted_results(self, ns: str, offset: float, limit: int, pages: int) -> None:
        due_before = self.now() + offset
        after: tuple[float, CallKey] | None = None
        for page in range(pages):
            cursor = after
            found = self.both(
                f"unsubmitted_results(due_before=now{offset:+g}, limit={limit}, "
                f"after={cursor!r}) page {page + 1}",
                ns,
                lambda s, cursor=cursor: s.unsubmitted_results(  # type: ignore[misc]
                    due_before=due_before, limit=limit, after=cursor
                ),
                calls_view,
                touches="",
            )
            records = _returned(found)
            if len(records) < limit:
                break
            last = records[-1]
            after = (last["next_attempt_at"], last["key"])

    def read_unresolved_deliveries(self, ns: str, offset: float, limit: int, pages: int) -> None:
        due_before = self.now() + offset
        after: tuple[float, str] | None = None
        for page in range(pages):
            cursor = after
            found = self.both(
                f"unresolved_deliveries(due_before=now{offset:+g}, limit={limit}, "
                f"after={cursor!r}) page {page + 1}",
                ns,
                lambda s, cursor=cursor: s.unresolved_deliveries(  # type: ignore[misc]
                    due_before=due_before, limit=limit, after=cursor
                ),
                deliveries_view,
                touches="",
            )
            records = _returned(found)
            if len(records) < limit:
                break
            last = records[-1]
            after = (last.next_attempt_at, last.delivery_id)

    def read_list_deliveries(self, ns: str, unresolved_only: bool, limit: int) -> None:
        self.both(
            f"list_deliveries(unresolved_only={unresolved_only}, limit={limit})",
            ns,
            lambda s: s.list_deliveries(unresolved_only=unresolved_only, limit=limit),
            deliveries_view,
            touches="",
        )

    def read_expired_claims(self, ns: str, margin: float, limit: int) -> None:
        self.by_lease_end(
            f"expired_claims(margin={margin}, limit={limit})",
            ns,
            limit,
            lambda s, limit: s.expired_claims(margin=margin, limit=limit),
        )

    def read_due_retries(self, ns: str, limit: int) -> None:
        self.by_lease_end(
            f"due_retries(limit={limit})", ns, limit, lambda s, limit: s.due_retries(limit=limit)
        )

    def by_lease_end(
        self,
        what: str,
        ns: str,
        limit: int,
        listing: Callable[[Store, int], Awaitable[list[CallRecord]]],
    ) -> None:
        """A listing ordered by lease end only: among equal ends the order (and, at the
        limit, the choice) is the backend's. So: the same ends in order, each record one of
        the reference's with that end."""

        async def run() -> tuple[list[CallRecord], list[CallRecord]]:
            everything = await listing(self.reference[ns], 1000)
            return everything, await listing(self.backend.stores[ns], limit)

        everything, actual = self.backend.run(run())
        what += f" in namespace {ns!r}"
        expected_ends = [r.lease_expires_at for r in everything][:limit]
        self.agree(what + " (lease ends)", expected_ends, [r.lease_expires_at for r in actual])
        by_key = {r.key: call_view(r) for r in everything}
        for record in actual:
            self.agree(what + f" ({record.key})", by_key.get(record.key), call_view(record))
        event(f"{what.split('(')[0]}: {min(len(actual), 2)} found")

    def read_stats(self, ns: str) -> None:
        self.both("stats()", ns, lambda s: s.stats(), stats_view, touches="")

    # -- after every step ----------------------------------------------------------------
    @invariant()
    def records_agree(self) -> None:
        """After a step that may have changed records, what it may have changed, in each
        namespace (the step's own and the other: isolation): the call it worked on (with its
        history), or every call, or every delivery."""
        touched, self.touched = self.touched, set()
        keys, self.touched_keys = self.touched_keys, set()
        if touched or keys:
            calls = "calls" in touched
            self.compare_records(
                keys=set() if calls else keys, calls=calls, deliveries="deliveries" in touched
            )

    def teardown(self) -> None:
        """At the end of every example: everything, and the counts, once more, and what
        the sweep and the operators would find now (the reads that depend on the time)."""
        if self.failed:
            return
        self.compare_records(calls=True, deliveries=True, stats=True)
        for ns in NAMESPACES:
            for margin in (0.0, 5.0):
                self.read_expired_claims(ns, margin, 1000)
            self.read_due_retries(ns, 1000)
            self.read_unsubmitted_results(ns, 0.0, 1000, 1)
            self.read_unresolved_deliveries(ns, 0.0, 1000, 1)
            self.read_list_calls(ns, "in_doubt", None, None, None, 1000, 1)

    def compare_records(
        self,
        *,
        keys: Collection[CallKey] = (),
        calls: bool = False,
        deliveries: bool = False,
        stats: bool = False,
    ) -> None:
        """The records of each namespace, as reads of the reference and of the backend."""
        ordered = sorted(keys, key=_key_tuple)

        async def look(store: Store) -> list[object]:
            view: list[object] = [
                call_view(record, history=True)
                for record in await asyncio.gather(
                    *(store.get_call(key, history=True) for key in ordered)
                )
            ]
            if calls:
                found = await asyncio.gather(*(store.find_calls(c) for c in CALL_IDS))
                view += [calls_view(records, history=True) for records in found]
            if deliveries:
                view.append(deliveries_view(await store.list_deliveries(limit=1000)))
            if stats:
                view.append(stats_view(await store.stats()))
            return view

        async def run() -> list[tuple[str, object, object]]:
            expected = [await look(self.reference[ns]) for ns in NAMESPACES]
            actual = await asyncio.gather(*(look(self.backend.stores[ns]) for ns in NAMESPACES))
            return list(zip(NAMESPACES, expected, actual, strict=True))

        what = ", ".join(
            [str(key) for key in ordered]
            + ["every call"] * calls
            + ["every delivery"] * deliveries
            + ["the counts"] * stats
        )
        for ns, expected, actual in self.backend.run(run()):
            self.agree(f"{what} of namespace {ns!r} after the step", expected, actual)
            if re.search(r"'history_dropped': [1-9]", repr(expected)):
                event("a history ran past its bound")


def _summary(found: object) -> str:
    """What a step's answer was, in a word, for ``--hypothesis-show-statistics``: which
    cases the generated histories reach (a claim taken over, a settle that settled...)."""
    assert isinstance(found, tuple)
    kind, value = found
    if kind == "raised":
        return f"raised {value}"
    if isinstance(value, tuple):  # a claim: (status, record)
        return str(value[0])
    if isinstance(value, dict):  # a record
        dropped = value.get("history_dropped")
        return str(value["state"]) + (" (history bounded)" if dropped else "")
    if isinstance(value, list):
        return f"{min(len(value), 2)}{'+' if len(value) > 2 else ''} found"
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return "removed some" if value else "removed none"
    return type(value).__name__


def _key_tuple(key: CallKey) -> tuple[str, str, str]:
    return (key.session_id, key.turn_id, key.call_id)


def _returned(found: object) -> list[Any]:
    """The records of a listing's compared answer (empty when it raised)."""
    assert isinstance(found, tuple)
    kind, value = found
    return value if kind == "returned" else []


@pytest.mark.slow  # tens of seconds per backend: not in `make check`
@pytest.mark.parametrize(
    "backend_name",
    [
        "memory",
        "sqlite",
        pytest.param("redis", marks=pytest.mark.backends),
        pytest.param("postgres", marks=pytest.mark.backends),
    ],
)
def test_generated_histories_agree_with_the_reference(
    backend_name: str, clock: FakeClock, tmp_path: Path
) -> None:
    """Random sequences of every operation, two namespaces, two owners: the backend answers
    and holds what the reference does after every step (see the module docstring).

    A plain test with its own event loop, not an async one: hypothesis drives the steps
    synchronously, and handing each to a loop in another thread costs more than the step.
    """
    run_settings = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,  # a step's time depends on the machine's load, not on the code
        database=None,  # nothing written into the checkout; failures print their steps
        # The default run is the same on every run (CI); a chosen count explores anew.
        derandomize="AGENTFN_HISTORY_EXAMPLES" not in os.environ,
        phases=tuple(phase for phase in Phase if SHRINK or phase is not Phase.shrink),
    )
    with asyncio.Runner() as runner:
        backend = runner.run(open_backend(backend_name, clock, tmp_path))
        backend.runner = runner
        try:
            # One name for every backend: the default run is the same examples on each.
            machine = type("GeneratedHistories", (Histories,), {"backend": backend})
            run_state_machine_as_test(machine, settings=run_settings)
        finally:
            runner.run(backend.close())
