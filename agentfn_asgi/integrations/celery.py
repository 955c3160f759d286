"""Run worker tools on Celery: an ``enqueue=`` that sends jobs to a task, and that task.

The web app sends each call of a worker tool to a Celery task; a Celery worker runs it with
the same registry and completes the call over HTTP (see :mod:`agentfn_asgi.worker` for the
protocol). One module shared by both sides::

    from celery import Celery
    from agentfn_asgi import FunctionTools, ToolContext
    from agentfn_asgi.integrations.celery import celery_enqueue, register_task

    celery_app = Celery("reports", broker="amqp://guest:guest@127.0.0.1:5672//")
    tools = FunctionTools()

    @tools.function(enqueue=celery_enqueue(celery_app, queue="reports"), job_deadline=600)
    def generate_report(ctx: ToolContext, topic: str) -> dict: ...

    register_task(celery_app, tools)     # the worker runs the same registry

The app mounts ``AgentWebhookApp(tools, completion_secret=..., public_url=...)``; workers
run ``celery -A mymodule worker -Q reports`` and need no secret: each job carries its
completion URL and a signed token.

How it is set up, and why:

- **Messages are JSON** (``job.to_dict()``, sent with ``serializer="json"``); never pickle.
  Their ``argsrepr`` (what logs and Flower show) names the tool and call only: the
  completion token is a credential for its call.
- **``expires`` is the job deadline.** A worker discards a job past it, and the task itself
  completes nothing after it: by then the app has failed the call
  (:data:`~agentfn_asgi.worker.JOB_DEADLINE_MESSAGE`) and refuses late completions.
- **``acks_late=True`` with ``reject_on_worker_lost=True``**: a message is acknowledged
  only when the task returns, so a job whose worker dies (SIGKILL, OOM, lost machine) is
  delivered again and run again, by this or another worker, until its deadline.
- **No Celery retry of the handler.** A handler's failure is the call's result (the model
  reads it); a task that fails (the app unreachable after the completion's own retries) is
  acknowledged, not redelivered, and its call fails at the job deadline.
- **No result backend.** The result goes to the app over HTTP (``ignore_result=True``); the
  task returns the app's answer (``accepted``, ``duplicate``, ...) for the worker's log.

Redelivery means **at-least-once execution**: a job whose worker died mid-job, or after
completing but before the acknowledgement, runs again. The completion endpoint saves the
first result and answers ``duplicate`` (same result) or ``conflict`` (another one) to later
ones, so the model gets exactly one result. A tool declared with ``side_effects=True`` is
not run again blindly: on a redelivered job its ``reconcile`` hook decides, as the app does
for in-doubt calls (``Ran``: its result completes the call; ``NotRun``: the handler runs;
``Unknown`` or no hook: the call fails with
:data:`~agentfn_asgi.results.REDELIVERED_IN_DOUBT_MESSAGE`). Pass ``ctx.idempotency_key``
(``job.idempotency_key``, the same on every delivery) downstream: it also covers the window
a reconcile hook cannot see.

**A job's deadline must be shorter than the broker's redelivery timeout**, or a job still
running is delivered to a second worker and runs twice, side by side. Redis and SQS deliver
again a message unacknowledged for ``visibility_timeout`` (kombu's defaults: 1 hour on
Redis, 30 minutes on SQS; ``broker_transport_options["visibility_timeout"]``); RabbitMQ
closes the channel of a delivery unacknowledged for its ``consumer_timeout`` (30 minutes by
default, set in ``rabbitmq.conf``, or per queue) and delivers the message again. The default
``job_deadline`` (1 hour) is too long for all three. The check runs when a tool is
registered with ``enqueue=celery_enqueue(...)`` and again in :func:`register_task` (the
workers' start): a deadline not shorter than the timeout is a ConfigurationError, in one
line naming the setting to change. The broker is not asked: RabbitMQ does not tell its
``consumer_timeout`` to clients, so one raised on the server is given as
``celery_enqueue(..., consumer_timeout=seconds)``. Other transports (``memory://``,
``filesystem://``, databases) are not checked.

Celery is imported only when these helpers are called; it is the ``celery`` extra:
``pip install 'agentfn-asgi[celery]'``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

import anyio
import httpx
from opentelemetry import trace
from opentelemetry.trace import SpanKind, TracerProvider

from ..errors import (
    ArgumentValidationError,
    CompletionTokenExpiredError,
    ConfigurationError,
    ResultEncodingError,
)
from ..messages import REDELIVERED_IN_DOUBT_MESSAGE, model_error_message
from ..results import encode_output
from ..running import run_reconcile
from ..tools import FunctionTool, FunctionTools, NotRun, Ran
from ..worker import Completion, Job, complete_call_sync, job_context, run_job

if TYPE_CHECKING:
    from celery import Celery, Task

__all__ = [
    "RABBITMQ_CONSUMER_TIMEOUT",
    "TASK_NAME",
    "TASK_OPTIONS",
    "CeleryEnqueue",
    "CeleryJobRunner",
    "RedeliveryTimeout",
    "celery_enqueue",
    "check_job_deadlines",
    "redelivery_timeout",
    "register_task",
]

logger = logging.getLogger("agentfn_asgi.integrations.celery")

#: The task's default name: the web app sends to it, workers register it.
TASK_NAME: Final = "agentfn_asgi.run_job"

#: How :func:`register_task` configures the task (``task_options`` may override these).
TASK_OPTIONS: Final[Mapping[str, Any]] = {
    # Acknowledge after the task returns: a job whose worker dies is delivered again.
    "acks_late": True,
    # ... including when the pool process running it is killed (Celery acks it otherwise).
    "reject_on_worker_lost": True,
    # Celery 5.7+: a lost worker requeues the same message (not a retry copy of it).
    "retry_on_worker_lost": False,
    # A task that raised (the app unreachable) is acknowledged: the handler never re-runs
    # for it; the call fails at its job deadline. (Celery < 5.7 reads the first name only.)
    "acks_on_failure_or_timeout": True,
    "acks_on_failure": True,
    "acks_on_timeout": True,
    # The handler's failures are results for the model, never Celery retries.
    "max_retries": 0,
    "serializer": "json",
    # The result goes to the app over HTTP; a result backend would only store a copy.
    "ignore_result": True,
}

#: RabbitMQ's default ``consumer_timeout`` in seconds (30 minutes, since RabbitMQ 3.8.15).
RABBITMQ_CONSUMER_TIMEOUT: Final = 1800.0
# kombu's defaults of broker_transport_options["visibility_timeout"].
_VISIBILITY_TIMEOUTS: Final = {"Redis": 3600.0, "SQS": 1800.0}
# URL schemes (the part before any "+") by broker; other transports are not checked.
_BROKERS: Final = {
    "redis": "Redis",
    "rediss": "Redis",
    "sentinel": "Redis",
    "sqs": "SQS",
    "amqp": "RabbitMQ",
    "amqps": "RabbitMQ",
    "pyamqp": "RabbitMQ",
    "librabbitmq": "RabbitMQ",
}

# What the job message itself decides: not overridable per enqueue.
_FIXED_SEND_OPTIONS: Final = frozenset({"args", "kwargs", "serializer", "expires", "argsrepr"})

_EXTRA_HINT: Final = "pip install 'agentfn-asgi[celery]'"


def _require_celery() -> Any:
    try:
        import celery
    except ImportError as exc:
        raise ConfigurationError(
            f"the Celery integration needs Celery installed: {_EXTRA_HINT}"
        ) from exc
    return celery


def _check_app(celery_app: object) -> None:
    celery = _require_celery()
    if not isinstance(celery_app, celery.Celery):
        raise ConfigurationError(f"expected a celery.Celery app, got {type(celery_app).__name__}")


# -- the broker's redelivery timeout ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RedeliveryTimeout:
    """After ``seconds`` without an acknowledgement, ``broker`` delivers a message again (to
    any worker, even while the first one still runs it); ``setting`` is what raises it."""

    broker: str
    seconds: float
    setting: str


def redelivery_timeout(
    celery_app: Celery, *, consumer_timeout: float | None = None
) -> RedeliveryTimeout | None:
    """The redelivery timeout of ``celery_app``'s broker (the one it sends to), read from its
    configuration without connecting; None for a transport that has none we know.

    Redis and SQS: ``broker_transport_options["visibility_timeout"]`` (kombu's default when
    unset). RabbitMQ: ``consumer_timeout`` when given (seconds; ``math.inf`` if the server has
    none), else the broker's default, :data:`RABBITMQ_CONSUMER_TIMEOUT`.
    """
    conf = celery_app.conf
    url: Any = conf.broker_write_url or conf.broker_url or "amqp://"
    if isinstance(url, list | tuple):  # a failover list: the first is used first
        url = url[0] if url else "amqp://"
    scheme = str(url).split(";", 1)[0].split("://", 1)[0].split("+", 1)[0].strip().lower()
    broker = _BROKERS.get(scheme)
    if broker is None:
        return None
    if broker == "RabbitMQ":
        seconds = RABBITMQ_CONSUMER_TIMEOUT if consumer_timeout is None else consumer_timeout
        return RedeliveryTimeout(
            broker,
            float(seconds),
            "consumer_timeout (in rabbitmq.conf, then celery_enqueue(..., consumer_timeout=))",
        )
    options = conf.broker_transport_options or {}
    seconds = options.get("visibility_timeout", _VISIBILITY_TIMEOUTS[broker])
    return RedeliveryTimeout(
        broker, float(seconds), "broker_transport_options['visibility_timeout']"
    )


def _check_deadline(timeout: RedeliveryTimeout | None, job_deadline: float, label: str) -> None:
    if timeout is None or job_deadline < timeout.seconds:
        return
    raise ConfigurationError(
        f"{label}: job_deadline={job_deadline:g} s is not shorter than {timeout.broker}'s "
        f"redelivery timeout ({timeout.seconds:g} s), so a running job could be delivered "
        f"again and run twice: raise {timeout.setting} above {job_deadline:g} s, or lower "
        "job_deadline"
    )


def check_job_deadlines(tools: FunctionTools | FunctionTool) -> None:
    """Refuse (ConfigurationError, one line naming the setting to change) a tool sent to
    Celery by :func:`celery_enqueue` whose ``job_deadline`` is not shorter than its broker's
    redelivery timeout (:func:`redelivery_timeout`). Registration already checks each tool;
    this checks again against the configuration as it is now (:func:`register_task` does)."""
    listed = [tools] if isinstance(tools, FunctionTool) else list(tools)
    for tool in listed:
        if isinstance(tool.enqueue, CeleryEnqueue):
            tool.enqueue.check_job_deadline(tool.job_deadline, f"tool {tool.name!r}")


# -- the web app's side ----------------------------------------------------------------------


class CeleryEnqueue:
    """A worker tool's ``enqueue=``: sends each job to the Celery task ``task_name``.

    Sends by name (``celery_app.send_task``, what ``Task.apply_async`` does underneath), so
    the web process need not register the task. It is synchronous: the app runs it in its
    thread pool, bounded by the tool's ``timeout``; a broker error reaches the model as
    "could not be queued".
    """

    def __init__(
        self,
        celery_app: Celery,
        *,
        task_name: str,
        options: Mapping[str, Any],
        consumer_timeout: float | None = None,
    ) -> None:
        self.celery_app = celery_app
        self.task_name = task_name
        self.options = dict(options)
        self.consumer_timeout = consumer_timeout

    def check_job_deadline(self, job_deadline: float, label: str) -> None:
        """Refuse a ``job_deadline`` not shorter than the broker's redelivery timeout (called
        when a tool is registered with this ``enqueue=``; see the module docstring)."""
        timeout = redelivery_timeout(self.celery_app, consumer_timeout=self.consumer_timeout)
        _check_deadline(timeout, job_deadline, label)

    def __call__(self, job: Job) -> None:
        """Send ``job`` (JSON) with its deadline as the message's expiry."""
        self.celery_app.send_task(
            self.task_name,
            args=(job.to_dict(),),
            serializer="json",
            expires=datetime.fromtimestamp(job.deadline, UTC),
            # What logs and monitors (Flower) show instead of the arguments: the token is a
            # credential for the call, and the arguments may be personal data.
            argsrepr=f"(<job of {job.tool_name} for call {job.call_id}>,)",
            **self.options,
        )

    def __repr__(self) -> str:
        return f"CeleryEnqueue({self.task_name!r}, {self.options!r})"


