"""The Celery worker's module: the shared Celery app, with the task that runs jobs.

::

    celery -A examples.celery_worker.worker:celery_app worker --loglevel INFO

It consumes ``EXAMPLE_JOBS_QUEUE`` (default ``agentfn.jobs``) on ``CELERY_BROKER_URL``. Each
job carries its completion URL (the app's ``AGENTFN_PUBLIC_URL``) and a signed, expiring
token, so a worker needs no secret and no configuration of the app. Run as many as you like:
a job whose worker dies mid-job is delivered again to another one (see docs/workers.md,
"Workers on Celery" for what that means for side effects).
"""

from __future__ import annotations

from agentfn_asgi.integrations.celery import register_task
from examples.celery_worker.tools import celery_app, tools

__all__ = ["celery_app", "run_agent_job"]

# The registry the app uses: its generate_report runs here instead of being enqueued.
run_agent_job = register_task(celery_app, tools)
