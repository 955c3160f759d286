"""Spans and metrics of agentfn_asgi.tracing, read back through the SDK's in-memory parts.

Every test injects its own providers: nothing here touches the global OpenTelemetry state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, StatusCode

from agentfn_asgi import __version__
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.tracing import Telemetry, trace_id_for_call
from agentfn_asgi.tracing.names import CONTENT_LIMIT


@dataclass
class Otel:
    """One isolated SDK setup: a tracer provider, a meter provider and their readers."""

    tracer_provider: TracerProvider
    exporter: InMemorySpanExporter
    meter_provider: MeterProvider
    reader: InMemoryMetricReader

    def telemetry(self, **options: Any) -> Telemetry:
        return Telemetry(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **options
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def span(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]

    def metrics(self) -> dict[str, Metric]:
        data = self.reader.get_metrics_data()
        found: dict[str, Metric] = {}
        if data is None:  # nothing recorded yet
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                assert scope_metrics.scope.name == "agentfn_asgi"
                for metric in scope_metrics.metrics:
                    found[metric.name] = metric
        return found


def _make_otel() -> Otel:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    return Otel(tracer_provider, exporter, MeterProvider(metric_readers=[reader]), reader)


@pytest.fixture
def otel() -> Iterator[Otel]:
    """A fresh, injected SDK setup per test."""
    setup = _make_otel()
    yield setup
    setup.tracer_provider.shutdown()
    setup.meter_provider.shutdown()


def _call(telemetry: Telemetry, **overrides: Any) -> Any:
    options: dict[str, Any] = {
        "tool_name": "get_weather",
        "session_id": "sess_1",
        "turn_id": "turn_1",
        "call_id": "call_1",
        "attempt": 1,
    }
    options.update(overrides)
    return telemetry.tool_call(**options)


def _points(metric: Metric) -> list[Any]:
    return list(metric.data.data_points)


def test_tool_call_span_follows_genai_conventions(otel: Otel) -> None:
    """The execute_tool span: name, INTERNAL kind, GenAI attributes, turn and attempt, scope."""
    telemetry = otel.telemetry()
    with _call(telemetry, attempt=2, description="Weather for a city.") as call:
        call.set_source("ran")
    span = otel.span("execute_tool get_weather")
    assert span.kind is SpanKind.INTERNAL
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Weather for a city.",
        "gen_ai.conversation.id": "sess_1",
        "openai.agents.turn_id": "turn_1",
        "agentfn.call.attempt": 2,
        "agentfn.call.source": "ran",
    }
    assert span.status.status_code is StatusCode.UNSET
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == "agentfn_asgi"
    assert span.instrumentation_scope.version == __version__


def test_call_trace_id_is_derived_from_session_and_call(otel: Otel) -> None:
    """Two replicas (separate providers) put attempts of one call in the same, documented
    trace, as siblings under one virtual remote parent; another call gets another trace."""
    other = _make_otel()
    with _call(otel.telemetry(), attempt=1):
        pass
    with _call(other.telemetry(), attempt=2):
        pass
    with _call(otel.telemetry(), call_id="call_2"):
        pass
    first, second = otel.spans()[0], other.spans()[0]
    expected = trace_id_for_call("sess_1", "call_1")
    assert format(first.context.trace_id, "032x") == expected
    assert format(second.context.trace_id, "032x") == expected
    assert first.parent is not None and second.parent is not None
    assert first.parent == second.parent
    assert first.parent.is_remote and first.parent.span_id != 0
    assert first.context.span_id != second.context.span_id
    assert otel.spans()[1].context.trace_id != first.context.trace_id


def test_trace_id_for_call_format() -> None:
    """32 lowercase hex digits, stable, and sensitive to both ids (no separator collisions)."""
    value = trace_id_for_call("sess_1", "call_1")
    assert len(value) == 32
    assert value == value.lower()
    int(value, 16)
    assert value == trace_id_for_call("sess_1", "call_1")
    assert trace_id_for_call("a", "bc") != trace_id_for_call("ab", "c")
    assert trace_id_for_call("sess_2", "call_1") != value


def test_call_span_links_to_its_delivery(otel: Otel) -> None:
    """A delivery remembered (an explicit step: setting an outcome remembers nothing) is
    found again by id; the call span it causes carries a link to it."""
    telemetry = otel.telemetry()
    with telemetry.delivery(delivery_id="msg_1") as delivery:
        delivery.set_outcome("accepted")
    assert telemetry.link_for_delivery("msg_1") is None
    telemetry.remember_delivery("msg_1", delivery.link)
    link = telemetry.link_for_delivery("msg_1")
    assert link is not None
    with _call(telemetry, delivery_link=link):
        pass
    delivery_span = otel.span("agentfn.webhook.delivery")
    call_span = otel.span("execute_tool get_weather")
    assert [ln.context for ln in call_span.links] == [delivery_span.context]
    assert call_span.context.trace_id != delivery_span.context.trace_id


def test_call_span_is_current_inside_the_block(otel: Otel) -> None:
    """Spans the handler makes nest under the execute_tool span."""
    telemetry = otel.telemetry()
    tracer = otel.tracer_provider.get_tracer("handler")
    with _call(telemetry) as call, tracer.start_as_current_span("db query"):
        pass
    assert otel.span("db query").parent == call.context


def test_call_error_sets_status_and_error_type(otel: Otel) -> None:
    """A classified failure: error.type, status ERROR, exception type and frames only."""
    telemetry = otel.telemetry()
    with _call(telemetry) as call:
        try:
            secret = "sk-" + "secret"  # built at run time: the source line must not show it
            raise ValueError(f"api key {secret} is wrong")
        except ValueError as exc:
            call.set_error("handler_error", "Handler failed: api key sk-secret", exc)
    span = otel.span("execute_tool get_weather")
    assert span.attributes is not None
    assert span.attributes["error.type"] == "handler_error"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "handler_error"
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes is not None
    assert event.attributes["exception.type"] == "ValueError"
    assert "test_tracing.py" in str(event.attributes["exception.stacktrace"])
    assert "sk-secret" not in json.dumps(
        [dict(span.attributes), dict(event.attributes), span.status.description]
    )


def test_call_error_message_recorded_only_with_capture(otel: Otel) -> None:
    """With content capture on, the status description and exception message are kept."""
    telemetry = otel.telemetry(capture_content=True)
    with _call(telemetry) as call:
        call.set_error("timeout", "timed out after 3s", TimeoutError("slow"))
    span = otel.span("execute_tool get_weather")
    assert span.status.description == "timed out after 3s"
    (event,) = span.events
    assert event.attributes is not None
    assert event.attributes["exception.message"] == "slow"


def test_escaping_exception_marks_the_call_failed(otel: Otel) -> None:
    """An exception leaving the block: qualified class name as error.type, re-raised."""
    telemetry = otel.telemetry()
    with pytest.raises(KeyError), _call(telemetry):
        raise KeyError("x")
    with pytest.raises(asyncio.CancelledError), _call(telemetry, call_id="call_2"):
        raise asyncio.CancelledError
    first, second = otel.spans()
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["error.type"] == "KeyError"
    assert second.attributes["error.type"] == "cancelled"
    assert first.status.status_code is StatusCode.ERROR


def test_content_not_captured_by_default(otel: Otel) -> None:
    """Arguments and results stay out of spans unless the user opts in."""
    telemetry = otel.telemetry()
    assert telemetry.capture_content is False
    with _call(telemetry) as call:
        call.set_arguments({"city": "Paris"})
        call.set_result("sunny")
    attributes = otel.span("execute_tool get_weather").attributes or {}
    assert "gen_ai.tool.call.arguments" not in attributes
    assert "gen_ai.tool.call.result" not in attributes


def test_content_captured_when_opted_in(otel: Otel) -> None:
    """Opted in: arguments and results as JSON text (strings kept), long values cut."""
    telemetry = otel.telemetry(capture_content=True)
    with _call(telemetry) as call:
        call.set_arguments({"city": "Zürich"})
        call.set_result("x" * (CONTENT_LIMIT + 100))
    with _call(telemetry, call_id="call_2") as call:
        call.set_arguments('{"city":"Paris"}')
        call.set_result({1, 2})  # not JSON: falls back to str(), never raises
    first, second = otel.spans()
    assert first.attributes is not None and second.attributes is not None
    assert json.loads(str(first.attributes["gen_ai.tool.call.arguments"])) == {"city": "Zürich"}
    result = str(first.attributes["gen_ai.tool.call.result"])
    assert result.startswith("x" * CONTENT_LIMIT)
    assert result.endswith("[truncated 100 bytes]")
    assert second.attributes["gen_ai.tool.call.arguments"] == '{"city":"Paris"}'
    assert second.attributes["gen_ai.tool.call.result"] == '"{1, 2}"'


def test_content_capture_is_off_unless_asked(otel: Otel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Telemetry reads no environment: content is captured only when asked for (the app
    asks when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says so; tests/test_config.py)."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    assert otel.telemetry().capture_content is False
    assert otel.telemetry(capture_content=True).capture_content is True


def test_delivery_span_outcomes(otel: Otel) -> None:
    """Delivery spans: name, kind, id, session, outcome and reason; rejected stays UNSET,
    unavailable is ERROR; outcomes are counted once each."""
    telemetry = otel.telemetry()
    with telemetry.delivery(delivery_id="msg_1") as delivery:
        delivery.set_session("sess_1")
        delivery.set_event_type("agent.session.action_required")
        delivery.set_outcome("accepted")
    with telemetry.delivery(delivery_id="msg_2") as delivery:
        delivery.set_outcome("rejected", "bad_signature")
    with telemetry.delivery(delivery_id=None) as delivery:
        delivery.set_outcome("unavailable", "store_unavailable")
    accepted, rejected, unavailable = otel.spans()
    assert accepted.name == "agentfn.webhook.delivery"
    assert accepted.kind is SpanKind.INTERNAL
    assert dict(accepted.attributes or {}) == {
        "agentfn.webhook.id": "msg_1",
        "gen_ai.conversation.id": "sess_1",
        "agentfn.webhook.event_type": "agent.session.action_required",
        "agentfn.delivery.outcome": "accepted",
    }
    assert rejected.attributes is not None
    assert rejected.attributes["agentfn.delivery.reason"] == "bad_signature"
    assert rejected.status.status_code is StatusCode.UNSET
    assert unavailable.attributes is not None
    assert unavailable.status.status_code is StatusCode.ERROR
    assert unavailable.attributes["error.type"] == "store_unavailable"
    assert telemetry.link_for_delivery("msg_2") is None  # nothing is remembered implicitly
    points = _points(otel.metrics()["agentfn.webhook.deliveries"])
    counted = {
        (p.attributes["agentfn.delivery.outcome"], p.attributes.get("agentfn.delivery.reason")): (
            p.value
        )
        for p in points
    }
    assert counted == {
        ("accepted", None): 1,
        ("rejected", "bad_signature"): 1,
        ("unavailable", "store_unavailable"): 1,
    }


def test_delivery_span_exposes_a_link_to_itself(otel: Otel) -> None:
    """DeliverySpan.link points at the delivery span; an escaping exception counts 'error'."""
    telemetry = otel.telemetry()
    links: list[Link | None] = []

    def receive() -> None:
        with telemetry.delivery(delivery_id="msg_1") as delivery:
            links.append(delivery.link)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        receive()
    (link,) = links
    span = otel.span("agentfn.webhook.delivery")
    assert link is not None
    assert link.context == span.context
    assert span.status.status_code is StatusCode.ERROR
    (point,) = _points(otel.metrics()["agentfn.webhook.deliveries"])
    assert dict(point.attributes) == {"agentfn.delivery.outcome": "error"}


def test_delivery_links_are_bounded(otel: Otel) -> None:
    """The delivery→link memory keeps only the most recent entries."""
    telemetry = otel.telemetry(link_cache_size=2)
    with telemetry.delivery(delivery_id="seed") as delivery:
        link = delivery.link
    for delivery_id in ("a", "b", "c"):
        telemetry.remember_delivery(delivery_id, link)
    assert telemetry.link_for_delivery("a") is None
    assert telemetry.link_for_delivery("b") is link
    assert telemetry.link_for_delivery("c") is link
    assert telemetry.link_for_delivery(None) is None


def test_session_read_span(otel: Otel) -> None:
    """GET session: CLIENT, conversation id, pending calls, retries as events, delivery link."""
    telemetry = otel.telemetry()
    with telemetry.delivery(delivery_id="msg_1") as delivery:
        pass
    with telemetry.session_read(session_id="sess_1", delivery_link=delivery.link) as read:
        telemetry.client_retry(_Retry(1, 0.25, "status", 503))
        read.set_attribute("agentfn.session.pending_calls", 2)
    span = otel.span("GET session")
    assert span.kind is SpanKind.CLIENT
    assert dict(span.attributes or {}) == {
        "gen_ai.conversation.id": "sess_1",
        "agentfn.session.pending_calls": 2,
    }
    assert [ev.name for ev in span.events] == ["retry"]
    assert [ln.context for ln in span.links] == [otel.span("agentfn.webhook.delivery").context]


@dataclass(frozen=True)
class _Retry:
    attempt: int
    delay: float
    reason: str
    status: int | None


def test_submission_span_under_call_span_with_retries(otel: Otel) -> None:
    """Inside the call span the submission is its child; client retries become events."""
    telemetry = otel.telemetry()
    with (
        _call(telemetry) as call,
        telemetry.submission(session_id="sess_1", turn_id="turn_1", call_id="call_1") as submit,
    ):
        telemetry.client_retry(_Retry(1, 0.5, "status", 502))
        submit.retry(2, 1.0, "connection", None)
        submit.set_outcome("submitted")
    telemetry.client_retry(_Retry(3, 1.0, "status", 502))  # no span waiting: ignored
    span = otel.span("POST session events")
    assert span.kind is SpanKind.CLIENT
    assert span.parent == call.context
    assert dict(span.attributes or {}) == {
        "gen_ai.conversation.id": "sess_1",
        "gen_ai.tool.call.id": "call_1",
        "openai.agents.turn_id": "turn_1",
        "agentfn.submission.outcome": "submitted",
        "agentfn.submission.attempts": 3,
    }
    assert submit.attempts == 3
    assert [dict(ev.attributes or {}) for ev in span.events] == [
        {
            "agentfn.retry.attempt": 1,
            "agentfn.retry.delay": 0.5,
            "agentfn.retry.reason": "status",
            "http.response.status_code": 502,
        },
        {
            "agentfn.retry.attempt": 2,
            "agentfn.retry.delay": 1.0,
            "agentfn.retry.reason": "connection",
        },
    ]


def test_resubmission_lands_in_the_call_trace(otel: Otel) -> None:
    """Outside any call span (recovery after a restart) the submission joins the call's
    trace under its virtual parent; an explicit parent wins; failure is submit_error."""
    telemetry = otel.telemetry()
    with _call(telemetry) as call:  # an attempt that ran earlier (here or on another replica)
        pass
    tracer = otel.tracer_provider.get_tracer("host")
    with tracer.start_as_current_span("sweep"):
        with telemetry.submission(session_id="sess_1", turn_id="turn_1", call_id="call_1") as s:
            s.set_outcome("failed")
        with telemetry.submission(
            session_id="sess_1", turn_id="turn_1", call_id="call_1", parent=call.context
        ) as s:
            s.set_outcome("stale")
    failed, stale = (span for span in otel.spans() if span.name == "POST session events")
    call_span = otel.span("execute_tool get_weather")
    assert format(failed.context.trace_id, "032x") == trace_id_for_call("sess_1", "call_1")
    assert failed.parent == call_span.parent  # a sibling of the attempts, not under "sweep"
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == "submit_error"
    assert failed.status.status_code is StatusCode.ERROR
    assert stale.parent == call_span.context
    assert stale.status.status_code is StatusCode.UNSET


def test_metrics_names_units_and_attributes(otel: Otel) -> None:
    """Documented metric names, units and attributes for calls and submissions."""
    telemetry = otel.telemetry()
    with _call(telemetry) as call:
        call.set_source("ran")
    with _call(telemetry, call_id="call_2") as call:
        call.set_source("ran")
        call.set_error("timeout")
    telemetry.record_submission(attempts=2, delivery_to_submit_seconds=1.5)
    telemetry.record_submission(attempts=1, delivery_to_submit_seconds=None)
    found = otel.metrics()
    calls = found["agentfn.tool.calls"]
    assert calls.unit == "{call}"
    assert sorted(
        (p.attributes["agentfn.call.outcome"], p.value, p.attributes["gen_ai.tool.name"])
        for p in _points(calls)
    ) == [("success", 1, "get_weather"), ("timeout", 1, "get_weather")]
    duration = found["gen_ai.execute_tool.duration"]
    assert duration.unit == "s"
    by_error = {p.attributes.get("error.type"): p for p in _points(duration)}
    assert set(by_error) == {None, "timeout"}
    assert by_error["timeout"].attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "agentfn.call.source": "ran",
        "error.type": "timeout",
    }
    assert by_error[None].count == 1
    attempts = found["agentfn.submission.attempts"]
    assert attempts.unit == "{attempt}"
    (point,) = _points(attempts)
    assert (point.count, point.sum) == (2, 3)
    latency = found["agentfn.delivery_to_result.duration"]
    assert latency.unit == "s"
    (point,) = _points(latency)
    assert (point.count, point.sum) == (1, 1.5)


def test_oldest_pending_gauge(otel: Otel) -> None:
    """The gauge reports the largest age of its sources; None and failing sources are skipped."""
    telemetry = otel.telemetry()
    ages: list[float | None] = [None]

    def broken() -> float | None:
        raise RuntimeError("store down")

    telemetry.observe_pending(lambda: ages[0])
    telemetry.observe_pending(broken)
    assert "agentfn.calls.oldest_pending.age" not in otel.metrics()
    ages[0] = 42.0
    telemetry.observe_pending(lambda: 7.0)
    gauge = otel.metrics()["agentfn.calls.oldest_pending.age"]
    assert gauge.unit == "s"
    assert [p.value for p in _points(gauge)] == [42.0]


class _BrokenProcessor(SpanProcessor):
    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("exporter bug")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("exporter bug")


def test_broken_span_processor_never_breaks_a_call(caplog: pytest.LogCaptureFixture) -> None:
    """Host span processors are foreign code: their exceptions are logged, not raised."""
    provider = TracerProvider()
    provider.add_span_processor(_BrokenProcessor())
    telemetry = Telemetry(tracer_provider=provider, meter_provider=MeterProvider())
    with _call(telemetry) as call:
        call.set_source("ran")
    assert "starting span" in caplog.text


def test_without_providers_nothing_raises() -> None:
    """With the global (unconfigured, no-op) providers every operation is a cheap no-op."""
    telemetry = Telemetry(capture_content=True)
    with telemetry.delivery(delivery_id="msg_1") as delivery:
        delivery.set_session("sess_1")
        delivery.set_outcome("accepted")
    assert delivery.link is None
    telemetry.remember_delivery("msg_1", delivery.link)
    assert telemetry.link_for_delivery("msg_1") is None
    with telemetry.session_read(session_id="sess_1") as read:
        read.set_pending_calls(1)
        telemetry.client_retry(_Retry(1, 0.1, "status", 503))
    with _call(telemetry) as call:
        call.set_source("ran")
        call.set_arguments({"a": 1})
        call.set_result("ok")
        call.set_error("handler_error", "boom", ValueError("boom"))
        with telemetry.submission(session_id="sess_1", turn_id="turn_1", call_id="call_1") as s:
            s.retry(1, 0.1, "status", 500)
            s.set_outcome("submitted")
    telemetry.record_submission(attempts=2, delivery_to_submit_seconds=0.3)
    telemetry.observe_pending(lambda: 1.0)


@pytest.mark.anyio
async def test_client_retries_reach_the_span_being_waited_on(otel: Otel) -> None:
    """AgentsClient(on_retry=telemetry.client_retry): the real client's retries land as events
    on the read or submission span around the request (found through the context)."""
    statuses = iter([503, 200, 502, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(statuses)
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "busy"}})
        if request.method == "GET":
            return httpx.Response(200, json={"id": "sess_1", "status": "running"})
        return httpx.Response(200, json={})

    async def no_sleep(_: float) -> None:
        return None

    telemetry = otel.telemetry()
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with AgentsClient(
        api_key="sk-test",
        base_url="http://127.0.0.1:9/v1",
        http_client=http,
        on_retry=telemetry.client_retry,
        sleep=no_sleep,
    ) as client:
        with telemetry.session_read(session_id="sess_1"):
            await client.retrieve_session("sess_1")
        with telemetry.submission(session_id="sess_1", turn_id="turn_1", call_id="call_1") as s:
            await client.submit_raw_events("sess_1", b'{"events":[]}', idempotency_key="k")
            s.set_outcome("submitted")
    await http.aclose()
    read, submit = otel.span("GET session"), otel.span("POST session events")
    assert [(ev.attributes or {}).get("http.response.status_code") for ev in read.events] == [503]
    assert [(ev.attributes or {}).get("http.response.status_code") for ev in submit.events] == [502]
    assert submit.attributes is not None
    assert submit.attributes["agentfn.submission.attempts"] == 2


@pytest.mark.anyio
async def test_a_cancelled_attempt_says_why_on_its_span(otel: Otel) -> None:
    """The attempt stopped because its turn was cancelled: error.type cancelled and the
    reason, through the real app and the fake."""
    import anyio

    from agentfn_asgi.testing import FakeCall
    from agentfn_asgi.tools import FunctionTools

    from .support.stack import running_stack

    tools = FunctionTools()
    started = anyio.Event()

    @tools.function
    async def wait_long() -> str:
        """Wait a long time."""
        started.set()
        await anyio.sleep(3600)
        return "never"

    async with running_stack(tools, telemetry=otel.telemetry()) as stack:
        sid = stack.fake.create_session([[FakeCall("wait_long", {}, "c1")]])
        with anyio.fail_after(10):
            await started.wait()
            stack.fake.cancel_turn(sid)
            while not [s for s in otel.spans() if s.name == "execute_tool wait_long"]:
                await anyio.sleep(0.02)
    span = otel.span("execute_tool wait_long")
    assert span.attributes is not None and span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "cancelled"
    assert span.attributes["agentfn.call.cancel_reason"] == (
        "the turn was cancelled; stopped while it ran"
    )
