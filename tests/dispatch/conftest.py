"""The dispatcher's parts over the memory store and the package's fake Agents API.

Each part is built by hand, as :class:`~agentfn_asgi.dispatch.Dispatcher` builds it, around
one in-process API (the fake, reached through the real client over ``httpx.ASGITransport``)
and one memory store on the suite's fake clock: a test moves time instead of waiting it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from agentfn_asgi.calls.records import CallKey, CallRecord
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.dispatch import Dispatcher, DispatchSettings
from agentfn_asgi.results import encode_result
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall
from agentfn_asgi.tools import FunctionTools

from ..support.clock import FakeClock

OWNER = "replica-a"
LEASE = 30.0
#: No pause before reading a missing session again, and a lease a test can outwait.
SETTINGS = DispatchSettings(lease_seconds=LEASE, not_found_retries=(), retry_base=5.0)


async def _no_sleep(_: float) -> None:
    return None


@dataclass
class API:
    """The fake and a client of it (retry pauses skipped)."""

    fake: FakeAgentsAPI
    client: AgentsClient

    def one_call(self, name: str = "lookup", call_id: str = "c1") -> CallKey:
        """A session waiting for one call; its key."""
        session_id = self.fake.create_session([[FakeCall(name, {"key": "a"}, call_id=call_id)]])
        [action] = self.fake.required_actions(session_id)
        return CallKey(session_id, action["turn_id"], action["call_id"])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
async def api() -> AsyncIterator[API]:
    async with FakeAgentsAPI() as fake:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake), base_url="http://fake")
        client = AgentsClient(
            api_key=fake.api_key, base_url="http://fake/v1", http_client=http, sleep=_no_sleep
        )
        async with client:
            yield API(fake, client)
        await http.aclose()


async def saved(store: MemoryStore, key: CallKey, output: str = "value") -> CallRecord:
    """Claim ``key`` for :data:`OWNER` and save ``output`` as its result."""
    await store.claim_call(key, tool_name="lookup", owner=OWNER, lease_seconds=LEASE)
    result = encode_result(key, output, tool_name="lookup")
    return await store.save_result(key, owner=OWNER, attempt=1, result=result)


def lookup_tools(runs: list[str] | None = None) -> FunctionTools:
    """One plain tool, ``lookup(key)``, noting each run in ``runs``."""
    tools = FunctionTools()
    seen = runs if runs is not None else []

    @tools.function
    def lookup(key: str) -> str:
        """Look a key up."""
        seen.append(key)
        return f"value of {key}"

    return tools


@contextlib.asynccontextmanager
async def dispatching(
    api: API,
    store: MemoryStore,
    clock: FakeClock,
    tools: FunctionTools,
    settings: DispatchSettings = SETTINGS,
) -> AsyncIterator[Dispatcher]:
    """A started dispatcher over ``store`` and the fake, on ``clock``: no start-up sweep
    (a test calls :meth:`Dispatcher.sweep` when it wants one), stopped on exit."""
    dispatcher = Dispatcher(tools, api.client, store, settings=settings, owner=OWNER, clock=clock)
    await dispatcher.start(recover=False)
    try:
        yield dispatcher
    finally:
        await dispatcher.stop(drain_timeout=1.0)
