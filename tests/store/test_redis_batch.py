"""The Redis store's loop-turn batching (:mod:`agentfn_asgi.store.redis.batch`), on a real
Redis: the scripts of one turn share one write, and each caller still gets its own answer.

Needs Redis on 127.0.0.1:6379; skipped when it is unreachable, failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agentfn_asgi.errors import StoreUnavailableError

from ..support.ports import free_port
from .conftest import REDIS_URL, require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

redis_asyncio = pytest.importorskip("redis.asyncio")
from redis.asyncio.connection import AbstractConnection  # noqa: E402
from redis.exceptions import ConnectionError as RedisConnectionError  # noqa: E402
from redis.exceptions import ResponseError  # noqa: E402

from agentfn_asgi.store.redis.batch import ALONE_OVER, BATCH_MAX, ScriptBatcher  # noqa: E402
from agentfn_asgi.store.redis.store import RedisStore  # noqa: E402


@pytest.fixture
async def client() -> AsyncIterator[Any]:
    redis = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        await redis.ping()
    except (OSError, RedisConnectionError) as exc:
        require_service("redis", str(exc))
    yield redis
    await redis.aclose()


@pytest.fixture
async def store() -> AsyncIterator[RedisStore]:
    opened = RedisStore(REDIS_URL, key_prefix=f"agentfn-test:{uuid.uuid4().hex}:")
    try:
        await opened.open()
    except StoreUnavailableError as exc:
        require_service("redis", str(exc))
    yield opened
    await opened.destroy()
    await opened.close()


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many writes carried scripts (one per lone script, or per batch)."""
    sent: list[int] = []
    original = AbstractConnection.send_packed_command

    async def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> None:
        first = command[0] if isinstance(command, list) and command else command
        if b"EVALSHA" in bytes(first)[:64]:  # not a new connection's handshake
            sent.append(1)
        await original(self, command, *args, **kwargs)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", counted)
    return sent


async def test_one_turns_steps_share_one_write_and_each_gets_its_own_answer(
    store: RedisStore, writes: list[int]
) -> None:
    await store.record_delivery("warm", "sess_0")  # the pool's connection is open
    writes.clear()
    new = [f"wh_{n}" for n in range(16)]
    assert await asyncio.gather(*(store.record_delivery(d, "sess_1") for d in new)) == [True] * 16
    assert len(writes) == 1
    # Known and new ids mixed in one batch: each answer is its own delivery's.
    mixed = [new[0], "wh_new_a", new[5], "wh_new_b"]
    writes.clear()
    found = await asyncio.gather(*(store.record_delivery(d, "sess_1") for d in mixed))
    assert found == [False, True, False, True]
    assert len(writes) == 1


async def test_one_step_at_a_time_is_sent_alone(store: RedisStore, writes: list[int]) -> None:
    await store.record_delivery("warm", "sess_0")
    writes.clear()
    for n in range(3):
        assert await store.record_delivery(f"wh_{n}", "sess_1") is True
    assert len(writes) == 3


async def test_an_error_reply_reaches_only_its_caller(client: Any) -> None:
    echo = client.register_script("return ARGV[1]")
    fail = client.register_script("return redis.error_reply('refused: ' .. ARGV[1])")
    await echo(keys=[], args=["load"], client=client)
    await client.script_load(fail.script)
    batcher = ScriptBatcher()
    answers = await asyncio.gather(
        batcher.run(echo, [], ["a"], client),
        batcher.run(fail, [], ["b"], client),
        batcher.run(echo, [], ["c"], client),
        return_exceptions=True,
    )
    assert answers[0] == "a" and answers[2] == "c"
    assert isinstance(answers[1], ResponseError) and "refused: b" in str(answers[1])


async def test_scripts_redis_does_not_know_are_loaded_and_sent_again(client: Any) -> None:
    # A body of its own: no other test or process has loaded it (NOSCRIPT on first send).
    body = f"-- {uuid.uuid4().hex}\nreturn ARGV[1] .. '!'"
    script = client.register_script(body)
    known = client.register_script("return ARGV[1]")
    await client.script_load(known.script)
    assert await client.script_exists(script.sha) == [False]
    batcher = ScriptBatcher()
    answers = await asyncio.gather(
        batcher.run(script, [], ["x"], client),
        batcher.run(known, [], ["y"], client),
        batcher.run(script, [], ["z"], client),
    )
    assert list(answers) == ["x!", "y", "z!"]
    assert await client.script_exists(script.sha) == [True]


