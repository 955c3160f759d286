"""Common mistakes, as data: what a user gets wrong, and what agentfn-asgi now says.

Each row is a short title as a user would put it, a trigger that makes the mistake, the
message it produces and its kind: ``error`` (the trigger raises ``category``), ``warning``
(it warns ``category``), ``log`` (a record at WARNING or above on ``logger``) or ``cli``
(the trigger runs ``agentfn-asgi`` and returns its exit code and stderr: one line, no
traceback, exit code ``exit_code``). The message is exact except where ``…`` stands for
text that varies (module paths, ports, temp dirs).

``tests/test_common_mistakes.py`` runs every row. The documentation's "Common mistakes" page
(``docs/common-mistakes.md``) is generated from this table and checked against it:
``python -m tests.mistakes`` prints its generated part, ``python -m tests.mistakes --write``
rewrites it in the page.

Adding a row for another part of the project is one decorated trigger (sync or async)::

    @mistake(
        "Starting the app",
        "My store URL points into a directory that does not exist",
        "…",
        category=ConfigurationError,
    )
    def _store_in_missing_directory() -> None:
        AgentWebhookApp(FunctionTools(), store="sqlite:///nowhere/x.sqlite3", ...)

Rows appear on the page grouped by area, in the order they are defined here.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import anyio
from pydantic import BaseModel, Field

from agentfn_asgi import (
    AgentsClient,
    AgentWebhookApp,
    Config,
    ConfigurationError,
    FunctionTool,
    FunctionTools,
    NotRun,
    ToolDefinitionError,
    ToolDefinitionWarning,
)
from agentfn_asgi.store import open_store

Kind = Literal["error", "warning", "log", "cli"]
T = TypeVar("T", bound=Callable[..., Any])

PAGE = Path(__file__).resolve().parents[1] / "docs" / "common-mistakes.md"
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
    exit_code: int | None = None


MISTAKES: list[Mistake] = []


def mistake(
    area: str,
    title: str,
    message: str,
    *,
    kind: Kind = "error",
    category: type[BaseException] | None = ToolDefinitionError,
    logger: str = "agentfn_asgi",
    exit_code: int | None = None,
) -> Callable[[T], T]:
    """Add the decorated trigger to :data:`MISTAKES` as one row."""

    def add(trigger: T) -> T:
        row = Mistake(area, title, message, kind, category, trigger, logger, exit_code)
        MISTAKES.append(row)
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
    if row.kind == "cli":
        code, err = _run(row.trigger)
        assert "Traceback" not in err, (row.title, err)
        assert err.count("\n") == 1, (row.title, err)  # one line
        assert code == row.exit_code, (row.title, code, err)
        return [err.strip()]
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


def _run(trigger: Callable[[], Any]) -> Any:
    if inspect.iscoroutinefunction(trigger):
        return anyio.run(trigger)
    return trigger()


def cli(*argv: str, **env: str | None) -> tuple[int, str]:
    """Run ``agentfn-asgi *argv`` with ``env`` set (None: unset) in this process; return its
    exit code and stderr."""
    from agentfn_asgi.cli import main

    saved = {name: os.environ.get(name) for name in env}
    err = io.StringIO()
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's usage errors
                code = int(exc.code or 0)
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return code, err.getvalue()


def markdown() -> str:
    """The page section's body, between its markers."""
    lines = [BEGIN, ""]
    areas = list(dict.fromkeys(row.area for row in MISTAKES))
    for area in areas:
        lines += [f"### {area}", ""]
        for row in (row for row in MISTAKES if row.area == area):
            if row.kind == "cli":
                what = f"exit code {row.exit_code}"
            elif row.category is None:
                what = row.kind
            else:
                what = f"{row.kind}, `{row.category.__name__}`"
            lines += [f"**{row.title}** ({what}):", "", "```text", row.message, "```", ""]
    lines.append(END)
    return "\n".join(lines)


def page_section(text: str) -> str:
    """The generated part of the page, markers included."""
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


# -- Registering tools -------------------------------------------------------------------------

REGISTERING = "Registering tools"


@mistake(
    REGISTERING,
    "I registered a generator function (it yields rows)",
    "tool function …stream_rows (…): a generator function (it uses yield) cannot be a tool, which"
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
    "tool function …stream_rows (…): an async generator function (async def with yield) cannot be"
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
    " approval, approval_timeout, background, burst, concurrency, concurrency_key,"
    " defer_loading, description, enqueue, in_doubt, job_deadline, max_attempts,"
    " max_calls_per_session, max_wait, name, rate, reconcile, retry, side_effects, timeout,"
    " truncate_oversize",
)
def _misspelled_option() -> None:
    tools = FunctionTools()
    tools.function(timout=5)  # type: ignore[call-overload]


@mistake(
    REGISTERING,
    "A limit that could never run a call: @tools.function(concurrency=0)",
    "tool function …lookup (…): concurrency=0 would never run a call; set concurrency=1 or more,"
    " or drop it for no bound",
)
def _concurrency_zero() -> None:
    @FunctionTools().function(concurrency=0)
    def lookup(key: str) -> str:
        """Look a key up."""
        return key


