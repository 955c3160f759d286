"""What the web app and the Celery workers share: the Celery app and one tool registry.

The registry is the shared tools plus ``generate_report``, registered with
``enqueue=celery_enqueue(...)``: the web app sends its calls to Celery instead of running
them, and the workers (``worker.py``) run them from this same registry. One definition, one
schema, one behaviour.

Environment (read by the app and the workers alike):

- ``CELERY_BROKER_URL``: default ``amqp://guest:guest@127.0.0.1:5672//`` (RabbitMQ);
  ``redis://127.0.0.1:6379/0`` works too;
- ``EXAMPLE_JOBS_QUEUE``: the queue jobs go to and workers consume, default ``agentfn.jobs``;
- ``EXAMPLE_JOB_DEADLINE``: seconds a job may take before its call fails, default 600.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import anyio
from celery import Celery

from agentfn_asgi import ToolContext, ToolError
from agentfn_asgi.demo.tools import build_tools
from agentfn_asgi.integrations.celery import celery_enqueue

__all__ = ["BROKER_URL", "JOBS_QUEUE", "JOB_DEADLINE", "celery_app", "generate_report", "tools"]

logger = logging.getLogger("examples.celery_worker")

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
JOBS_QUEUE = os.environ.get("EXAMPLE_JOBS_QUEUE", "agentfn.jobs")
JOB_DEADLINE = float(os.environ.get("EXAMPLE_JOB_DEADLINE", "600"))

celery_app = Celery("agentfn_example", broker=BROKER_URL)
celery_app.conf.update(
    # Workers consume this queue without -Q; the app sends there (queue= below).
    task_default_queue=JOBS_QUEUE,
    # With acks_late, a prefetched job waits behind a slow one: take one job at a time.
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    broker_transport_options=(
        # Redis redelivers a job unacknowledged for visibility_timeout seconds even if its
        # worker is alive: keep it above the job deadline, or a slow job runs twice.
        {"visibility_timeout": JOB_DEADLINE + 60}
        if BROKER_URL.startswith(("redis://", "rediss://"))
        # RabbitMQ confirms each job: a job the broker did not take fails the call at once
        # ("could not be queued") instead of at its deadline.
        else {"confirm_publish": True}
    ),
)


async def generate_report(ctx: ToolContext, topic: str, pages: int = 1) -> dict[str, Any]:
    """Write a short report on a topic. Runs in a background worker; takes a while.

    Args:
        topic: What the report is about.
        pages: How many pages to write (1-20).
    """
    if not 1 <= pages <= 20:
        raise ToolError(f"pages must be between 1 and 20, got {pages}")
    logger.info("writing a %d-page report on %s for call %s", pages, topic, ctx.call_id)
    await anyio.sleep(0.05 * pages)  # stands in for slow work
    # Named after the call's idempotency key: a job run again writes the same report.
    report_id = "rep_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
    return {
        "report_id": report_id,
        "topic": topic,
        "pages": pages,
        "summary": f"A {pages}-page report on {topic}.",
    }


tools = build_tools()
# `timeout` bounds sending the job to the broker; `job_deadline` bounds the whole job.
tools.add(
    generate_report,
    enqueue=celery_enqueue(celery_app, queue=JOBS_QUEUE),
    job_deadline=JOB_DEADLINE,
    timeout=10,
)
