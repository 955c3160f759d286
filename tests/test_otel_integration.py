"""Tracing through the real app and dispatcher, with the OpenTelemetry SDK (issue 6).

Unit tests of the span helpers live in test_tracing.py; these pin what a user sees in a
trace backend when the whole stack runs, including across two app instances.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from agentfn_asgi import FunctionTools, Telemetry, ToolError, trace_id_for_call
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.testing import (
    Connection,
    FakeAgentsAPI,
    FakeCall,
    action_required_event,
    signed_delivery,
)
from examples import otel_console

from .support.stack import API_KEY, SECRET, running_stack

SETTINGS = DispatchSettings(
    lease_seconds=0.3, recovery_interval=0.1, recovery_grace=0.1, retry_base=0.05
)


def _recorder() -> tuple[Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Telemetry(tracer_provider=provider), exporter


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _tools(counter: dict[str, int]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def get_customer(customer_id: str) -> dict[str, bool]:
        """Look up a customer by ID."""
        counter["runs"] = counter.get("runs", 0) + 1
        return {"found": customer_id == "123"}

    @tools.function
    def refuse() -> str:
        """Always refuses."""
        raise ToolError("no")

    return tools


async def _trigger(stack: Connection, session_id: str) -> None:
    body, headers = signed_delivery(SECRET, action_required_event(session_id))
    assert (await stack.post_webhook(body, headers)).status_code == 200


@pytest.mark.anyio
async def test_one_trace_per_call_across_two_app_instances(tmp_path: Path) -> None:
    """App 1 runs the call but cannot submit; app 2 (same SQLite file, another tracer
    provider, as a restarted replica would have) resubmits the saved result. Both attempts'
    ``execute_tool`` spans share the trace id derived from (session, call)."""
    db = f"sqlite:///{tmp_path / 'calls.sqlite3'}"
    counter: dict[str, int] = {}
    first_telemetry, first_spans = _recorder()
    second_telemetry, second_spans = _recorder()
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake:
        fake.fail_next("submit", 1000, 503)
        async with running_stack(
            _tools(counter), store=db, settings=SETTINGS, fake=fake, telemetry=first_telemetry
        ) as first:
            sid = fake.create_session(
                [[FakeCall("get_customer", {"customer_id": "123"}, call_id="c1")]]
            )
            await _trigger(first, sid)
            with anyio.fail_after(5):
                while not await first.store.unsubmitted_results(due_before=2e9):
                    await anyio.sleep(0.02)
        fake.faults.failures["submit"].clear()
        async with running_stack(
            _tools(counter), store=db, settings=SETTINGS, fake=fake, telemetry=second_telemetry
        ):
            await fake.wait_idle(sid, timeout=5)
    assert counter["runs"] == 1
    expected = trace_id_for_call(sid, "c1")
    [ran] = _named(first_spans, "execute_tool get_customer")
    [saved] = _named(second_spans, "execute_tool get_customer")
    for span in (ran, saved):
        assert span.context is not None
        assert f"{span.context.trace_id:032x}" == expected
        assert span.kind is SpanKind.INTERNAL
        attrs = dict(span.attributes or {})
        assert attrs["gen_ai.operation.name"] == "execute_tool"
        assert attrs["gen_ai.tool.name"] == "get_customer"
        assert attrs["gen_ai.tool.call.id"] == "c1"
        assert attrs["gen_ai.tool.type"] == "function"
        assert attrs["gen_ai.conversation.id"] == sid
        assert "gen_ai.tool.call.arguments" not in attrs  # content capture is off
    assert dict(ran.attributes or {})["agentfn.call.source"] == "ran"
    assert dict(saved.attributes or {})["agentfn.call.source"] == "saved"
    # The first attempt links back to the delivery that caused it.
    [delivery] = [
        s
        for s in _named(first_spans, "agentfn.webhook.delivery")
        if dict(s.attributes or {}).get("agentfn.delivery.outcome") == "accepted"
    ]
    assert delivery.context is not None
    assert [link.context.span_id for link in ran.links] == [delivery.context.span_id]
    # Submissions of both instances sit in the call's trace; the first ones failed.
    submits = _named(first_spans, "POST session events") + _named(
        second_spans, "POST session events"
    )
    assert {f"{s.context.trace_id:032x}" for s in submits if s.context} == {expected}
    assert submits[-1].status.status_code is not StatusCode.ERROR


@pytest.mark.anyio
async def test_a_failed_call_sets_error_type_and_status() -> None:
    """A ToolError marks its execute_tool span ERROR with error.type=tool_error."""
    telemetry, spans = _recorder()
    async with running_stack(_tools({}), telemetry=telemetry) as stack:
        sid = stack.fake.create_session([[FakeCall("refuse", {}, call_id="r1")]])
        await stack.fake.wait_idle(sid, timeout=5)
    [span] = _named(spans, "execute_tool refuse")
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "tool_error"
    reads = _named(spans, "GET session")
    assert reads
    assert all(s.kind is SpanKind.CLIENT for s in reads)


def test_the_console_example_prints_the_spans(capsys: pytest.CaptureFixture[str]) -> None:
    """examples/otel_console.py plays a session and prints its spans and metrics."""
    assert otel_console.main([]) == 0
    out = capsys.readouterr().out
    assert "execute_tool create_refund" in out
    assert "POST session events" in out
    assert "gen_ai.execute_tool.duration" in out
