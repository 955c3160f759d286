"""The Redis store's script calls of one event-loop turn, sent together as one pipeline.

At saturation many calls wake in the same turn of the loop (their HTTP answers arrived
together) and each makes its next durable step: one Lua script each. Sent one by one, every
script pays for a pool checkout, a socket write and a read wake-up of its own, which cost
more than the script itself. :class:`ScriptBatcher` gathers the scripts started in one turn
and sends them as one **non-transactional** pipeline of ``EVALSHA`` commands on one pooled
connection: one checkout, one write, one read loop for all of them (measured in-process at
64 callers: ≈ 110 against ≈ 180 µs of CPU per script 4 at a time, ≈ 80 against ≈ 200 µs 8
at a time).

What does not change:

- Each script is still atomic on its own, and nothing becomes atomic *together*: Redis runs
  the commands of a pipeline one after the other, as it would run them from separate
  connections. Every caller gets its own script's reply, or its own error: an error reply
  of one script never reaches another caller.
- A failure of the connection fails every script of the batch (each caller maps it to
  :class:`~agentfn_asgi.errors.StoreUnavailableError`). As for a single command, a script
  whose write was sent may have run: the store's steps are already decided by what they
  find, whoever retries them.
- A script alone in its turn (one call at a time) is sent as before, from its caller's
  task: one pass of the loop later.
- A script Redis does not know (``NOSCRIPT``: Redis restarted or ``SCRIPT FLUSH``) did not
  run; it is loaded and sent again on its own, as :class:`redis.asyncio.client.Script`
  does.

The batch is sent by a task of its own, so a caller cancelled meanwhile (its own future
cancelled) never cancels the others' scripts; its script may still run, as a cancelled
single command may have.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from redis.exceptions import NoScriptError

__all__ = ["BATCH_MAX", "ScriptBatcher"]

#: At most this many scripts share one pipeline; the next ones start a batch of their own.
BATCH_MAX: Final = 64

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
        """Wait until every batch handed to a task is answered (closing the store)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

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
    """One pipeline for ``group``; every caller's future is settled, whatever happens."""
    try:
        pipe = client.pipeline(transaction=False)
        for script, keys, args, _ in group:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = await pipe.execute(raise_on_error=False)
    except asyncio.CancelledError:
        for *_, fut in group:
            if fut is not None:
                fut.cancel()
        raise
    except Exception as exc:
        for *_, fut in group:
            _settle(fut, exc, failed=True)
        return
    unknown: list[_Entry] = []
    for entry, reply in zip(group, replies, strict=True):
        if isinstance(reply, NoScriptError):
            unknown.append(entry)
        else:
            _settle(entry[3], reply, failed=isinstance(reply, Exception))
    for script, keys, args, fut in unknown:
        if fut is None or fut.done():
            continue
        try:
            # Loads the script and sends it again (it did not run: NOSCRIPT).
            reply = await script(keys=keys, args=args, client=client)
        except Exception as exc:
            _settle(fut, exc, failed=True)
        else:
            _settle(fut, reply, failed=False)


def _settle(fut: asyncio.Future[Any] | None, value: Any, *, failed: bool) -> None:
    if fut is None or fut.done():  # its caller was cancelled meanwhile
        return
    if failed:
        fut.set_exception(value)
    else:
        fut.set_result(value)
