"""The configuration of docs/deployment.md, run: its ``uvicorn`` line (``--workers``) on one
host, one shared store, a worker SIGTERMed under load (what a rolling deploy or an
orchestrator does).

The fake posts each webhook once to the one port the workers share (the kernel hands each
connection to one of them). A worker is sent SIGTERM while it is running calls, and more
sessions are started while it drains; uvicorn's supervisor starts a new worker in its place.
Asserted: every call has exactly one accepted result, every refund is in the ledger once,
the call the SIGTERMed worker was running finished there (graceful, not taken over after
its lease), a new worker took its place, and the health check, asked on fresh connections
as a proxy does, answered 200 throughout.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pytest

from agentfn_asgi.calls.records import CallKey, CallQuery
from agentfn_asgi.demo import run_example
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import DURABLE, store_url_for
from .support.docs import block
from .support.replicas import taken_over_calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
#: Bounds the test's time should a call be taken over (the default is 30 s).
LEASE_SECONDS = 5.0


def _page_options() -> list[str]:
    """The uvicorn options of the page's command, but the target, host and port."""
    lines = block("deployment-uvicorn").splitlines()
    [line] = [line for line in lines if line.startswith("uvicorn ")]
    words = shlex.split(line)[2:]
    options = []
    while words:
        word = words.pop(0)
        if word in ("--host", "--port"):
            words.pop(0)
        else:
            options.append(word)
    return options


def _session(i: int) -> list[list[FakeCall]]:
    """Four parallel calls (a refund, two 1 s handlers), then a second step."""
    return [
        [
            FakeCall("get_customer", {"customer_id": "123"}, call_id=f"c{i}_customer"),
            FakeCall(
                "create_refund",
                {"order_id": f"ord_{i}", "amount_cents": 100 + i},
                call_id=f"c{i}_refund",
            ),
            FakeCall("slow_echo", {"text": f"a{i}", "delay_ms": 1000}, call_id=f"c{i}_a"),
            FakeCall("slow_echo", {"text": f"b{i}", "delay_ms": 1000}, call_id=f"c{i}_b"),
        ],
        [FakeCall("get_customer", {"customer_id": f"{i}"}, call_id=f"c{i}_z")],
    ]


def _workers(supervisor: int) -> set[int]:
    """The pids of uvicorn's worker processes (multiprocessing's spawned children); a
    worker that just ended (a zombie until uvicorn reaps it) is none of them."""
    found = set()
    for child in psutil.Process(supervisor).children():
        try:
            if any("spawn_main" in part for part in child.cmdline()):
                found.add(child.pid)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    return found


async def _busy_worker(url: str, workers: set[int]) -> tuple[int, CallKey]:
    """A worker running a slow call now, and the call: claimed by it (its pid is in the
    claim's owner) at least 0.2 s ago, so past the claim and into the handler."""
    store = open_store(url)
    try:
        while True:
            running = await store.list_calls(
                CallQuery(state="claimed", tool_name="slow_echo", limit=500)
            )
            for record in running:
                pid = int((record.owner or "::").split(":")[1] or 0)
                # The lease's end minus its length is when it was claimed or last renewed.
                since = time.time() - (record.lease_expires_at - LEASE_SECONDS)
                if pid in workers and since >= 0.2:
                    return pid, record.key
            await asyncio.sleep(0.01)
    finally:
        await store.close()


async def _attempts(url: str, key: CallKey) -> int:
    store = open_store(url)
    try:
        record = await store.get_call(key)
    finally:
        await store.close()
    assert record is not None
    return record.attempt


async def _probe_health(url: str, answers: list[int], stop: asyncio.Event) -> None:
    """GET the health check every 50 ms, each on a new connection (as a proxy probes).

    A connection the stopping worker had accepted but closes unanswered is tried again at
    once, as a load balancer's health checker does before it counts a failure: a second
    failure in a row is recorded as 0."""
    while not stop.is_set():
        for _ in range(2):
            try:
                async with httpx.AsyncClient(timeout=10.0) as http:
                    answers.append((await http.get(url)).status_code)
                break
            except (httpx.RemoteProtocolError, httpx.ConnectError):
                continue
        else:
            answers.append(0)
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("backend", DURABLE)
async def test_sigterm_of_one_worker_under_load_loses_and_repeats_nothing(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The page's workers on one port and one store; 60 sessions (300 calls), 40 started
    before a busy worker is SIGTERMed and 20 while it drains."""
    options = _page_options()
    workers = int(options[options.index("--workers") + 1])
    assert workers >= 2
    ledger = tmp_path / "ledger.jsonl"
    fake = FakeAgentsAPI(webhook_secret=SECRET, webhook_concurrency=32)
    plans = [_session(i) for i in range(60)]
    expected = {call.call_id for plan in plans for step in plan for call in step}
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": base_url,
            "OPENAI_WEBHOOK_SECRET": SECRET,
            "AGENTFN_STORE_URL": url,
            "EXAMPLE_LEDGER": str(ledger),
            "AGENTFN_RECOVERY_INTERVAL": "0.5",
            "AGENTFN_LEASE_SECONDS": str(LEASE_SECONDS),
        }
        log = tmp_path / "uvicorn.log"
        target = "examples.starlette_app:app"
        async with run_example(target, env=env, log_path=log, options=options) as running:
            supervisor = running.process.pid
            async with asyncio.timeout(20):
                while len(_workers(supervisor)) < workers:
                    await asyncio.sleep(0.05)
            first = _workers(supervisor)
            fake.add_webhook_url(running.webhook_url)
            health: list[int] = []
            stop = asyncio.Event()
            health_url = running.webhook_url + "/healthz"
            probe = asyncio.create_task(_probe_health(health_url, health, stop))
            began = time.monotonic()
            session_ids = [fake.create_session(plan) for plan in plans[:40]]
            async with asyncio.timeout(30):
                victim, running_call = await _busy_worker(url, first)
            os.kill(victim, signal.SIGTERM)
            session_ids += [fake.create_session(plan) for plan in plans[40:]]
            try:
                async with asyncio.timeout(45):
                    for session_id in session_ids:
                        await fake.wait_idle(session_id, timeout=45)
                    while len(_workers(supervisor)) < workers:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                pytest.fail(f"not finished: {len(fake.submissions)} results\n{running.log()}")
            elapsed = time.monotonic() - began
            stop.set()
            await probe
            replaced = _workers(supervisor)
        taken_over = await taken_over_calls(url, session_ids)
        running_call_attempts = await _attempts(url, running_call)
    per_call = Counter(s.call_id for s in fake.submissions)
    assert set(per_call) == expected
    assert set(per_call.values()) == {1}, [c for c, n in per_call.items() if n > 1]
    refunds = Counter(json.loads(line)["call_id"] for line in ledger.read_text().splitlines())
    assert refunds == Counter({f"c{i}_refund": 1 for i in range(60)})
    assert victim not in replaced and len(replaced - first) == 1
    assert health and set(health) == {200}, Counter(health)
    # Graceful: the call the worker was running when SIGTERM came finished there.
    assert running_call_attempts == 1
    with capsys.disabled():
        print(
            f"\n[deployment/{backend}] {len(expected)} calls in {elapsed:.2f} s, worker "
            f"{victim} SIGTERMed under load and replaced, {len(health)} health probes all 200, "
            f"{taken_over} calls taken over after a lease, "
            f"{len(fake.duplicate_submissions)} identical resubmissions absorbed"
        )
