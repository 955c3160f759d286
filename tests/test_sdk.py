"""Handlers written for the openai SDK's ``sessions.stream(tool_handlers=...)``, adopted as
they are (agentfn_asgi/_sdk.py and FunctionTools.from_sdk).

The real ``openai`` package is the oracle: its ``function_tool`` objects give the
definitions, its own client serialises them for ``agents.create``, and its own tool
dispatcher answers the same calls on the same fake session as the app does. A look-alike
object without ``openai`` shows the runtime only duck-types it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import httpx
import httpx2
import openai
import openai.lib.beta.agents  # before lib.streaming, to dodge an import cycle
import pytest
from openai._models import construct_type
from openai.lib.beta.agents import function_tool, pydantic_function_tool
from openai.lib.streaming.agents._dispatch import AsyncToolDispatcher
from openai.types.beta.agent_session_event import AgentSessionEvent
from pydantic import BaseModel, Field
from starlette.types import Receive, Scope, Send

from agentfn_asgi import (
    AgentsClient,
    AgentWebhookApp,
    ArgumentValidationError,
    FunctionTool,
    FunctionTools,
    NotRun,
    Ran,
    ToolContext,
    ToolDefinitionError,
)
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall
from agentfn_asgi.tools import derive_idempotency_key

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _context(name: str) -> ToolContext:
    return ToolContext(
        session_id="sess_1",
        turn_id="turn_1",
        call_id="call_1",
        tool_name=name,
        attempt=1,
        deadline=None,
        idempotency_key=derive_idempotency_key("sess_1", "turn_1", "call_1"),
    )


# -- the SDK-built tools every test shares ---------------------------------------------------


class Lookup(BaseModel):
    """Look up a customer by id."""

    customer_id: str = Field(description="The customer's id.")


def build_sdk_tools(seen: list[tuple[str, Any]]) -> list[Any]:
    """One of each kind the SDK makes: sync and async ``function_tool``, deferred and not
    (explicitly False too), and a ``pydantic_function_tool``."""

    @function_tool
    def get_weather(city: str, days: int = 1) -> dict[str, Any]:
        """Get the weather forecast.

        Args:
            city: The city.
            days: How many days.
        """
        seen.append(("get_weather", (city, days)))
        return {"city": city, "forecast": ["sunny"] * days}

    @function_tool(defer_loading=True)
    async def convert(amount: float, to: str) -> str:
        """Convert an amount of money."""
        seen.append(("convert", (amount, to)))
        return f"{amount} {to}"

    @function_tool(name="ping", description="Check the service.", defer_loading=False)
    def health() -> str:
        seen.append(("ping", ()))
        return "pong"

    def lookup(query: Lookup) -> Lookup:
        seen.append(("Lookup", query.customer_id))
        return Lookup(customer_id=query.customer_id.upper())

    return [get_weather, convert, health, pydantic_function_tool(Lookup, handler=lookup)]


def plain_definitions() -> list[dict[str, Any]]:
    """What a user of plain ``tool_handlers`` functions already sends as ``agent.tools``."""
    schema = {
        "type": "object",
        "properties": {"sku": {"type": "string"}},
        "required": ["sku"],
        "additionalProperties": False,
    }
    return [
        {
            "type": "function",
            "name": "stock",
            "description": "Stock of a SKU.",
            "parameters": schema,
        },
        {
            "type": "function",
            "name": "reserve",
            "description": "Reserve one unit of a SKU.",
            "parameters": schema,
            "defer_loading": True,
        },
        {"type": "tool_search"},
        {
            "type": "function",
            "name": "elsewhere",
            "description": "Served by another service.",
            "parameters": {"type": "object", "properties": {}},
        },
    ]


def build_plain_handlers(seen: list[tuple[str, Any]]) -> dict[str, Callable[..., Any]]:
    """Plain SDK handlers: one positional dict in, a str/dict/content parts out, sync or async."""

    def stock(arguments: dict[str, Any]) -> dict[str, Any]:
        seen.append(("stock", arguments))
        return {"sku": arguments["sku"], "units": 3}

    async def reserve(arguments: dict[str, Any]) -> list[dict[str, str]]:
        seen.append(("reserve", arguments))
        return [{"type": "input_text", "text": f"reserved {arguments['sku']}"}]

    return {"stock": stock, "reserve": reserve}


# -- definitions ---------------------------------------------------------------------------------


class AgentCapture:
    """An ASGI stand-in for ``POST /agents`` that keeps the raw request bodies."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        answer = json.dumps({"id": "agent_1", "object": "agent", "model": "gpt-test"}).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})


