"""Function tools: schemas from signatures, registration refusals, arguments, invocation."""

from __future__ import annotations

import functools
import json
import re
import threading
import typing
from collections.abc import Callable
from enum import Enum, IntEnum
from typing import Annotated, Any, Literal

import anyio
import pytest
from openai.types.beta.agent_tool_param import (
    AgentToolConfigParamFunction,
    AgentToolConfigParamToolSearch,
)
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from agentfn_asgi._threads import ThreadPool
from agentfn_asgi.errors import ArgumentValidationError, ToolDefinitionError
from agentfn_asgi.tools import (
    TOOL_DEFINITIONS_LIMIT,
    FunctionTool,
    FunctionTools,
    NotRun,
    Ran,
    ToolContext,
    Unknown,
    derive_idempotency_key,
)

SECRET = "sk-live-SECRET0123456789"


class Color(Enum):
    """A string enum."""

    RED = "red"
    GREEN = "green"


class Priority(IntEnum):
    """An integer enum."""

    LOW = 1
    HIGH = 2


class Address(BaseModel):
    """A postal address."""

    street: str
    title: str | None = None  # a *property* called title must survive title stripping


class StrictItem(BaseModel):
    """An order line that forbids unknown keys."""

    model_config = ConfigDict(extra="forbid")
    sku: str = Field(description="Stock keeping unit.")
    quantity: int = Field(ge=1)


class Order(BaseModel):
    """An order as a whole argument object."""

    customer_id: str
    items: list[StrictItem]
    address: Address | None = None


class Node(BaseModel):
    """A self-referencing tree."""

    value: int
    children: list[Node] = []


class Checked(BaseModel):
    """A model whose validator's message quotes the input."""

    code: str

    @field_validator("code")
    @classmethod
    def _no_secrets(cls, value: str) -> str:
        if value.startswith("sk-"):
            raise ValueError(f"refusing {value}")
        return value


class Cat(BaseModel):
    """One member of a discriminated union."""

    kind: Literal["cat"]


class Dog(BaseModel):
    """The other member of a discriminated union."""

    kind: Literal["dog"]


class NotAModel:
    """An arbitrary class pydantic cannot describe."""


def _context(tool_name: str = "t", *, deadline: float | None = None) -> ToolContext:
    return ToolContext(
        session_id="sess_1",
        turn_id="turn_1",
        call_id="call_1",
        tool_name=tool_name,
        attempt=1,
        deadline=deadline,
        idempotency_key=derive_idempotency_key("sess_1", "turn_1", "call_1"),
    )


def _walk(node: Any) -> typing.Iterator[tuple[str | None, Any]]:
    """Yield (key, value) pairs of every dict in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _single(fn: Callable[..., Any], **options: Any) -> FunctionTool:
    tools = FunctionTools()
    return tools.add(fn, **options)


# --------------------------------------------------------------------------- schemas


def test_basic_definition_shape() -> None:
    """Name, docstring summary, closed root object, required list and no pydantic titles."""

    def get_customer(customer_id: str, verbose: bool = False) -> dict[str, Any]:
        """Look up a customer by ID.

        Longer notes for developers that should not reach the model.
        """
        return {}

    tool = _single(get_customer)
    assert tool.name == "get_customer"
    assert tool.description == "Look up a customer by ID."
    assert tool.parameters == {
        "type": "object",
        "properties": {
            "customer_id": {"type": "string"},
            "verbose": {"type": "boolean", "default": False},
        },
        "required": ["customer_id"],
        "additionalProperties": False,
    }


def test_name_and_description_overrides() -> None:
    """``name=`` and ``description=`` replace the function's name and docstring."""

    def f() -> None:
        """Ignored."""

    tool = _single(f, name="lookup-v2", description="  Better words.  ")
    assert (tool.name, tool.description) == ("lookup-v2", "Better words.")
    assert tool.parameters["properties"] == {}
    assert "required" not in tool.parameters


