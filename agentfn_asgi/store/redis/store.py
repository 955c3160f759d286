"""Redis store (``redis://`` / ``rediss://``): several replicas sharing one Redis.

Every step is one Lua script (:mod:`agentfn_asgi.store.redis.scripts`), so it is atomic
inside Redis: a record, its history and the indexes over it change together, and a retried
or concurrent step from another replica never falls into a gap. The scripts started in one
turn of the event loop go to Redis together, as one pipeline on one connection
(:mod:`agentfn_asgi.store.redis.batch`): one write and one read for many steps, each still
atomic on its own and answered on its own.

Keys, all under ``key_prefix`` ``{p}``; ``h()`` is SHA-1 in hex (Lua computes the same with
``redis.sha1hex``), so identifiers of any length and content are safe. Everything but the
layout marker lives under its namespace's prefix ``{n}`` = ``{p}n:{h(namespace)}:``, so
a namespace's records, histories, sets and indexes are apart from every other's by
construction: every script is handed ``{n}`` and builds every key it touches on it::

    {p}layout                    hash: the key layout's version (see _redis_layout)
    {n}d:{h(delivery_id)}        hash: one delivery
    {n}c:{h(member)}             hash: one call
    {n}h:{h(member)}             list: the call's history, one CallEvent JSON per entry
                                 (bounded: the first 10 and the last 40 events)
    {n}s:{h(session_id)}         set: the members of a session's calls
    {n}k:{h(call_id)}            set: the members of the calls with that call id
    {n}i:{index}                 sorted sets of the namespace (below)
    {n}l:{h(limiter)}:holders    sorted set: the members of the calls that took one of
                                 the limiter's slots (scored by their lease then)
    {n}l:{h(limiter)}:waiters    sorted set: the members of the calls waiting for a slot,
                                 by created_at (the line's order, ties by member)
    {n}l:{h(limiter)}:bucket     hash: the limiter's rate bucket {tokens, updated_at}
    {n}b:{h(session_id)}:{h(tool_name)}
                                 set: the members of a session's calls of a tool counted
                                 against its call budget (max_calls_per_session)
    {p}r:{h(token_id)}           string: a revoked credential's expires_at (store-wide,
                                 random ids: no namespace needed)

A call's *member* is its key ``(session_id, turn_id, call_id)`` joined by ``\\0\\0`` (a NUL
inside an id is written ``\\0\\1``): sorted sets order equal scores by member bytes, which
is then the order of the key tuples, so the sweeps' and the listing's cursors are exact.

The indexes of a namespace, each a sorted set kept in step with the records by the scripts::

    deliveries          every delivery, by received_at     (list_deliveries, prune, stats)
    unresolved          unresolved deliveries, by received_at        (list, stats)
    deliveries_due      unresolved deliveries, by next_attempt_at    (the sweep's backoff)
    failing             unresolved deliveries with a failed resolve  (stats)
    calls               every call, by created_at                    (list_calls)
    state:{state}       the calls in that state, by created_at       (list_calls, stats)
    lease               claimed calls and calls waiting for a limiter's slot, by
                        lease_expires_at                 (expired_claims, stats)
    due                 saved, unsubmitted results, by next_attempt_at (the sweep)
    retry               scheduled retries, by their next attempt's time (due_retries)
    finished            submitted, stale and cancelled calls, by updated_at (prune)
    submitted_failed    submitted failures, by created_at            (stats)
    waiting             calls awaiting approval, by the request's expiry (expiry, lists)
    approved            approved calls not yet run, by updated_at    (every replica's poll)
    buckets             rated limiters' names, by their bucket's updated_at       (prune)

and ``{n}a:{h(approval_id)}`` (a string: the member of the call whose approval request it
is), so a person's decision finds its call.

Flow control: a limiter's holders and waiters sets only say which calls to look at; the
call hashes (``state``, ``limiter``, ``lease_expires_at``) decide. The claim or admission
that counts them drops every member whose hash says it moved on, so a holder taken over
frees its slot without the script that moved it knowing of limiters, and a renewal need
not touch them; a call that leaves ``claimed`` or ``waiting`` with its limiter (saved,
held, scheduled...) leaves the sets in ``reindex_call``, so they last no longer than the
limiter's calls. A claim without a limit reads none of them. A bucket goes in ``prune``.

A store sees and changes only its own namespace's records: the same call key or delivery
id in two namespaces are two independent records.

Time: scores and record fields come from the injected ``clock``, passed into every script,
never Redis' own ``TIME``. Nothing expires by TTL but revocations (their entry is compared
with the clock too, and outlives its ``expires_at`` by a second): :meth:`RedisStore.prune`
is the retention (quarantined and pending calls are never pruned).

Redis Cluster: scripts compute most keys they touch from the prefix, so all keys must live
in one slot; give the prefix a hash tag (``key_prefix="{agentfn}:"``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import logging
import math
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

from agentfn_asgi.calls.records import (
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    Limit,
    StoreStats,
)
from agentfn_asgi.calls.states import WORKLISTS, admission_bounds
from agentfn_asgi.errors import (
    ConfigurationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from agentfn_asgi.store import redact_url, unknown_url_parameter
from agentfn_asgi.store._codec import claim_status_for, flat_args, record_from_mapping
from agentfn_asgi.store.base import Store
from agentfn_asgi.store.redis import scripts
from agentfn_asgi.store.redis.layout import LAYOUT_KEY, layout_change

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    from agentfn_asgi.store.redis.batch import ScriptBatcher  # imports the driver too
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "the redis:// store needs the redis driver: pip install 'agentfn-asgi[redis]'"
    ) from exc

__all__ = ["RedisStore"]

logger = logging.getLogger("agentfn_asgi.store.redis")

# The query keys redis-py takes from a URL: its parsed ones and its connections' keywords
# (any other key reaches a connection's constructor as a TypeError, at the first command).
_DRIVER_PARAMETERS = frozenset(
    getattr(aioredis.connection, "URL_QUERY_ARGUMENT_PARSERS", {})
).union(
    *(
        inspect.signature(kind.__init__).parameters
        for kind in (
            aioredis.connection.AbstractConnection,
            aioredis.Connection,
            aioredis.SSLConnection,
            aioredis.UnixDomainSocketConnection,
            aioredis.BlockingConnectionPool,
        )
    )
) - {"self", "kwargs", "connection_kwargs", "connection_class"}

_PRUNE_BATCH = 500
#: How many index entries one list_calls script looks at, so a filter that matches little
#: never holds Redis for long; the listing continues where the last script stopped.
_LIST_BUDGET = 500
_SCRIPTS = {
    **{name.lower(): getattr(scripts, name) for name in scripts.__all__},
    **{f"row {name}": script for name, script in scripts.TRANSITIONS.items()},
    **dict.fromkeys(WORKLISTS, scripts.WORKLIST),
}
#: Each worklist's index (see the layout above).
_WORKLIST_INDEX: Final = {
    "expired_claims": "lease",
    "due_retries": "retry",
    "unsubmitted_results": "due",
    "waiting_approvals": "waiting",
    "approved_calls": "approved",
}


def _h(text: str) -> str:
    # SHA-1 because Lua has it (redis.sha1hex): scripts derive the same keys from members.
    # surrogatepass: a key for any string; a text Redis cannot take fails when it is sent
    # (a StoreError, see _translated), not here.
    return hashlib.sha1(text.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest()


def _num(value: float) -> str:
    # repr() round-trips a float exactly; Lua's own number formatting would keep 14 digits.
    return repr(float(value))


def _arg(value: object) -> str:
    """A step's argument as a script reads it: a boolean as 1 or 0, a number exactly."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return _num(value)
    return str(value)