async def _sent_by_openai(tools: list[dict[str, Any]]) -> bytes:
    """The exact body the official client sends for ``agents.create(tools=tools)``."""
    capture = AgentCapture()
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=capture))
    client = openai.AsyncOpenAI(api_key="sk-test", base_url="http://x/v1", http_client=http)
    await client.beta.agents.create(model="gpt-test", tools=tools)  # type: ignore[arg-type]
    await client.close()
    [body] = capture.bodies
    return body


@pytest.mark.anyio
async def test_sdk_tools_give_byte_identical_definitions() -> None:
    """``FunctionTools.from_sdk`` sends each SDK tool's definition byte for byte, in order,
    and the official client puts exactly the same bytes on the wire for both lists (plus
    the tool_search entry a deferred tool needs, which the SDK user adds by hand)."""
    sdk_tools = build_sdk_tools([])
    theirs = [tool.definition for tool in sdk_tools] + [{"type": "tool_search"}]
    ours = FunctionTools.from_sdk(sdk_tools).definitions()
    assert json.dumps(ours) == json.dumps(theirs)
    assert ours[2]["defer_loading"] is False  # kept as the SDK wrote it
    assert await _sent_by_openai(ours) == await _sent_by_openai(theirs)
    keyed = FunctionTools.from_sdk({tool.name: tool for tool in sdk_tools})
    assert json.dumps(keyed.definitions()) == json.dumps(ours)


@pytest.mark.anyio
async def test_plain_handlers_keep_the_definitions_the_user_wrote() -> None:
    """A plain handler takes its definition from ``definitions=`` by name, unchanged; other
    entries (tool_search, tools served elsewhere) are not registered."""
    given = plain_definitions()
    tools = FunctionTools.from_sdk(build_plain_handlers([]), definitions=given)
    assert [tool.name for tool in tools] == ["stock", "reserve"]
    ours = tools.definitions()
    assert json.dumps(ours) == json.dumps([given[0], given[1], given[2]])
    assert await _sent_by_openai(ours) == await _sent_by_openai([given[0], given[1], given[2]])


def test_options_switch_on_what_the_definition_leaves_off() -> None:
    """Options apply to adopted tools as to native ones; ``name``/``description`` rename a
    single tool; ``background`` adds ``"async": true`` after the SDK's own keys."""
    weather, *_ = build_sdk_tools([])
    tools = FunctionTools()
    tool = tools.add(weather, name="forecast", description="Forecast.", background=True, timeout=5)
    assert (tool.name, tool.timeout, tool.background, tool.defer_loading) == (
        "forecast",
        5.0,
        True,
        False,
    )
    definition = tools.definitions()[0]
    assert list(definition) == ["type", "name", "description", "parameters", "async"]
    assert (definition["name"], definition["description"]) == ("forecast", "Forecast.")
    assert definition["parameters"] == weather.definition["parameters"]


def test_stacking_tools_function_on_function_tool_adopts_it_unchanged() -> None:
    """``@tools.function`` on top of ``@function_tool`` registers the SDK tool and hands it
    back unchanged, so the same object still works with ``sessions.stream``."""
    tools = FunctionTools()

    @tools.function(side_effects=True, reconcile=lambda ctx, arguments: NotRun())
    @function_tool
    def refund(order_id: str, amount_cents: int) -> str:
        """Refund part of an order."""
        return f"refunded {amount_cents} on {order_id}"

    assert isinstance(refund, openai.lib.beta.agents.FunctionTool)
    assert refund({"order_id": "o1", "amount_cents": 5}) == "refunded 5 on o1"
    registered = tools.get("refund")
    assert registered is not None and registered.fn is refund and registered.side_effects
    assert tools.definitions() == [refund.definition]
    assert tools.problems() == []


