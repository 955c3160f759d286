"""The nemesis cuts only the soak's own store connections: the servers are shared."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

from ..support.backends import store_url_for
from .cluster import StoreCutter, named_url

pytestmark = [pytest.mark.anyio, pytest.mark.backends]


async def test_redis_cut_kills_the_named_replicas_clients_only(tmp_path: Path) -> None:
    tag = f"afn-soak-test-{secrets.token_hex(3)}"
    async with store_url_for("redis", tmp_path) as url:
        cutter = StoreCutter("redis", url, tag)
        base = url.partition("?")[0]
        clients: dict[str, Any] = {
            name: aioredis.Redis.from_url(base, client_name=name, decode_responses=True)
            for name in (cutter.name(0), cutter.name(1), f"{tag}-someone-else")
        }
        try:
            for client in clients.values():
                await client.ping()
            assert await cutter.cut([0]) == 1
            names = {entry["name"] for entry in await clients[cutter.name(1)].client_list()}
            assert cutter.name(0) not in names
            assert {cutter.name(1), f"{tag}-someone-else"} <= names
        finally:
            for client in clients.values():
                await client.aclose()


async def test_postgres_cut_terminates_the_named_replicas_backends_only(tmp_path: Path) -> None:
    tag = f"afn-soak-test-{secrets.token_hex(3)}"
    async with store_url_for("postgres", tmp_path) as url:
        cutter = StoreCutter("postgres", url, tag)
        base = url.partition("?")[0]
        mine = await asyncpg.connect(named_url(base, "postgres", cutter.name(2)))
        other = await asyncpg.connect(base, server_settings={"application_name": f"{tag}-x"})
        try:
            assert await cutter.cut([2]) == 1
            assert await other.fetchval("SELECT 1") == 1
            names = "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1"
            with anyio.fail_after(10):  # a backend ends shortly after it is told to
                while cutter.name(2) in {row[0] for row in await other.fetch(names, f"{tag}%")}:
                    await anyio.sleep(0.05)
            assert f"{tag}-x" in {row[0] for row in await other.fetch(names, f"{tag}%")}
        finally:
            await other.close()
            mine.terminate()


def test_sqlite_has_nothing_to_cut() -> None:
    cutter = StoreCutter("sqlite", "sqlite:////tmp/x.sqlite3", "t")
    assert not cutter.supported
    assert named_url("sqlite:////tmp/x.sqlite3", "sqlite", "t-r0") == "sqlite:////tmp/x.sqlite3"
