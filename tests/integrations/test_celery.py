"""The Celery integration in process: the ``enqueue=`` message on kombu's in-memory broker,
and the task run by Celery (``Task.apply``) against the real app served on loopback.

The end-to-end test with RabbitMQ and real worker processes is test_celery_e2e.py.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from celery import Celery, Task
from celery.exceptions import Reject
from kombu.message import Message
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.errors import ConfigurationError, ToolError
from agentfn_asgi.integrations.celery import (
    TASK_NAME,
    CeleryJobRunner,
    celery_enqueue,
    register_task,
)
from agentfn_asgi.messages import ENQUEUE_FAILED_MESSAGE, REDELIVERED_IN_DOUBT_MESSAGE
from agentfn_asgi.testing import Connection as Stack
from agentfn_asgi.testing import FakeCall, serve_app
from agentfn_asgi.tools import FunctionTools, NotRun, Ran, ReconcileOutcome, ToolContext, Unknown
from agentfn_asgi.worker import Job

from ..support.stack import APP_URL, running_stack

COMPLETION_SECRET = "completion-secret-0123456789abcdef"

pytestmark = pytest.mark.anyio


@pytest.fixture
def celery_app() -> Iterator[Celery]:
    """A Celery app on kombu's in-memory broker (process-wide: queue names are unique)."""
    app = Celery(f"test-{uuid.uuid4().hex[:8]}", broker="memory://", set_as_current=False)
    app.conf.broker_transport_options = {"polling_interval": 0.01}  # default: 1 s
    try:
        yield app
    finally:
        app.close()


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    """The client a task completes calls through, closed after the test."""
    with httpx.Client(timeout=10) as client:
        yield client


@pytest.fixture
def queue() -> str:
    """A queue name no other test uses."""
    return f"agentfn.test.{uuid.uuid4().hex}"


def report_tools(ran: list[str], **options: Any) -> FunctionTools:
    """A registry whose ``generate_report`` records each run (``options`` registers it)."""
    tools = FunctionTools()

    @tools.function(**options)
    async def generate_report(ctx: ToolContext, topic: str) -> dict[str, Any]:
        """Write a report."""
        ran.append(ctx.call_id)
        if topic == "refused":
            raise ToolError("that topic is off limits")
        return {"topic": topic, "key": ctx.idempotency_key}

    return tools


def take_message(app: Celery, queue: str) -> Message:
    """The next message on ``queue``, acknowledged (blocking: call it in a thread)."""
    with app.connection_for_read() as connection:
        simple = connection.SimpleQueue(queue)
        try:
            message: Message = simple.get(timeout=5)
            message.ack()
            return message
        finally:
            simple.close()


async def next_job(app: Celery, queue: str) -> Job:
    """What the worker gets: the job rebuilt from the next message's JSON body."""
    message = await anyio.to_thread.run_sync(take_message, app, queue)
    assert message.content_type == "application/json" and isinstance(message.body, str | bytes)
    args, kwargs, _embed = json.loads(message.body)
    assert kwargs == {}
    [job] = args
    return Job.from_dict(job)


def run_task(task: Task[Any, str], job: Job | dict[str, Any]) -> Any:
    """Run the task as a worker would (Celery's tracer, no broker); returns its EagerResult."""
    payload = job.to_dict() if isinstance(job, Job) else job
    return task.apply(args=(payload,))


@dataclasses.dataclass
class Served:
    stack: Stack
    complete_url: str


@pytest.fixture
async def served_app(
    celery_app: Celery, queue: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[Served, list[str]]]:
    """The app with a Celery-queued ``generate_report``, served on 127.0.0.1, and the list of
    calls its handler ran for (it runs only in the task)."""
    ran: list[str] = []
    deadline = getattr(request, "param", 30.0)
    tools = report_tools(
        ran, enqueue=celery_enqueue(celery_app, queue=queue), job_deadline=deadline
    )
    async with (
        running_stack(tools, completion_secret=COMPLETION_SECRET, public_url=APP_URL) as stack,
        serve_app(stack.app) as root,
    ):
        yield Served(stack, root + "/calls/complete"), ran


# -- the app's side --------------------------------------------------------------------------