# -- invocation ---------------------------------------------------------------------------------


def _calls() -> list[FakeCall]:
    return [
        FakeCall("get_weather", {"city": "Paris", "days": 2}, call_id="call_weather"),
        FakeCall("convert", {"amount": 3, "to": "EUR"}, call_id="call_convert"),
        FakeCall("ping", {}, call_id="call_ping"),
        FakeCall("Lookup", {"customer_id": "c1"}, call_id="call_lookup"),
        FakeCall("stock", {"sku": "A1"}, call_id="call_stock"),
        FakeCall("reserve", {"sku": "B2"}, call_id="call_reserve"),
        FakeCall("get_weather", {"city": 5}, call_id="call_bad"),
    ]


def _handlers(seen: list[tuple[str, Any]]) -> dict[str, Any]:
    sdk_tools = {tool.name: tool for tool in build_sdk_tools(seen)}
    return {**sdk_tools, **build_plain_handlers(seen)}


async def _answered_by_the_sdk(seen: list[tuple[str, Any]]) -> dict[str, tuple[bool, Any, Any]]:
    """The SDK's own dispatcher answers the calls of one fake session (its stream helper
    wraps exactly this; the fake's history stands in for the event stream)."""
    async with FakeAgentsAPI() as fake:
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=fake))
        client = openai.AsyncOpenAI(
            api_key="sk-test", base_url="http://fake/v1", http_client=http, max_retries=0
        )
        sid = fake.create_session([_calls()])
        dispatcher = AsyncToolDispatcher(client.beta.agents.sessions, _handlers(seen))
        for raw in fake.events(sid):
            event = construct_type(type_=AgentSessionEvent, value=raw)
            pending = dispatcher.prepare(event)  # type: ignore[arg-type]
            if pending is not None:
                await dispatcher.dispatch(pending)
        await client.close()
        assert fake.session(sid)["status"] == "idle"
        return {s.call_id: (s.success, s.output, s.error) for s in fake.submissions}


async def _answered_by_us(seen: list[tuple[str, Any]]) -> dict[str, tuple[bool, Any, Any]]:
    """The app answers the same calls, with the handlers adopted by from_sdk."""
    tools = FunctionTools.from_sdk(_handlers(seen), definitions=plain_definitions())
    apps: list[AgentWebhookApp] = []
    hooks = httpx.AsyncClient(transport=httpx.ASGITransport(app=lambda s, r, c: apps[0](s, r, c)))
    fake = FakeAgentsAPI(webhook_secret=SECRET, webhook_url="http://app/", webhook_client=hooks)
    api = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
    client = AgentsClient(api_key="sk-test", base_url="http://fake/v1", http_client=api)
    apps.append(AgentWebhookApp(tools, webhook_secret=SECRET, client=client, store="memory://"))
    async with fake, apps[0].lifespan():
        sid = fake.create_session([_calls()])
        await fake.wait_idle(sid)
    await hooks.aclose()
    await api.aclose()
    return {s.call_id: (s.success, s.output, s.error) for s in fake.submissions}


@pytest.mark.anyio
async def test_handlers_answer_as_under_the_sdk_dispatcher() -> None:
    """The same handlers, given the same calls, submit the same results through the app as
    through the SDK's own dispatcher: same arguments (one positional dict for plain
    handlers, validated models for SDK tools), sync and async alike. Invalid arguments fail
    in both; the app also tells the model which field is wrong."""
    their_seen: list[tuple[str, Any]] = []
    our_seen: list[tuple[str, Any]] = []
    theirs = await _answered_by_the_sdk(their_seen)
    ours = await _answered_by_us(our_seen)
    assert sorted(our_seen, key=repr) == sorted(their_seen, key=repr)
    assert ("stock", {"sku": "A1"}) in our_seen
    assert set(ours) == set(theirs) == {call.call_id for call in _calls()}
    for call_id in set(theirs) - {"call_bad"}:
        assert ours[call_id] == theirs[call_id], call_id
    assert theirs["call_bad"] == (False, None, "Tool handler failed.")
    success, output, error = ours["call_bad"]
    assert (success, output) == (False, None)
    assert error == "Invalid arguments for get_weather: city: Input should be a valid string"