async def test_more_callers_than_a_batch_holds_start_the_next_batch(
    store: RedisStore, writes: list[int]
) -> None:
    await store.record_delivery("warm", "sess_0")
    writes.clear()
    ids = [f"wh_{n}" for n in range(2 * BATCH_MAX + 22)]
    assert await asyncio.gather(*(store.record_delivery(d, "sess_1") for d in ids)) == [True] * len(
        ids
    )
    assert len(writes) == 3


async def test_a_cancelled_caller_never_takes_the_others_scripts_with_it(client: Any) -> None:
    echo = client.register_script("return ARGV[1]")
    await echo(keys=[], args=["load"], client=client)
    for cancelled in (0, 1):  # the caller that sends the batch, then one that joined it
        batcher = ScriptBatcher()
        tasks = [asyncio.create_task(batcher.run(echo, [], [str(n)], client)) for n in range(3)]
        await asyncio.sleep(0)  # every task has started: the first waits for the turn's end
        tasks[cancelled].cancel()
        # Bounded: a batch its sender dropped would leave the others waiting for ever.
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert isinstance(done[cancelled], asyncio.CancelledError)
        assert [d for n, d in enumerate(done) if n != cancelled] == [
            str(n) for n in range(3) if n != cancelled
        ]
        await batcher.wait_sent()


async def test_a_failed_connection_fails_every_script_of_the_batch(client: Any) -> None:
    dead = redis_asyncio.Redis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1.0
    )
    echo = dead.register_script("return ARGV[1]")
    batcher = ScriptBatcher()
    try:
        answers = await asyncio.gather(
            *(batcher.run(echo, [], [x], dead) for x in "abc"), return_exceptions=True
        )
    finally:
        await dead.aclose()
    assert all(isinstance(answer, RedisConnectionError) for answer in answers), answers


async def test_a_batch_cut_short_fails_its_callers_with_a_lost_connection(client: Any) -> None:
    """The task sending a batch cancelled while Redis has not answered (a Redis that
    accepts and never answers): every caller fails with a connection error of its own,
    none waits for ever and none sees a cancellation it never asked for."""

    accepted: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await reader.read(1 << 16)

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    mute = redis_asyncio.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=30)
    echo = mute.register_script("return ARGV[1]")
    batcher = ScriptBatcher()
    try:
        callers = [asyncio.create_task(batcher.run(echo, [], [x], mute)) for x in "abc"]
        await asyncio.sleep(0.2)  # the batch is with its task, waiting for Redis
        (sender,) = batcher._tasks
        sender.cancel()
        answers = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), 10)
    finally:
        await mute.aclose()
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()
    assert all(isinstance(a, RedisConnectionError) for a in answers), answers
    assert len({id(a) for a in answers}) == 3  # each caller raises its own exception


async def test_closing_waits_for_the_batch_still_gathering_its_turn() -> None:
    prefix = f"agentfn-test:{uuid.uuid4().hex}:"
    store = RedisStore(REDIS_URL, key_prefix=prefix)
    try:
        await store.open()
    except StoreUnavailableError as exc:
        require_service("redis", str(exc))
    callers = [asyncio.create_task(store.record_delivery(f"wh_{n}", "s")) for n in range(3)]
    await asyncio.sleep(0)  # the first waits for the end of the turn, the others joined it
    await store.close()
    assert all(caller.done() for caller in callers)
    assert [caller.result() for caller in callers] == [True] * 3
    cleanup = RedisStore(REDIS_URL, key_prefix=prefix)
    await cleanup.destroy()
    await cleanup.close()