def _member(key: CallKey) -> str:
    """The call's member: order-preserving (byte order = key tuple order) and injective."""
    parts = (key.session_id, key.turn_id, key.call_id)
    return "\0\0".join(part.replace("\0", "\0\1") for part in parts)


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {str(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _record(reply: Sequence[Any], *, history: bool = False) -> CallRecord:
    """A call from a script's ``{hash fields, history events}`` reply; its history (and the
    count of events dropped from it) only when the read asked for it, like every store."""
    flat, events = reply
    if not history:
        return _plain(flat)
    return _call({**_pairs(flat), "history": "\n".join(events)})


def _plain(flat: Sequence[Any]) -> CallRecord:
    data = _pairs(flat)
    data.pop("history_dropped", None)
    return _call(data)


def _call(data: dict[str, Any]) -> CallRecord:
    # The hash's `limiter` field is absent when the call holds or waits for no slot.
    return dataclasses.replace(record_from_mapping(data), limiter=data.get("limiter"))


def _limit_args(limit: Limit) -> list[str]:
    """A limit as the scripts read it: name, concurrency, rate, burst ('' = no bound), then
    the admission's bounds (:func:`~agentfn_asgi.calls.states.admission_bounds`)."""
    bounds = admission_bounds(concurrency=limit.concurrency, rate=limit.rate, burst=limit.burst)
    return [
        limit.name,
        "" if limit.concurrency is None else str(limit.concurrency),
        "" if limit.rate is None else _num(limit.rate),
        str(limit.burst),
        *map(str, bounds),
    ]


def _delivery(flat: Sequence[Any]) -> DeliveryRecord:
    data = _pairs(flat)
    return DeliveryRecord(
        delivery_id=data["delivery_id"],
        session_id=data["session_id"],
        received_at=float(data["received_at"]),
        resolved=data.get("resolved") == "1",
        attempts=int(data.get("attempts") or 0),
        next_attempt_at=float(data.get("next_attempt_at") or 0.0),
        last_error=data.get("last_error"),
    )


def _escape_glob(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


@contextmanager
def _translated(action: str) -> Iterator[None]:
    """Turn driver errors into ours: unreachable → StoreUnavailableError, else StoreError;
    and give back a cancellation the driver lost.

    redis-py sends each command under ``asyncio.wait_for``, which on Python 3.11 swallows a
    cancellation that arrives just as the send completes (CPython gh-86296, fixed in 3.12):
    the cancelled task would go on as if nothing happened (a lease heartbeat then renewed
    forever). The task still counts the request (``cancelling()``), so it is raised here.
    """
    task = asyncio.current_task()
    requested = task.cancelling() if task is not None else 0
    try:
        yield
    except (
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        redis_errors.ReadOnlyError,  # a replica during failover: retry later
        OSError,  # includes TimeoutError (asyncio's too, on Python 3.11+)
    ) as exc:
        _raise_lost_cancellation(task, requested)
        raise StoreUnavailableError(f"Redis store unavailable during {action}: {exc}") from exc
    except redis_errors.RedisError as exc:
        _raise_lost_cancellation(task, requested)
        raise StoreError(f"Redis store failed during {action}: {exc}") from exc
    except UnicodeError as exc:  # a text that is not valid Unicode (a lone surrogate)
        _raise_lost_cancellation(task, requested)
        raise StoreRefusedError(f"Redis store refused a value during {action}: {exc}") from exc
    _raise_lost_cancellation(task, requested)


def _raise_lost_cancellation(task: asyncio.Task[Any] | None, requested: int) -> None:
    """Raise CancelledError if ``task`` was asked to cancel since it counted ``requested``
    requests, yet the operation ended without raising it (see :func:`_translated`)."""
    if task is not None and task.cancelling() > requested:
        raise asyncio.CancelledError


class RedisStore(Store):
    """A :class:`~agentfn_asgi.store.base.Store` on Redis (5+ with Lua; 7 recommended).

    ``namespace`` is the app's part of a shared Redis (see the module docstring for what
    it separates). Every operation waits at most about ``socket_timeout`` before it raises
    :class:`StoreUnavailableError`; dropped connections are re-opened on the next call.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "agentfn:",
        namespace: str = "",
        clock: Callable[[], float] = time.time,
        socket_timeout: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        for name, _ in urllib.parse.parse_qsl(
            urllib.parse.urlsplit(url).query, keep_blank_values=True
        ):
            if name not in _DRIVER_PARAMETERS:
                raise unknown_url_parameter(url, name, [*_DRIVER_PARAMETERS, "key_prefix"])
        self._url = url
        self._prefix = key_prefix
        self.namespace = namespace
        self._clock = clock
        self._socket_timeout = socket_timeout
        self._max_connections = max_connections
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        # One loop turn's scripts share one pipeline (see store/redis/batch.py).
        self._batcher = ScriptBatcher()
        self._closed = False
        self._layout_checked = False

    def __repr__(self) -> str:
        return f"RedisStore({self.location!r})"

    @property
    def location(self) -> str:
        """Where the data lives, for logs and operators (password hidden)."""
        where = f"{redact_url(self._url)} (key prefix {self._prefix}"
        return where + (f", namespace {self.namespace})" if self.namespace else ")")

    # -- keys ------------------------------------------------------------------------------
    @property
    def _space(self) -> str:
        """The namespace's key prefix: every key of this store's work starts with it."""
        return f"{self._prefix}n:{_h(self.namespace)}:"

    def _call_key(self, key: CallKey) -> str:
        return f"{self._space}c:{_h(_member(key))}"

    def _delivery_key(self, delivery_id: str) -> str:
        return f"{self._space}d:{_h(delivery_id)}"

    def _index(self, name: str) -> str:
        return f"{self._space}i:{name}"

    # -- plumbing --------------------------------------------------------------------------
    def _redis(self) -> Any:
        if self._closed:
            raise StoreUnavailableError("the Redis store is closed")
        if self._client is None:
            try:
                pool: Any = aioredis.BlockingConnectionPool.from_url(
                    self._url,
                    max_connections=self._max_connections,
                    timeout=self._socket_timeout,
                    socket_timeout=self._socket_timeout,
                    socket_connect_timeout=self._socket_timeout,
                    decode_responses=True,
                    # RESP2 whatever the driver's default (redis-py 8.2 moved to RESP3): the
                    # scripts' replies convert as written for (a Lua false is nil, not a
                    # boolean), and a new connection needs no HELLO round trip.
                    protocol=2,
                    # Few, quick retries on a dropped connection (one reconnect after a
                    # restart); never on timeouts, which would multiply the wait.
                    retry=Retry(
                        ExponentialBackoff(cap=0.2, base=0.02),
                        2,
                        supported_errors=(redis_errors.ConnectionError,),
                    ),
                )
            except ValueError as exc:
                raise ConfigurationError(f"bad Redis store URL: {exc}") from exc
            client: Any = aioredis.Redis(connection_pool=pool)
            self._scripts = {
                name: client.register_script(source) for name, source in _SCRIPTS.items()
            }
            self._client = client
        return self._client

    async def _run(self, script: str, keys: Sequence[str], *args: object) -> Any:
        """Run one script (its name says what failed); ``ARGV[1]`` is always the namespace's
        key prefix, the only keys the script can reach."""
        client = self._redis()
        if not self._layout_checked:
            await self._check_layout(client)
            client = self._redis()  # closed meanwhile: refused, as after close()
        argv = [self._space, *(str(arg) for arg in args)]
        with _translated(script):
            return await self._batcher.run(self._scripts[script], list(keys), argv, client)

    async def _check_layout(self, client: Any) -> None:
        """Refuse a key prefix of a layout this code cannot work on, and bring it to this
        layout (:mod:`~agentfn_asgi.store.redis.layout`) when it lags."""
        where = f"Redis key prefix {self._prefix!r}"
        with _translated("open"):
            while True:
                found = await client.hmget(self._prefix + LAYOUT_KEY, "version", "readable_from")
                change = layout_change(found, where)
                # 0: another replica moved the marker meanwhile; read it again.
                if change is None or await client.eval(change[0], 0, self._prefix, *change[1]):
                    break
        self._layout_checked = True

    async def _calls(
        self, script: str, keys: Sequence[str], *args: object, history: bool = False
    ) -> list[CallRecord]:
        return [_record(r, history=history) for r in await self._run(script, keys, *args)]

    async def _step(
        self,
        script: str,
        key: CallKey,
        *args: object,
        now: float | None = None,
        also: Sequence[str] = (),
    ) -> Any:
        """A step on one call: its hash (then the keys ``also``), then ``now`` and its
        member, then ``args``."""
        now = self._clock() if now is None else now
        keys = [self._call_key(key), *also]
        return await self._run(script, keys, _num(now), _member(key), *args)

    async def _drain(self, script: str, keys: Sequence[str], *args: object) -> int:
        """Run a batch script until a batch comes back short; the records it removed."""
        removed = 0
        while True:
            count = int(await self._run(script, keys, *args, _PRUNE_BATCH))
            removed += count
            if count < _PRUNE_BATCH:
                return removed

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        """Create the connection pool, check Redis answers and the key layout. Idempotent."""
        self._closed = False
        await self.ping()
        if not self._layout_checked:
            await self._check_layout(self._redis())
            await self._warn_unless_persistent(self._redis())

    async def _warn_unless_persistent(self, client: Any) -> None:
        """A WARNING when Redis keeps its data only in memory (``appendonly no``): a delivery
        acknowledged to OpenAI, or a saved result, is then lost if Redis restarts. Skipped
        where ``CONFIG`` is not allowed (managed services often rename or deny it)."""
        try:
            found = await client.config_get("appendonly")
        except redis_errors.RedisError:
            return
        if found.get("appendonly") == "no":
            logger.warning(
                "Redis at %s keeps its data in memory only (appendonly no): deliveries "
                "acknowledged and results saved since its last snapshot are lost if Redis "
                "restarts. Set appendonly yes (appendfsync everysec loses at most a second "
                "on a power loss; always, nothing)",
                redact_url(self._url),
            )

    async def close(self) -> None:
        """Close the connection pool. Idempotent."""
        client, self._client = self._client, None
        self._closed = True
        if client is not None:
            with _translated("close"):
                try:
                    # Scripts started before close() (their batch too) get their answers.
                    await self._batcher.wait_sent()
                finally:
                    await client.aclose()
                    # A pool handed to Redis() is not the client's to close: close it here.
                    await client.connection_pool.disconnect()

    async def ping(self) -> None:
        """``PING``; raises :class:`StoreUnavailableError` when Redis cannot be reached."""
        client = self._redis()
        with _translated("ping"):
            await client.ping()

    async def destroy(self) -> None:
        """Delete every key under this store's prefix, every namespace's (tests, teardown)."""
        client = self._redis()
        with _translated("destroy"):
            batch: list[str] = []
            async for key in client.scan_iter(match=_escape_glob(self._prefix) + "*", count=500):
                batch.append(key)
                if len(batch) >= 500:
                    await client.unlink(*batch)
                    batch.clear()
            if batch:
                await client.unlink(*batch)
        self._layout_checked = False

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(
        self, delivery_id: str, session_id: str, *, nonce: str | None = None
    ) -> bool:
        """Record a delivery; True if new, or our own retried write (same ``nonce``)."""
        created = await self._run(
            "record_delivery",
            [self._delivery_key(delivery_id)],
            _num(self._clock()),
            delivery_id,
            session_id,
            self.namespace,
            nonce or "",
        )
        return bool(created)

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Mark a delivery resolved; unknown ids are ignored."""
        key = self._delivery_key(delivery_id)
        await self._run("resolve_delivery", [key], delivery_id)

    async def delivery_failed(self, delivery_id: str, *, error: str, retry_at: float) -> None:
        """Count a failed resolve, keep its error, retry at ``retry_at``."""
        key = self._delivery_key(delivery_id)
        await self._run("delivery_failed", [key], delivery_id, error, _num(retry_at))

    async def unresolved_deliveries(
        self,
        *,
        due_before: float,
        limit: int = 100,
        after: tuple[float, str] | None = None,
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries due at or before ``due_before``, soonest first."""
        if limit <= 0:
            return []
        at, after_id = ("", "") if after is None else (_num(after[0]), after[1])
        rows = await self._run(
            "due_deliveries",
            [self._index("deliveries_due")],
            _num(due_before),
            limit,
            at,
            after_id,
        )
        return [_delivery(flat) for flat in rows]

    async def list_deliveries(
        self, *, unresolved_only: bool = False, limit: int = 50
    ) -> list[DeliveryRecord]:
        """Deliveries, newest first."""
        if limit <= 0:
            return []
        index = self._index("unresolved" if unresolved_only else "deliveries")
        rows = await self._run("list_deliveries", [index], limit)
        return [_delivery(flat) for flat in rows]

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Delete old deliveries, old finished (submitted, stale or cancelled) calls and the
        buckets of limiters
        idle since ``calls_before`` of this namespace, in batches of 500 (one short script
        each, so other clients get Redis in between); the deliveries and calls removed."""
        deliveries = await self._drain("prune_deliveries", [], _num(deliveries_before))
        calls = await self._drain("prune_calls", [self._index("finished")], _num(calls_before))
        await self._drain("prune_buckets", [self._index("buckets")], _num(calls_before))
        return deliveries + calls

    # -- calls -----------------------------------------------------------------------------
    async def _claim(
        self,
        key: CallKey,
        args: Mapping[str, Any],
        *,
        limit: Limit | None,
        margin: float,
        resolves: str | None,
    ) -> ClaimOutcome:
        """Decide who runs ``key`` in one script (with ``limit``: admitted or waiting, in
        the same script; with ``resolves``: the delivery resolved in it too); see
        :meth:`Store.claim_call`."""
        status, flat = await self._step(
            "claim",
            key,
            self.namespace,
            args["owner"],
            _num(args["lease_expires_at"]),
            _num(args["takeover_before"]),
            args["tool_name"],
            key.session_id,
            key.turn_id,
            key.call_id,
            args["delivery_id"] or "",
            # This claim's own, should it be sent again (a lost answer): which row it made.
            args["nonce_retry"],
            args["nonce_adopt"],
            # Without a limit the script reads nothing of the limiters: nothing is passed.
            *(() if limit is None else _limit_args(limit)),
            now=args["now"],
            also=[] if resolves is None else [self._delivery_key(resolves)],
        )
        return ClaimOutcome(ClaimStatus(status), _plain(flat))

    async def admit_call(
        self,
        key: CallKey,
        *,
        owner: str,
        attempt: int,
        limit: Limit,
        lease_seconds: float,
        margin: float = 0.0,
    ) -> ClaimOutcome | None:
        """Ask ``limit`` for a slot for the call we hold, in one script; see
        :meth:`Store.admit_call`."""
        now = self._clock()
        reply = await self._step(
            "admit",
            key,
            owner,
            attempt,
            _num(now + lease_seconds),
            _num(now - margin),
            *_limit_args(limit),
            now=now,
        )
        if not reply:
            return None
        status, flat = reply
        record = _plain(flat)
        # '': not the caller's to admit; it is told what a claim would be.
        return ClaimOutcome(ClaimStatus(status) if status else claim_status_for(record), record)

    async def count_call(
        self, key: CallKey, *, owner: str, attempt: int, budget: int
    ) -> CallRecord | None:
        """Count the call we hold against its session's budget, in one script; see
        :meth:`Store.count_call`."""
        reply = await self._step("count", key, owner, attempt, budget)
        return _plain(reply) if reply else None

    async def _transition(
        self, name: str, key: CallKey, args: Mapping[str, Any], *, record: bool
    ) -> tuple[bool, CallRecord | None]:
        """Row ``name``'s script on ``key``; see :meth:`Store._transition`."""
        pairs: list[object] = []
        for field, value in flat_args(args).items():
            if value is not None:
                pairs += [field, _arg(value)]
        reply = await self._run(
            f"row {name}", [self._call_key(key)], _member(key), "1" if record else "0", *pairs
        )
        if not reply:
            return False, None
        done = reply[0] == 1
        return done, _plain(reply[1]) if record else None

    async def _worklist(
        self,
        name: str,
        *,
        upto: float | None,
        limit: int,
        after: tuple[float, CallKey] | None = None,
    ) -> list[CallRecord]:
        """A worklist's first calls from its index, in one script; see
        :meth:`Store._worklist`."""
        if limit <= 0:
            return []
        most = "+inf" if upto is None else _num(upto)
        if upto is not None and WORKLISTS[name].strict:
            most = "(" + most
        at, member = ("", "") if after is None else (_num(after[0]), _member(after[1]))
        index = self._index(_WORKLIST_INDEX[name])
        return await self._calls(name, [index], most, limit, at, member)

    # -- approval ------------------------------------------------------------------------
    async def find_approval(self, approval_id: str) -> CallRecord | None:
        """The call whose approval request is ``approval_id``, with its history."""
        reply = await self._run("find_approval", [], approval_id)
        return _record(reply, history=True) if reply else None

    async def count_waiting_approvals(self) -> int:
        """How many calls wait for a person (the size of their index)."""
        return int(await self._run("count_waiting_approvals", [self._index("waiting")]))

    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of ``key`` (with its history if asked), or None."""
        reply = await self._run(
            "get_call", [self._call_key(key)], _member(key), "1" if history else "0"
        )
        return _record(reply, history=history) if reply else None

    async def find_calls(self, call_id: str) -> list[CallRecord]:
        """Every call with ``call_id`` in this namespace, with its history."""
        found = await self._calls("set_calls", [f"{self._space}k:{_h(call_id)}"], "1", history=True)
        found.sort(key=lambda c: (c.created_at, c.key.session_id, c.key.turn_id))
        return found

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of a session in this namespace, oldest first."""
        found = await self._calls("set_calls", [f"{self._space}s:{_h(session_id)}"], "0")
        found.sort(key=lambda c: (c.created_at, c.key.turn_id, c.key.call_id))
        return found

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching ``query``, newest first, in bounded stretches of the index."""
        if query.limit <= 0:
            return []
        if query.state == "in_doubt":
            lease_before = _num(self._clock() - query.margin)
            index = self._index("state:claimed")
        else:
            index, lease_before = self._index(f"state:{query.state}"), ""
            if query.state is None:
                index = self._index("calls")
            elif query.state not in {state.value for state in CallState}:
                return []
        hi, cursor = "+inf", ""
        if query.before is not None:
            at, session_id, turn_id, call_id = query.before
            hi, cursor = _num(at), _member(CallKey(session_id, turn_id, call_id))
        lo = "-inf" if query.since is None else _num(query.since)
        matching: list[str] = []
        for name in ("session_id", "tool_name"):
            value = getattr(query, name)
            if value is not None:
                matching += [name, value]
        found: list[CallRecord] = []
        while len(found) < query.limit:
            rows, *last = await self._run(
                "list_calls",
                [index],
                hi,
                lo,
                cursor,
                _LIST_BUDGET,
                query.limit - len(found),
                lease_before,
                *matching,
            )
            found += [_record(reply) for reply in rows]
            if not last:
                break
            hi, cursor = last
        return found

    async def stats(self, *, margin: float = 0.0) -> StoreStats:
        """Counts for operators, read in one script; every state is listed, zeros too."""
        reply = await self._run("stats", [], _num(self._clock() - margin))
        deliveries, unresolved, failing, in_doubt, submitted_failed, *rest = reply
        counts = {
            state.value: int(count) for state, count in zip(CallState, rest[:-1], strict=True)
        }
        oldest = rest[-1]
        return StoreStats(
            deliveries=int(deliveries),
            unresolved_deliveries=int(unresolved),
            calls_by_state=counts,
            in_doubt=int(in_doubt),
            oldest_pending_at=float(oldest) if oldest else None,
            successes=counts[CallState.SUBMITTED.value] - int(submitted_failed),
            failures=int(submitted_failed),
            failing_deliveries=int(failing),
        )

    # -- revocations -----------------------------------------------------------------------
    def _revoked_key(self, token_id: str) -> str:
        return f"{self._prefix}r:{_h(token_id)}"

    async def revoke_token(self, token_id: str, *, expires_at: float) -> None:
        """Revoke ``token_id`` until ``expires_at``; Redis drops the entry after it."""
        seconds = expires_at - self._clock()
        if seconds <= 0:
            return
        client = self._redis()
        with _translated("revoke_token"):
            await client.set(
                self._revoked_key(token_id), _num(expires_at), ex=math.ceil(seconds) + 1
            )

    async def token_revoked(self, token_id: str) -> bool:
        """Whether ``token_id`` is revoked and its entry not expired."""
        client = self._redis()
        with _translated("token_revoked"):
            found = await client.get(self._revoked_key(token_id))
        return found is not None and float(found) > self._clock()