def test_annotated_descriptions_and_docstring_args() -> None:
    """Annotated Field descriptions and constraints reach the schema; Google ``Args:``
    entries (typed, multi-line) fill in the rest, and Annotated wins over the docstring."""

    def refund(
        order_id: str,
        amount_cents: Annotated[int, Field(description="Cents, from Field.", ge=1)],
        reason: str = "other",
    ) -> str:
        """Refund part of an order.

        Args:
            order_id (str): The order
                to refund, as shown
                on the receipt.
            amount_cents: Docstring text that loses to Field.
            reason: Why.

        Returns:
            A confirmation.
        """
        return ""

    props = _single(refund).parameters["properties"]
    assert props["order_id"]["description"] == "The order to refund, as shown on the receipt."
    assert props["amount_cents"] == {
        "type": "integer",
        "minimum": 1,
        "description": "Cents, from Field.",
    }
    assert props["reason"] == {"type": "string", "default": "other", "description": "Why."}


def test_nested_models_enums_literals() -> None:
    """Nested models go to ``$defs`` via ``$ref``; enums, IntEnum and Literal become enums;
    a nested model's own ``extra="forbid"`` shows as ``additionalProperties: false``."""

    def ship(
        items: list[StrictItem],
        address: Address,
        color: Color = Color.RED,
        priority: Priority = Priority.LOW,
        speed: Literal["slow", "fast"] = "slow",
        mode: Literal["air"] = "air",
    ) -> None:
        """Ship items."""

    schema = _single(ship).parameters
    props = schema["properties"]
    assert props["items"] == {"type": "array", "items": {"$ref": "#/$defs/StrictItem"}}
    assert props["address"] == {"$ref": "#/$defs/Address"}
    assert props["color"] == {"$ref": "#/$defs/Color", "default": "red"}
    assert props["priority"] == {"$ref": "#/$defs/Priority", "default": 1}
    assert props["speed"] == {"type": "string", "enum": ["slow", "fast"], "default": "slow"}
    assert props["mode"]["const"] == "air"
    defs = schema["$defs"]
    assert defs["Color"] == {
        "type": "string",
        "enum": ["red", "green"],
        "description": "A string enum.",
    }
    assert defs["Priority"]["type"] == "integer"
    assert defs["StrictItem"]["additionalProperties"] is False
    assert defs["StrictItem"]["properties"]["sku"]["description"] == "Stock keeping unit."
    assert "additionalProperties" not in defs["Address"]
    assert set(defs["Address"]["properties"]) == {"street", "title"}
    assert all(key != "title" for key, _ in _walk(schema["properties"]) if key != "properties")
    assert not any(key == "title" and isinstance(value, str) for key, value in _walk(schema)), (
        "pydantic titles must be stripped"
    )
    assert schema["required"] == ["items", "address"]


