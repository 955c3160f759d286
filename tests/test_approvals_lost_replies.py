"""Approval writes whose answer is lost (issue 37, item 2), on Redis and PostgreSQL.

A loopback proxy in front of the store's server lets one chosen request through and cuts the
connection when its answer comes back: the write committed, the store never heard. The
store then sends it again (redis-py's ``Retry``, the PostgreSQL store's one retry) or, for a
Redis pipeline, answers every step of it "unavailable". Each step must recognise its own
earlier success: the approved call runs exactly once and is not in doubt, an operator's
re-run runs, and every approval request made is told to ``on_approval_request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import ApprovalRequest, CallKey, CallState, ClaimStatus
from agentfn_asgi.dispatch.approvals import ApprovalView
from agentfn_asgi.errors import StoreError
from agentfn_asgi.results import failure_result
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import Connection, FakeCall
from agentfn_asgi.tools import FunctionTools, ToolContext

from .store.conftest import require_service
from .support.stack import FAST, running_stack
from .test_approvals import submitted, until_state

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

SETTINGS = dataclasses.replace(FAST, approval_poll_interval=0.05)
UPSTREAM = {"redis": 6379, "postgres": 5432}


class ReplyDropper:
    """A TCP proxy on a loopback port in front of ``upstream``. Once :meth:`arm` ed with a
    marker, the next request holding it goes through, and the connection is cut when its
    answer comes back (after the server committed it): the answer never arrives. With a
    ``blackout``, every connection is cut then and new ones for that many seconds, so the
    store cannot read back what happened either."""

    def __init__(self, upstream: int) -> None:
        self._upstream = upstream
        self._marker: bytes | None = None
        self._blackout = 0.0
        self._dark_until = 0.0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._links: set[asyncio.WriteTransport] = set()
        self.dropped = 0
        self.port = 0

    def arm(self, marker: bytes, *, blackout: float = 0.0) -> None:
        self._marker, self._blackout = marker, blackout

    def _cut(self) -> None:
        self.dropped += 1
        if self._blackout:
            self._dark_until = time.monotonic() + self._blackout
            for transport in list(self._links):
                transport.abort()

    async def __aenter__(self) -> ReplyDropper:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if time.monotonic() < self._dark_until:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream)
        except OSError:
            writer.close()
            return
        links = {writer.transport, up_writer.transport}
        self._links |= links
        doomed = asyncio.Event()

        async def requests() -> None:
            while data := await reader.read(1 << 16):
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    doomed.set()
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()

        async def answers() -> None:
            while data := await up_reader.read(1 << 16):
                if doomed.is_set():
                    await asyncio.sleep(0.1)  # the rest of the answer: all of it committed
                    self._cut()
                    writer.transport.abort()
                    up_writer.transport.abort()
                    return
                writer.write(data)
                await writer.drain()
            writer.close()

        with contextlib.suppress(Exception):
            await asyncio.gather(requests(), answers())
        writer.transport.abort()
        up_writer.transport.abort()
        self._links -= links
        self._tasks.discard(task)


@contextlib.asynccontextmanager
async def lossy_store(backend: str) -> AsyncIterator[tuple[Store, ReplyDropper]]:
    """A new, empty store of ``backend`` reached through a :class:`ReplyDropper`."""
    tag = secrets.token_hex(4)
    if backend == "redis":
        url = f"redis://127.0.0.1:{{port}}/0?key_prefix=afn-test-{tag}:"
    else:
        url = f"postgresql://postgres@127.0.0.1:{{port}}/test?schema=afn_test_{tag}"
    async with ReplyDropper(UPSTREAM[backend]) as proxy:
        store = open_store(url.format(port=proxy.port))
        try:
            with anyio.fail_after(5):
                await store.open()
        except Exception as exc:
            require_service(backend, f"{type(exc).__name__}: {exc}")
        try:
            await warm_up(store)
            yield store, proxy
        finally:
            await store.close()
            direct = open_store(url.format(port=UPSTREAM[backend]))
            try:
                await direct.destroy()  # type: ignore[attr-defined]  # Redis/PostgreSQL
            finally:
                await direct.close()


async def warm_up(store: Store) -> None:
    """Run each approval and settling step once on a call that does not exist, so that
    Redis knows its script: the answer dropped is then the step's own, not the ``NOSCRIPT``
    refusal that precedes a script's first run."""
    nobody = CallKey("warm", "up", "nobody")
    request = ApprovalRequest(
        approval_id="apr_none", tool_name="t", digest="", requested_at=0.0, expires_at=0.0
    )
    assert await store.claim_approved(nobody, owner="w", lease_seconds=1) is None
    assert await store.release(nobody, owner="w", lease_seconds=1) is None
    result = failure_result(nobody, "no", "none", source="operator")
    assert await store.settle(nobody, result=result) is None
    with contextlib.suppress(StoreError):
        await store.request_approval(nobody, owner="w", attempt=1, request=request)


