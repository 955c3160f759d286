"""The Redis store's script calls of one event-loop turn, sent together on one connection.

At saturation many calls wake in the same turn of the loop (their HTTP answers arrived
together) and each makes its next durable step: one Lua script each. Sent one by one, every
script pays for a pool checkout, a socket write and a read wake-up of its own, which cost
more than the script itself. :class:`ScriptBatcher` gathers the scripts started in one turn
and sends them as one **non-transactional** pipeline of ``EVALSHA`` commands on one pooled
connection: one checkout, one write, then the replies read in order (measured in-process,
CPU per script: ≈ 50 against ≈ 85 µs 4 at a time, ≈ 38 against ≈ 95 µs 8 at a time).

What does not change:

- Each script is still atomic on its own, and nothing becomes atomic *together*: Redis runs
  the commands of a pipeline one after the other, as it would run them from separate
  connections. Every caller gets its own script's reply, or its own error, as soon as it is
  read: an error reply of one script never reaches another caller.
- A script alone in its turn (one call at a time) is sent as before, from its caller's task
  and through redis-py's own command path (one pass of the loop later). So is a script with
  long arguments (a large saved result: over :data:`ALONE_OVER` characters), so that it
  has the socket timeout to itself.
- A caller's arguments that the driver cannot encode (a lone surrogate), or a reply it
  cannot parse, fail that caller alone, as they would a lone command.
- A script Redis does not know (``NOSCRIPT``: Redis restarted or ``SCRIPT FLUSH``) did not
  run; it is loaded and sent again on its own, as :class:`redis.asyncio.client.Script`
  does.

What a batch does differently: it is never re-sent. redis-py retries a lone command on a
dropped connection; a pipeline re-sent whole would run again the scripts whose replies were
already read. So when the connection fails part way (or the store closes under it), the
scripts answered so far keep their answers and every other caller gets a
:class:`redis.exceptions.ConnectionError` of its own (the store's
:class:`~agentfn_asgi.errors.StoreUnavailableError`): its script may have run, as for a
single command whose answer was lost, and the store's steps are decided by what they find
when retried. The pool checks a connection before handing it out (a socket Redis closed is
reopened then), so a restart of Redis costs the first batch nothing.

The batch is sent by a task of its own, so a caller cancelled meanwhile (its own future
cancelled) never cancels the others' scripts. A caller cancelled before the batch is
written is left out of it; once written, its script runs, as a cancelled single command's
may have. A store is used from one event loop at a time (its connections
belong to it); a script started on another loop never joins this loop's batch.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any, Final

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["ALONE_OVER", "BATCH_MAX", "ScriptBatcher"]

#: At most this many scripts share one pipeline; the next ones start a batch of their own.
BATCH_MAX: Final = 64

#: A script whose arguments are longer than this (characters) is sent alone: a batch is
#: written under one socket timeout, which 64 saved results of 4 MiB would not meet.
ALONE_OVER: Final = 64 * 1024

# (script, keys, args, the caller's future: None for the caller that sends a lone script)
_Entry = tuple[Any, list[str], list[str], "asyncio.Future[Any] | None"]


class ScriptBatcher:
    """Sends the scripts started in one loop turn as one pipeline (see the module doc)."""

    def __init__(self, *, max_batch: int = BATCH_MAX) -> None:
        self._max = max_batch
        self._open: list[_Entry] | None = None
        self._open_loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, script: Any, keys: list[str], args: list[str], client: Any) -> Any:
        """Run ``script`` (a registered script) with ``keys`` and ``args`` on ``client``,
        in one pipeline with the others started in this loop turn; its reply (decoded as
        the client decodes), or its error raised (redis-py's exceptions)."""
        if sum(map(len, args)) > ALONE_OVER:
            return await script(keys=keys, args=args, client=client)
        loop = asyncio.get_running_loop()
        group = self._open
        if group is not None and self._open_loop is loop and len(group) < self._max:
            joined: asyncio.Future[Any] = loop.create_future()
            group.append((script, keys, args, joined))
            return await joined
        # The first script of this turn: wait one pass of the loop for the others.
        group = [(script, keys, args, None)]
        self._open, self._open_loop = group, loop
        try:
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            self._seal(group)
            self._send_later(group[1:], client)
            raise
        self._seal(group)
        if len(group) == 1:
            return await script(keys=keys, args=args, client=client)
        mine: asyncio.Future[Any] = loop.create_future()
        group[0] = (script, keys, args, mine)
        self._send_later(group, client)
        return await mine

    async def wait_sent(self) -> None:
        """Wait until every batch of this turn and before is answered (closing the store).

        A caller cancelling this wait (a shutdown's own timeout) cancels none of the batches.
        """
        await asyncio.sleep(0)  # a batch still gathering its turn is handed to its task
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    def _seal(self, group: list[_Entry]) -> None:
        if self._open is group:
            self._open = self._open_loop = None

    def _send_later(self, group: list[_Entry], client: Any) -> None:
        if not group:
            return
        task = asyncio.get_running_loop().create_task(_send(group, client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _send(group: list[_Entry], client: Any) -> None:
    """Send ``group`` and settle every caller's future, whatever happens: the callers not
    answered when the connection fails, or this task is cancelled, fail as a lost
    connection would (see the module docstring)."""
    failure: BaseException | None = None
    try:
        unknown = await _pipeline(group, client)
        for script, keys, args, fut in unknown:
            if fut is None or fut.done():
                continue
            try:
                # Loads the script and sends it again (it did not run: NOSCRIPT).
                reply = await script(keys=keys, args=args, client=client)
            except Exception as exc:
                _settle(fut, _own(exc), failed=True)
            else:
                _settle(fut, reply, failed=False)
    except Exception as exc:
        failure = exc
    finally:
        for *_, fut in group:
            if fut is not None and not fut.done():
                _settle(fut, _unanswered(failure), failed=True)


async def _pipeline(group: list[_Entry], client: Any) -> list[_Entry]:
    """One checkout, one write of every ``EVALSHA``, the replies read and settled in order;
    the entries Redis answered ``NOSCRIPT``. A failure of the connection is raised (the
    driver has closed it, so the pool reconnects it before its next use)."""
    pool = client.connection_pool
    conn = await pool.get_connection()
    try:
        # A caller cancelled before the write: its script is not sent, as a lone command
        # cancelled before its write never runs.
        group = [entry for entry in group if entry[3] is None or not entry[3].done()]
        if not group:
            return []
        commands = [
            ("EVALSHA", script.sha, len(keys), *keys, *args) for script, keys, args, _ in group
        ]
        try:
            packed = conn.pack_commands(commands)
        except Exception:  # one caller's arguments cannot be encoded: it alone fails
            group, commands = _encodable(conn, group, commands)
            if not group:
                return []
            packed = conn.pack_commands(commands)
        await conn.send_packed_command(packed)
        unknown: list[_Entry] = []
        for entry in group:
            try:
                reply = await conn.read_response()
            except NoScriptError:
                unknown.append(entry)
            except ResponseError as exc:  # this script's error reply: the next ones follow
                _settle(entry[3], exc, failed=True)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                raise  # the scripts not answered yet fail as a lost connection
            except Exception as exc:
                # A reply the driver could not parse is this script's error; the driver
                # dropped the connection, so the next replies are lost with it.
                _settle(entry[3], exc, failed=True)
                raise RedisConnectionError(f"the connection failed after a reply: {exc}") from exc
            else:
                _settle(entry[3], reply, failed=False)
        return unknown
    finally:
        await pool.release(conn)


def _encodable(
    conn: Any, group: list[_Entry], commands: list[tuple[Any, ...]]
) -> tuple[list[_Entry], list[tuple[Any, ...]]]:
    """The entries whose command the driver can encode, and their commands; each other
    entry's caller gets its own encoding error (a lone command would have raised it)."""
    kept: list[tuple[_Entry, tuple[Any, ...]]] = []
    for entry, command in zip(group, commands, strict=True):
        try:
            conn.pack_command(*command)
        except Exception as exc:
            _settle(entry[3], exc, failed=True)
        else:
            kept.append((entry, command))
    return [entry for entry, _ in kept], [command for _, command in kept]


def _own(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one caller: an exception raised in several tasks would gather
    all their tracebacks."""
    try:
        return copy.copy(exc)
    except Exception:  # pragma: no cover - an exception type that cannot be copied
        return exc


def _unanswered(failure: BaseException | None) -> BaseException:
    if failure is None:  # this task was cancelled: the store is closing
        return RedisConnectionError("the store closed before Redis answered this script")
    return _own(failure)


def _settle(fut: asyncio.Future[Any] | None, value: Any, *, failed: bool) -> None:
    if fut is None or fut.done():  # its caller was cancelled meanwhile
        return
    if failed:
        fut.set_exception(value)
    else:
        fut.set_result(value)