def celery_enqueue(
    celery_app: Celery,
    *,
    task_name: str = TASK_NAME,
    consumer_timeout: float | None = None,
    **options: Any,
) -> CeleryEnqueue:
    """The ``enqueue=`` of a worker tool, sending its jobs to ``task_name`` on Celery.

    ``options`` go to ``send_task`` as they are: routing (``queue``, ``exchange``,
    ``routing_key``), ``priority``, ``headers``, ``retry_policy``... (``task_routes`` in the
    app's configuration works too). The message's ``args``, ``serializer`` (JSON) and
    ``expires`` (the job deadline) are fixed: passing them is a ConfigurationError.

    Registering a tool with it checks that the tool's ``job_deadline`` is shorter than the
    broker's redelivery timeout (module docstring); ``consumer_timeout`` is RabbitMQ's, in
    seconds, when the server's differs from the default 30 minutes.
    """
    _check_app(celery_app)
    fixed = sorted(_FIXED_SEND_OPTIONS.intersection(options))
    if fixed:
        raise ConfigurationError(f"celery_enqueue sets {fixed} itself: leave them out")
    if consumer_timeout is not None and not (
        isinstance(consumer_timeout, int | float) and consumer_timeout > 0
    ):
        raise ConfigurationError("consumer_timeout must be a positive number of seconds")
    return CeleryEnqueue(
        celery_app, task_name=task_name, options=options, consumer_timeout=consumer_timeout
    )


