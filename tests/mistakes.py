"""Common mistakes, as data: what a user gets wrong, and what agentfn-asgi now says.

Each row is a short title as a user would put it, a trigger that makes the mistake, the
message it produces and its kind: ``error`` (the trigger raises ``category``), ``warning``
(it warns ``category``) or ``log`` (a record at WARNING or above on ``logger``). The message
is exact except where ``…`` stands for text that varies (module paths, ports, temp dirs).

``tests/test_common_mistakes.py`` runs every row. README.md's "Common mistakes" section is
generated from this table and checked against it: ``python -m tests.mistakes`` prints it,
``python -m tests.mistakes --write`` rewrites it in README.md.

Adding a row for another part of the project is one decorated trigger (sync or async)::

    @mistake(
        "Starting the app",
        "My store URL points into a directory that does not exist",
        "…",
        category=ConfigurationError,
    )
    def _store_in_missing_directory() -> None:
        AgentWebhookApp(FunctionTools(), store="sqlite:///nowhere/x.sqlite3", ...)

Rows appear in the README grouped by area, in the order they are defined here.
"""

from __future__ import annotations

import inspect
import logging
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from pydantic import BaseModel, Field

from agentfn_asgi import (
    FunctionTool,
    FunctionTools,
    NotRun,
    ToolDefinitionError,
    ToolDefinitionWarning,
)

Kind = Literal["error", "warning", "log"]
T = TypeVar("T", bound=Callable[..., Any])

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- mistakes:begin (generated: python -m tests.mistakes --write) -->"
END = "<!-- mistakes:end -->"


@dataclass(frozen=True, slots=True)
class Mistake:
    """One row: a mistake, how to make it, and what the user is told."""

    area: str
    title: str
    message: str
    kind: Kind
    category: type[BaseException] | None
    trigger: Callable[[], Any]
    logger: str = "agentfn_asgi"


MISTAKES: list[Mistake] = []


def mistake(
    area: str,
    title: str,
    message: str,
    *,
    kind: Kind = "error",
    category: type[BaseException] | None = ToolDefinitionError,
    logger: str = "agentfn_asgi",
) -> Callable[[T], T]:
    """Add the decorated trigger to :data:`MISTAKES` as one row."""

    def add(trigger: T) -> T:
        MISTAKES.append(Mistake(area, title, message, kind, category, trigger, logger))
        return trigger

    return add


