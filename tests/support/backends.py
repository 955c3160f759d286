"""Store URLs of a fresh, isolated store on each durable backend, for tests that need a URL
(processes, the CLI) rather than a store object: ``sqlite`` in a temp folder, ``redis``
under its own key prefix, ``postgres`` in its own schema. Redis and PostgreSQL are the
machine's services: without them the test skips with the reason (fails under CI=true)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import anyio

from agentfn_asgi.store import open_store

from ..store.conftest import require_service

__all__ = ["DURABLE", "SHARED", "store_url_for"]

#: The backends several processes can share, and all durable ones.
SHARED = ("redis", "postgres")
DURABLE = ("sqlite", *SHARED)


@contextlib.asynccontextmanager
async def store_url_for(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    """A URL naming a new, empty store of ``backend``; its data is removed after."""
    tag = secrets.token_hex(4)
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / f'store-{tag}.sqlite3'}"
        return
    if backend == "redis":
        url = f"redis://127.0.0.1:6379/0?key_prefix=afn-test-{tag}:"
    elif backend == "postgres":
        url = f"postgresql://postgres@127.0.0.1:5432/test?schema=afn_test_{tag}"
    else:
        raise ValueError(f"unknown backend {backend!r}")
    await _require(backend, url)
    try:
        yield url
    finally:
        store = open_store(url)
        try:
            await store.destroy()  # type: ignore[attr-defined]  # Redis/PostgreSQL test helper
        finally:
            await store.close()


async def _require(backend: str, url: str) -> None:
    store = open_store(url)
    try:
        with anyio.fail_after(5):
            await store.ping()
    except Exception as exc:
        require_service(backend, f"{type(exc).__name__}: {exc}")
    finally:
        with contextlib.suppress(Exception):
            await store.close()