@contextlib.asynccontextmanager
async def lossy_stack(
    backend: str, tools: FunctionTools, **options: Any
) -> AsyncIterator[tuple[Connection, Store, ReplyDropper]]:
    """The app serving ``tools`` on a :func:`lossy_store`; ``options`` go to the app."""
    async with (
        lossy_store(backend) as (store, proxy),
        running_stack(tools, store=store, settings=SETTINGS, **options) as stack,
    ):
        yield stack, store, proxy


def transfer_tools(ran: list[int]) -> FunctionTools:
    """A side-effect tool without a reconcile hook: in doubt, it fails "may or may not have
    completed", so a call wrongly taken for in doubt shows."""
    tools = FunctionTools()

    @tools.function(side_effects=True, approval=True)
    def transfer(ctx: ToolContext, amount: int) -> str:
        """Transfer money."""
        ran.append(ctx.attempt)
        return f"sent {amount}"

    return tools


def owner_of(stack: Connection) -> bytes:
    return stack.app.dispatcher.owner.encode()


BACKENDS = pytest.mark.parametrize("backend", ["redis", "postgres"])


@BACKENDS
@pytest.mark.parametrize("blackout", [0.0, 1.0], ids=["read-back", "store-down-a-while"])
async def test_a_lost_answer_to_claiming_an_approved_call_still_runs_it_once(
    backend: str, blackout: float
) -> None:
    """The approved call's claim commits and its answer is lost: the store's retry finds the
    call claimed with its own nonce, so the call runs at once, exactly once, not in doubt;
    when the store cannot be read back at once (down for a second, less than the lease),
    the next poll that can read it finds the claim its own and runs it."""
    ran: list[int] = []
    async with lossy_stack(backend, transfer_tools(ran)) as (stack, store, proxy):
        sid = stack.fake.create_session([[FakeCall("transfer", {"amount": 5}, call_id="t")]])
        waiting = await until_state(stack, sid, "t", CallState.AWAITING_APPROVAL)
        assert waiting.approval is not None
        # The next step naming us: the claim of the approved call.
        proxy.arm(owner_of(stack), blackout=blackout)
        await stack.app.approve(waiting.approval.approval_id, by="alice")
        submission = await submitted(stack, "t")
        record = await store.get_call(waiting.key, history=True)
    assert proxy.dropped == 1
    assert submission.success, submission.error
    assert ran == [1]
    assert record is not None
    kinds = [event.kind for event in record.history]
    assert "taken_over" not in kinds and kinds.count("claimed_approved") == 1


