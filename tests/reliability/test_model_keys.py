"""Values the model chooses that end up in the store's keys (issue 37, item 1).

A ``concurrency_key`` keyed by an argument makes the model choose the limiter's name. Each
test names the behaviour of the code before the fix.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentfn_asgi import FunctionTools, ToolContext
from agentfn_asgi.calls.records import LIMITER_KEY_SEPARATOR, CallKey
from agentfn_asgi.dispatch.limits import limit_for
from agentfn_asgi.messages import STORE_REFUSED_MESSAGE
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.wire import FunctionCallAction

from ..support.backends import store_url_for
from ..support.stack import running_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

BACKENDS = [
    "memory",
    "sqlite",
    pytest.param("redis", marks=pytest.mark.backends),
    pytest.param("postgres", marks=pytest.mark.backends),
]


@contextlib.asynccontextmanager
async def _store_url(backend: str, tmp_path: Path) -> AsyncIterator[str]:
    if backend == "memory":
        yield "memory://"
        return
    async with store_url_for(backend, tmp_path) as url:
        yield url


def _customer_tools(ran: list[str]) -> FunctionTools:
    tools = FunctionTools()

    def customer_of(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        return str(arguments["customer_id"])

    @tools.function(concurrency=1, rate="100/s", burst=5, concurrency_key=customer_of)
    async def lookup_customer(customer_id: str) -> str:
        """Look a customer up."""
        ran.append(customer_id)
        return f"found {len(customer_id)}"

    return tools


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_10kb_concurrency_key_value_is_answered_on_every_store(
    backend: str, tmp_path: Path
) -> None:
    """Before: on PostgreSQL the limiter's name (the tool's name and the key's value, from
    the model) went into the ``calls_limiter`` index and the buckets' primary key; past
    about 2.7 KB PostgreSQL refused every claim, the sweep retried it as an outage for ever
    and the session waited for ever (a NUL in the value the same). Now: every call runs under
    a limiter of bounded size, and an operator still reads the value's start."""
    huge = secrets.token_hex(5_000)  # 10 KB that do not compress
    values = {"big1": huge, "big2": huge, "nul": "acme\x00corp", "plain": "acme"}
    ran: list[str] = []
    calls = [
        FakeCall("lookup_customer", {"customer_id": value}, call_id=call_id)
        for call_id, value in values.items()
    ]
    async with (
        _store_url(backend, tmp_path) as url,
        running_stack(_customer_tools(ran), store=url) as stack,
    ):
        sid = stack.fake.create_session([calls])
        await stack.fake.wait_idle(sid, timeout=20)
        records = {r.key.call_id: r for r in await stack.store.calls_for_session(sid)}
    by_call = {s.call_id: s for s in stack.fake.submissions}
    assert set(by_call) == set(values)
    assert all(s.success for s in by_call.values()), by_call
    assert sorted(ran) == sorted(values.values())
    limiters = {call_id: r.limiter or "" for call_id, r in records.items()}
    assert set(limiters) == set(values)
    tool = f"lookup_customer{LIMITER_KEY_SEPARATOR}"
    assert limiters["plain"] == f"{tool}acme"  # a short printable value is kept as it is
    assert limiters["big1"] == limiters["big2"] != limiters["plain"]
    assert limiters["big1"].startswith(f"{tool}{huge[:24]}…")
    assert limiters["nul"].startswith(f"{tool}acme\\x00corp…")
    assert all(len(name.encode()) < 200 for name in limiters.values())


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_call_whose_values_the_store_refuses_fails_instead_of_looping(
    backend: str, tmp_path: Path
) -> None:
    """A function name holding a NUL (the model chose it; no tool has it): PostgreSQL
    refuses the text. Before: every claim raised, the sweep retried it as an outage for ever
    and the session waited for ever. Now: the call is recorded under a storable name and
    fails for the model; its sibling is answered as usual, on every store."""
    ran: list[str] = []
    async with (
        _store_url(backend, tmp_path) as url,
        running_stack(_customer_tools(ran), store=url) as stack,
    ):
        calls = [
            FakeCall("lookup\x00customer", {"customer_id": "acme"}, call_id="strange"),
            FakeCall("lookup_customer", {"customer_id": "acme"}, call_id="plain"),
        ]
        sid = stack.fake.create_session([calls])
        await stack.fake.wait_idle(sid, timeout=20)
        records = {r.key.call_id: r for r in await stack.store.calls_for_session(sid)}
    by_call = {s.call_id: s for s in stack.fake.submissions}
    assert set(by_call) == {"strange", "plain"}
    assert by_call["plain"].success and ran == ["acme"]
    assert not by_call["strange"].success
    strange = records["strange"]
    assert strange.result is not None
    if backend == "postgres":
        assert strange.tool_name == "lookup\\x00customer"
        assert strange.result.error_type == "store_refused"
        assert by_call["strange"].error == STORE_REFUSED_MESSAGE.format(name=strange.tool_name)
    else:  # the others take the name: no such tool
        assert strange.tool_name == "lookup\x00customer"
        assert strange.result.error_type == "unknown_tool"


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("c" * 64, True),  # the longest value kept as it is
        ("c" * 65, False),
        ("acme\ncorp", False),  # control characters are never kept
        ("acme\x1fcorp", False),  # nor the separator: a kept name has exactly one
        ("acme\ud800", False),  # nor a lone surrogate
        ("顧客-42", True),  # printable text of any script is
    ],
)
async def test_a_limiter_name_keeps_short_printable_values_and_digests_the_rest(
    value: str, kept: bool
) -> None:
    """Two values sharing their first characters still get two limiters (the digest covers
    the whole value); a kept name holds one separator, a digested one two, so no value
    kept as it is can name another value's limiter."""
    tool = _customer_tools([]).get("lookup_customer")
    key = CallKey("sess_1", "turn_1", "call_1")

    async def name_of(customer_id: str) -> str:
        action = FunctionCallAction(
            turn_id="turn_1",
            call_id="call_1",
            name="lookup_customer",
            arguments={"customer_id": customer_id},
        )
        assert tool is not None
        limit = (await limit_for(key, action, tool, None)).limit
        assert limit is not None
        return limit.name

    name, sibling = await name_of(value), await name_of(value + "x")
    assert name != sibling and name == await name_of(value)
    assert name.count(LIMITER_KEY_SEPARATOR) == (1 if kept else 2)
    assert (name == f"lookup_customer{LIMITER_KEY_SEPARATOR}{value}") is kept
    assert name.replace(LIMITER_KEY_SEPARATOR, ":").isprintable()
    assert len(name) <= len("lookup_customer") + 1 + max(64, 24 * 6 + 2 + 32)
