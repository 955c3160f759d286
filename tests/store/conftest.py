"""Fixtures of the store contract suite: a fake clock and one factory per backend.

``store_factory`` runs each test against ``memory``, ``sqlite``, ``redis`` and ``postgres``.
Redis and PostgreSQL are skipped when their module or service is missing, except under
``CI=true`` where a missing service fails the run (see :func:`require_service`).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import NoReturn, Protocol

import pytest

from agentfn_asgi.calls.records import ApprovalRequest, CallKey, ClaimStatus, SavedResult
from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.store import MemoryStore, SQLiteStore, Store

# Re-exported: store tests (and others' branches) import the suite's clock from here too.
from ..support.clock import FakeClock as FakeClock

REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"

#: The call most contract tests work on, and the lease they claim it with.
KEY = CallKey("sess_1", "turn_1", "call_1")
LEASE = 30.0


def result(text: str = "ok", *, success: bool = True, key: str = "idem-1") -> SavedResult:
    """A saved tool result (a failure carries ``error_type="handler_error"``)."""
    event = {"type": "agent.session.input.tool_result", "output": text}
    return SavedResult(
        success=success,
        event_json=json.dumps(event, separators=(",", ":")),
        idempotency_key=key,
        error_type=None if success else "handler_error",
    )


async def claim(store: Store, owner: str, key: CallKey = KEY) -> ClaimStatus:
    """Claim ``key`` for ``owner`` with the standard lease; the status the store decided."""
    outcome = await store.claim_call(key, tool_name="lookup", owner=owner, lease_seconds=LEASE)
    return outcome.status


async def hold_for_approval(store: Store, count: int, *, expires_at: float) -> None:
    """Put ``count`` calls of session ``held`` in ``awaiting_approval``, all expiring at
    ``expires_at`` (ties: the lists' order is the key's then)."""

    async def hold(i: int) -> None:
        key = CallKey("held", "t", f"c{i:05}")
        await store.claim_call(key, tool_name="lookup", owner="a", lease_seconds=LEASE)
        asked = ApprovalRequest(
            approval_id=f"apr_{i}",
            tool_name="lookup",
            digest="d" * 64,
            requested_at=expires_at - 3600,
            expires_at=expires_at,
        )
        await store.request_approval(key, owner="a", attempt=1, request=asked)

    for first in range(0, count, 50):
        await asyncio.gather(*(hold(i) for i in range(first, min(count, first + 50))))


class StoreFactory(Protocol):
    """``await store_factory()`` → a new opened store; ``opened=False`` skips ``open()``;
    ``namespace=`` works in another namespace of the same backend's data."""

    def __call__(self, *, opened: bool = True, namespace: str = "") -> Awaitable[Store]: ...


def require_service(name: str, reason: str) -> NoReturn:
    """Skip a test that needs ``name``; under ``CI=true`` fail instead, so CI never goes
    green by silently skipping the backends it is meant to check."""
    message = f"{name} unavailable: {reason}"
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"{message} (CI=true requires every backend)", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock shared by every store a test creates."""
    return FakeClock()


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("redis", marks=pytest.mark.backends),
        pytest.param("postgres", marks=pytest.mark.backends),
    ]
)
async def store_factory(
    request: pytest.FixtureRequest, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    """Return an async factory of opened stores that all share one backend's data.

    Each call creates a new instance (a new connection) on the same file, key prefix or
    schema, like several replicas would; ``memory`` returns its single instance every time.
    Every store is closed and the backend's data removed after the test.
    """
    backend: str = request.param
    created: list[Store] = []
    cleanup: Callable[[], Awaitable[None]] | None = None
    make: Callable[[str], Store]
    memory_store = MemoryStore(clock=clock)
    memories: dict[str, Store] = {"": memory_store}

    if backend == "memory":

        def make(namespace: str) -> Store:
            if namespace not in memories:
                memories[namespace] = memory_store.sharing(namespace)
            return memories[namespace]

    elif backend == "sqlite":
        path = tmp_path / "store.sqlite3"
        make = lambda namespace: SQLiteStore(path, clock=clock, namespace=namespace)  # noqa: E731
    elif backend == "redis":
        make, cleanup = _redis_backend(clock)
    else:
        make, cleanup = _postgres_backend(clock)

    async def factory(*, opened: bool = True, namespace: str = "") -> Store:
        store = make(namespace)
        try:
            # Even for opened=False, check the service is there (then close: reopen lazily).
            await store.open()
        except StoreUnavailableError as exc:
            await store.close()
            require_service(backend, f"cannot open the store: {exc}")
        if not opened and backend != "memory":
            await store.close()
            store = make(namespace)
        if store not in created:
            created.append(store)
        return store

    try:
        yield factory
    finally:
        for store in created:
            await store.close()
        if cleanup is not None and created:
            await cleanup()


@pytest.fixture
async def store(store_factory: StoreFactory) -> Store:
    """One opened store of the parametrised backend."""
    return await store_factory()


def _redis_backend(
    clock: FakeClock,
) -> tuple[Callable[[str], Store], Callable[[], Awaitable[None]]]:
    try:
        from agentfn_asgi.store.redis.store import RedisStore
    except ImportError as exc:
        require_service("redis", f"agentfn_asgi.store.redis.store cannot be imported: {exc}")
    prefix = f"agentfn-test:{uuid.uuid4().hex}:"

    async def cleanup() -> None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(REDIS_URL)
        try:
            keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
            if keys:
                await client.delete(*keys)
        finally:
            # types-redis lags redis 5+, which added aclose() and deprecated close().
            await client.aclose()  # type: ignore[attr-defined]

    return (
        lambda namespace: RedisStore(
            REDIS_URL, key_prefix=prefix, clock=clock, namespace=namespace
        ),
        cleanup,
    )


def _postgres_backend(
    clock: FakeClock,
) -> tuple[Callable[[str], Store], Callable[[], Awaitable[None]]]:
    try:
        from agentfn_asgi.store.sql.postgres import PostgresStore
    except ImportError as exc:
        require_service("postgres", f"agentfn_asgi.store.sql.postgres cannot be imported: {exc}")
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"

    async def cleanup() -> None:
        import asyncpg

        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    return (
        lambda namespace: PostgresStore(
            POSTGRES_URL, schema=schema, clock=clock, namespace=namespace
        ),
        cleanup,
    )
