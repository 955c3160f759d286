"""What the web app and the worker share: the queued tool and the Redis queue.

``generate_report`` is a plain function. The web app registers it with ``enqueue=`` (so
calls become jobs on a Redis list); the worker registers the same function without it and
runs it with :func:`agentfn_asgi.worker.run_job`. One definition, one schema, one behaviour.

Environment: ``REDIS_URL`` (default ``redis://127.0.0.1:6379/0``), ``WORKER_QUEUE`` (the
list's key, default ``agentfn:jobs``), ``EXAMPLE_JOB_DEADLINE`` (seconds a job may take
before the call fails, default 600).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import anyio
import redis.asyncio as aioredis

from agentfn_asgi.errors import ToolError
from agentfn_asgi.tools import ToolContext
from agentfn_asgi.worker import Job

__all__ = ["RedisQueue", "generate_report", "job_deadline"]


async def generate_report(ctx: ToolContext, topic: str, pages: int = 1) -> dict[str, Any]:
    """Write a short report on a topic. Runs in a background worker; takes a while.

    Args:
        topic: What the report is about.
        pages: How many pages to write (1-20).
    """
    if not 1 <= pages <= 20:
        raise ToolError(f"pages must be between 1 and 20, got {pages}")
    await anyio.sleep(0.05 * pages)  # stands in for slow work
    # Named after the call's idempotency key: a retried job writes the same report.
    report_id = "rep_" + hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:12]
    return {
        "report_id": report_id,
        "topic": topic,
        "pages": pages,
        "summary": f"A {pages}-page report on {topic}.",
    }


def job_deadline() -> float:
    """``EXAMPLE_JOB_DEADLINE`` seconds (default 600)."""
    return float(os.environ.get("EXAMPLE_JOB_DEADLINE", "600"))


class RedisQueue:
    """A Redis list of JSON jobs: the app ``LPUSH``es, workers ``BRPOP``.

    Deliberately simple: a worker that dies holding a job loses it, and the app's job
    deadline turns that into a failed call the model is told about. (Redis' reliable-queue
    pattern, ``BLMOVE`` to a processing list, would let another worker retry it instead.)
    """

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        # Any: the installed types-redis stubs predate redis 5's asyncio API (``aclose``).
        self._client: Any = None

    @classmethod
    def from_env(cls) -> RedisQueue:
        """The queue named by ``REDIS_URL`` and ``WORKER_QUEUE``."""
        return cls(
            os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
            os.environ.get("WORKER_QUEUE", "agentfn:jobs"),
        )

    @property
    def client(self) -> Any:
        # Created on first use, inside the event loop that will use it.
        if self._client is None:
            self._client = aioredis.Redis.from_url(self.url)
        return self._client

    async def push(self, job: Job) -> None:
        """The tool's ``enqueue``: one JSON job onto the list."""
        await self.client.lpush(self.key, job.to_json())

    async def pop(self, *, wait: float = 1.0) -> Job | None:
        """The next job, or None after ``wait`` seconds without one."""
        item = await self.client.brpop([self.key], timeout=wait)
        if item is None:
            return None
        return Job.from_json(item[1])

    async def aclose(self) -> None:
        """Release the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
