"""Flow control across replicas: three real processes of the Starlette example on Redis or
PostgreSQL, every webhook sent to all three. ``limited_echo`` (the examples' contract:
``concurrency=2``, ``EXAMPLE_RATE`` adds a rate with a burst of 1, one ledger line
``{"call_id", "tool", "start", "end"}`` per execution) must never run more than twice at
once across the replicas, free a SIGKILLed holder's slot once its lease (plus the margin)
has passed, and keep to its rate; every call answered exactly once."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.calls.records import CallQuery
from agentfn_asgi.demo import RunningExample
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import SHARED, store_url_for
from .support.ports import free_port
from .support.replicas import replicas, taken_over_calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOOL = "limited_echo"
CONCURRENCY = 2  # agentfn_asgi.demo.tools.LIMITED_CONCURRENCY, restated: the contract
LEASE_SECONDS = 2.0
LEASE_MARGIN = 0.5
SESSIONS = 10
CALLS_EACH = 3


@dataclass(frozen=True, slots=True)
class Run:
    """One execution of ``limited_echo``, from its ledger line (Unix times)."""

    call_id: str
    start: float
    end: float


def _env(base_url: str, url: str, ledger: Path, **extra: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_WEBHOOK_SECRET": SECRET,
        "AGENTFN_STORE_URL": url,
        "EXAMPLE_LEDGER": str(ledger),
        "AGENTFN_LEASE_SECONDS": str(LEASE_SECONDS),
        "AGENTFN_LEASE_MARGIN": str(LEASE_MARGIN),
        "AGENTFN_RECOVERY_INTERVAL": "0.5",
        **extra,
    }


def _runs(ledger: Path) -> list[Run]:
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    return [Run(e["call_id"], e["start"], e["end"]) for e in lines if e["tool"] == TOOL]


def _max_overlap(runs: list[Run]) -> int:
    """The most [start, end) intervals covering one instant."""
    # At equal times an end sorts before a start: [start, end) intervals that merely touch
    # do not overlap.
    events = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def _first_full_after(runs: list[Run], since: float) -> float | None:
    """The first instant after ``since`` at which ``CONCURRENCY`` runs overlap."""
    events = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    running = 0
    for at, step in events:
        running += step
        if at > since and running >= CONCURRENCY:
            return at
    return None


def _plans(delay_ms: int) -> list[list[list[FakeCall]]]:
    """``SESSIONS`` sessions, each one turn of ``CALLS_EACH`` parallel limited_echo calls."""
    return [
        [
            [
                FakeCall(TOOL, {"text": f"t{s}_{c}", "delay_ms": delay_ms}, call_id=f"c{s}_{c}")
                for c in range(CALLS_EACH)
            ]
        ]
        for s in range(SESSIONS)
    ]


@asynccontextmanager
async def _three_replicas(
    backend: str, tmp_path: Path, **extra: str
) -> AsyncIterator[tuple[FakeAgentsAPI, str, list[RunningExample]]]:
    """A fake posting every webhook to three replicas of the Starlette example on one fresh
    store of ``backend``; yields the fake, the store URL and the replicas."""
    ports = [free_port() for _ in range(3)]
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{p}/openai/webhooks" for p in ports],
    )
    async with (
        store_url_for(backend, tmp_path) as url,
        fake,
        serve_fake(fake) as base_url,
        replicas(_env(base_url, url, tmp_path / "ledger.jsonl", **extra), tmp_path, ports) as up,
    ):
        yield fake, url, up


async def _finish(fake: FakeAgentsAPI, sessions: list[str], running: list[RunningExample]) -> float:
    """Wait until every session is idle; the seconds it took."""
    began = time.monotonic()
    try:
        with anyio.fail_after(60):
            for session_id in sessions:
                await fake.wait_idle(session_id, timeout=60)
    except TimeoutError:
        logs = "\n".join(r.log()[-3000:] for r in running if r.process.returncode is None)
        pytest.fail(f"not finished: {len(fake.submissions)} results\n{logs}")
    return time.monotonic() - began


def _assert_answered_once(fake: FakeAgentsAPI, plans: list[list[list[FakeCall]]]) -> None:
    expected = {call.call_id: call for plan in plans for step in plan for call in step}
    per_call = Counter(s.call_id for s in fake.submissions)
    assert set(per_call) == set(expected)
    assert set(per_call.values()) == {1}, [c for c, n in per_call.items() if n > 1]
    for submission in fake.submissions:
        call = expected[submission.call_id]
        assert submission.success, submission.error
        assert isinstance(call.arguments, Mapping)
        assert submission.output == call.arguments["text"]


async def _arrivals(url: str) -> dict[str, tuple[float, str, str, str]]:
    """call id -> its place in the line's order, ``(created_at, session_id, turn_id,
    call_id)``, as the store has it."""
    store = open_store(url)
    try:
        records = await store.list_calls(CallQuery(tool_name=TOOL, limit=100))
    finally:
        await store.close()
    return {
        r.key.call_id: (r.created_at, r.key.session_id, r.key.turn_id, r.key.call_id)
        for r in records
    }


async def _wait_for_slot_held_by(url: str, pid: int) -> None:
    """Return once the replica with that pid holds a slot of limited_echo: one of its
    calls is claimed by it with the limiter set (owners are "host:pid:random")."""
    marker = f":{pid}:"
    store = open_store(url)
    try:
        while True:
            claimed = await store.list_calls(CallQuery(state="claimed", tool_name=TOOL, limit=100))
            if any(marker in (r.owner or "") and r.limiter for r in claimed):
                return
            await anyio.sleep(0.001)
    finally:
        await store.close()


@pytest.mark.parametrize("backend", SHARED)
async def test_never_more_than_two_at_once_across_three_replicas(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """30 calls of 300 ms over 10 sessions: at most two ledger intervals ever overlap (and
    two do: the limit is used, not serialised), one run and one result per call, and the
    calls start in the order they arrived across the replicas' lines (none is overtaken by
    more calls than the slots that may be admitted together)."""
    plans = _plans(delay_ms=300)
    async with _three_replicas(backend, tmp_path) as (fake, url, running):
        sessions = [fake.create_session(plan) for plan in plans]
        elapsed = await _finish(fake, sessions, running)
        arrived = await _arrivals(url)
    _assert_answered_once(fake, plans)
    runs = _runs(tmp_path / "ledger.jsonl")
    assert Counter(r.call_id for r in runs) == Counter({s.call_id: 1 for s in fake.submissions})
    assert _max_overlap(runs) == CONCURRENCY
    started = sorted(runs, key=lambda r: r.start)
    for i, run in enumerate(started):
        overtaken = [r.call_id for r in started[:i] if arrived[r.call_id] > arrived[run.call_id]]
        assert len(overtaken) < CONCURRENCY, (run.call_id, overtaken)
    with capsys.disabled():
        print(f"\n[limits/{backend}] 30 calls of 300 ms at concurrency 2: {elapsed:.2f} s")


@pytest.mark.exclusive
@pytest.mark.parametrize("backend", SHARED)
async def test_a_sigkilled_holders_slot_is_free_after_its_lease(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A replica is SIGKILLed while it holds a slot: the two slots are in use again within
    lease plus margin (plus polling slack), no instant ever sees more than two runs, and
    every call (the killed one's included) is answered once."""
    plans = _plans(delay_ms=300)
    async with _three_replicas(backend, tmp_path) as (fake, url, running):
        sessions = [fake.create_session(plan) for plan in plans]
        victim = running[0]
        with anyio.fail_after(30):
            await _wait_for_slot_held_by(url, victim.process.pid)
        victim.process.send_signal(signal.SIGKILL)
        killed_at = time.time()
        await victim.process.wait()
        await _finish(fake, sessions, running)
        taken_over = await taken_over_calls(url, sessions)
    _assert_answered_once(fake, plans)
    runs = _runs(tmp_path / "ledger.jsonl")
    assert {r.call_id for r in runs} == {s.call_id for s in fake.submissions}
    assert _max_overlap(runs) <= CONCURRENCY
    full_again = _first_full_after(runs, killed_at)
    assert full_again is not None
    # The dead holder's lease may have been renewed just before the kill; waiters look
    # again at least every lease third: 1.5 s of slack covers that and a loaded machine.
    freed_after = full_again - killed_at
    assert freed_after <= LEASE_SECONDS + LEASE_MARGIN + 1.5
    assert taken_over >= 1
    with capsys.disabled():
        print(
            f"\n[limits/{backend}] slot of the SIGKILLed holder in use again "
            f"{freed_after:.2f} s after the kill (lease {LEASE_SECONDS} s, margin "
            f"{LEASE_MARGIN} s), {taken_over} call(s) taken over"
        )