async def test_a_connection_lost_part_way_keeps_the_answers_already_read() -> None:
    """Redis answers the first script of a batch, then the connection drops: that caller
    keeps its answer, the others fail with a connection error each (their scripts may have
    run), and the batch is not sent again (it would run the first script twice)."""

    batches: list[bytes] = []

    async def answer_one_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        received = b""
        while received.count(b"EVALSHA") < 3:
            chunk = await reader.read(1 << 16)
            if not chunk:
                return
            # The connection's handshake (CLIENT SETINFO ...) is answered OK.
            writer.write(b"+OK\r\n" * chunk.count(b"CLIENT"))
            received += chunk
        batches.append(received)
        writer.write(b"$5\r\nfirst\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_one_then_drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # RESP2: the handshake is two CLIENT SETINFO, answered above (RESP3's HELLO needs a map).
    flaky = redis_asyncio.Redis.from_url(
        f"redis://127.0.0.1:{port}/0", protocol=2, socket_timeout=10
    )
    echo = flaky.register_script("return ARGV[1]")
    batcher = ScriptBatcher()
    try:
        answers = await asyncio.wait_for(
            asyncio.gather(
                *(batcher.run(echo, [], [x], flaky) for x in "abc"), return_exceptions=True
            ),
            10,
        )
        await batcher.wait_sent()
    finally:
        await flaky.aclose()
        server.close()
        await server.wait_closed()
    assert answers[0] == b"first"
    assert all(isinstance(a, RedisConnectionError) for a in answers[1:]), answers
    assert answers[1] is not answers[2]
    assert len(batches) == 1  # sent once, never again on a new connection


async def test_arguments_the_driver_cannot_encode_fail_only_their_caller(client: Any) -> None:
    """A lone surrogate in one caller's arguments (redis-py refuses to encode it): that
    caller gets the error a lone command would raise; the others of its turn are sent."""
    echo = client.register_script("return ARGV[1]")
    await echo(keys=[], args=["load"], client=client)
    batcher = ScriptBatcher()
    answers = await asyncio.gather(
        batcher.run(echo, [], ["a"], client),
        batcher.run(echo, [], ["b \ud800"], client),
        batcher.run(echo, [], ["c"], client),
        return_exceptions=True,
    )
    assert answers[0] == "a" and answers[2] == "c", answers
    assert isinstance(answers[1], UnicodeEncodeError)


async def test_a_reply_the_driver_cannot_parse_is_its_callers_error_alone(client: Any) -> None:
    """One script's reply is not UTF-8 (the client decodes replies): that caller gets the
    decoding error, the callers before it keep their answers, the ones after it fail as a
    lost connection (the driver drops the connection), not with another's decoding error."""
    script = client.register_script("if ARGV[1] == 'bad' then return '\\255' end return ARGV[1]")
    await script(keys=[], args=["load"], client=client)
    batcher = ScriptBatcher()
    answers = await asyncio.gather(
        *(batcher.run(script, [], [x], client) for x in ("a", "bad", "c")),
        return_exceptions=True,
    )
    assert answers[0] == "a", answers
    assert isinstance(answers[1], UnicodeDecodeError), answers
    assert isinstance(answers[2], RedisConnectionError), answers
    assert await script(keys=[], args=["d"], client=client) == "d"  # the pool reconnects


async def test_a_caller_cancelled_before_the_write_is_left_out(client: Any) -> None:
    """As a lone command cancelled before its write never runs, a caller cancelled while
    its batch gathers is not sent; the others are."""
    prefix = f"agentfn-test:{uuid.uuid4().hex}:"
    bump = client.register_script("return redis.call('INCR', KEYS[1])")
    await client.script_load(bump.script)
    batcher = ScriptBatcher()
    keys = [f"{prefix}{n}" for n in range(3)]
    try:
        tasks = [asyncio.create_task(batcher.run(bump, [k], [], client)) for k in keys]
        await asyncio.sleep(0)  # the first waits for the turn's end, the others joined it
        tasks[1].cancel()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        await batcher.wait_sent()
        assert isinstance(done[1], asyncio.CancelledError)
        assert (done[0], done[2]) == (1, 1)
        assert await client.mget(keys) == ["1", None, "1"]
    finally:
        await client.delete(*keys)


async def test_a_script_with_long_arguments_is_sent_alone(client: Any, writes: list[int]) -> None:
    """A large saved result does not share a batch's write (and its socket timeout)."""
    echo = client.register_script("return string.len(ARGV[1])")
    await echo(keys=[], args=["load"], client=client)
    batcher = ScriptBatcher()
    writes.clear()
    big = "x" * (ALONE_OVER + 1)
    answers = await asyncio.gather(
        batcher.run(echo, [], ["a"], client),
        batcher.run(echo, [], [big], client),
        batcher.run(echo, [], ["c"], client),
    )
    assert list(answers) == [1, ALONE_OVER + 1, 1]
    assert len(writes) == 2  # the long one alone, the two others together
