"""End to end: examples/celery_worker under uvicorn, real Celery worker processes and
RabbitMQ, against FakeAgentsAPI over loopback (issue 17).

Needs RabbitMQ on 127.0.0.1:5672 (guest/guest): skipped without it, except under ``CI=true``
where that fails. Each run uses a queue of its own, deleted afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import psutil
import pytest
from kombu import Connection, Queue

from agentfn_asgi.calls.records import CallKey
from agentfn_asgi.demo import run_example
from agentfn_asgi.jobs import CompletionTokens
from agentfn_asgi.messages import JOB_DEADLINE_MESSAGE
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, Submission, serve_fake

from ..store.conftest import require_service
from ..support.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.anyio]

ROOT = Path(__file__).resolve().parents[2]
BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
#: Covers a killed job's second run: Celery notices a lost pool process within ~5 s (its
#: pool maintenance timer, when the exit signal is missed), then the job runs 1 s again.
JOB_DEADLINE = 10.0
#: generate_report(pages=20) takes 1 s: long enough to be killed in the middle.
SLOW_PAGES = 20


@pytest.fixture
def jobs_queue() -> Iterator[str]:
    """A RabbitMQ queue for this run only, deleted with anything left in it afterwards."""
    name = f"agentfn.test.{secrets.token_hex(8)}"
    with Connection(BROKER_URL, connect_timeout=2) as connection:
        try:
            connection.connect()
        except OSError as exc:
            require_service("rabbitmq", f"cannot connect to {BROKER_URL}: {exc}")
        try:
            yield name
        finally:
            # Deleting drops whatever is left in it (and is a no-op if it never existed).
            Queue(name, channel=connection.default_channel).delete()


@dataclass
class Worker:
    """A ``celery worker`` process (group leader of its pool processes) and its log."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pool_pid(self) -> int:
        """The one pool process running its jobs (``--concurrency 1``)."""
        [child] = psutil.Process(self.process.pid).children()
        pid: int = child.pid
        return pid


@contextlib.contextmanager
def celery_worker(name: str, env: dict[str, str], tmp_path: Path) -> Iterator[Worker]:
    """``celery -A examples.celery_worker.worker:celery_app worker``, one pool process; warm
    shutdown on exit (SIGTERM), then SIGKILL to its whole group."""
    log_path = tmp_path / f"worker-{name}.log"
    command = [sys.executable, "-m", "celery", "-A", "examples.celery_worker.worker:celery_app"]
    command += ["worker", "--loglevel", "INFO", "--concurrency", "1", "-n", f"{name}@%h"]
    # Start-up without the cluster chatter this test does not need.
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        yield Worker(name, process, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


async def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 20.0) -> None:  # noqa: ASYNC109
    try:
        with anyio.fail_after(timeout):
            while not predicate():
                await anyio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def wait_ready(*workers: Worker) -> None:
    for worker in workers:
        await wait_for(
            lambda w=worker: " ready." in w.log() or w.process.poll() is not None,  # type: ignore[misc]
            f"worker {worker.name} to be ready",
        )
        assert worker.process.poll() is None, worker.log()


def writing(call_id: str) -> re.Pattern[str]:
    """The line generate_report logs when it starts on a call."""
    return re.compile(rf"writing a \d+-page report on \w+ for call {call_id}\b")


async def worker_writing(call_id: str, workers: list[Worker]) -> Worker:
    """The worker whose handler started on ``call_id``."""
    found: list[Worker] = []

    def started() -> bool:
        found[:] = [w for w in workers if writing(call_id).search(w.log())]
        return bool(found)

    await wait_for(started, f"a worker to start call {call_id}")
    return found[0]


def slow_report(call_id: str) -> FakeCall:
    """A generate_report call that takes long enough to be killed in the middle."""
    return FakeCall("generate_report", {"topic": "slow", "pages": SLOW_PAGES}, call_id=call_id)


def results_for(fake: FakeAgentsAPI, session_id: str) -> list[Submission]:
    return [s for s in fake.submissions if s.session_id == session_id]


def logs_of(workers: list[Worker]) -> str:
    """Every worker's output, for assertion messages."""
    return "\n".join(f"--- worker {w.name}:\n{w.log()}" for w in workers)