@mistake(
    REGISTERING,
    "A rate of zero: @tools.function(rate='0/s')",
    "tool function …lookup (…): rate='0/s' would never run a call; give a positive rate such as"
    " rate='5/s', or drop it for no bound",
)
def _rate_zero() -> None:
    @FunctionTools().function(rate="0/s")
    def lookup(key: str) -> str:
        """Look a key up."""
        return key


@mistake(
    REGISTERING,
    "A limit on a tool handed to a queue: @tools.function(enqueue=..., concurrency=4)",
    "tool function …lookup (…): concurrency= and rate= limit calls run here; a queued tool's"
    " worker is limited by its queue (bound its workers), so drop them or drop enqueue=",
)
def _limit_with_enqueue() -> None:
    @FunctionTools().function(enqueue=lambda job: None, concurrency=4)
    def lookup(key: str) -> str:
        """Look a key up."""
        return key


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
    "tool function …Shop.lookup (…): parameter 'self': this is a method taken from its class;"
    " register the bound method of an instance instead: tools.add(instance.lookup)",
)
def _method_in_class_body() -> None:
    FunctionTools().add(Shop.lookup)


@mistake(
    REGISTERING,
    "My tool has no docstring",
    "tool function …ping (…): the Agents API requires a description; add a docstring or pass"
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
    "tool function …query (…): parameter 'db' has type Connection, which pydantic cannot validate"
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
    "tool function …lookup (…): parameter 'customer': cannot resolve annotation 'Customer'"
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
    "tool function …send_invoice (…): parameter 'invoice' has type Invoice, which refers to"
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
    "tool function …search (…): parameter 'limit' has the default inf, which JSON cannot hold;"
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
    "tool function …find (…): parameter 'code' has type str with invalid constraints: unclosed"
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
    "tool function …charge (…): reconcile= only applies with side_effects=True",
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
    "tool function …_get_weather (…): the definition has the Chat Completions shape {'type':"
    " 'function', 'function': {...}}; agent.tools takes it flat: {'type': 'function', 'name':"
    " ..., 'description': ..., 'parameters': {...}}",
)
def _chat_completions_definition() -> None:
    nested = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    FunctionTool.from_sdk(_get_weather, definition=nested)