@pytest.mark.anyio
async def test_reconcile_hooks_and_jobs_get_the_argument_object() -> None:
    """For an adopted tool the "keyword arguments" are the argument object itself: that is
    what a reconcile hook receives and what a worker job carries (and parses back)."""
    got: list[dict[str, Any]] = []

    def reconcile(ctx: ToolContext, arguments: dict[str, Any]) -> Ran:
        got.append(arguments)
        return Ran("already reserved")

    handlers = build_plain_handlers([])
    tool = FunctionTool.from_sdk(
        handlers["reserve"],
        definition=plain_definitions()[1],
        side_effects=True,
        reconcile=reconcile,
    )
    arguments = tool.parse_arguments('{"sku": "B2"}')
    assert arguments == {"sku": "B2"}
    assert await tool.run_reconcile(arguments, _context("reserve")) == Ran("already reserved")
    assert got == [{"sku": "B2"}]
    assert tool.parse_arguments(tool.dump_arguments(arguments)) == arguments
    assert tool.is_async


def test_sdk_tool_arguments_are_checked_with_its_own_model_without_values() -> None:
    """A field-level message before the call, naming the path, never the submitted value."""
    weather, *_ = build_sdk_tools([])
    tool = FunctionTool.from_sdk(weather)
    assert tool.parse_arguments({"city": "Oslo"}) == {"city": "Oslo"}
    with pytest.raises(ArgumentValidationError) as raised:
        tool.parse_arguments({"city": "sk-live-SECRET", "days": "many", "extra": 1})
    assert "days" in raised.value.message and "extra" in raised.value.message
    assert "SECRET" not in raised.value.message and "many" not in raised.value.message


# -- no openai at run time ---------------------------------------------------------------------


