"""Redis store (``redis://`` / ``rediss://``): several replicas sharing one Redis.

Every state change is one Lua script (or one ``SET NX PX``), so it is atomic inside Redis and
the indexes below change in the same step as the record they index.

Keys, all under ``key_prefix`` (identifiers are hashed, so any id of any length is safe)::

    {p}d:{h(delivery_id)}       string, JSON of the delivery; SET NX PX dedup_window
    {p}i:deliveries             zset of every recorded delivery, score received_at
    {p}i:unresolved             zset of deliveries not resolved yet, score received_at
    {p}c:{h(session)}:{h(key)}  hash, one per call (the "member" is "{h(session)}:{h(key)}")
    {p}s:{h(session)}           set of the members of a session's calls
    {p}i:claimed                zset of claimed calls, score lease_expires_at
    {p}i:{state}                zset per other state, score updated_at
    {p}i:pending                zset of non-terminal calls, score created_at

Time: scores and record fields come from the injected ``clock`` (passed into every script as
an argument, never Redis' own ``TIME``), so leases are compared in the caller's time and the
contract tests can use a fake clock. Key *expiry* is Redis' real time: the dedup window (a
delivery key's TTL) and ``call_retention`` (a terminal call's TTL) pass in wall-clock time.
:meth:`RedisStore.prune` also deletes by the clock-based scores, and removes index entries whose
keys already expired; until it runs, :meth:`RedisStore.stats` may count expired terminal calls.

Redis Cluster: scripts touch keys they compute from the prefix, so all keys must live in one
slot; give the prefix a hash tag (``key_prefix="{agentfn}:"``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from agentfn_asgi.errors import ConfigurationError, StoreError, StoreUnavailableError
from agentfn_asgi.records import (
    CallKey,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.store._codec import record_from_mapping
from agentfn_asgi.store._redis_scripts import (
    CLAIM,
    INDEXED_CALLS,
    PRUNE_CALLS,
    PRUNE_DELIVERIES,
    RECORD_DELIVERY,
    RENEW,
    SAVE,
    SESSION_CALLS,
    TERMINATE,
    UNRESOLVED,
)

try:
    import redis.asyncio as aioredis
    from redis import exceptions as redis_errors
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "the redis:// store needs the redis driver: pip install 'agentfn-asgi[redis]'"
    ) from exc

__all__ = ["RedisStore"]

_PRUNE_BATCH = 500
_STATE_INDEXES = tuple(state.value for state in CallState)
_TERMINAL = (CallState.SUBMITTED, CallState.STALE, CallState.QUARANTINED)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _num(value: float) -> str:
    # repr() round-trips a float exactly; Lua's own number formatting would keep 14 digits.
    return repr(float(value))


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


def _record(flat: Sequence[Any]) -> CallRecord:
    return record_from_mapping(_pairs(flat))


def _result_fields(result: SavedResult) -> list[str]:
    fields = [
        "success", "1" if result.success else "0",
        "event_json", result.event_json,
        "idempotency_key", result.idempotency_key,
        "source", result.source,
    ]  # fmt: skip
    if result.error_type is not None:
        fields += ["error_type", result.error_type]
    if result.full_output is not None:
        fields += ["full_output", result.full_output]
    return fields


def _escape_glob(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


@contextmanager
def _translated(action: str) -> Iterator[None]:
    """Turn driver errors into ours: unreachable → StoreUnavailableError, else StoreError."""
    try:
        yield
    except (
        redis_errors.ConnectionError,
        redis_errors.TimeoutError,
        redis_errors.ReadOnlyError,  # a replica during failover: retry later
        OSError,  # includes TimeoutError (asyncio's too, on Python 3.11+)
    ) as exc:
        raise StoreUnavailableError(f"Redis store unavailable during {action}: {exc}") from exc
    except redis_errors.RedisError as exc:
        raise StoreError(f"Redis store failed during {action}: {exc}") from exc


class RedisStore:
    """A :class:`~agentfn_asgi.store.base.Store` on Redis (5+ with Lua; 7 recommended).

    ``dedup_window`` is the lifetime of a delivery's dedup key, ``call_retention`` the time a
    terminal call is kept. Every operation waits at most about ``socket_timeout`` before it
    raises :class:`StoreUnavailableError`; dropped connections are re-opened on the next call.
    """

    def __init__(
        self,
        url: str,
        *,
        key_prefix: str = "agentfn:",
        clock: Callable[[], float] = time.time,
        dedup_window: float = 72 * 3600,
        call_retention: float = 7 * 86400,
        socket_timeout: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        if dedup_window <= 0 or call_retention <= 0:
            raise ConfigurationError("dedup_window and call_retention must be positive")
        self._url = url
        self._prefix = key_prefix
        self._clock = clock
        self._dedup_ms = max(1, int(dedup_window * 1000))
        self._retention_ms = max(1, int(call_retention * 1000))
        self._socket_timeout = socket_timeout
        self._max_connections = max_connections
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._closed = False

    # -- keys ------------------------------------------------------------------------------
    def _key(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _member(self, key: CallKey) -> str:
        triple = json.dumps([key.session_id, key.turn_id, key.call_id])
        return f"{_digest(key.session_id)}:{_digest(triple)}"

    def _session_key(self, session_id: str) -> str:
        return self._key(f"s:{_digest(session_id)}")

    def _index(self, state: str) -> str:
        return self._key(f"i:{state}")

    # -- lifecycle -------------------------------------------------------------------------
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
                name: client.register_script(source)
                for name, source in (
                    ("record_delivery", RECORD_DELIVERY),
                    ("unresolved", UNRESOLVED),
                    ("claim", CLAIM),
                    ("renew", RENEW),
                    ("save", SAVE),
                    ("terminate", TERMINATE),
                    ("session_calls", SESSION_CALLS),
                    ("indexed_calls", INDEXED_CALLS),
                    ("prune_deliveries", PRUNE_DELIVERIES),
                    ("prune_calls", PRUNE_CALLS),
                )
            }
            self._client = client
        return self._client

    async def _run(self, action: str, script: str, keys: Sequence[str], args: Sequence[str]) -> Any:
        client = self._redis()
        with _translated(action):
            return await self._scripts[script](keys=list(keys), args=list(args), client=client)

    async def open(self) -> None:
        """Create the connection pool and check Redis answers. Idempotent; no schema needed."""
        self._closed = False
        await self.ping()

    async def close(self) -> None:
        """Close the connection pool. Idempotent."""
        client, self._client = self._client, None
        self._closed = True
        if client is not None:
            with _translated("close"):
                await client.aclose()
                # A pool handed to Redis() is not the client's to close: close it here.
                await client.connection_pool.disconnect()

    async def ping(self) -> None:
        """``PING``; raises :class:`StoreUnavailableError` when Redis cannot be reached."""
        client = self._redis()
        with _translated("ping"):
            await client.ping()

    async def destroy(self) -> None:
        """Delete every key under this store's prefix (tests and teardown), with ``SCAN``."""
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

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(self, delivery_id: str, session_id: str) -> bool:
        """``SET NX PX`` of the delivery key plus its index entries, in one script."""
        now = self._clock()
        member = _digest(delivery_id)
        value = json.dumps(
            {"delivery_id": delivery_id, "session_id": session_id, "received_at": now}
        )
        created = await self._run(
            "record_delivery",
            "record_delivery",
            [self._key(f"d:{member}"), self._index("deliveries"), self._index("unresolved")],
            [member, value, str(self._dedup_ms), _num(now)],
        )
        return bool(created)

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Drop the delivery from the unresolved index (one ``ZREM``)."""
        client = self._redis()
        with _translated("mark_delivery_resolved"):
            await client.zrem(self._index("unresolved"), _digest(delivery_id))

    async def unresolved_deliveries(
        self, *, older_than: float, limit: int = 100
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries received at or before ``older_than``, oldest first."""
        if limit <= 0:
            return []
        values = await self._run(
            "unresolved_deliveries",
            "unresolved",
            [self._index("unresolved"), self._index("deliveries")],
            [self._key("d:"), _num(older_than), str(limit)],
        )
        records = []
        for raw in values:
            data = json.loads(raw)
            records.append(
                DeliveryRecord(
                    delivery_id=data["delivery_id"],
                    session_id=data["session_id"],
                    received_at=float(data["received_at"]),
                )
            )
        return records

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Delete old deliveries and terminal calls in batches of 500 (one script each).

        Also drops index entries whose keys Redis already expired. Returns keys deleted.
        """
        removed = 0
        finished = False
        while not finished:
            count, done = await self._run(
                "prune",
                "prune_deliveries",
                [self._index("deliveries"), self._index("unresolved")],
                [self._key("d:"), _num(deliveries_before), str(_PRUNE_BATCH)],
            )
            removed += int(count)
            finished = bool(done)
        for state in _TERMINAL:
            finished = False
            while not finished:
                count, done = await self._run(
                    "prune",
                    "prune_calls",
                    [self._index(state)],
                    [
                        self._key("c:"),
                        self._key("s:"),
                        _num(calls_before),
                        str(_PRUNE_BATCH),
                        state.value,
                    ],
                )
                removed += int(count)
                finished = bool(done)
        return removed

    # -- calls -----------------------------------------------------------------------------
    async def claim_call(
        self,
        key: CallKey,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None = None,
    ) -> ClaimOutcome:
        """Insert, take over an expired lease, or classify, in one Lua script."""
        now = self._clock()
        lease = _num(now + lease_seconds)
        member = self._member(key)
        fields = [
            "session_id", key.session_id, "turn_id", key.turn_id, "call_id", key.call_id,
            "tool_name", tool_name, "state", CallState.CLAIMED.value, "attempt", "1",
            "owner", owner, "lease_expires_at", lease, "created_at", _num(now),
            "updated_at", _num(now),
        ]  # fmt: skip
        if delivery_id is not None:
            fields += ["delivery_id", delivery_id]
        status, flat = await self._run(
            "claim_call",
            "claim",
            [
                self._key(f"c:{member}"),
                self._session_key(key.session_id),
                self._index("claimed"),
                self._index("pending"),
            ],
            [member, _num(now), lease, owner, delivery_id or "", *fields],
        )
        return ClaimOutcome(ClaimStatus(status), _record(flat))

    async def renew_lease(self, key: CallKey, *, owner: str, lease_seconds: float) -> bool:
        """Extend the lease if ``owner`` still holds the claim."""
        now = self._clock()
        member = self._member(key)
        renewed = await self._run(
            "renew_lease",
            "renew",
            [self._key(f"c:{member}"), self._index("claimed")],
            [member, owner, _num(now), _num(now + lease_seconds)],
        )
        return bool(renewed)

    async def save_result(self, key: CallKey, *, owner: str, result: SavedResult) -> CallRecord:
        """``claimed`` → ``succeeded``/``failed``; first writer wins (see the protocol)."""
        now = self._clock()
        member = self._member(key)
        state = CallState.SUCCEEDED if result.success else CallState.FAILED
        flat = await self._run(
            "save_result",
            "save",
            [self._key(f"c:{member}"), self._index("claimed"), self._index(state)],
            [member, _num(now), owner, state.value, *_result_fields(result)],
        )
        if not flat:
            raise StoreError(f"cannot save a result for unknown call {key}")
        return _record(flat)

    async def _terminate(
        self,
        key: CallKey,
        target: CallState,
        *,
        allowed: Sequence[CallState],
        owner: str = "",
        extra: Sequence[str] = (),
    ) -> None:
        member = self._member(key)
        await self._run(
            f"mark {target.value}",
            "terminate",
            [
                self._key(f"c:{member}"),
                self._index("claimed"),
                self._index("succeeded"),
                self._index("failed"),
                self._index("pending"),
                self._index(target),
            ],
            [
                member,
                _num(self._clock()),
                str(self._retention_ms),
                target.value,
                owner,
                " ".join(state.value for state in allowed),
                *extra,
            ],
        )

    async def mark_submitted(self, key: CallKey) -> None:
        """``succeeded``/``failed`` → ``submitted``; the call then expires after retention."""
        await self._terminate(
            key, CallState.SUBMITTED, allowed=(CallState.SUCCEEDED, CallState.FAILED)
        )

    async def mark_stale(self, key: CallKey) -> None:
        """Any non-terminal state → ``stale``."""
        await self._terminate(
            key,
            CallState.STALE,
            allowed=(CallState.CLAIMED, CallState.SUCCEEDED, CallState.FAILED),
        )

    async def quarantine(self, key: CallKey, *, owner: str, reason: str) -> None:
        """``claimed`` by ``owner`` → ``quarantined`` (the reason is kept on the record)."""
        await self._terminate(
            key,
            CallState.QUARANTINED,
            allowed=(CallState.CLAIMED,),
            owner=owner,
            extra=("quarantine_reason", reason),
        )

    async def get_call(self, key: CallKey) -> CallRecord | None:
        """``HGETALL`` of the call's hash."""
        client = self._redis()
        with _translated("get_call"):
            fields = await client.hgetall(self._key(f"c:{self._member(key)}"))
        return record_from_mapping(fields) if fields else None

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of the session, oldest first."""
        rows = await self._run(
            "calls_for_session",
            "session_calls",
            [self._session_key(session_id)],
            [self._key("c:")],
        )
        records = [_record(flat) for flat in rows]
        records.sort(key=lambda r: (r.created_at, r.key.turn_id, r.key.call_id))
        return records

    async def _indexed(
        self, action: str, states: Sequence[str], max_score: str, limit: int
    ) -> list[CallRecord]:
        if limit <= 0:
            return []
        rows = await self._run(
            action,
            "indexed_calls",
            [self._index(state) for state in states],
            [self._key("c:"), max_score, str(limit)],
        )
        return [_record(flat) for flat in rows]

    async def unsubmitted_results(self, *, limit: int = 100) -> list[CallRecord]:
        """Saved, not yet accepted results, oldest first."""
        records = await self._indexed("unsubmitted_results", ("succeeded", "failed"), "+inf", limit)
        return [r for r in records if r.state in (CallState.SUCCEEDED, CallState.FAILED)]

    async def expired_claims(self, *, limit: int = 100) -> list[CallRecord]:
        """Claims whose lease expired by the store's clock (``lease_expires_at < now``)."""
        now = self._clock()
        records = await self._indexed("expired_claims", ("claimed",), "(" + _num(now), limit)
        return [r for r in records if r.state is CallState.CLAIMED and r.lease_expires_at < now]

    async def stats(self) -> StoreStats:
        """Counts from the index zsets (no ``SCAN``; expired terminal calls count until pruned)."""
        now = self._clock()
        client = self._redis()
        with _translated("stats"):
            async with client.pipeline(transaction=True) as pipe:
                pipe.zcard(self._index("deliveries"))
                pipe.zcard(self._index("unresolved"))
                for state in _STATE_INDEXES:
                    pipe.zcard(self._index(state))
                pipe.zcount(self._index("claimed"), "-inf", "(" + _num(now))
                pipe.zrange(self._index("pending"), 0, 0, withscores=True)
                replies = await pipe.execute()
        deliveries, unresolved, *rest = replies
        counts = rest[: len(_STATE_INDEXES)]
        in_doubt, oldest = rest[len(_STATE_INDEXES) :]
        return StoreStats(
            deliveries=int(deliveries),
            unresolved_deliveries=int(unresolved),
            calls_by_state={
                state: int(count) for state, count in zip(_STATE_INDEXES, counts, strict=True)
            },
            in_doubt=int(in_doubt),
            oldest_pending_at=float(oldest[0][1]) if oldest else None,
        )