def test_the_job_goes_out_as_json_expiring_at_its_deadline(celery_app: Celery, queue: str) -> None:
    """The message is the task's name, ``job.to_dict()`` as JSON, the deadline as
    ``expires``, the given routing and priority, and logs/monitors see no token."""
    job = Job(
        session_id="sess_1",
        turn_id="turn_1",
        call_id="call_1",
        tool_name="generate_report",
        arguments={"topic": "q3"},
        idempotency_key="afn_key",
        completion_token="token-not-for-logs",
        deadline=time.time() + 60,
    )
    celery_enqueue(celery_app, queue=queue, priority=3)(job)
    message = take_message(celery_app, queue)
    assert message.content_type == "application/json" and isinstance(message.body, str | bytes)
    args, kwargs, _embed = json.loads(message.body)
    assert (args, kwargs) == ([job.to_dict()], {})
    assert message.headers["task"] == TASK_NAME
    assert datetime.fromisoformat(message.headers["expires"]) == datetime.fromtimestamp(
        job.deadline, UTC
    )
    properties: dict[str, Any] = dict(message.properties)
    assert properties["priority"] == 3
    assert message.delivery_info["routing_key"] == queue
    assert "token-not-for-logs" not in json.dumps(message.headers)
    assert "call_1" in message.headers["argsrepr"]


def test_the_enqueue_keeps_the_options_it_sets_itself(celery_app: Celery) -> None:
    """``serializer`` (JSON only), ``expires`` (the deadline), ``args`` and ``argsrepr`` are
    the integration's; anything but a Celery app is refused."""
    for option in ("serializer", "expires", "args", "argsrepr"):
        fixed: dict[str, Any] = {option: "pickle"}
        with pytest.raises(ConfigurationError, match=option):
            celery_enqueue(celery_app, **fixed)
    with pytest.raises(ConfigurationError, match=r"celery\.Celery"):
        celery_enqueue(object())  # type: ignore[arg-type]


