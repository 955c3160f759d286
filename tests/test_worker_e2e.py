"""End to end: examples/worker/app.py under uvicorn plus worker processes taking jobs from
Redis, against FakeAgentsAPI over loopback (issue 10).

Needs Redis on 127.0.0.1:6379: skipped without it, except under ``CI=true`` where that fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import redis

from agentfn_asgi.jobs import CompletionTokens
from agentfn_asgi.records import CallKey
from agentfn_asgi.results import JOB_DEADLINE_MESSAGE
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[1]
REDIS_URL = "redis://127.0.0.1:6379/0"
JOB_DEADLINE = 4.0


@pytest.fixture
def queue_key() -> Iterator[str]:
    """A fresh Redis list for this test, deleted afterwards; skips when Redis is absent."""
    client = redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError as exc:
        message = f"Redis is not reachable on 127.0.0.1:6379 ({exc}); start it to run this"
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"{message} (CI=true requires it)", pytrace=False)
        pytest.skip(message)
    key = f"agentfn:test:{secrets.token_hex(8)}"
    try:
        yield key
    finally:
        client.delete(key)
        client.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def child(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A child process of the repository's interpreter, stopped (then killed) on exit."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def text_of(log: Path) -> str:
    """A child's output so far (tiny files: reading them inline is fine)."""
    return log.read_text(errors="replace")


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109
    try:
        with anyio.fail_after(timeout):
            while not predicate():
                await anyio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    async with httpx.AsyncClient() as http:
        with anyio.fail_after(20):
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"the app exited:\n{text_of(log)}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(url)).status_code == 200:
                        return
                await anyio.sleep(0.1)


@contextlib.asynccontextmanager
async def deployment(
    tmp_path: Path, queue_key: str
) -> AsyncIterator[tuple[FakeAgentsAPI, str, dict[str, str]]]:
    """The fake API over loopback and the example app in a child; yields the fake, the
    app's webhook URL and the environment workers need."""
    port = free_port()
    app_url = f"http://127.0.0.1:{port}/openai/webhooks"
    fake = FakeAgentsAPI(api_key="sk-test", webhook_url=app_url)
    async with fake, serve_fake(fake) as base_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTFN_", "OPENAI_"))}
        env.update(
            OPENAI_API_KEY="sk-test",
            OPENAI_BASE_URL=base_url,
            OPENAI_WEBHOOK_SECRET=fake.webhook_secret,
            AGENTFN_COMPLETION_SECRET=secrets.token_urlsafe(32),
            AGENTFN_PUBLIC_URL=app_url,
            AGENTFN_STORE_URL=f"sqlite:///{tmp_path / 'store.sqlite3'}",
            EXAMPLE_LEDGER=str(tmp_path / "ledger.jsonl"),
            EXAMPLE_JOB_DEADLINE=str(JOB_DEADLINE),
            AGENTFN_RECOVERY_INTERVAL="0.3",
            REDIS_URL=REDIS_URL,
            WORKER_QUEUE=queue_key,
        )
        app_args = ["-m", "uvicorn", "examples.worker.app:app", "--host", "127.0.0.1"]
        log = tmp_path / "app.log"
        with child([*app_args, "--port", str(port), "--lifespan", "on"], env, log) as app:
            await wait_healthy(app_url + "/healthz", app, log)
            yield fake, app_url, env


def worker_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    # The worker needs no secret: the job carries its URL and token.
    return {k: v for k, v in env.items() if k != "AGENTFN_COMPLETION_SECRET"} | extra


async def test_workers_complete_calls_and_a_crashed_job_fails_at_its_deadline(
    tmp_path: Path, queue_key: str
) -> None:
    """A worker killed mid-job leaves its call to the job deadline (the model gets the
    documented failure, nothing is re-run); a forged completion is refused and changes
    nothing; a healthy worker's results arrive next to in-process results."""
    async with deployment(tmp_path, queue_key) as (fake, app_url, env):
        # 1. A worker that SIGKILLs itself right after taking the job.
        crash_log = tmp_path / "crasher.log"
        with child(
            ["-m", "examples.worker.worker"], worker_env(env, EXAMPLE_WORKER_CRASH="1"), crash_log
        ) as crasher:
            lost = fake.create_session(
                [[FakeCall("generate_report", {"topic": "lost", "pages": 1}, call_id="lost1")]]
            )
            await wait_for(lambda: crasher.poll() is not None, "the crashing worker to die")
        assert crasher.returncode == -signal.SIGKILL, text_of(crash_log)
        assert redis.Redis.from_url(REDIS_URL).llen(queue_key) == 0  # the job died with it

        # A forged token for the pending call: refused, and it changes nothing.
        [action] = fake.required_actions(lost)
        forged = CompletionTokens("forger-secret-0123456789abcdef").issue(
            CallKey(lost, action["turn_id"], "lost1"), owner="x", tool_name="generate_report"
        )
        async with httpx.AsyncClient() as http:
            refused = await http.post(
                app_url + "/calls/complete",
                json={"success": True, "output": "forged result"},
                headers={"authorization": f"Bearer {forged}"},
            )
        assert (refused.status_code, refused.json()) == (401, {"error": "invalid_token"})

        await fake.wait_idle(lost, timeout=JOB_DEADLINE + 15)
        [failure] = [s for s in fake.submissions if s.session_id == lost]
        assert (failure.success, failure.error) == (False, JOB_DEADLINE_MESSAGE)

        # 2. A healthy worker: queued and in-process calls of one step all complete.
        log = tmp_path / "worker.log"
        with child(["-m", "examples.worker.worker"], worker_env(env), log):
            await wait_for(lambda: "worker ready" in text_of(log), "the worker to be ready")
            served = fake.create_session(
                [
                    [
                        FakeCall("generate_report", {"topic": "sales", "pages": 2}, call_id="r1"),
                        FakeCall("generate_report", {"topic": "ops"}, call_id="r2"),
                        FakeCall("get_customer", {"customer_id": "123"}, call_id="here"),
                    ]
                ]
            )
            await fake.wait_idle(served, timeout=JOB_DEADLINE + 10)
        results = {s.call_id: s for s in fake.submissions if s.session_id == served}
    assert set(results) == {"r1", "r2", "here"}
    assert all(s.success for s in results.values())
    sales = json.loads(results["r1"].output)
    assert (sales["topic"], sales["pages"], sales["summary"]) == (
        "sales",
        2,
        "A 2-page report on sales.",
    )
    assert json.loads(results["r2"].output)["pages"] == 1
    assert json.loads(results["here"].output)["found"] is True
    assert all("forged" not in str(s.output) for s in fake.submissions)
    assert "took job for call r1" in text_of(log) and "took job for call r2" in text_of(log)
