"""The worker's side of worker tools (agentfn_asgi.worker): running a job like the app
would, and completing its call with retries (sync and async share one retry policy)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentfn_asgi.errors import APIConnectionError
from agentfn_asgi.messages import INTERNAL_ERROR_MESSAGE
from agentfn_asgi.testing import FakeCall, serve_app
from agentfn_asgi.tracing import trace_id_for_call
from agentfn_asgi.worker import (
    Completion,
    Job,
    complete_call,
    complete_call_sync,
    run_job,
)

from .support.jobs import app_options, next_job, queue_of_jobs, worker_tools
from .support.stack import running_stack


def fixed_job(tool_name: str, arguments: dict[str, Any]) -> Job:
    return Job(
        session_id="s",
        turn_id="t",
        call_id="c",
        tool_name=tool_name,
        arguments=arguments,
        idempotency_key="afn_k",
        completion_token="tok",
        deadline=4e9,
    )


@pytest.mark.anyio
async def test_run_job_encodes_outcomes_like_the_dispatcher() -> None:
    """Output as compact JSON; ToolError text as written; other exceptions a safe message;
    invalid arguments their field paths; an unknown tool a failure."""
    tools = worker_tools()
    ok = await run_job(tools, fixed_job("generate_report", {"topic": "q3", "pages": 2}))
    assert ok == Completion(True, '{"topic":"q3","pages":2,"key":"afn_k"}')
    refused = await run_job(tools, fixed_job("generate_report", {"topic": "refused"}))
    assert refused == Completion(False, error="that topic is off limits")
    crashed = await run_job(tools, fixed_job("generate_report", {"topic": "crash"}))
    assert crashed == Completion(False, error=INTERNAL_ERROR_MESSAGE)
    invalid = await run_job(tools, fixed_job("generate_report", {"pages": "x"}))
    assert invalid.success is False and "topic" in (invalid.error or "")
    unknown = await run_job(tools, fixed_job("nope", {}))
    assert unknown.success is False


@pytest.mark.anyio
async def test_the_workers_span_joins_the_calls_trace() -> None:
    """The job's traceparent is in the call's trace (trace_id_for_call); a worker span
    started from job.trace_context() lands in that trace, under the call's span."""
    jobs, enqueue = queue_of_jobs()
    async with running_stack(worker_tools(enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
    version, trace_id, parent_span_id, _flags = job.traceparent.split("-")
    assert (version, trace_id) == ("00", trace_id_for_call(sid, job.call_id))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("worker").start_as_current_span(
        "generate_report job", context=job.trace_context()
    ):
        pass
    provider.shutdown()
    [span] = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.parent is not None and format(span.parent.span_id, "016x") == parent_span_id


@pytest.mark.anyio
async def test_the_sync_client_completes_over_loopback() -> None:
    """complete_call_sync (for Celery/RQ workers) against the app served on 127.0.0.1."""
    jobs, enqueue = queue_of_jobs()
    async with running_stack(worker_tools(enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        async with serve_app(stack.app) as root:
            answer = await anyio.to_thread.run_sync(
                lambda: complete_call_sync(
                    root + "/calls/complete", job.completion_token, success=True, output="sync"
                )
            )
        await stack.fake.wait_idle(sid, timeout=5)
    assert answer.status == "accepted"
    assert [s.output for s in stack.fake.submissions] == ["sync"]


@pytest.mark.anyio
async def test_the_client_retries_unavailable_answers() -> None:
    """A 503 (store down, draining) is retried; the final answer is returned."""
    answers = iter([503, 503, 200])

    async def flaky(scope: Any, receive: Any, send: Any) -> None:
        status = next(answers)
        body = b'{"status":"accepted"}' if status == 200 else b'{"error":"unavailable"}'
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})

    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=flaky), base_url="http://w.test")
    async with http:
        result = await complete_call(
            "http://w.test/calls/complete", "tok", success=True, output=1, http_client=http
        )
    assert result.status == "accepted"


def _scripted(statuses: list[int | None]) -> Callable[[httpx.Request], httpx.Response]:
    """A transport handler answering each request with the next status (None: a dropped
    connection), so the sync and async clients can be driven through the same script."""
    answers = iter(statuses)

    def handler(request: httpx.Request) -> httpx.Response:
        status = next(answers)
        if status is None:
            raise httpx.ConnectError("connection refused", request=request)
        body = {"status": "accepted"} if status == 200 else {"error": "unavailable"}
        return httpx.Response(status, json=body)

    return handler


@pytest.mark.anyio
async def test_sync_and_async_completion_share_one_retry_policy() -> None:
    """Both drivers retry a 503 and a dropped connection, then return the answer; with the
    attempts used up, both raise APIConnectionError for a connection that never comes."""
    url = "http://w.test/calls/complete"
    script = [503, None, 200]
    async with httpx.AsyncClient(transport=httpx.MockTransport(_scripted(script))) as http:
        answer = await complete_call(url, "tok", success=True, output=1, http_client=http)
    assert answer.status == "accepted"
    with httpx.Client(transport=httpx.MockTransport(_scripted(script))) as sync_http:
        answer = complete_call_sync(url, "tok", success=True, output=1, http_client=sync_http)
    assert answer.status == "accepted"
    with (
        httpx.Client(transport=httpx.MockTransport(_scripted([None, None]))) as sync_http,
        pytest.raises(APIConnectionError),
    ):
        complete_call_sync(url, "tok", success=False, error="x", http_client=sync_http, attempts=2)
    async with httpx.AsyncClient(transport=httpx.MockTransport(_scripted([None, None]))) as http:
        with pytest.raises(APIConnectionError):
            await complete_call(url, "tok", success=False, error="x", http_client=http, attempts=2)
