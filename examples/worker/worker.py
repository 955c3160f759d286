"""A worker process: takes ``generate_report`` jobs from Redis and completes them over HTTP.

::

    REDIS_URL=redis://127.0.0.1:6379/0 WORKER_QUEUE=agentfn:jobs python -m examples.worker.worker

Each job carries its completion URL (the app's ``AGENTFN_PUBLIC_URL``) and a signed,
expiring token, so the worker needs no secret and no configuration of the app. Its span
joins the call's trace through the job's ``traceparent`` (when an OpenTelemetry SDK is set
up). ``EXAMPLE_WORKER_CRASH=1`` makes it SIGKILL itself right after taking a job: the test
uses it to show the job deadline turning a lost job into a failed call.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import httpx
from opentelemetry import trace

from agentfn_asgi.errors import AgentFnError
from agentfn_asgi.tools import FunctionTools
from agentfn_asgi.worker import complete_job, run_job
from examples.worker.jobs import RedisQueue, generate_report

logger = logging.getLogger("examples.worker")
tracer = trace.get_tracer("examples.worker")


async def work(queue: RedisQueue, *, crash: bool = False) -> None:
    """Take jobs until SIGTERM/SIGINT; each is run, then completed (or left to its deadline)."""
    tools = FunctionTools()
    tools.add(generate_report)  # the same function, run here instead of enqueued
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with httpx.AsyncClient(timeout=30) as http:
        logger.info("worker ready on %s", queue.key)
        while not stop.is_set():
            job = await queue.pop(wait=1.0)
            if job is None:
                continue
            logger.info("took job for call %s (attempt %d)", job.call_id, job.attempt)
            with tracer.start_as_current_span(
                f"worker {job.tool_name}", context=job.trace_context()
            ):
                if crash:
                    os.kill(os.getpid(), signal.SIGKILL)
                completion = await run_job(tools, job)
                try:
                    result = await complete_job(job, completion, http_client=http)
                except AgentFnError as exc:
                    # Expired token, app unreachable after retries: the app's job deadline
                    # settles the call; nothing more to do here.
                    logger.warning("could not complete call %s: %s", job.call_id, exc)
                    continue
            logger.info("call %s completed: %s", job.call_id, result.status)
    await queue.aclose()


def main() -> None:
    """Entry point: ``python -m examples.worker.worker``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(work(RedisQueue.from_env(), crash=os.environ.get("EXAMPLE_WORKER_CRASH") == "1"))


if __name__ == "__main__":
    main()
