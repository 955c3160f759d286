"""The crash matrix (issue 8): SIGKILL a real uvicorn process at each step, restart, check.

For each crash point (``agentfn_asgi._crash``) and each kind of tool (``crash_app``): the app
runs in a child process on a SQLite file, the Agents API is a ``FakeAgentsAPI`` served by
this process over loopback and outliving the app. The child dies at the point, a new child
starts on the same port and store, the fake redelivers as the real service does, and then:

- the call ends with exactly one accepted result: the handler's, the reconciled one, or the
  documented quarantine (``IN_DOUBT_MESSAGE``) for an unreconcilable side effect;
- the ledger shows no refund twice (a plain tool may run twice: at-least-once);
- nothing stays pending: the session is idle, every call record is terminal, every recorded
  delivery is resolved.

Then the lease that lapses while its holder still works (issue 14): two replicas of the
Starlette example on one shared store (a SQLite file, PostgreSQL, Redis), a refund slower
than the lease, and the store unreachable for longer than the lease while it runs
(``outage.py``): the refund happens once and the call gets one result.
"""

from __future__ import annotations

import contextlib
import signal
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.calls.records import CallRecord, CallState, StoreStats
from agentfn_asgi.messages import IN_DOUBT_MESSAGE
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from ..support.backends import store_url_for
from ..support.ports import free_port
from ..support.replicas import replicas
from .crash_app import PLAIN, RECONCILED, UNRECONCILED, read_ledger
from .outage import StallingProxy, postgres_locked, sqlite_locked
from .process import AppProcess

pytestmark = [pytest.mark.anyio, pytest.mark.reliability, pytest.mark.slow]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
API_KEY = "sk-crash-matrix"
ACTION_REQUIRED = "agent.session.action_required"
#: The fake retries a failed delivery every 0.25 s for 5 s: the same webhook-id reaches the
#: restarted app soon after it is up, as OpenAI's sender would (more slowly).
RETRY_DELAYS = (0.25,) * 20

POINTS = (
    "before_ack",  # body read, delivery recorded, 200 not sent
    "after_ack",  # 200 sent, session not read
    "after_claim",  # call claimed, handler not started
    "during_handler",  # side effect done (ledger line), no result
    "after_handler",  # handler returned, result not saved
    "after_save",  # result saved, not submitted
    "after_submit",  # result accepted by the API, not marked submitted
)
KINDS = (PLAIN, RECONCILED, UNRECONCILED)


@dataclass(frozen=True, slots=True)
class Expected:
    """The documented outcome of one (point, kind) cell."""

    success: bool
    runs: int  # ledger lines for the call: how many times the side effect happened
    source: str  # how the submitted result was obtained (SavedResult.source)


def expected(point: str, kind: str) -> Expected:
    """The outcome docs/how-it-works/architecture.md promises for a crash at ``point`` in a call
    of ``kind``."""
    if point == "after_claim" and kind == UNRECONCILED:
        # The handler never started, but nothing can prove it: quarantine, not a blind re-run.
        return Expected(success=False, runs=0, source="quarantined")
    if point in ("during_handler", "after_handler"):
        return {
            PLAIN: Expected(success=True, runs=2, source="ran"),  # at-least-once
            RECONCILED: Expected(success=True, runs=1, source="reconciled"),
            UNRECONCILED: Expected(success=False, runs=1, source="quarantined"),
        }[kind]
    return Expected(success=True, runs=1, source="ran")


def crash_spec(point: str, kind: str) -> str:
    # The ack points run before any tool is known, so they take no tool filter.
    return point if point in ("before_ack", "after_ack") else f"{point}:{kind}"


async def settled(store_url: str, session_id: str) -> tuple[list[CallRecord], StoreStats]:
    """Wait until every call of the session is terminal and every delivery is resolved."""
    store = open_store(store_url)
    try:
        with anyio.fail_after(15):
            while True:
                records = await store.calls_for_session(session_id)
                stats = await store.stats()
                if (
                    records
                    and all(record.state.terminal for record in records)
                    and stats.unresolved_deliveries == 0
                ):
                    return records, stats
                await anyio.sleep(0.05)
    finally:
        await store.close()


