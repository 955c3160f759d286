"""Print the OpenTelemetry spans and metrics of one demo session to the console.

Run it from the repository root (it needs the dev extra for ``opentelemetry-sdk``)::

    python -m examples.otel_console            # spans as one line each, then metrics
    python -m examples.otel_console --json     # the SDK's full JSON for every span

Everything runs in this process: ``agentfn_asgi.testing.connect`` wires ``FakeAgentsAPI``
(the Agents API, sending signed webhooks) and an ``AgentWebhookApp`` together over httpx's
ASGI transport, so nothing listens on a port. The tools are the examples' six tools
(``get_customer``, ``create_refund``, ``slow_echo`` and the others of
``agentfn_asgi.demo.tools``); content capture is on, so the call
spans carry their arguments and results.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentfn_asgi import Telemetry, trace_id_for_call
from agentfn_asgi.demo.tools import ExampleResources, Ledger, tools
from agentfn_asgi.testing import FakeCall, connect


async def play(workdir: Path, tracer_provider: TracerProvider, meter: MeterProvider) -> str:
    """Run one session (three parallel calls, then one more) and return its session id."""
    telemetry = Telemetry(
        tracer_provider=tracer_provider, meter_provider=meter, capture_content=True
    )
    async with connect(
        tools,
        store=f"sqlite:///{workdir / 'store.sqlite3'}",
        resources=ExampleResources(ledger=Ledger(workdir / "ledger.jsonl")),
        telemetry=telemetry,
    ) as connection:
        fake = connection.fake
        session_id = fake.create_session(
            [
                [
                    FakeCall("get_customer", {"customer_id": "123"}, call_id="call_customer"),
                    FakeCall(
                        "create_refund",
                        {"order_id": "ord_1", "amount_cents": 1500},
                        call_id="call_refund",
                    ),
                    FakeCall("slow_echo", {"text": "hi", "delay_ms": 50}, call_id="call_echo"),
                ],
                [FakeCall("create_refund", {"order_id": "ord_2", "amount_cents": 0})],
            ]
        )
        await fake.wait_idle(session_id, timeout=10)
        await fake.drain_webhooks()  # the last "idle" webhook, before the app stops
    return session_id


def _line(span: ReadableSpan) -> str:
    attrs = dict(span.attributes or {})
    keys = (
        "gen_ai.tool.call.id",
        "agentfn.call.source",
        "error.type",
        "agentfn.delivery.outcome",
        "agentfn.session.pending_calls",
    )
    shown = " ".join(f"{k.rsplit('.', 1)[-1]}={attrs[k]}" for k in keys if k in attrs)
    trace_id = f"{span.context.trace_id:032x}" if span.context else "?"
    kind = span.kind.name if span.kind else ""
    return f"  trace {trace_id[:12]}…  {span.name:<34} {kind:<8} {shown}"


def main(argv: list[str] | None = None) -> int:
    """Play the session and print what a trace backend would receive."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the SDK's JSON per span")
    args = parser.parse_args(argv)
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    if args.json:
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader])
    with tempfile.TemporaryDirectory() as tmp:
        session_id = asyncio.run(play(Path(tmp), provider, meter))
    spans = sorted(memory.get_finished_spans(), key=lambda s: s.start_time or 0)
    print(f"{len(spans)} spans for session {session_id}:")
    for span in spans:
        print(_line(span))
    print(f"\ncall_refund's trace id: {trace_id_for_call(session_id, 'call_refund')}")
    data = reader.get_metrics_data()
    print("\nmetrics:")
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                print(f"  {metric.name} ({metric.unit}): {len(metric.data.data_points)} series")
    provider.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
