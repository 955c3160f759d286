"""Shared by the worker-tool tests (tests/test_jobs.py, tests/test_worker.py): a registry with
a queued tool, an in-memory job queue, and ways to wait for a call's record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import anyio

from agentfn_asgi.calls.records import CallKey, CallRecord, CallState, Job
from agentfn_asgi.errors import ToolError
from agentfn_asgi.store import Store
from agentfn_asgi.testing import Connection
from agentfn_asgi.tools import FunctionTools, ToolContext

from .stack import APP_URL

COMPLETION_SECRET = "completion-secret-0123456789abcdef"
OTHER_SECRET = "another-apps-secret-0123456789abcdef"
COMPLETE_URL = APP_URL + "/calls/complete"
KEY = CallKey("sess_1", "turn_1", "call_1")


def worker_tools(record: list[str] | None = None, **options: Any) -> FunctionTools:
    """A registry whose ``generate_report`` is handed to ``options['enqueue']``."""
    tools = FunctionTools()
    seen = record if record is not None else []

    @tools.function(**options)
    def generate_report(ctx: ToolContext, topic: str, pages: int = 1) -> dict[str, Any]:
        """Generate a report in the background."""
        seen.append(ctx.call_id)
        if topic == "refused":
            raise ToolError("that topic is off limits")
        if topic == "crash":
            raise RuntimeError("password=hunter2")
        return {"topic": topic, "pages": pages, "key": ctx.idempotency_key}

    return tools


def queue_of_jobs() -> tuple[asyncio.Queue[Job], Callable[[Job], Any]]:
    """An in-memory queue and the async ``enqueue`` that fills it."""
    jobs: asyncio.Queue[Job] = asyncio.Queue()

    async def enqueue(job: Job) -> None:
        await jobs.put(job)

    return jobs, enqueue


async def next_job(jobs: asyncio.Queue[Job]) -> Job:
    """The next queued job (5 s at most)."""
    with anyio.fail_after(5):
        return await jobs.get()


async def record_of(store: Store, session_id: str, call_id: str) -> CallRecord:
    """The stored record of one call of a session."""
    for record in await store.calls_for_session(session_id):
        if record.key.call_id == call_id:
            return record
    raise AssertionError(f"no record for {call_id}")


async def wait_state(stack: Connection, sid: str, call_id: str, state: CallState) -> CallRecord:
    """Wait (5 s at most) until the call reaches ``state``."""
    with anyio.fail_after(5):
        while (record := await record_of(stack.store, sid, call_id)).state is not state:
            await anyio.sleep(0.02)
    return record


def app_options() -> dict[str, Any]:
    """App options enabling the completion endpoint, with a public URL for jobs."""
    return {"completion_secret": COMPLETION_SECRET, "public_url": APP_URL}


def first_call(required_actions: Any) -> tuple[str, str]:
    """(turn_id, call_id) of the first function call among ``required_actions``."""
    for action in required_actions:
        if action.get("type") == "function_call":
            return action["turn_id"], action["call_id"]
    raise AssertionError(f"no function call in {required_actions!r}")