@dataclass
class Deployment:
    """The fake Agents API (in this process) and the app (in a child process)."""

    fake: FakeAgentsAPI
    app: AppProcess


@contextlib.asynccontextmanager
async def deployment_of(
    tmp_path: Path, retry_delays: tuple[float, ...]
) -> AsyncIterator[Deployment]:
    """A fake Agents API on loopback (it outlives every child) and the app process slot."""
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET, webhook_retry_delays=retry_delays)
    async with fake, serve_fake(fake) as api_base:
        app = AppProcess(api_base=api_base, secret=SECRET, api_key=API_KEY, workdir=tmp_path)
        fake.add_webhook_url(app.url)
        try:
            yield Deployment(fake, app)
        finally:
            await app.stop()
            app.kill()


async def run_case(
    tmp_path: Path,
    point: str,
    kind: str,
    *,
    redeliver: bool,
    retry_delays: tuple[float, ...],
    left: Callable[[str, str], Awaitable[None]] | None = None,
) -> tuple[Deployment, str, CallRecord]:
    """Crash at ``point`` while serving one call of ``kind``; restart; wait until settled.
    ``left(store_url, session_id)`` looks at what the crash left, before the restart."""
    async with deployment_of(tmp_path, retry_delays) as deployment:
        fake, app = deployment.fake, deployment.app
        await app.start(crash_at=crash_spec(point, kind))
        session_id = fake.create_session([[FakeCall(kind, {"order_id": "o1"}, call_id="c1")]])
        assert await app.wait_exit() == -signal.SIGKILL, app.log_text()
        if left is not None:
            await left(app.store_url, session_id)
        await app.start()
        if redeliver:
            fake.redeliver(session_id)  # None when the call was answered before the crash
        await fake.wait_idle(session_id, timeout=15)
        [record], stats = await settled(app.store_url, session_id)
        assert stats.in_doubt == 0
        if point == "before_ack" and retry_delays:
            await fake.drain_webhooks(timeout=10)
    return deployment, session_id, record


def check_outcome(
    deployment: Deployment, session_id: str, record: CallRecord, point: str, kind: str
) -> None:
    """Assert the cell's documented outcome (see the module docstring)."""
    want = expected(point, kind)
    fake, app = deployment.fake, deployment.app
    # Exactly one accepted result, and the one documented for this cell.
    [accepted] = [s for s in fake.submissions if s.call_id == "c1"]
    assert accepted.success is want.success
    if not want.success:
        assert accepted.error == IN_DOUBT_MESSAGE
    else:
        assert "o1" in str(accepted.output)
    # No refund twice; a plain lookup may run twice (at-least-once, same idempotency key).
    runs = [entry for entry in read_ledger(app.ledger) if entry["call_id"] == "c1"]
    assert len(runs) == want.runs, runs
    assert len({entry["key"] for entry in runs}) <= 1
    # Nothing pending: the API waits for nothing, the store holds a submitted record.
    assert fake.session(session_id)["status"] == "idle"
    assert fake.required_actions(session_id) == []
    assert record.state is CallState.SUBMITTED
    assert record.result is not None and record.result.source == want.source
    # Whatever the children logged on the way (warnings, recovery notes), no secret.
    assert SECRET.removeprefix("whsec_") not in app.log_text()
    assert API_KEY not in app.log_text()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("point", POINTS)