# -- the worker's side -----------------------------------------------------------------------


class CeleryJobRunner:
    """What the task does with one job: run it, then complete its call over HTTP.

    A redelivered job of a side-effect tool asks the tool's ``reconcile`` hook first (see
    the module docstring).

    Returns the app's answer (``accepted``, ``duplicate``, ``stale``, ``conflict``), or
    ``expired`` when the job is past its deadline (nothing is sent). Raises what
    :func:`~agentfn_asgi.worker.complete_call_sync` raises once its retries are spent.
    """

    def __init__(
        self,
        tools: FunctionTools | FunctionTool,
        *,
        resources: Any = None,
        complete_url: str | None = None,
        http_client: httpx.Client | None = None,
        completion_attempts: int = 4,
        tracer_provider: TracerProvider | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tools = tools
        self.resources = resources
        self.complete_url = complete_url
        self.completion_attempts = completion_attempts
        self._clock = clock
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        self._tracer = provider.get_tracer("agentfn_asgi.integrations.celery")
        self._given_client = http_client
        # One client per process: Celery's prefork pool forks after import, and a client's
        # connections must not be shared across processes.
        self._client: httpx.Client | None = None
        self._client_pid = 0
        self._lock = threading.Lock()

    def http_client(self) -> httpx.Client:
        """The client completions go through (the given one, else one per process)."""
        if self._given_client is not None:
            return self._given_client
        with self._lock:
            if self._client is None or self._client_pid != os.getpid():
                self._client = httpx.Client(timeout=30.0)
                self._client_pid = os.getpid()
            return self._client

    def close(self) -> None:
        """Close the client this runner created (a given ``http_client`` is the caller's)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None and self._client_pid == os.getpid():
            client.close()

    def __call__(self, job: Job, *, redelivered: bool = False) -> str:
        """Run ``job`` and complete its call; see the class docstring for the answer."""
        delivery = " (redelivered)" if redelivered else ""
        if job.remaining(clock=self._clock) <= 0:
            logger.warning(
                "job for call %s of tool %s is past its deadline%s: not run, the app has "
                "failed the call",
                job.call_id,
                job.tool_name,
                delivery,
            )
            return "expired"
        url = self.complete_url or job.complete_url
        if not url:
            raise ConfigurationError(
                "the job has no complete_url: give the app public_url= (AGENTFN_PUBLIC_URL) "
                "or register_task(complete_url=...)"
            )
        logger.info("running job for call %s of tool %s%s", job.call_id, job.tool_name, delivery)
        with self._tracer.start_as_current_span(
            f"celery job {job.tool_name}", context=job.trace_context(), kind=SpanKind.CONSUMER
        ) as span:
            span.set_attribute("gen_ai.tool.name", job.tool_name)
            span.set_attribute("gen_ai.tool.call.id", job.call_id)
            span.set_attribute("gen_ai.conversation.id", job.session_id)
            completion = anyio.run(functools.partial(self._outcome, job, redelivered=redelivered))
            status = self._complete(job, url, completion)
            span.set_attribute("agentfn.completion.status", status)
        logger.info("call %s completed: %s", job.call_id, status)
        return status

    async def _outcome(self, job: Job, *, redelivered: bool) -> Completion:
        tool = self.tools if isinstance(self.tools, FunctionTool) else self.tools.get(job.tool_name)
        if redelivered and tool is not None and tool.name == job.tool_name and tool.side_effects:
            # The first delivery may have done the side effect before its worker died: never
            # run it again blindly (the app's rule for in-doubt calls).
            settled = await self._reconcile(tool, job)
            if settled is not None:
                return settled
        return await run_job(self.tools, job, resources=self.resources)

    async def _reconcile(self, tool: FunctionTool, job: Job) -> Completion | None:
        """A redelivered side-effect job: its reconcile hook's answer as a completion, or
        None when the hook says it did not run (run it now)."""
        try:
            arguments = tool.parse_arguments(job.arguments)
        except ArgumentValidationError:
            return None  # it cannot have run either: run_job reports the arguments
        remaining = job.remaining(clock=self._clock)
        with anyio.move_on_after(remaining):
            outcome = await run_reconcile(
                tool, arguments, job_context(job, resources=self.resources), time_limit=remaining
            )
            if isinstance(outcome, NotRun):
                return None
            if isinstance(outcome, Ran):
                try:
                    return Completion(True, output=encode_output(outcome.result))
                except ResultEncodingError as exc:
                    return Completion(False, error=model_error_message(exc, tool_name=tool.name))
            logger.warning(
                "redelivered job for call %s of tool %s is in doubt (%s): not run again",
                job.call_id,
                tool.name,
                outcome.reason,
            )
        return Completion(False, error=REDELIVERED_IN_DOUBT_MESSAGE)

    def _complete(self, job: Job, url: str, completion: Completion) -> str:
        if job.remaining(clock=self._clock) <= 0:
            # run_job gave up at the deadline; the app has saved the deadline failure.
            logger.warning("job for call %s ran past its deadline: not completed", job.call_id)
            return "expired"
        try:
            result = complete_call_sync(
                url,
                job.completion_token,
                success=completion.success,
                output=completion.output,
                error=completion.error,
                http_client=self.http_client(),
                attempts=self.completion_attempts,
            )
        except CompletionTokenExpiredError:
            # The app's clock passed the deadline first: it has failed the call already.
            logger.warning("the app found the job for call %s past its deadline", job.call_id)
            return "expired"
        return result.status


def register_task(
    celery_app: Celery,
    tools: FunctionTools | FunctionTool,
    *,
    name: str = TASK_NAME,
    resources: Any = None,
    complete_url: str | None = None,
    http_client: httpx.Client | None = None,
    completion_attempts: int = 4,
    tracer_provider: TracerProvider | None = None,
    **task_options: Any,
) -> Task[Any, str]:
    """Register the task that runs jobs on ``celery_app`` and return it.

    The task rebuilds the :class:`~agentfn_asgi.worker.Job`, runs its tool from ``tools``
    (:func:`~agentfn_asgi.worker.run_job`: arguments re-validated, the handler abandoned at
    the deadline, ``resources`` in its context) and posts the completion to
    ``complete_url`` (default: the job's own), retrying connection errors, 408, 429 and 5xx
    ``completion_attempts`` times. Its span (``celery job {tool}``) joins the call's trace.
    A message that is not a job is rejected without requeueing (dead-lettered where the
    queue has a dead-letter exchange).

    Configured by :data:`TASK_OPTIONS`; ``task_options`` (``rate_limit``, ``time_limit``...)
    are added, and override those at your own risk. Runs in the default prefork pool and in
    the threads pool (each job gets its own event loop).

    Refuses (ConfigurationError) a tool of ``tools`` sent by :func:`celery_enqueue` whose
    ``job_deadline`` is not shorter than the broker's redelivery timeout, with the
    configuration as it is now (:func:`check_job_deadlines`).
    """
    _check_app(celery_app)
    check_job_deadlines(tools)
    from celery import signals
    from celery.exceptions import Reject

    runner = CeleryJobRunner(
        tools,
        resources=resources,
        complete_url=complete_url,
        http_client=http_client,
        completion_attempts=completion_attempts,
        tracer_provider=tracer_provider,
    )

    def run_agent_job(task: Task[Any, str], job: object) -> str:
        try:
            parsed = Job.from_dict(job)  # type: ignore[arg-type]  # checked: ValueError
        except ValueError as exc:
            logger.error("task %s got a message that is not a job: %s", task.request.id, exc)
            raise Reject(f"not a job: {exc}", requeue=False) from exc
        redelivered = bool((task.request.delivery_info or {}).get("redelivered"))
        return runner(parsed, redelivered=redelivered)

    # The runner's client lives in the process that runs jobs: a pool process (prefork) or
    # the worker itself (threads, solo).
    def close_runner(**_: Any) -> None:
        runner.close()

    signals.worker_process_shutdown.connect(close_runner, weak=False)
    signals.worker_shutdown.connect(close_runner, weak=False)

    run_agent_job.__doc__ = f"Run one agentfn-asgi job and complete its call ({name})."
    options = {**TASK_OPTIONS, **task_options}
    # The stubs' overloads of app.task cannot type options given as a dict.
    make_task: Callable[..., Callable[[Callable[..., str]], Task[Any, str]]] = celery_app.task
    return make_task(name=name, bind=True, **options)(run_agent_job)
