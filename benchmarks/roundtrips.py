"""Count the store's driver round trips inside a target process (installed before the app).

Each durable store talks to its database through one driver; this module wraps the driver's
entry points at class level so every call the store makes is counted, whatever the store
code does around it:

- SQLite: ``sqlite3.connect`` is given a connection class whose ``execute``/``executemany``
  count statements (``BEGIN``/``COMMIT``/``ROLLBACK``/``SAVEPOINT``/``RELEASE`` and
  ``PRAGMA`` apart: ``commits`` counts the ``COMMIT`` statements). In process, so a
  "round trip" is one statement handed to SQLite.
- PostgreSQL: asyncpg's ``Connection.execute/executemany/fetch/fetchrow/fetchval`` (a
  transaction's ``BEGIN``/``COMMIT`` go through ``execute`` and are counted too). One driver
  call is one round trip once the statement is in asyncpg's prepared-statement cache (the
  first use of a statement on a connection adds a prepare).
- Redis: redis-py's ``AbstractConnection.send_packed_command``: one write of one command, or
  of a whole pipeline, and its reply(ies) read after it.

The counters are read by the driver through the target's ``GET /bench/counters``.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["COUNTS", "install"]

#: ``round_trips``: driver calls; ``commits``: transactions committed (SQL stores).
COUNTS: Counter[str] = Counter()

_CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE", "PRAGMA")


#: Also count each statement by its opening words (``by:INSERT INTO … deliveries``) when set:
#: which durable steps the round trips are (``--count-round-trips`` in the target sets it).
BY_KIND = True


def _kind(sql: str) -> str:
    return " ".join(sql[:200].split()[:7])[:90]


def _classify(sql: str) -> None:
    if BY_KIND:
        COUNTS["by:" + _kind(sql)] += 1
    head = sql.lstrip()[:10].upper()
    if head.startswith("COMMIT"):
        COUNTS["commits"] += 1
    if head.startswith(_CONTROL):
        COUNTS["control"] += 1
    else:
        COUNTS["statements"] += 1
    COUNTS["round_trips"] += 1


class _CountingConnection(sqlite3.Connection):
    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        _classify(sql)
        return super().execute(sql, *args)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        _classify(sql)
        return super().executemany(sql, *args)


def _install_sqlite() -> None:
    connect = sqlite3.connect

    @functools.wraps(connect)
    def counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", _CountingConnection)
        conn: sqlite3.Connection = connect(*args, **kwargs)
        return conn

    sqlite3.connect = counting_connect  # type: ignore[assignment]


def _wrap_async(cls: type, name: str, count: Callable[[tuple[Any, ...]], None]) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    async def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        count(args)
        return await original(self, *args, **kwargs)

    setattr(cls, name, counted)


def _install_postgres() -> None:
    from asyncpg.connection import Connection

    def count(args: tuple[Any, ...]) -> None:
        if args and isinstance(args[0], str):
            _classify(args[0])
        else:
            COUNTS["round_trips"] += 1

    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        _wrap_async(Connection, name, count)


def _install_redis() -> None:
    from redis.asyncio.connection import AbstractConnection

    def count(args: tuple[Any, ...]) -> None:
        COUNTS["round_trips"] += 1
        if BY_KIND and args:
            packed = args[0]
            first = packed[0] if isinstance(packed, list) and packed else packed
            if isinstance(first, (bytes, bytearray, memoryview)):
                # RESP: *N\r\n$len\r\nNAME\r\n... ; a pipeline starts with MULTI or its first.
                parts = bytes(first[:80]).split(b"\r\n")
                name = parts[2].decode(errors="replace") if len(parts) > 2 else "?"
                if name.upper() == "EVALSHA" and len(parts) > 4:
                    name += " " + parts[4].decode(errors="replace")[:8]
                COUNTS["by:" + name] += 1

    _wrap_async(AbstractConnection, "send_packed_command", count)


def install(store: str) -> None:
    """Wrap the driver of ``store`` (``sqlite``, ``postgres``, ``redis``; else nothing)."""
    {"sqlite": _install_sqlite, "postgres": _install_postgres, "redis": _install_redis}.get(
        store, lambda: None
    )()