class LookAlike:
    """What openai's FunctionTool offers publicly: ``name``, ``definition``, ``__call__``."""

    def __init__(self) -> None:
        self.name = "shout"
        self.definition = {
            "type": "function",
            "name": "shout",
            "description": "Shout a word.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        }

    def __call__(self, arguments: dict[str, Any]) -> str:
        if not isinstance(arguments.get("word"), str):
            raise ValueError("word must be a string")
        word: str = arguments["word"]
        return word.upper()


@pytest.mark.anyio
async def test_a_look_alike_is_adopted_by_its_public_surface() -> None:
    """Duck typing: an object shaped like the SDK's tool is adopted without ``openai``; with
    no argument model to check against, bad arguments fail inside the call, as in the SDK."""
    tools = FunctionTools.from_sdk([LookAlike()])
    tool = tools.get("shout")
    assert tool is not None and not tool.is_async
    assert tools.definitions() == [LookAlike().definition]
    assert await tool.invoke(tool.parse_arguments('{"word": "hi"}'), _context("shout")) == "HI"
    with pytest.raises(ValueError, match="word must be a string"):
        await tool.invoke(tool.parse_arguments({"word": 1}), _context("shout"))


# Runs in a fresh interpreter: this test module imports openai itself.
_WITHOUT_OPENAI = """
import sys

import anyio

from agentfn_asgi import FunctionTools, ToolContext


class Shout:
    name = "shout"
    definition = {
        "type": "function",
        "name": "shout",
        "description": "Shout a word.",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    }

    async def __call__(self, arguments):
        word: str = arguments["word"]
        return word.upper()


def stock(arguments):
    return {"units": 3, **arguments}


definition = {
    "type": "function",
    "name": "stock",
    "description": "Stock of a SKU.",
    "parameters": {"type": "object", "properties": {"sku": {"type": "string"}}},
}
tools = FunctionTools.from_sdk({"stock": stock, "shout": Shout()}, definitions=[definition])
context = ToolContext("s", "t", "c", "x", 1, None, "k")
for name, arguments, expected in [
    ("stock", '{"sku": "A"}', {"units": 3, "sku": "A"}),
    ("shout", '{"word": "hi"}', "HI"),
]:
    tool = tools.get(name)
    result = anyio.run(tool.invoke, tool.parse_arguments(arguments), context)
    assert result == expected, result
assert [d["name"] for d in tools.definitions()] == ["stock", "shout"]
assert "openai" not in sys.modules, "openai was imported"
print("ok")
"""


class AsyncLookAlike(LookAlike):
    """A look-alike whose ``__call__`` is a coroutine function."""

    async def __call__(self, arguments: dict[str, Any]) -> str:  # type: ignore[override]
        return "async " + super().__call__(arguments)


@pytest.mark.anyio
async def test_an_async_look_alike_runs_on_the_loop() -> None:
    """An async ``__call__`` counts as async (no thread hop), and its result is awaited."""
    tool = FunctionTool.from_sdk(AsyncLookAlike())
    assert tool.is_async
    assert await tool.invoke({"word": "hi"}, _context("shout")) == "async HI"


def test_a_look_alike_with_a_definition_that_is_not_json_is_refused() -> None:
    """A definition that cannot be sent is a ToolDefinitionError, never a bare TypeError."""
    odd = LookAlike()
    odd.definition = {**odd.definition, "parameters": {"type": "object", "x": {1, 2}}}
    with pytest.raises(ToolDefinitionError, match="openai tool 'shout': the definition is not"):
        FunctionTools().add(odd)


@pytest.mark.slow  # starts a Python process
def test_the_runtime_never_imports_openai() -> None:
    """Adopting SDK-shaped tools and plain handlers, and running them (sync and async),
    imports no ``openai``: it stays a dev-only dependency."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OPENAI],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- refusals -----------------------------------------------------------------------------------


def _plain(arguments: dict[str, Any]) -> str:
    return "ok"


def _definition(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "function",
        "name": "plain",
        "description": "Plain.",
        "parameters": {"type": "object", "properties": {}},
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: FunctionTools.from_sdk("get_weather"), r"expected a tool_handlers dict.*not str"),
        (
            lambda: FunctionTools.from_sdk([_plain]),
            r"test_sdk._plain is a plain function, so it",
        ),
        (lambda: FunctionTools.from_sdk({}, name="x"), r"name= would apply to every tool"),
        (lambda: FunctionTools.from_sdk({}, timout=1), r"did you mean 'timeout'"),  # type: ignore[call-arg]
        (lambda: FunctionTool.from_sdk(_plain), r"a plain handler needs the definition"),
        (lambda: FunctionTool.from_sdk("x", definition=_definition()), r"must be callable"),  # type: ignore[arg-type]
        (
            lambda: FunctionTool.from_sdk(LookAlike(), definition=_definition()),
            r"carries its own definition",
        ),
        (lambda: FunctionTool.from_sdk(_plain, definition=[]), r"must be a dict"),  # type: ignore[arg-type]
        (lambda: FunctionTool.from_sdk(_plain, definition=_definition(type="mcp")), r"'function'"),
        (
            lambda: FunctionTool.from_sdk(_plain, definition=_definition(description=None)),
            r"needs a description string",
        ),
        (
            lambda: FunctionTool.from_sdk(_plain, definition=_definition(parameters={})),
            r"parameters must be a JSON Schema of type 'object'",
        ),
        (
            lambda: FunctionTool.from_sdk(_plain, definition=_definition(name="has space")),
            r"tool name 'has space'",
        ),
        (
            lambda: FunctionTool.from_sdk(
                _plain, definition=_definition(parameters={"type": "object", "x": float("nan")})
            ),
            r"the definition is not JSON",
        ),
    ],
)
def test_what_cannot_be_adopted_is_refused_with_the_fix(
    make: Callable[[], object], pattern: str
) -> None:
    """Every adoption mistake is a ToolDefinitionError saying what to do instead."""
    with pytest.raises(ToolDefinitionError, match=pattern):
        make()