async def test_crash_restart_and_redelivery(tmp_path: Path, point: str, kind: str) -> None:
    """A SIGKILL at ``point`` in a ``kind`` call ends in its documented single outcome."""
    deployment, session_id, record = await run_case(
        tmp_path, point, kind, redeliver=True, retry_delays=RETRY_DELAYS
    )
    check_outcome(deployment, session_id, record, point, kind)
    submits = [r for r in deployment.fake.requests if r.route == "submit"]
    if point == "after_submit":
        # The answer to the accepted submission was lost with the process: the restarted app
        # sent the identical request again (same Idempotency-Key) and got a harmless 202.
        keys = {r.idempotency_key for r in submits}
        assert len(keys) == 1 and len(submits) >= 2
        assert all(r.status == 202 for r in submits)
    if point == "before_ack":
        # The sender retried the unacknowledged delivery with the same webhook-id; the
        # restarted app answered it (a duplicate: recorded before the crash).
        first = next(a for a in deployment.fake.deliveries if a.event_type == ACTION_REQUIRED)
        attempts = [a for a in deployment.fake.deliveries if a.webhook_id == first.webhook_id]
        assert attempts[0].status is None and attempts[-1].ok


@pytest.mark.parametrize(
    ("point", "kind"),
    [("after_ack", PLAIN), ("during_handler", RECONCILED), ("after_save", UNRECONCILED)],
)
async def test_recovery_sweep_alone_finishes_the_work(
    tmp_path: Path, point: str, kind: str
) -> None:
    """No redelivery and no sender retry: the start-up/periodic sweep alone settles the call.

    After ``after_ack`` the sender believes the delivery succeeded; only the recorded,
    unresolved delivery brings the session back. After ``during_handler`` only the expired
    claim does; after ``after_save`` only the saved, unsubmitted result.
    """
    deployment, session_id, record = await run_case(
        tmp_path, point, kind, redeliver=False, retry_delays=()
    )
    check_outcome(deployment, session_id, record, point, kind)


async def test_a_crash_after_the_claim_leaves_the_claim_not_the_delivery(
    tmp_path: Path,
) -> None:
    """The delivery of a single call is resolved by the call's claim, in the same store
    step: a crash right after it leaves a resolved delivery and the claimed call, whose
    expired lease alone brings the call back (no redelivery, no sender retry)."""

    async def resolved_by_the_claim(store_url: str, session_id: str) -> None:
        store = open_store(store_url)
        try:
            [claimed] = await store.calls_for_session(session_id)
            assert (claimed.state, claimed.attempt) == (CallState.CLAIMED, 1)
            assert claimed.delivery_id is not None
            [delivery] = await store.list_deliveries()
            assert (delivery.delivery_id, delivery.resolved) == (claimed.delivery_id, True)
        finally:
            await store.close()

    deployment, session_id, record = await run_case(
        tmp_path,
        "after_claim",
        PLAIN,
        redeliver=False,
        retry_delays=(),
        left=resolved_by_the_claim,
    )
    check_outcome(deployment, session_id, record, "after_claim", PLAIN)


# -- the store unreachable for longer than the lease while a handler runs (issue 14) --------

#: Short leases keep the case fast: the refund (``DELAY_MS``) outlives several of them, and
#: the outage (``OUTAGE``) is longer than one lease plus its margin.
LAPSE_LEASE = 1.0
DELAY_MS = 4000
OUTAGE = 2.5 * LAPSE_LEASE
REFUND_CALL = "call_refund"


@dataclass
class SharedStore:
    """One store two replicas share: the URL they use, the URL the test reads it with, and
    how to make it unreachable (see ``outage.py``)."""

    replica_url: str
    test_url: str
    unreachable: Callable[[], contextlib.AbstractAsyncContextManager[None]]


@contextlib.asynccontextmanager
async def shared_store(backend: str, tmp_path: Path) -> AsyncIterator[SharedStore]:
    """A fresh store on ``backend`` (skipped, or failed under CI, when its server is down)."""
    async with store_url_for(backend, tmp_path) as url:
        if backend == "sqlite":
            path = Path(url.removeprefix("sqlite:///"))
            yield SharedStore(url, url, lambda: sqlite_locked(path))
        elif backend == "postgres":
            dsn, _, query = url.partition("?")
            schema = urllib.parse.parse_qs(query)["schema"][0]
            yield SharedStore(url, url, lambda: postgres_locked(dsn, schema))
        else:
            async with StallingProxy("127.0.0.1", 6379) as proxy:
                via_proxy = url.replace("127.0.0.1:6379", f"127.0.0.1:{proxy.port}")
                yield SharedStore(via_proxy, url, proxy.stalled)