def observe(row: Mistake) -> list[str]:
    """Run the row's trigger and return what it said: the error's text, or every warning of
    the row's category, or every log record of WARNING and above. Raises AssertionError when
    the expected error does not happen."""
    if row.kind == "error":
        assert row.category is not None
        try:
            _run(row.trigger)
        except row.category as exc:
            return [str(exc)]
        raise AssertionError(f"{row.title!r}: no {row.category.__name__} was raised")
    if row.kind == "warning":
        assert row.category is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _run(row.trigger)
        return [str(w.message) for w in caught if issubclass(w.category, row.category)]
    handler = _Collect()
    logger = logging.getLogger(row.logger)
    logger.addHandler(handler)
    try:
        _run(row.trigger)
    finally:
        logger.removeHandler(handler)
    return [record.getMessage() for record in handler.records]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` word for word, ``…`` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual, re.DOTALL) is not None


def _run(trigger: Callable[[], Any]) -> None:
    if inspect.iscoroutinefunction(trigger):
        anyio.run(trigger)
    else:
        trigger()


def markdown() -> str:
    """The README section's body, between its markers."""
    lines = [BEGIN, ""]
    areas = list(dict.fromkeys(row.area for row in MISTAKES))
    for area in areas:
        lines += [f"### {area}", ""]
        for row in (row for row in MISTAKES if row.area == area):
            what = row.kind if row.category is None else f"{row.kind}, `{row.category.__name__}`"
            lines += [f"**{row.title}** ({what}):", "", "```text", row.message, "```", ""]
    lines.append(END)
    return "\n".join(lines)


def readme_section(text: str) -> str:
    """The generated part of README.md, markers included."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


# -- Registering tools -------------------------------------------------------------------------

REGISTERING = "Registering tools"


@mistake(
    REGISTERING,
    "I registered a generator function (it yields rows)",
    "tool function …stream_rows: a generator function (it uses yield) cannot be a tool, which"
    " sends one result when it returns; collect the items and return them (return list(...))"
    " or return one string",
)
def _generator() -> None:
    tools = FunctionTools()

    @tools.function
    def stream_rows(table: str) -> Any:
        """Read every row of a table."""
        yield from ()

    del stream_rows


@mistake(
    REGISTERING,
    "I registered an async generator function",
    "tool function …stream_rows: an async generator function (async def with yield) cannot be"
    " a tool, which sends one result when it returns; collect the items and return them"
    " (return [item async for item in ...]) or return one string",
)
def _async_generator() -> None:
    tools = FunctionTools()

    @tools.function
    async def stream_rows(table: str) -> Any:
        """Read every row of a table."""
        yield table

    del stream_rows


@mistake(
    REGISTERING,
    "A parameter is typed Any (or object)",
    "tool function …save: parameter 'payload' accepts any value, so its JSON Schema is empty"
    " and the model gets no guidance for it; give it a concrete type or a pydantic model, or"
    ' describe the value with Annotated[Any, Field(json_schema_extra={"type": "object"})]',
    kind="warning",
    category=ToolDefinitionWarning,
)
def _any_parameter() -> None:
    tools = FunctionTools()

    @tools.function
    def save(key: str, payload: Any) -> str:
        """Save a document."""
        return key

    del save


class Order(BaseModel):
    """An order whose ``extra`` field accepts anything."""

    sku: str
    extra: Any = None


@mistake(
    REGISTERING,
    "A field of my pydantic model is typed Any",
    "tool function …place: field 'Order.extra' accepts any value, so its JSON Schema is empty"
    " and the model gets no guidance for it; give it a concrete type or a pydantic model, or"
    ' describe the value with Annotated[Any, Field(json_schema_extra={"type": "object"})]',
    kind="warning",
    category=ToolDefinitionWarning,
)
def _any_model_field() -> None:
    tools = FunctionTools()

    @tools.function
    def place(order: Order, express: bool = False) -> str:
        """Place an order."""
        return order.sku

    del place


@mistake(
    REGISTERING,
    "A tool has side effects but no reconcile hook",
    "tool 'refund' has side_effects=True but no reconcile hook: a call left in doubt (its"
    " process died while it ran) is never run again blindly but quarantined: the model gets a"
    " failure saying the outcome is unknown, or the call waits for an operator with"
    ' DispatchSettings(in_doubt="hold"). Add a hook that checks your records and returns'
    " Ran(result) or NotRun(): reconcile=... or @tools.reconciler('refund')",
    kind="warning",
    category=ToolDefinitionWarning,
)
def _side_effects_without_reconcile() -> None:
    tools = FunctionTools()

    @tools.function(side_effects=True)
    def refund(order_id: str) -> str:
        """Refund an order."""
        return order_id

    tools.definitions()  # registration is complete here (also: tools.problems())


@mistake(
    REGISTERING,
    "I misspelled an option: @tools.function(timout=5)",
    "@tools.function: unknown option 'timout' (did you mean 'timeout'?); the options are"
    " background, defer_loading, description, enqueue, job_deadline, name, reconcile,"
    " side_effects, timeout, truncate_oversize",
)
def _misspelled_option() -> None:
    tools = FunctionTools()
    tools.function(timout=5)  # type: ignore[call-overload]


@mistake(
    REGISTERING,
    'I passed the name positionally: @tools.function("lookup")',
    "@tools.function takes the function itself, not 'lookup'; pass options by keyword:"
    " @tools.function(name='lookup')",
)
def _positional_name() -> None:
    FunctionTools().function("lookup")  # type: ignore[call-overload]


class Shop:
    """A class whose method was decorated in the class body."""

    def lookup(self, sku: str) -> str:
        """Look up a product."""
        return sku


@mistake(
    REGISTERING,
    "I decorated a method inside its class",
    "tool function …Shop.lookup: parameter 'self': this is a method taken from its class;"
    " register the bound method of an instance instead: tools.add(instance.lookup)",
)
def _method_in_class_body() -> None:
    FunctionTools().add(Shop.lookup)


@mistake(
    REGISTERING,
    "My tool has no docstring",
    "tool function …ping: the Agents API requires a description; add a docstring or pass"
    " description=...",
)
def _no_docstring() -> None:
    def ping() -> str:
        return "pong"

    FunctionTools().add(ping)


class Connection:
    """A class pydantic knows nothing about."""


@mistake(
    REGISTERING,
    "A parameter's type is a class pydantic cannot describe",
    "tool function …query: parameter 'db' has type Connection, which pydantic cannot validate"
    " or describe; use JSON types (str, int, float, bool, list, dict), a pydantic model, a"
    " dataclass or a TypedDict",
)
def _unknown_class() -> None:
    def query(db: Connection, sql: str) -> str:
        """Run a query."""
        return sql

    FunctionTools().add(query)


@mistake(
    REGISTERING,
    "An annotation names a class imported under TYPE_CHECKING (or defined in a function)",
    "tool function …lookup: parameter 'customer': cannot resolve annotation 'Customer'"
    " (name 'Customer' is not defined); define or import it at module level, not under"
    " `if TYPE_CHECKING:` nor inside a function: annotations are read from the module when"
    " the tool is registered",
)
def _unresolvable_annotation() -> None:
    def lookup(customer: Customer) -> str:  # type: ignore[name-defined]  # noqa: F821
        """Look a customer up."""
        return ""

    FunctionTools().add(lookup)


class Invoice(BaseModel):
    """A model referring to a class that does not exist (yet)."""

    lines: list[InvoiceLine]  # type: ignore[name-defined]  # noqa: F821


@mistake(
    REGISTERING,
    "My model refers to a class that is not defined",
    "tool function …send_invoice: parameter 'invoice' has type Invoice, which refers to"
    " InvoiceLine, a name that is not defined; define or import InvoiceLine at module level"
    " (if it comes after Invoice, call Invoice.model_rebuild() below it)",
)
def _undefined_forward_reference() -> None:
    def send_invoice(invoice: Invoice) -> str:
        """Send an invoice."""
        return ""

    FunctionTools().add(send_invoice)


@mistake(
    REGISTERING,
    'A default cannot be written as JSON: limit: float = float("inf")',
    "tool function …search: parameter 'limit' has the default inf, which JSON cannot hold;"
    " use a finite number or None",
)
def _default_not_json() -> None:
    def search(query: str, limit: float = float("inf")) -> str:
        """Search the catalogue."""
        return query

    FunctionTools().add(search)


@mistake(
    REGISTERING,
    "A Field constraint is invalid",
    "tool function …find: parameter 'code' has type str with invalid constraints: unclosed"
    " character class",
)
def _invalid_constraint() -> None:
    def find(code: Annotated[str, Field(pattern="[A-Z")]) -> str:
        """Find a product by code."""
        return code

    FunctionTools().add(find)


@mistake(
    REGISTERING,
    "reconcile= without side_effects=True",
    "tool function …charge: reconcile= only applies with side_effects=True",
)
def _reconcile_without_side_effects() -> None:
    def charge(amount: int) -> str:
        """Charge a card."""
        return "ok"

    FunctionTool.from_function(charge, reconcile=lambda context, arguments: NotRun())


# -- Coming from the openai SDK ----------------------------------------------------------------

FROM_SDK = "Coming from the openai SDK"


def _get_weather(arguments: dict[str, Any]) -> str:
    return f"sunny in {arguments['city']}"


@mistake(
    FROM_SDK,
    "A plain function in tool_handlers, without its definition",
    "FunctionTools.from_sdk: tool_handlers['get_weather'] is a plain function, and the SDK"
    " sends no definition for it; pass the agent's tools (definitions=agent_tools) or wrap it"
    " with openai's function_tool()",
)
def _plain_handler_without_definition() -> None:
    FunctionTools.from_sdk({"get_weather": _get_weather})


@mistake(
    FROM_SDK,
    "A tool_handlers key that is not the tool's name",
    "FunctionTools.from_sdk: tool_handlers['weather'] holds the openai tool 'get_weather'; the"
    " model calls it 'get_weather', so use that as its key",
)
def _key_is_not_the_name() -> None:
    from openai.lib.beta.agents import function_tool

    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        return "sunny"

    FunctionTools.from_sdk({"weather": function_tool(get_weather)})


@mistake(
    FROM_SDK,
    "A definition in the Chat Completions shape",
    "tool function …_get_weather: the definition has the Chat Completions shape {'type':"
    " 'function', 'function': {...}}; agent.tools takes it flat: {'type': 'function', 'name':"
    " ..., 'description': ..., 'parameters': {...}}",
)
def _chat_completions_definition() -> None:
    nested = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    FunctionTool.from_sdk(_get_weather, definition=nested)


@mistake(
    FROM_SDK,
    'A definition with "strict": true (a Responses API habit)',
    "tool function …_get_weather: the definition has keys agent.tools does not take: strict"
    " (it takes async, defer_loading, description, name, parameters, type)",
)
def _strict_definition() -> None:
    definition = {
        "type": "function",
        "name": "get_weather",
        "description": "Get the weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        "strict": True,
    }
    FunctionTool.from_sdk(_get_weather, definition=definition)


def main(argv: list[str]) -> int:
    """Print the README section, or with ``--write`` put it into README.md."""
    section = markdown()
    if argv[1:] == ["--write"]:
        text = README.read_text(encoding="utf-8")
        README.write_text(text.replace(readme_section(text), section), encoding="utf-8")
        return 0
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