def test_optionals_defaults_dicts_and_lists() -> None:
    """``X | None = None`` is optional with a null default; ``X | None`` without a default
    stays required; dict and list annotations keep their item types."""

    def f(
        a: int | None = None,
        b: str | None = None,
        c: int | None = 0,
        d: dict[str, int] | None = None,
        e: list[str] = [],  # noqa: B006 - the default is only read for the schema
    ) -> None:
        """F."""

    def g(b: str | None, counts: dict[str, int]) -> None:
        """G."""

    props = _single(f).parameters["properties"]
    assert props["a"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["c"]["default"] == 0
    assert props["d"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["e"] == {"type": "array", "items": {"type": "string"}, "default": []}
    assert "required" not in _single(f).parameters
    g_schema = _single(g).parameters
    assert g_schema["required"] == ["b", "counts"]


def test_awkward_parameter_names() -> None:
    """Names pydantic dislikes as fields (leading underscore, BaseModel attributes) work."""

    def f(json: str, schema: int, _cursor: str = "", model_config: int = 0) -> None:
        """F."""

    tool = _single(f)
    assert list(tool.parameters["properties"]) == ["json", "schema", "_cursor", "model_config"]
    assert tool.parse_arguments({"json": "x", "schema": 1, "_cursor": "c"}) == {
        "json": "x",
        "schema": 1,
        "_cursor": "c",
        "model_config": 0,
    }


def test_single_model_parameter_is_the_whole_argument_object() -> None:
    """``def f(order: Order)`` takes the order's fields at the root, validates with Order and
    refuses unknown root keys even though Order itself ignores extras."""

    def place(ctx: ToolContext, order: Order) -> None:
        """Place an order."""

    tool = _single(place)
    schema = tool.parameters
    assert set(schema["properties"]) == {"customer_id", "items", "address"}
    assert schema["additionalProperties"] is False
    assert schema["description"] == "An order as a whole argument object."
    args = tool.parse_arguments({"customer_id": "c1", "items": [{"sku": "a", "quantity": 2}]})
    assert args == {"order": Order(customer_id="c1", items=[StrictItem(sku="a", quantity=2)])}
    with pytest.raises(ArgumentValidationError, match="surprise: Unexpected field"):
        tool.parse_arguments({"customer_id": "c1", "items": [], "surprise": 1})


def test_recursive_model_root_is_inlined() -> None:
    """A self-referencing model as the argument object still gets an object root."""

    def walk(tree: Node) -> int:
        """Sum a tree."""
        return 0

    tool = _single(walk)
    assert tool.parameters["type"] == "object"
    assert tool.parameters["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert "Node" in tool.parameters["$defs"]
    parsed = tool.parse_arguments({"value": 1, "children": [{"value": 2}]})
    assert parsed["tree"].children[0].value == 2


def test_context_parameter_is_injected_not_described() -> None:
    """A ToolContext parameter (any name, any position) never appears in the schema."""

    def f(order_id: str, context: ToolContext) -> None:
        """F."""

    tool = _single(f)
    assert list(tool.parameters["properties"]) == ["order_id"]
    assert tool.parse_arguments({"order_id": "o"}) == {"order_id": "o"}


def test_unresolvable_return_annotation_is_ignored() -> None:
    """Only parameter annotations are resolved, so a TYPE_CHECKING-only return type is fine."""

    def f(x: int) -> NotImportedAnywhere:  # type: ignore[name-defined]  # noqa: F821
        """F."""

    assert _single(f).parameters["required"] == ["x"]


def test_decorator_returns_the_function_unchanged() -> None:
    """Both decorator forms hand back the original function, still callable as Python."""
    tools = FunctionTools()

    @tools.function
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tools.function(name="mul", defer_loading=True, timeout=5)
    def multiply(a: int, b: int) -> int:
        """Multiply two numbers."""
        return a * b

    assert add(2, 3) == 5
    assert multiply(2, 3) == 6
    assert len(tools) == 2
    assert "add" in tools
    assert "mul" in tools
    assert "multiply" not in tools
    mul = tools.get("mul")
    assert mul is not None
    assert mul.fn is multiply
    assert (mul.defer_loading, mul.timeout, mul.is_async) == (True, 5.0, False)
    assert [t.name for t in tools] == ["add", "mul"]


def _varargs(*args: int) -> None:
    """Varargs."""


def _kwargs(**kwargs: int) -> None:
    """Kwargs."""


def _posonly(a: int, /) -> None:
    """Positional-only."""


def _unannotated(a, b: int) -> None:  # type: ignore[no-untyped-def]
    """Missing annotation."""


def _two_contexts(a: ToolContext, b: ToolContext) -> None:
    """Two contexts."""


def _optional_context(ctx: ToolContext | None) -> None:
    """Wrapped context."""


def _undocumented(a: int) -> None:
    pass


def _unresolvable(a: Missing) -> None:  # type: ignore[name-defined]  # noqa: F821
    """Unresolvable annotation."""


def _arbitrary(thing: NotAModel) -> None:
    """Arbitrary class."""


def _bad_default(when: int = object()) -> None:  # type: ignore[assignment]
    """Default that is not JSON."""


def _docstring_only_args(a: int) -> None:
    """Args:
    a: Only an args section, no summary.
    """


@pytest.mark.parametrize(
    ("fn", "options", "pattern"),
    [
        (_varargs, {}, r"parameter 'args'.*\*args"),
        (_kwargs, {}, r"parameter 'kwargs'.*\*\*kwargs"),
        (_posonly, {}, r"parameter 'a'.*positional-only"),
        (_unannotated, {}, r"parameter 'a'.*annotation"),
        (_two_contexts, {}, r"parameter 'b'.*one ToolContext"),
        (_optional_context, {}, r"parameter 'ctx'.*plain ToolContext"),
        (_undocumented, {}, r"_undocumented.*description"),
        (_docstring_only_args, {}, r"description"),
        (_unresolvable, {}, r"parameter 'a'.*cannot resolve"),
        (_arbitrary, {}, r"parameter 'thing'"),
        (_bad_default, {}, r"parameter 'when'"),
        (lambda x: x, {"description": "A lambda."}, r"'<lambda>'.*name="),
        (_posonly, {"name": "has space"}, r"tool name 'has space'"),
        (_posonly, {"name": "x" * 65}, r"tool name"),
        (_posonly, {"name": ""}, r"tool name"),
        (_posonly, {"name": "ok\n"}, r"tool name"),
        (_varargs, {"description": "   "}, r"description"),
    ],
)
def test_bad_signatures_are_refused_at_registration(
    fn: Callable[..., Any], options: dict[str, Any], pattern: str
) -> None:
    """Every unsupported signature or name fails when registered, naming the culprit."""
    with pytest.raises(ToolDefinitionError, match=re.compile(pattern, re.DOTALL)):
        FunctionTools().add(fn, **options)


def test_bad_options_are_refused() -> None:
    """reconcile without side_effects and non-positive timeouts are registration errors."""

    def f() -> None:
        """F."""

    def hook(context: ToolContext, arguments: dict[str, Any]) -> NotRun:
        return NotRun()

    with pytest.raises(ToolDefinitionError, match="side_effects"):
        _single(f, reconcile=hook)
    for timeout in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ToolDefinitionError, match="timeout"):
            _single(f, timeout=timeout)
    assert _single(f, side_effects=True).reconcile is None  # allowed: policy decides


def test_duplicate_names_are_refused() -> None:
    """A second tool with a taken name fails; include() is all-or-nothing."""
    tools = FunctionTools()

    @tools.function
    def lookup() -> None:
        """First."""

    with pytest.raises(ToolDefinitionError, match="'lookup' is already registered"):

        @tools.function(name="lookup")
        def other() -> None:
            """Second."""

    extra = FunctionTools()

    @extra.function
    def fresh() -> None:
        """Fresh."""

    @extra.function(name="lookup")
    def clash() -> None:
        """Clash."""

    with pytest.raises(ToolDefinitionError, match="already registered"):
        tools.include(extra)
    assert "fresh" not in tools
    del extra
    merged = FunctionTools()
    merged.include(tools)
    assert "lookup" in merged


# --------------------------------------------------------------------------- definitions


def _check_against_openai(definition: dict[str, Any]) -> None:
    """Validate with openai's own TypedDicts, refusing keys they do not declare."""
    typed: Any = {
        "function": AgentToolConfigParamFunction,
        "tool_search": AgentToolConfigParamToolSearch,
    }[definition["type"]]
    allowed = typed.__required_keys__ | typed.__optional_keys__
    assert set(definition) <= allowed, set(definition) - allowed
    assert typed.__required_keys__ <= set(definition)
    TypeAdapter(typed).validate_python(definition, strict=True)


def test_definitions_match_the_openai_types() -> None:
    """Every emitted definition validates against ``openai``'s agent tool param types, with
    ``defer_loading`` only when set, ``"async": true`` only for ``background=True`` and a
    trailing tool_search when anything is deferred."""
    tools = FunctionTools()

    @tools.function
    def plain(order: Order) -> None:
        """Plain."""

    @tools.function(defer_loading=True)
    def deferred(color: Color, tags: list[str] | None = None) -> None:
        """Deferred."""

    @tools.function(background=True, defer_loading=True)
    def report(topic: str) -> None:
        """Write a report; the agent goes on without waiting."""

    definitions = tools.definitions()
    assert [d["type"] for d in definitions] == ["function", "function", "function", "tool_search"]
    assert "defer_loading" not in definitions[0]
    assert "async" not in definitions[0]
    assert "async" not in definitions[1]
    assert definitions[1]["defer_loading"] is True
    assert definitions[2]["async"] is True
    assert definitions[2]["defer_loading"] is True
    assert _tool(tools, "report").background is True
    assert definitions[3] == {"type": "tool_search"}
    for definition in definitions:
        _check_against_openai(definition)
        json.dumps(definition, allow_nan=False)


def test_definitions_without_deferred_tools_have_no_tool_search() -> None:
    """tool_search is only added when needed; an empty registry gives an empty list."""
    tools = FunctionTools()
    assert tools.definitions() == []

    @tools.function
    def f() -> None:
        """F."""

    assert [d["type"] for d in tools.definitions()] == ["function"]


def test_definitions_are_copies() -> None:
    """Mutating the returned definitions cannot corrupt the registered schema."""
    tools = FunctionTools()

    @tools.function
    def f(x: int) -> None:
        """F."""

    tools.definitions()[0]["parameters"]["properties"]["x"]["type"] = "string"
    assert tools.definitions()[0]["parameters"]["properties"]["x"]["type"] == "integer"


def test_definitions_over_three_mib_are_refused() -> None:
    """A list over 3,145,728 bytes of compact UTF-8 JSON fails, reporting the size."""
    tools = FunctionTools()
    tools.add(lambda: None, name="huge", description="é" * (TOOL_DEFINITIONS_LIMIT // 2))
    with pytest.raises(ToolDefinitionError, match=r"\d+ bytes.*3145728"):
        tools.definitions()


# --------------------------------------------------------------------------- arguments


def _order_tool() -> FunctionTool:
    def submit(customer_id: str, items: list[StrictItem], note: str | None = None) -> None:
        """Submit an order."""

    return _single(submit)


def test_arguments_as_object_json_string_or_bytes() -> None:
    """The ``arguments`` value may be an object, a JSON string or bytes; models are built."""
    tool = _order_tool()
    expected = {"customer_id": "c", "items": [StrictItem(sku="s", quantity=1)], "note": None}
    raw = {"customer_id": "c", "items": [{"sku": "s", "quantity": 1}]}
    assert tool.parse_arguments(raw) == expected
    assert tool.parse_arguments(json.dumps(raw)) == expected
    assert tool.parse_arguments(json.dumps(raw).encode()) == expected


def test_empty_arguments_count_as_an_empty_object() -> None:
    """None and a blank string are ``{}`` (no-argument calls are sent both ways)."""

    def ping() -> str:
        """Ping."""
        return "pong"

    tool = _single(ping)
    assert tool.parse_arguments(None) == {}
    assert tool.parse_arguments("  ") == {}
    assert tool.parse_arguments("{}") == {}


@pytest.mark.parametrize(
    ("raw", "pattern"),
    [
        ('{"customer_id": "' + SECRET, r"not valid JSON \(line 1, column \d+\)"),
        ("[" * 100_000, r"not valid JSON|nested too deeply"),
        (f'["{SECRET}"]', r"must be a JSON object, not array"),
        (f'"{SECRET}"', r"not string"),
        ("42", r"not number"),
        ("null", r"not null"),
        (b"\xff\xfe", r"not valid UTF-8"),
        ([SECRET], r"not array"),
    ],
)
def test_malformed_arguments_are_refused_without_values(raw: object, pattern: str) -> None:
    """Invalid JSON and non-object arguments raise ArgumentValidationError quoting nothing."""
    with pytest.raises(ArgumentValidationError, match=pattern) as info:
        _order_tool().parse_arguments(raw)
    assert SECRET not in info.value.message
    assert info.value.__cause__ is None
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_wrong_types_report_paths_and_expectations_not_values() -> None:
    """Errors name field paths and what was expected; the submitted values never appear."""
    raw = {
        "customer_id": 12,
        "items": [{"sku": "ok", "quantity": 1}, {"sku": SECRET, "quantity": SECRET, "x": SECRET}],
        SECRET: SECRET,
    }
    with pytest.raises(ArgumentValidationError) as info:
        _order_tool().parse_arguments(raw)
    message = info.value.message
    assert "customer_id: Input should be a valid string" in message
    assert "items[1].quantity: Input should be a valid integer" in message
    assert "items[1].x: Unexpected field" in message
    assert "sk-live-SECRET0123456789: Unexpected field" in message  # a key is a path
    assert message.count(SECRET) == 1  # ...but never as a value
    assert info.value.__cause__ is None


def test_constraint_and_missing_messages() -> None:
    """Constraints are explained from the schema (``greater than or equal to 1``)."""
    with pytest.raises(ArgumentValidationError) as info:
        _order_tool().parse_arguments({"items": [{"sku": "a", "quantity": 0}]})
    assert info.value.message == (
        "customer_id: Field required; items[0].quantity: Input should be greater than or equal to 1"
    )


def test_validator_and_union_tag_messages_do_not_leak() -> None:
    """Custom validator messages and discriminator tags quote input, so they are replaced."""

    def f(
        checked: Checked,
        pet: Annotated[Cat | Dog, Field(discriminator="kind")],
        scores: dict[str, int],
    ) -> None:
        """F."""

    tool = _single(f)
    with pytest.raises(ArgumentValidationError) as info:
        tool.parse_arguments(
            {"checked": {"code": SECRET}, "pet": {"kind": SECRET}, "scores": {"a b": SECRET}}
        )
    message = info.value.message
    assert SECRET not in message
    assert "checked.code: Value is not valid" in message
    assert "pet: Tag does not match" in message
    assert "scores[<key>]: Input should be a valid integer" in message


def test_enum_and_literal_messages_list_the_allowed_values() -> None:
    """Enum and Literal errors tell the model which values are allowed."""

    def f(color: Color, speed: Literal["slow", "fast"]) -> None:
        """F."""

    with pytest.raises(ArgumentValidationError) as info:
        _single(f).parse_arguments({"color": SECRET, "speed": SECRET})
    assert "color: Input should be 'red' or 'green'" in info.value.message
    assert "speed: Input should be 'slow' or 'fast'" in info.value.message
    assert SECRET not in info.value.message


def test_many_errors_are_capped() -> None:
    """Only the first ten errors are listed, then a count."""

    def f(values: list[int]) -> None:
        """F."""

    with pytest.raises(ArgumentValidationError, match=r"and 15 more errors$"):
        _single(f).parse_arguments({"values": ["x"] * 25})


# --------------------------------------------------------------------------- invocation


@pytest.mark.anyio
async def test_async_handler_runs_on_the_loop_with_context() -> None:
    """Async handlers are awaited on the event loop and receive the injected context."""
    seen: list[ToolContext] = []

    async def lookup(customer_id: str, ctx: ToolContext) -> dict[str, str]:
        """Look up."""
        seen.append(ctx)
        return {"id": customer_id, "thread": threading.current_thread().name}

    tool = _single(lookup)
    assert tool.is_async
    context = _context("lookup")
    result = await tool.invoke(tool.parse_arguments({"customer_id": "c1"}), context)
    assert result == {"id": "c1", "thread": threading.current_thread().name}
    assert seen == [context]


@pytest.mark.anyio
async def test_sync_handler_runs_in_a_worker_thread_of_the_pool() -> None:
    """Sync handlers run in a thread; the pool bounds how many run at once."""
    active = 0
    peak = 0
    lock = threading.Lock()

    def slow(n: int) -> str:
        """Slow."""
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        threading.Event().wait(0.05)
        with lock:
            active -= 1
        return threading.current_thread().name

    tool = _single(slow)
    assert not tool.is_async
    pool = ThreadPool(2)
    names: list[str] = []

    async def one(n: int) -> None:
        names.append(await tool.invoke({"n": n}, _context(), threads=pool))

    async with anyio.create_task_group() as group:
        for n in range(6):
            group.start_soon(one, n)
    assert peak == 2
    assert threading.current_thread().name not in names


@pytest.mark.anyio
async def test_callable_instances_and_partials() -> None:
    """Async callable objects are detected as async; partials run with their bound args."""

    class Greeter:
        async def __call__(self, name: str) -> str:
            """Greet someone."""
            return f"hi {name}"

    def scale(factor: int, value: int) -> int:
        """Scale."""
        return factor * value

    greeter = _single(Greeter(), name="greet")
    assert greeter.is_async
    assert await greeter.invoke({"name": "bo"}, _context()) == "hi bo"
    doubled = _single(functools.partial(scale, 2), name="double")
    assert doubled.description == "Scale."
    assert greeter.description == "Greet someone."
    assert list(doubled.parameters["properties"]) == ["value"]
    assert await doubled.invoke(doubled.parse_arguments('{"value": 21}'), _context()) == 42


def test_idempotency_key_is_stable_and_unambiguous() -> None:
    """The key is ``afn_`` + 40 hex digits, the same for the same call and different when the
    ids differ, even if their concatenation is the same."""
    key = derive_idempotency_key("sess", "turn", "call")
    assert re.fullmatch(r"afn_[0-9a-f]{40}", key)
    assert key == derive_idempotency_key("sess", "turn", "call")
    assert derive_idempotency_key("a", "bc", "d") != derive_idempotency_key("ab", "c", "d")


def test_context_remaining_time() -> None:
    """remaining() counts down to the deadline, floors at zero and is None without one."""
    assert _context().remaining() is None
    context = _context(deadline=1_000.0)
    assert context.remaining(clock=lambda: 990.0) == 10.0
    assert context.remaining(clock=lambda: 2_000.0) == 0.0


# --------------------------------------------------------------------------- reconcile


def _refund_tools(**options: Any) -> FunctionTools:
    tools = FunctionTools()

    @tools.function(side_effects=True, **options)
    def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return tools


def _tool(tools: FunctionTools, name: str) -> FunctionTool:
    tool = tools.get(name)
    assert tool is not None
    return tool


@pytest.mark.anyio
async def test_reconcile_outcomes() -> None:
    """No hook → Unknown; sync and async hooks get context and parsed arguments."""
    context = _context("refund")
    assert await _tool(_refund_tools(), "refund").run_reconcile({}, context) == Unknown(
        "no reconcile hook"
    )

    calls: list[tuple[ToolContext, dict[str, Any]]] = []

    def sync_hook(ctx: ToolContext, arguments: dict[str, Any]) -> Ran:
        calls.append((ctx, arguments))
        return Ran({"refund": arguments["order_id"]})

    async def async_hook(ctx: ToolContext, arguments: dict[str, Any]) -> NotRun:
        return NotRun()

    sync_tool = _tool(_refund_tools(reconcile=sync_hook), "refund")
    assert await sync_tool.run_reconcile({"order_id": "o1"}, context) == Ran({"refund": "o1"})
    assert calls == [(context, {"order_id": "o1"})]
    async_tool = _tool(_refund_tools(reconcile=async_hook), "refund")
    assert await async_tool.run_reconcile({"order_id": "o1"}, context) == NotRun()


@pytest.mark.anyio
async def test_failing_or_confused_hooks_give_unknown() -> None:
    """A hook that raises or returns something else yields Unknown; nothing propagates."""

    def boom(ctx: ToolContext, arguments: dict[str, Any]) -> Ran:
        raise RuntimeError(SECRET)

    def confused(ctx: ToolContext, arguments: dict[str, Any]) -> Any:
        return True

    context = _context("refund")
    failed = await _tool(_refund_tools(reconcile=boom), "refund").run_reconcile({}, context)
    assert failed == Unknown("reconcile hook raised RuntimeError")
    odd = await _tool(_refund_tools(reconcile=confused), "refund").run_reconcile({}, context)
    assert isinstance(odd, Unknown)
    assert "returned bool" in odd.reason


@pytest.mark.anyio
async def test_reconciler_decorator() -> None:
    """``@tools.reconciler(name_or_function)`` attaches a hook once, to side-effect tools."""
    tools = FunctionTools()

    @tools.function(side_effects=True)
    def charge(amount: int) -> str:
        """Charge a card."""
        return "ok"

    @tools.function
    def read(key: str) -> str:
        """Read a value."""
        return key

    @tools.reconciler(charge)
    async def check_charge(ctx: ToolContext, arguments: dict[str, Any]) -> Ran:
        return Ran("already charged")

    assert _tool(tools, "charge").reconcile is check_charge
    assert await _tool(tools, "charge").run_reconcile({"amount": 1}, _context()) == Ran(
        "already charged"
    )
    with pytest.raises(ToolDefinitionError, match="already has a reconcile hook"):
        tools.reconciler("charge")(check_charge)
    with pytest.raises(ToolDefinitionError, match="side_effects=True"):
        tools.reconciler("read")(check_charge)
    with pytest.raises(ToolDefinitionError, match="no registered tool"):
        tools.reconciler("missing")