@BACKENDS
@pytest.mark.parametrize("rerun", [True, False], ids=["rerun", "result"])
async def test_a_lost_answer_to_an_operators_settling_still_counts(
    backend: str, rerun: bool
) -> None:
    """The operator's re-run (``release``) or result (``settle``) commits and its answer is
    lost: it is still the operator's, which runs the call (or submits the result), not
    "refused: it changed meanwhile"."""
    ran: list[int] = []
    tools = FunctionTools()

    @tools.function(side_effects=True)
    def transfer(ctx: ToolContext, amount: int) -> str:
        """Transfer money."""
        ran.append(ctx.attempt)
        return f"sent {amount}"

    async with lossy_stack(backend, tools) as (stack, store, proxy):
        call = FakeCall("transfer", {"amount": 5}, call_id="t")
        sid = stack.fake.create_session([[call]], deliver=False)
        [action] = stack.fake.required_actions(sid)
        key = CallKey(sid, str(action["turn_id"]), "t")
        await store.claim_call(key, tool_name="transfer", owner="gone", lease_seconds=60)
        await store.quarantine(key, owner="gone", attempt=1, reason="held for a person")
        # The next step naming us (the release), or saying who answered (the settle).
        proxy.arm(owner_of(stack) if rerun else b"source=operator")
        operator = stack.app.operator()
        if rerun:
            outcome = await operator.settle("t", session_id=sid, rerun=True)
        else:
            outcome = await operator.settle("t", session_id=sid, output="sent by hand")
        assert outcome.status == ("running" if rerun else "submitted"), outcome.message
        submission = await submitted(stack, "t")
    assert proxy.dropped == 1
    assert submission.success, submission.error
    assert ran == ([2] if rerun else [])


@BACKENDS
@pytest.mark.parametrize("blackout", [0.0, 1.0], ids=["read-back", "store-down-a-while"])
async def test_every_approval_request_is_told_even_when_the_answer_was_lost(
    backend: str, blackout: float
) -> None:
    """One turn asks for four approvals; the answer to the requests' writes (on Redis one
    pipeline for the four) is lost after they committed: each is read back and told to
    ``on_approval_request`` all the same; when the store cannot be read back at once (down
    for a second), the approvals poll reads them once it can."""
    told: list[str] = []

    async def notify(view: ApprovalView) -> None:
        told.append(view.approval_id)

    calls = [FakeCall("transfer", {"amount": n}, call_id=f"t{n}") for n in range(4)]
    tools = transfer_tools([])
    async with lossy_stack(backend, tools, on_approval_request=notify) as (stack, store, proxy):
        # In every request's JSON: the first write of a request.
        proxy.arm(b'"digest"', blackout=blackout)
        sid = stack.fake.create_session([calls])
        waiting = [
            await until_state(stack, sid, f"t{n}", CallState.AWAITING_APPROVAL)
            for n in range(len(calls))
        ]
        ids = sorted(r.approval.approval_id for r in waiting if r.approval is not None)
        with anyio.fail_after(10):
            while sorted(told) != ids:
                await anyio.sleep(0.02)
        # Asked once each: the writes whose answer was lost are the ones that stand.
        histories = [await store.get_call(record.key, history=True) for record in waiting]
    assert proxy.dropped == 1
    assert len(ids) == 4
    for record in histories:
        assert record is not None
        assert [e.kind for e in record.history] == ["claimed", "approval_requested"]


@BACKENDS
async def test_a_lost_answer_to_claiming_a_due_retry_still_answers_retry(backend: str) -> None:
    """The claim of a retry that came due commits and its answer is lost: the store sends it
    again, finds the call claimed by this very claim (the retry row's nonce) and answers as
    the first did, a fresh attempt (RETRY), not "in doubt" (where a side-effect tool without
    a reconcile hook would fail "may or may not have completed" though nothing ran)."""
    async with lossy_store(backend) as (store, proxy):
        key = CallKey("sess", "turn", "call_" + secrets.token_hex(4))
        await store.claim_call(key, tool_name="t", owner="first", lease_seconds=60)
        assert await store.schedule_retry(
            key, owner="first", attempt=1, at=time.time() - 1, reason="HTTP 429"
        )
        owner = "retrier-" + secrets.token_hex(4)
        # The request that makes the retry row: Redis' claim script (it names the owner);
        # on PostgreSQL the upsert that declines the call names the owner too, so the
        # statement of the row is found by the nonce it records.
        proxy.arm(owner.encode() if backend == "redis" else b":retry")
        outcome = await store.claim_call(key, tool_name="t", owner=owner, lease_seconds=60)
    assert proxy.dropped == 1
    record = outcome.record
    assert (outcome.status, record.attempt, record.owner) == (ClaimStatus.RETRY, 2, owner)