async def _wait_until_claimed(url: str, session_id: str) -> None:
    """Return once the refund is claimed: its handler is in its ``delay_ms`` wait."""
    store = open_store(url)
    try:
        with anyio.fail_after(20):
            while True:
                records = await store.calls_for_session(session_id)
                if any(r.state is CallState.CLAIMED for r in records):
                    return
                await anyio.sleep(0.02)
    finally:
        await store.close()


@pytest.mark.parametrize(
    "backend",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.backends),
        pytest.param("redis", marks=pytest.mark.backends),
    ],
)
async def test_store_unreachable_longer_than_the_lease_during_the_handler(
    backend: str, tmp_path: Path
) -> None:
    """Two replicas, one store, a refund slower than the lease, the store gone meanwhile.

    Both replicas of the Starlette example receive the webhook; one claims the refund
    (``create_refund(delay_ms=4000)``, a 1 s lease) and, while it waits, the store stops
    answering for 2.5 leases (a held lock on SQLite and PostgreSQL, a stalled proxy for
    Redis). The holder cannot renew: it fences itself and cancels the refund before its
    ledger line; when the store is back, a replica takes the call over in doubt, its
    reconcile hook finds no ledger line, and the refund runs once. Fails on the code before
    self-fencing (issue 14): the first holder's refund went on and wrote its line, the
    takeover's reconcile had found nothing yet, and the ledger had the refund twice.
    """
    ledger = tmp_path / "ledger.jsonl"
    async with shared_store(backend, tmp_path) as store:
        ports = [free_port() for _ in range(2)]
        fake = FakeAgentsAPI(
            api_key=API_KEY,
            webhook_secret=SECRET,
            webhook_url=[f"http://127.0.0.1:{port}/openai/webhooks" for port in ports],
        )
        async with fake, serve_fake(fake) as api_base, contextlib.AsyncExitStack() as stack:
            env = {
                "OPENAI_API_KEY": API_KEY,
                "OPENAI_BASE_URL": api_base,
                "OPENAI_WEBHOOK_SECRET": SECRET,
                "AGENTFN_STORE_URL": store.replica_url,
                "AGENTFN_LEASE_SECONDS": str(LAPSE_LEASE),
                "AGENTFN_RECOVERY_INTERVAL": "0.2",
                "EXAMPLE_LEDGER": str(ledger),
            }
            running = await stack.enter_async_context(replicas(env, tmp_path, ports))
            arguments = {"order_id": "ord_1", "amount_cents": 1500, "delay_ms": DELAY_MS}
            session_id = fake.create_session(
                [[FakeCall("create_refund", arguments, call_id=REFUND_CALL)]]
            )
            await _wait_until_claimed(store.test_url, session_id)
            async with store.unreachable():
                await anyio.sleep(OUTAGE)
            await fake.wait_idle(session_id, timeout=30)
            [record], _ = await settled(store.test_url, session_id)
            # Stop both replicas (drained) before reading the ledger: a refund the fenced
            # holder had not stopped would have written its line by then.
            await stack.aclose()
        logs = "\n".join(replica.log() for replica in running)
    # The lease did lapse: the first attempt was fenced and a second one took the call over.
    assert "its outcome is dropped, not saved" in logs, logs
    assert record.attempt >= 2, logs
    assert record.state is CallState.SUBMITTED
    # The side effect exactly once, and exactly one accepted result: the refund's.
    refunds = [entry for entry in read_ledger(ledger) if entry["call_id"] == REFUND_CALL]
    assert len(refunds) == 1, (refunds, logs)
    [accepted] = [s for s in fake.submissions if s.call_id == REFUND_CALL]
    assert accepted.success, accepted
    assert "ord_1" in str(accepted.output)
    assert all(s.output == accepted.output for s in fake.duplicate_submissions)