@contextlib.asynccontextmanager
async def deployment(
    tmp_path: Path, jobs_queue: str
) -> AsyncIterator[tuple[FakeAgentsAPI, str, dict[str, str]]]:
    """The fake API over loopback and the example app under uvicorn; yields the fake, the
    app's webhook URL and the environment the workers get."""
    port = free_port()
    app_url = f"http://127.0.0.1:{port}/openai/webhooks"
    fake = FakeAgentsAPI(api_key="sk-test", webhook_url=app_url)
    prefixes = ("AGENTFN_", "OPENAI_", "CELERY_", "EXAMPLE_")
    shared = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    shared.update(
        CELERY_BROKER_URL=BROKER_URL,
        EXAMPLE_JOBS_QUEUE=jobs_queue,
        EXAMPLE_JOB_DEADLINE=str(JOB_DEADLINE),
        PYTHONUNBUFFERED="1",
    )
    async with fake, serve_fake(fake) as base_url:
        app_env = shared | {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": base_url,
            "OPENAI_WEBHOOK_SECRET": fake.webhook_secret,
            "AGENTFN_COMPLETION_SECRET": secrets.token_urlsafe(32),
            "AGENTFN_PUBLIC_URL": app_url,
            "AGENTFN_STORE_URL": f"sqlite:///{tmp_path / 'store.sqlite3'}",
            "AGENTFN_RECOVERY_INTERVAL": "0.3",
            "EXAMPLE_LEDGER": str(tmp_path / "ledger.jsonl"),
        }
        async with run_example(
            "examples.celery_worker.app:app", env=app_env, log_path=tmp_path / "app.log", port=port
        ):
            # Workers need no secret and no API key: each job carries its URL and token.
            yield fake, app_url, shared


async def test_celery_workers_complete_calls_once_through_kills_and_refuse_forgeries(
    tmp_path: Path, jobs_queue: str
) -> None:
    """With RabbitMQ and real workers: a job nobody took before its deadline fails its call
    and is never run; a forged completion is refused; a job whose pool process, then whose
    whole worker, is SIGKILLed mid-job is delivered again and its call gets exactly one
    result; worker and in-process results of one step all arrive."""
    async with deployment(tmp_path, jobs_queue) as (fake, app_url, env):
        # 1. No worker yet: the job waits in the queue past its deadline.
        late = fake.create_session(
            [[FakeCall("generate_report", {"topic": "late"}, call_id="late")]]
        )
        await wait_for(lambda: bool(fake.required_actions(late)), "the late call to be asked")
        [action] = fake.required_actions(late)
        forged = CompletionTokens("forger-secret-0123456789abcdef").issue(
            CallKey(late, action["turn_id"], "late"),
            owner="x",
            tool_name="generate_report",
            attempt=1,
        )
        async with httpx.AsyncClient() as http:
            refused = await http.post(
                app_url + "/calls/complete",
                json={"success": True, "output": "forged result"},
                headers={"authorization": f"Bearer {forged}"},
            )
        assert (refused.status_code, refused.json()) == (401, {"error": "invalid_token"})
        await fake.wait_idle(late, timeout=JOB_DEADLINE + 15)
        [failure] = results_for(fake, late)
        assert (failure.success, failure.error) == (False, JOB_DEADLINE_MESSAGE)

        with (
            celery_worker("a", env, tmp_path) as a,
            celery_worker("b", env, tmp_path) as b,
        ):
            workers = [a, b]
            await wait_ready(a, b)

            # 2. The pool process dies mid-job: the worker requeues its job
            #    (reject_on_worker_lost) and it runs again, here or in the other worker.
            call = "pool1"
            lost_pool = fake.create_session([[slow_report(call)]])
            running = await worker_writing(call, workers)
            os.kill(running.pool_pid(), signal.SIGKILL)
            await fake.wait_idle(lost_pool, timeout=JOB_DEADLINE + 10)
            [result] = results_for(fake, lost_pool)
            assert result.success, logs_of(workers)
            assert sum(len(writing(call).findall(w.log())) for w in workers) == 2
            assert f"running job for call {call} of tool generate_report (redelivered)" in (
                logs_of(workers)
            )
            # The worker logs the app's answer after the app has already submitted it.
            completed = f"call {call} completed: accepted"
            await wait_for(lambda: completed in logs_of(workers), "the worker's answer")
            assert logs_of(workers).count(completed) == 1

            # 3. A whole worker dies mid-job (pool and main process): RabbitMQ delivers its
            #    unacknowledged job to the other worker.
            call = "worker1"
            lost_worker = fake.create_session([[slow_report(call)]])
            victim = await worker_writing(call, workers)
            os.killpg(victim.process.pid, signal.SIGKILL)
            survivor = b if victim is a else a
            await fake.wait_idle(lost_worker, timeout=JOB_DEADLINE + 10)
            [result] = results_for(fake, lost_worker)
            assert result.success, logs_of(workers)
            assert f"running job for call {call} of tool generate_report (redelivered)" in (
                survivor.log()
            )

            # 4. The survivor serves a step mixing worker and in-process calls.
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
            logs = a.log() + b.log()

    results = {s.call_id: s for s in results_for(fake, served)}
    assert set(results) == {"r1", "r2", "here"} and all(s.success for s in results.values())
    sales = json.loads(results["r1"].output)
    assert (sales["topic"], sales["pages"], sales["summary"]) == (
        "sales",
        2,
        "A 2-page report on sales.",
    )
    assert json.loads(results["here"].output)["found"] is True
    # The expired job was dropped, never run; nothing forged reached the model.
    assert not writing("late").search(logs)
    assert len(results_for(fake, late)) == 1
    assert all("forged" not in str(s.output) for s in fake.submissions)
