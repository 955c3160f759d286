"""Retries across replicas (flow control, issue 24): three real processes of the Starlette
example on Redis or PostgreSQL, every webhook sent to all three. ``flaky_lookup`` (the
examples' contract: one ledger line per execution) must run each attempt exactly once, at or
after the time kept in the store, also when the replica that scheduled it is SIGKILLed
between attempts and another process resumes it."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import SHARED, store_url_for
from .support.ports import free_port
from .support.replicas import replicas

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _env(base_url: str, url: str, ledger: Path) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_WEBHOOK_SECRET": SECRET,
        "AGENTFN_STORE_URL": url,
        "EXAMPLE_LEDGER": str(ledger),
        "AGENTFN_LEASE_SECONDS": "2",
        "AGENTFN_RECOVERY_INTERVAL": "0.5",
    }


def _attempts(ledger: Path) -> Counter[tuple[str, int]]:
    lines = [json.loads(line) for line in ledger.read_text().splitlines()]
    return Counter((e["call_id"], e["attempt"]) for e in lines if e["tool"] == "flaky_lookup")


@pytest.mark.parametrize("backend", SHARED)
async def test_three_replicas_run_each_attempt_once(backend: str, tmp_path: Path) -> None:
    """fail_times=2 succeeds on attempt 3, fail_times=9 fails after 4; every attempt's
    ledger line exactly once, every call answered once."""
    ledger = tmp_path / "ledger.jsonl"
    ports = [free_port() for _ in range(3)]
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{p}/openai/webhooks" for p in ports],
    )
    plans = {f"ok{i}": 2 for i in range(8)} | {f"bad{i}": 9 for i in range(2)}
    async with (
        store_url_for(backend, tmp_path) as url,
        fake,
        serve_fake(fake) as base_url,
        replicas(_env(base_url, url, ledger), tmp_path, ports) as running,
    ):
        sessions = [
            fake.create_session(
                [[FakeCall("flaky_lookup", {"key": cid, "fail_times": n}, call_id=cid)]]
            )
            for cid, n in plans.items()
        ]
        try:
            for session_id in sessions:
                await fake.wait_idle(session_id, timeout=60)
        except TimeoutError:
            pytest.fail("\n".join(r.log()[-3000:] for r in running))
    per_call = {s.call_id: s for s in fake.submissions}
    assert Counter(s.call_id for s in fake.submissions) == Counter(plans.keys())
    attempts = _attempts(ledger)
    assert set(attempts.values()) == {1}, attempts
    for cid, fail_times in plans.items():
        runs = 3 if fail_times == 2 else 4
        assert sorted(n for c, n in attempts if c == cid) == list(range(1, runs + 1))
        submission = per_call[cid]
        if fail_times == 2:
            assert json.loads(submission.output or "") == {"key": cid, "attempts": 3}
        else:
            assert submission.success is False and "tried 4 times" in (submission.error or "")


@pytest.mark.parametrize("backend", SHARED)
async def test_a_retry_survives_a_sigkill_and_resumes_at_its_time(
    backend: str, tmp_path: Path
) -> None:
    """The only replica is SIGKILLed while its call waits for its retry; a new process on
    the same store resumes it no sooner than the time kept in the store, once per attempt."""
    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = _env(base_url, url, ledger)
        for name in ("first", "second"):
            (tmp_path / name).mkdir()
        store = open_store(url)
        try:
            async with replicas(env, tmp_path / "first", [port]) as [victim]:
                session_id = fake.create_session(
                    [[FakeCall("flaky_lookup", {"key": "k", "fail_times": 2}, call_id="c1")]]
                )
                due = None
                with anyio.fail_after(30):
                    while due is None:
                        for record in await store.calls_for_session(session_id):
                            if record.state is CallState.RETRY_SCHEDULED:
                                due = record.next_attempt_at
                                victim.process.send_signal(signal.SIGKILL)
                        await anyio.sleep(0.001)
                await victim.process.wait()
                victim_pid = victim.process.pid
            async with replicas(env, tmp_path / "second", [port]) as running:
                try:
                    await fake.wait_idle(session_id, timeout=60)
                except TimeoutError:
                    pytest.fail(running[0].log()[-3000:])
            [record] = await store.calls_for_session(session_id)
            detailed = await store.get_call(record.key, history=True)
        finally:
            await store.close()
    [submission] = fake.submissions
    assert json.loads(submission.output or "") == {"key": "k", "attempts": 3}
    assert set(_attempts(ledger).values()) == {1}
    assert detailed is not None
    retried = [e for e in detailed.history if e.kind == "retried"]
    assert retried and retried[0].at >= due
    # Resumed by the new process (owners are "host:pid:random"), not before the kill.
    assert f":{victim_pid}:" not in (retried[0].owner or "")
