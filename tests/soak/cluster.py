"""The replicas of a soak and the cutting of their store connections.

Each replica is the Starlette example under uvicorn (:func:`agentfn_asgi.demo.run_example`,
as ``tests/support/replicas.py`` starts them), restartable on the same port with a new log
file per start. Each names its store connections (PostgreSQL ``application_name``, Redis
``CLIENT SETNAME``) ``<tag>-r<index>``, so the nemesis can cut exactly those: the servers are
shared with other people's sessions, which it must never touch.
"""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from agentfn_asgi.demo import RunningExample, run_example

__all__ = ["TARGET", "Replica", "StoreCutter", "named_url"]

#: The app every replica serves.
TARGET = "examples.starlette_app:app"


def named_url(url: str, store: str, name: str) -> str:
    """``url`` with its connections named ``name`` (nothing for SQLite: no connections)."""
    parameter = {"postgres": "application_name", "redis": "client_name"}.get(store)
    if parameter is None:
        return url
    return f"{url}{'&' if '?' in url else '?'}{parameter}={name}"


class Replica:
    """One replica: started, SIGKILLed and restarted, paused and resumed, stopped."""

    def __init__(self, index: int, port: int, env: dict[str, str], workdir: Path) -> None:
        self.index = index
        self.port = port
        self.env = env
        self.workdir = workdir
        self.starts = 0
        self.paused = False
        self.running: RunningExample | None = None
        self._stack: contextlib.AsyncExitStack | None = None

    @property
    def webhook_url(self) -> str:
        """Where the fake posts its webhooks for this replica."""
        return f"http://127.0.0.1:{self.port}/openai/webhooks"

    def log_paths(self) -> list[Path]:
        """The log of every start so far."""
        return [self.workdir / f"replica{self.index}-{n}.log" for n in range(1, self.starts + 1)]

    async def start(self) -> None:
        """Start a new process on this replica's port; return once it is healthy."""
        self.starts += 1
        stack = contextlib.AsyncExitStack()
        log_path = self.workdir / f"replica{self.index}-{self.starts}.log"
        self.running = await stack.enter_async_context(
            run_example(TARGET, env=self.env, log_path=log_path, port=self.port)
        )
        self._stack = stack

    async def kill(self) -> None:
        """SIGKILL the process and reap it."""
        running = self.running
        if running is None:
            return
        with contextlib.suppress(ProcessLookupError):
            running.process.send_signal(signal.SIGKILL)
        await running.process.wait()
        self.paused = False
        await self._close()

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets and leases but runs nothing."""
        if self.running is not None:
            # A replica that just exited on its own (its process is gone) has nothing to pause.
            with contextlib.suppress(ProcessLookupError):
                self.running.process.send_signal(signal.SIGSTOP)
                self.paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.running is not None and self.paused:
            with contextlib.suppress(ProcessLookupError):
                self.running.process.send_signal(signal.SIGCONT)
        self.paused = False

    async def stop(self) -> None:
        """Stop gracefully (SIGTERM, as a deployment would), resuming it first if paused."""
        self.resume()
        await self._close()

    async def _close(self) -> None:
        stack, self._stack, self.running = self._stack, None, None
        if stack is not None:
            await stack.aclose()


class StoreCutter:
    """Cuts the store connections of named replicas, and only theirs.

    PostgreSQL: ``pg_terminate_backend`` of the backends whose ``application_name`` is the
    replica's; Redis: ``CLIENT KILL ID`` of the clients whose name is the replica's (found
    with ``CLIENT LIST``). Other sessions on the same servers are never touched.
    """

    def __init__(self, store: str, url: str, tag: str) -> None:
        self.store = store
        self.url = url
        self.tag = tag

    def name(self, index: int) -> str:
        """The connection name of replica ``index``."""
        return f"{self.tag}-r{index}"

    @property
    def supported(self) -> bool:
        """Whether this store has connections to cut (SQLite has none)."""
        return self.store in ("postgres", "redis")

    async def cut(self, indexes: list[int]) -> int:
        """Cut every store connection of the replicas ``indexes``; return how many."""
        names = [self.name(index) for index in indexes]
        if self.store == "postgres":
            return await self._cut_postgres(names)
        if self.store == "redis":
            return await self._cut_redis(names)
        return 0

    async def _cut_postgres(self, names: list[str]) -> int:
        base = self.url.partition("?")[0]
        conn = await asyncpg.connect(base, server_settings={"application_name": f"{self.tag}-n"})
        try:
            rows = await conn.fetch(
                "SELECT pg_terminate_backend(pid) AS done FROM pg_stat_activity "
                "WHERE application_name = ANY($1::text[]) AND pid <> pg_backend_pid()",
                names,
            )
        finally:
            await conn.close()
        return sum(1 for row in rows if row["done"])

    async def _cut_redis(self, names: list[str]) -> int:
        base = self.url.partition("?")[0]
        client: Any = aioredis.Redis.from_url(
            base, decode_responses=True, client_name=f"{self.tag}-n"
        )
        try:
            cut = 0
            for entry in await client.client_list():
                if entry.get("name") in names:
                    # By id: an address could have been reused by someone else's client.
                    with contextlib.suppress(aioredis.ResponseError):
                        cut += int(await client.client_kill_filter(_id=entry["id"]))
            return cut
        finally:
            await client.aclose()