@mistake(
    FROM_SDK,
    'A definition with "strict": true (a Responses API habit)',
    "tool function …_get_weather (…): the definition has keys agent.tools does not take: strict"
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


# -- Starting the app --------------------------------------------------------------------------

STARTING = "Starting the app"
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@mistake(
    STARTING,
    "My store URL points into a directory that does not exist",
    "SQLite store …/nonexistent_dir/x.db: the directory …/nonexistent_dir does not exist;"
    " create it (the store never creates directories, so a mistyped path cannot start an"
    " empty store) or fix AGENTFN_STORE_URL",
    category=ConfigurationError,
)
async def _store_in_missing_directory() -> None:
    with tempfile.TemporaryDirectory() as folder:
        client = AgentsClient(api_key="sk-test", base_url="http://127.0.0.1:9/v1")
        webhooks = AgentWebhookApp(
            FunctionTools(),
            webhook_secret=SECRET,
            client=client,
            store=f"sqlite:///{folder}/nonexistent_dir/x.db",
        )
        try:
            await webhooks.startup()  # the lifespan's start: the store is opened here
        finally:
            await webhooks.shutdown()
            await client.aclose()


@mistake(
    STARTING,
    "I started the app without OPENAI_WEBHOOK_SECRET and OPENAI_API_KEY",
    "2 configuration problems: (1) no webhook secret: pass webhook_secret= or set"
    " OPENAI_WEBHOOK_SECRET (the whsec_... value shown when the webhook endpoint was created);"
    " (2) no API key: set the OPENAI_API_KEY environment variable (or pass client= an"
    " AgentsClient(api_key=...))",
    category=ConfigurationError,
)
async def _no_secret_no_key() -> None:
    # Building the app checks nothing (a module that builds it always imports); its start-up
    # (the lifespan) names every problem at once.
    webhooks = AgentWebhookApp(FunctionTools(), store="memory://", config=Config())
    try:
        await webhooks.startup()
    finally:
        await webhooks.shutdown()


@mistake(
    STARTING,
    "I misspelled an AGENTFN_* variable",
    "unknown variable AGENTFN_STORE_ULR (did you mean AGENTFN_STORE_URL?): agentfn-asgi has no"
    " such setting. Fix the name, or, if your host owns it, list it in AGENTFN_ALLOW_UNKNOWN"
    " (names separated by commas; PREFIX_* for a prefix)",
    category=ConfigurationError,
)
def _misspelled_variable() -> None:
    Config.from_env({"AGENTFN_STORE_ULR": "redis://redis.internal:6379/0"})


@mistake(
    STARTING,
    "I misspelled a store URL option",
    "unknown parameter ?key_prefx= in store URL 'redis://redis.internal:6379/0?key_prefx=app1:'"
    " (did you mean ?key_prefix=?): fix or remove it in AGENTFN_STORE_URL (or store=)",
    category=ConfigurationError,
)
def _misspelled_store_option() -> None:
    open_store("redis://redis.internal:6379/0?key_prefx=app1:")


@mistake(
    STARTING,
    "I wrote sqlite:/x (one slash)",
    "store URL 'sqlite:/x' is malformed: expected sqlite:///relative.db (from the working"
    " directory) or sqlite:////abs/path.db",
    category=ConfigurationError,
)
def _sqlite_one_slash() -> None:
    open_store("sqlite:/x")


@mistake(
    STARTING,
    "I wrote memory: for the in-memory store",
    "store URL 'memory:' is malformed: expected memory://",
    category=ConfigurationError,
)
def _memory_without_slashes() -> None:
    open_store("memory:")


@mistake(
    STARTING,
    "I gave a file path as the store URL",
    "store URL 'data/agentfn.sqlite3' has no scheme: for this SQLite file use"
    " sqlite:///data/agentfn.sqlite3 (relative to the working directory)",
    category=ConfigurationError,
)
def _bare_path() -> None:
    open_store("data/agentfn.sqlite3")


# -- The command line --------------------------------------------------------------------------

COMMAND_LINE = "The command line"
_NOT_A_REGISTRY = (
    "not a FunctionTools registry: name the registry your tools are registered on"
    " (MODULE:tools), an AgentWebhookApp, or a function without arguments that returns one"
)


@mistake(
    COMMAND_LINE,
    "agentfn-asgi tools pointed at the host application (main:app)",
    f"agentfn-asgi tools: tests.support.cli_targets:app is a Starlette app, {_NOT_A_REGISTRY}",
    kind="cli",
    category=None,
    exit_code=2,
)
def _tools_at_the_host_app() -> tuple[int, str]:
    return cli("tools", "tests.support.cli_targets:app")


@mistake(
    COMMAND_LINE,
    "agentfn-asgi tools pointed at a setting",
    f"agentfn-asgi tools: tests.support.cli_targets:retries is an int, {_NOT_A_REGISTRY}",
    kind="cli",
    category=None,
    exit_code=2,
)
def _tools_at_an_int() -> tuple[int, str]:
    return cli("tools", "tests.support.cli_targets:retries")


@mistake(
    COMMAND_LINE,
    "agentfn-asgi tools pointed at one tool function",
    "agentfn-asgi tools: tests.support.cli_targets:lookup is a function taking arguments"
    f" (city), {_NOT_A_REGISTRY}",
    kind="cli",
    category=None,
    exit_code=2,
)
def _tools_at_a_function() -> tuple[int, str]:
    return cli("tools", "tests.support.cli_targets:lookup")


@mistake(
    COMMAND_LINE,
    "My tools module fails when it is imported",
    "agentfn-asgi tools: importing 'tests.support.cli_broken' failed: KeyError:"
    " 'SHOP_API_URL_FOR_A_TEST' (…/tests/support/cli_broken.py:…)",
    kind="cli",
    category=None,
    exit_code=2,
)
def _tools_module_fails() -> tuple[int, str]:
    return cli("tools", "tests.support.cli_broken:tools", SHOP_API_URL_FOR_A_TEST=None)


@mistake(
    COMMAND_LINE,
    "agentfn-asgi recover without an API key",
    "agentfn-asgi recover: configuration error: no API key: set the OPENAI_API_KEY environment"
    " variable (recover reads the sessions through the Agents API; OPENAI_BASE_URL points it"
    " at another server, e.g. agentfn-asgi fake-api)",
    kind="cli",
    category=None,
    exit_code=2,
)
def _recover_without_key() -> tuple[int, str]:
    return cli(
        "recover",
        "--tools",
        "tests.support.cli_targets:tools",
        OPENAI_API_KEY=None,
        AGENTFN_STORE_URL="memory://",
    )


@mistake(
    COMMAND_LINE,
    "agentfn-asgi status run from another folder (or with a mistyped path)",
    "agentfn-asgi status: configuration error: no store at …/nonexistent_dir/x.db (nothing was"
    " created): pass --store or set AGENTFN_STORE_URL to the app's store; sqlite:///x.db is"
    " relative to the working directory (…), sqlite:////x.db is absolute",
    kind="cli",
    category=None,
    exit_code=2,
)
def _status_of_a_missing_store() -> tuple[int, str]:
    return cli("status", AGENTFN_STORE_URL="sqlite:///nonexistent_dir/x.db")


def main(argv: list[str]) -> int:
    """Print the page's generated part, or with ``--write`` put it into the page."""
    section = markdown()
    if argv[1:] == ["--write"]:
        text = PAGE.read_text(encoding="utf-8")
        PAGE.write_text(text.replace(page_section(text), section), encoding="utf-8")
        return 0
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