def test_a_missing_celery_names_the_extra(
    celery_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without Celery installed (simulated: it is a dev dependency), both helpers say which
    extra to install."""
    monkeypatch.setitem(sys.modules, "celery", None)
    with pytest.raises(ConfigurationError, match=r"agentfn-asgi\[celery\]"):
        celery_enqueue(celery_app)
    with pytest.raises(ConfigurationError, match=r"agentfn-asgi\[celery\]"):
        register_task(celery_app, FunctionTools())


async def test_a_broker_that_refuses_the_job_fails_the_call_at_once() -> None:
    """No broker listening: the model is told the job could not be queued (it did not
    run), without waiting for the job deadline."""
    nowhere = Celery("down", broker="amqp://guest:guest@127.0.0.1:9//", set_as_current=False)
    nowhere.conf.broker_connection_timeout = 1
    ran: list[str] = []
    tools = report_tools(
        ran, enqueue=celery_enqueue(nowhere, retry=False), timeout=10, job_deadline=600
    )
    try:
        async with running_stack(
            tools, completion_secret=COMPLETION_SECRET, public_url=APP_URL
        ) as stack:
            sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
            await stack.fake.wait_idle(sid, timeout=10)
    finally:
        nowhere.close()
    [submission] = stack.fake.submissions
    assert submission.error == ENQUEUE_FAILED_MESSAGE.format(name="generate_report")
    assert ran == []


# -- the deadline against the broker's redelivery timeout ------------------------------------

REDIS_BROKER = "redis://127.0.0.1:6379/0"
RABBITMQ_BROKER = "amqp://guest:guest@127.0.0.1:5672//"


@pytest.fixture
def broker_app() -> Iterator[Callable[..., Celery]]:
    """``broker_app(url, **conf)``: a Celery app on that broker (nothing connects)."""
    made: list[Celery] = []

    def make(url: str, **conf: Any) -> Celery:
        app = Celery(f"test-{uuid.uuid4().hex[:8]}", broker=url, set_as_current=False)
        app.conf.update(conf)
        made.append(app)
        return app

    yield make
    for app in made:
        app.close()


def refusal(register: Callable[[], object]) -> str:
    """The one-line ConfigurationError ``register()`` raises."""
    with pytest.raises(ConfigurationError) as caught:
        register()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("url", "conf", "broker", "limit", "setting"),
    [
        (REDIS_BROKER, {}, "Redis", 3600, "broker_transport_options['visibility_timeout']"),
        ("sqs://", {}, "SQS", 1800, "broker_transport_options['visibility_timeout']"),
        (RABBITMQ_BROKER, {}, "RabbitMQ", 1800, "consumer_timeout"),
        ("pyamqp://guest@127.0.0.1//", {}, "RabbitMQ", 1800, "consumer_timeout"),
        (
            REDIS_BROKER,
            {"broker_transport_options": {"visibility_timeout": 600}},
            "Redis",
            600,
            "broker_transport_options['visibility_timeout']",
        ),
    ],
)
def test_a_job_deadline_the_broker_would_redeliver_within_is_refused_at_registration(
    broker_app: Callable[..., Celery],
    url: str,
    conf: dict[str, Any],
    broker: str,
    limit: float,
    setting: str,
) -> None:
    """The default deadline (1 h) is not shorter than Redis' default visibility_timeout
    (1 h) nor RabbitMQ's consumer_timeout (30 min): a running job would be delivered again
    and run twice. Registering such a tool is refused in one line naming the tool, both
    numbers and the setting to change; a deadline one second shorter is accepted."""
    app = broker_app(url, **conf)
    message = refusal(lambda: report_tools([], enqueue=celery_enqueue(app), job_deadline=limit))
    assert "generate_report" in message and f"job_deadline={limit:g} s" in message
    assert f"{broker}'s redelivery timeout ({limit:g} s)" in message and setting in message
    if limit == 3600:  # the default deadline
        refusal(lambda: report_tools([], enqueue=celery_enqueue(app)))
    tools = report_tools([], enqueue=celery_enqueue(app), job_deadline=limit - 1)
    assert tools.get("generate_report") is not None


def test_a_raised_timeout_admits_a_longer_deadline(broker_app: Callable[..., Celery]) -> None:
    """``visibility_timeout`` raised in broker_transport_options, or RabbitMQ's
    consumer_timeout raised on the server and given to celery_enqueue: the default deadline
    is accepted. In-memory and other transports are not checked."""
    redis = broker_app(REDIS_BROKER, broker_transport_options={"visibility_timeout": 3660})
    report_tools([], enqueue=celery_enqueue(redis))
    rabbit = broker_app(RABBITMQ_BROKER)
    report_tools([], enqueue=celery_enqueue(rabbit, consumer_timeout=7200))
    report_tools([], enqueue=celery_enqueue(rabbit, consumer_timeout=math.inf))
    for url in ("memory://", "filesystem://"):
        report_tools([], enqueue=celery_enqueue(broker_app(url)), job_deadline=10 * 86400)
    with pytest.raises(ConfigurationError, match="consumer_timeout must be"):
        celery_enqueue(rabbit, consumer_timeout=0)


def test_the_workers_start_checks_the_configuration_as_it_is_then(
    broker_app: Callable[..., Celery],
) -> None:
    """register_task (the workers' start) checks again: a visibility_timeout lowered after
    the tools were registered is refused there, naming the tool and the setting."""
    app = broker_app(REDIS_BROKER, broker_transport_options={"visibility_timeout": 7200})
    tools = report_tools([], enqueue=celery_enqueue(app))
    app.conf.broker_transport_options = {"visibility_timeout": 1800}
    message = refusal(lambda: register_task(app, tools))
    assert "tool 'generate_report': job_deadline=3600 s" in message
    assert "broker_transport_options['visibility_timeout']" in message


# -- the worker's side -----------------------------------------------------------------------


def test_the_task_is_set_up_for_redelivery_and_json(celery_app: Celery) -> None:
    """acks_late and reject_on_worker_lost (a lost worker's job is delivered again), no
    Celery retries, JSON, no stored result, failures acknowledged."""
    task = register_task(celery_app, FunctionTools(), rate_limit="10/s")
    assert task.name == TASK_NAME
    assert celery_app.tasks[TASK_NAME].name == TASK_NAME
    assert (task.acks_late, task.reject_on_worker_lost, task.acks_on_failure_or_timeout) == (
        True,
        True,
        True,
    )
    assert (task.max_retries, task.serializer, task.ignore_result) == (0, "json", True)
    assert task.rate_limit == "10/s"


async def test_a_job_runs_in_the_task_and_its_call_gets_one_result(
    celery_app: Celery, queue: str, served_app: tuple[Served, list[str]], http: httpx.Client
) -> None:
    """The app's job, taken from the broker, runs in the task (not in the app) and completes
    the call; run again (a redelivery) it re-runs the handler and gets ``duplicate``: the
    model receives exactly one result, with the call's idempotency key."""
    served, ran = served_app
    task = register_task(
        celery_app,
        report_tools(ran),
        complete_url=served.complete_url,
        http_client=http,
        name="reports.run",
    )
    sid = served.stack.fake.create_session(
        [[FakeCall("generate_report", {"topic": "q3"}, call_id="w1")]]
    )
    job = await next_job(celery_app, queue)
    assert ran == []
    first = await anyio.to_thread.run_sync(run_task, task, job)
    await served.stack.fake.wait_idle(sid, timeout=5)
    again = await anyio.to_thread.run_sync(run_task, task, job)
    assert (first.state, first.result, again.state, again.result) == (
        "SUCCESS",
        "accepted",
        "SUCCESS",
        "duplicate",
    )
    assert ran == ["w1", "w1"]
    [submission] = served.stack.fake.submissions
    assert json.loads(submission.output) == {"topic": "q3", "key": job.idempotency_key}


async def test_a_tool_error_reaches_the_model_as_written(
    celery_app: Celery, queue: str, served_app: tuple[Served, list[str]], http: httpx.Client
) -> None:
    """A handler's ToolError is the call's result (a failure the model reads), not a
    Celery failure or retry."""
    served, ran = served_app
    task = register_task(
        celery_app, report_tools(ran), complete_url=served.complete_url, http_client=http
    )
    sid = served.stack.fake.create_session([[FakeCall("generate_report", {"topic": "refused"})]])
    job = await next_job(celery_app, queue)
    result = await anyio.to_thread.run_sync(run_task, task, job)
    await served.stack.fake.wait_idle(sid, timeout=5)
    assert (result.state, result.result) == ("SUCCESS", "accepted")
    [submission] = served.stack.fake.submissions
    assert (submission.success, submission.error) == (False, "that topic is off limits")


async def test_a_job_past_its_deadline_is_neither_run_nor_completed(
    celery_app: Celery, queue: str, served_app: tuple[Served, list[str]], http: httpx.Client
) -> None:
    """A job the worker finds past its deadline: the handler does not run and nothing is
    sent (the app fails the call itself); the call is still the app's to settle."""
    served, ran = served_app
    task = register_task(
        celery_app, report_tools(ran), complete_url=served.complete_url, http_client=http
    )
    sid = served.stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
    job = await next_job(celery_app, queue)
    late = dataclasses.replace(job, deadline=time.time() - 1)
    result = await anyio.to_thread.run_sync(run_task, task, late)
    assert (result.state, result.result) == ("SUCCESS", "expired")
    assert ran == []
    [record] = await served.stack.store.calls_for_session(sid)
    assert record.state is CallState.CLAIMED
    assert served.stack.fake.submissions == []


@pytest.mark.parametrize("served_app", [0.5], indirect=True)
async def test_a_worker_whose_clock_runs_behind_reports_expired(
    queue: str, celery_app: Celery, served_app: tuple[Served, list[str]]
) -> None:
    """The job looks fresh on the worker's clock but the app refuses its token as expired
    (401 token_expired): the runner answers ``expired`` instead of failing the task."""
    served, ran = served_app
    sid = served.stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
    job = await next_job(celery_app, queue)
    await anyio.sleep(max(0.0, job.deadline - time.time()) + 0.1)
    # Its own client this time (the default: one per worker process).
    runner = CeleryJobRunner(
        report_tools(ran), complete_url=served.complete_url, clock=lambda: time.time() - 60
    )
    try:
        status = await anyio.to_thread.run_sync(runner, job)
    finally:
        runner.close()
    assert status == "expired"
    assert ran == [job.call_id]
    await served.stack.fake.wait_idle(sid, timeout=5)
    assert all(s.success is False for s in served.stack.fake.submissions)


def test_a_message_that_is_not_a_job_is_rejected_without_requeue(celery_app: Celery) -> None:
    """Garbage is rejected (dead-lettered where configured), never requeued to loop."""
    task = register_task(celery_app, FunctionTools())
    result = run_task(task, {"session_id": "s"})
    assert result.state == "REJECTED"
    assert isinstance(result.result, Reject)
    rejected: Any = result.result  # the stubs do not know Reject's attributes
    assert rejected.requeue is False
    assert "turn_id" in str(rejected.reason)


async def test_the_tasks_span_joins_the_calls_trace(
    celery_app: Celery, queue: str, served_app: tuple[Served, list[str]], http: httpx.Client
) -> None:
    """The task's span is a child of the call's span (the job's traceparent) and records
    the app's answer."""
    served, ran = served_app
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    task = register_task(
        celery_app,
        report_tools(ran),
        complete_url=served.complete_url,
        http_client=http,
        tracer_provider=provider,
    )
    sid = served.stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
    job = await next_job(celery_app, queue)
    await anyio.to_thread.run_sync(run_task, task, job)
    await served.stack.fake.wait_idle(sid, timeout=5)
    provider.shutdown()
    [span] = exporter.get_finished_spans()
    _version, trace_id, parent_span_id, _flags = job.traceparent.split("-")
    assert span.name == "celery job generate_report"
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == parent_span_id
    assert span.attributes is not None
    assert span.attributes["gen_ai.tool.call.id"] == job.call_id
    assert span.attributes["agentfn.completion.status"] == "accepted"


def refund_tools(
    ran: list[str], outcome: ReconcileOutcome, asked: list[str], **options: Any
) -> FunctionTools:
    """A registry whose side-effect ``refund`` records runs, and whose reconcile hook
    records each question and answers ``outcome``."""
    tools = FunctionTools()

    def reconcile(ctx: ToolContext, arguments: dict[str, Any]) -> ReconcileOutcome:
        asked.append(ctx.idempotency_key)
        return outcome

    @tools.function(side_effects=True, reconcile=reconcile, **options)
    def refund(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Refund an order."""
        ran.append(order_id)
        return {"refund_id": "fresh", "order_id": order_id}

    return tools


@pytest.mark.parametrize(
    ("outcome", "runs", "success", "text"),
    [
        (Ran({"refund_id": "earlier", "order_id": "o1"}), [], True, '"refund_id":"earlier"'),
        (NotRun(), ["o1"], True, '"refund_id":"fresh"'),
        (Unknown("ledger unreachable"), [], False, REDELIVERED_IN_DOUBT_MESSAGE),
    ],
)
async def test_a_redelivered_side_effect_job_asks_reconcile_before_running(
    celery_app: Celery,
    queue: str,
    http: httpx.Client,
    outcome: ReconcileOutcome,
    runs: list[str],
    success: bool,
    text: str,
) -> None:
    """A side-effect job delivered again (its worker died) is never run blindly: Ran
    completes the call with the earlier result, NotRun runs the handler, Unknown fails the
    call as in doubt. A first delivery runs without asking."""
    ran: list[str] = []
    asked: list[str] = []
    enqueue = celery_enqueue(celery_app, queue=queue)
    app_tools = refund_tools([], outcome, [], enqueue=enqueue)
    async with (
        running_stack(app_tools, completion_secret=COMPLETION_SECRET, public_url=APP_URL) as stack,
        serve_app(stack.app) as root,
    ):
        runner = CeleryJobRunner(
            refund_tools(ran, outcome, asked),
            complete_url=root + "/calls/complete",
            http_client=http,
        )
        first = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"})]])
        job = await next_job(celery_app, queue)
        assert await anyio.to_thread.run_sync(runner, job) == "accepted"
        assert (ran, asked) == (["o1"], [])
        ran.clear()
        again = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"})]])
        job = await next_job(celery_app, queue)
        redelivered = functools.partial(runner, job, redelivered=True)
        assert await anyio.to_thread.run_sync(redelivered) == "accepted"
        for session in (first, again):
            await stack.fake.wait_idle(session, timeout=5)
    assert (ran, asked) == (runs, [job.idempotency_key])
    [submission] = results_for(stack, again)
    assert submission.success is success
    assert text in (submission.output if success else submission.error or "")


def results_for(stack: Stack, session_id: str) -> list[Any]:
    return [s for s in stack.fake.submissions if s.session_id == session_id]