@pytest.mark.exclusive
@pytest.mark.parametrize("backend", SHARED)
async def test_a_rate_holds_across_three_replicas(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EXAMPLE_RATE=5/s (burst 1): 30 calls cannot all start in less than about 6 s (29
    tokens at 5/s; 5 s asserted), and every call is answered once. The rate is also used:
    waiters that backed off past it took 20 s here (about 1.5 calls a second); polling
    at half the token interval takes about 7 s, and 15 s is the generous bound."""
    plans = _plans(delay_ms=10)
    async with _three_replicas(backend, tmp_path, EXAMPLE_RATE="5/s") as (fake, _, running):
        sessions = [fake.create_session(plan) for plan in plans]
        elapsed = await _finish(fake, sessions, running)
    _assert_answered_once(fake, plans)
    runs = _runs(tmp_path / "ledger.jsonl")
    starts = sorted(r.start for r in runs)
    assert len(starts) == SESSIONS * CALLS_EACH
    spread = starts[-1] - starts[0]
    assert spread >= 5.0, spread
    assert spread <= 15.0, f"the rate went unused: {spread:.2f} s for 29 tokens at 5/s"
    with capsys.disabled():
        print(
            f"\n[limits/{backend}] 30 calls at 5/s: first to last start {spread:.2f} s, "
            f"all answered in {elapsed:.2f} s"
        )
