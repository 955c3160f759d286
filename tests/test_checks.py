"""Registration checks (agentfn_asgi/_checks.py, with the schema errors of _schema.py): each
newcomer mistake is caught when the tool registers, or said once registration is complete,
with a message that names the fix. The user-facing table is tests/mistakes.py; these pin the
variants and the mechanics behind it."""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Optional

import pydantic
import pytest
from pydantic import BaseModel, Field
from pydantic_core import SchemaError

from agentfn_asgi import (
    AgentFnWarning,
    FunctionTool,
    FunctionTools,
    NotRun,
    ToolContext,
    ToolDefinitionError,
    ToolDefinitionWarning,
)
from agentfn_asgi.tools import ToolProblem


def _nothing(ctx: ToolContext, arguments: dict[str, Any]) -> NotRun:
    return NotRun()


# -- generators ----------------------------------------------------------------------------------


def _rows(n: int) -> Iterator[int]:
    """Rows."""
    yield n


class _RowsCallable:
    """A callable instance whose __call__ yields."""

    def __call__(self, n: int) -> Iterator[int]:
        """Rows."""
        yield n


@pytest.mark.parametrize(
    "fn", [_rows, functools.partial(_rows), _RowsCallable()], ids=["function", "partial", "call"]
)
def test_generators_are_refused_however_they_are_wrapped(fn: Callable[..., Any]) -> None:
    """A generator is refused through a partial or a callable instance too, not only bare."""
    with pytest.raises(
        ToolDefinitionError, match=r"a generator function .*\(return list\(\.\.\.\)\)"
    ):
        FunctionTools().add(fn, name="rows")


# -- unknown options ---------------------------------------------------------------------------


def test_a_misspelled_option_is_named_by_every_entry_point() -> None:
    """``function(...)``, ``add(...)`` and ``FunctionTool.from_function(...)`` all refuse an
    unknown option with ToolDefinitionError naming it and the closest valid one."""

    def ping() -> str:
        """Ping."""
        return "pong"

    tools = FunctionTools()
    attempts: list[Callable[[], object]] = [
        lambda: tools.function(timout=5),  # type: ignore[call-overload]
        lambda: tools.add(ping, timout=5),  # type: ignore[call-arg]
        lambda: FunctionTool.from_function(ping, timout=5),  # type: ignore[call-arg]
    ]
    for attempt in attempts:
        with pytest.raises(
            ToolDefinitionError, match=r"unknown option 'timout' \(did you mean 'timeout'\?\)"
        ):
            attempt()
    with pytest.raises(
        ToolDefinitionError, match=r"'side_effect' \(did you mean 'side_effects'\?\)"
    ):
        tools.add(ping, side_effect=True)  # type: ignore[call-arg]
    with pytest.raises(
        ToolDefinitionError, match=r"unknown option 'colour'; the options are approval, "
    ):
        tools.add(ping, colour="red")  # type: ignore[call-arg]
    assert len(tools) == 0


# -- pydantic's errors, in one line ------------------------------------------------------------


class _Opaque:
    """A class pydantic cannot describe."""


class _Dangling(BaseModel):
    """A model whose field names a class that does not exist."""

    child: list[Nowhere]  # type: ignore[name-defined]  # noqa: F821


def _opaque(thing: _Opaque) -> None:
    """Opaque."""


def _callable(hook: Callable[[int], int]) -> None:
    """Callable."""


def _dangling_alone(model: _Dangling) -> None:
    """The model is the whole argument object."""


def _dangling_among_others(model: _Dangling, flag: bool) -> None:
    """The model is one parameter of several."""


def _bad_pattern(code: Annotated[str, Field(pattern="(")]) -> None:
    """An invalid regular expression."""


def _bad_constraint_default(count: int = Field(default=1, gt="x")) -> None:
    """An invalid constraint given as the default."""


def _sentinel_default(when: int = object()) -> None:  # type: ignore[assignment]
    """A default that is not JSON."""


def _nan_default(ratio: float = float("nan")) -> None:
    """NaN has no JSON."""


@pytest.mark.parametrize(
    ("fn", "expected", "cause"),
    [
        (
            _opaque,
            "parameter 'thing' has type _Opaque, which pydantic cannot",
            pydantic.PydanticSchemaGenerationError,
        ),
        (
            _callable,
            "parameter 'hook' has type Callable[[int], int], which has no JSON Schema",
            pydantic.PydanticInvalidForJsonSchema,
        ),
        (
            _dangling_alone,
            "parameter 'model' has type _Dangling, which refers to Nowhere",
            pydantic.PydanticUserError,
        ),
        (
            _dangling_among_others,
            "parameter 'model' has type _Dangling, which refers to Nowhere",
            pydantic.PydanticUserError,
        ),
        (_bad_pattern, "parameter 'code' has type str with invalid constraints:", SchemaError),
        (
            _bad_constraint_default,
            "parameter 'count' has type int with invalid constraints:",
            SchemaError,
        ),
        (_sentinel_default, "parameter 'when' has a default of type object, which cannot", Warning),
        (_nan_default, "parameter 'ratio' has the default nan, which JSON cannot hold", ValueError),
    ],
)
def test_schema_errors_are_one_line_with_pydantic_as_the_cause(
    fn: Callable[..., Any], expected: str, cause: type[BaseException]
) -> None:
    """What pydantic refuses becomes one line naming the tool, the parameter, the type and
    the fix, with no URL; pydantic's own error stays as ``__cause__``. Regression: an invalid
    constraint used to escape as a bare pydantic_core SchemaError."""
    with pytest.raises(ToolDefinitionError) as raised:
        FunctionTools().add(fn)
    message = str(raised.value)
    assert "\n" not in message
    assert "errors.pydantic.dev" not in message
    line = fn.__code__.co_firstlineno
    label = f"tool function {fn.__module__}.{fn.__qualname__} (tests/test_checks.py:{line}): "
    assert message.startswith(label)
    assert expected in message
    assert isinstance(raised.value.__cause__, cause)


def test_an_unresolvable_annotation_says_where_to_import_it() -> None:
    """A name only imported under TYPE_CHECKING (or a local class behind a string
    annotation) fails with the NameError's reason and where the import belongs."""

    def lookup(customer: Customer) -> None:  # type: ignore[name-defined]  # noqa: F821
        """Look up."""

    with pytest.raises(ToolDefinitionError) as raised:
        FunctionTools().add(lookup)
    assert "name 'Customer' is not defined" in str(raised.value)
    assert "not under `if TYPE_CHECKING:`" in str(raised.value)
    assert isinstance(raised.value.__cause__, NameError)


# -- parameters that tell the model nothing ------------------------------------------------------


class _Loose(BaseModel):
    """A model with one unguided field and one described one."""

    data: Any
    note: Annotated[Any, Field(json_schema_extra={"type": "string"})] = None


def _untyped_parameters(tools: FunctionTools, fn: Callable[..., Any]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tools.add(fn)
    found = [w for w in caught if issubclass(w.category, ToolDefinitionWarning)]
    for w in found:
        assert w.filename == __file__  # points at the tool's def line, where the fix goes
    return [re.findall(r"(?:parameter|field) '([^']+)'", str(w.message))[0] for w in found]


def test_only_parameters_whose_schema_says_nothing_warn() -> None:
    """``Any``, ``object`` and ``Any | None`` warn (their schema is empty), and so does an Any
    with only a description; containers of Any still give the model a shape and stay quiet,
    as does an Any given a type with json_schema_extra. A nested model's field is named
    ``Model.field``. Each finding is also listed by problems()."""

    def store(
        a: Any,
        b: object,
        c: Optional[Any],  # noqa: UP045 - the spelling a newcomer writes
        d: list[Any],
        e: dict[str, Any],
        f: Annotated[Any, Field(json_schema_extra={"type": "object"})],
        g: Annotated[Any, Field(description="Prose is not a type.")] = None,
    ) -> None:
        """Store things."""

    def place(order: _Loose, express: bool = False) -> None:
        """Place."""

    def place_whole(order: _Loose) -> None:
        """A single model is the argument object: its fields are the parameters."""

    tools = FunctionTools()
    assert _untyped_parameters(tools, store) == ["a", "b", "c", "g"]
    assert _untyped_parameters(tools, place) == ["_Loose.data"]
    assert _untyped_parameters(tools, place_whole) == ["data"]
    assert [(p.tool, p.code) for p in tools.problems()] == [("store", "untyped_parameter")] * 4 + [
        ("place", "untyped_parameter"),
        ("place_whole", "untyped_parameter"),
    ]
    assert issubclass(ToolDefinitionWarning, AgentFnWarning)
    assert issubclass(ToolDefinitionWarning, UserWarning)


@pytest.mark.slow  # starts a Python process
def test_the_warning_works_for_a_script_run_with_python_c() -> None:
    """Regression: the warning points at the tool's ``def`` line; for a ``python -c`` (or
    REPL) ``__main__`` that used to raise ImportError from the loader instead of warning."""
    script = (
        "from typing import Any\n"
        "from agentfn_asgi import FunctionTools\n"
        "def save(payload: Any) -> None:\n"
        "    'Save.'\n"
        "FunctionTools().add(save)\n"
        "print('registered')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "registered\n"
    assert "<string>:3: ToolDefinitionWarning: tool function __main__.save:" in done.stderr


def test_the_warning_is_an_error_under_error_filters() -> None:
    """``filterwarnings = error`` (this suite's setting) turns the warning into an error at
    registration, so a CI run can insist on typed tools."""

    def save(payload: Any) -> None:
        """Save."""

    with pytest.raises(ToolDefinitionWarning, match="parameter 'payload' accepts any value"):
        FunctionTools().add(save)


# -- side effects without a reconcile hook ---------------------------------------------------------


def test_no_reconcile_is_judged_on_the_complete_registry() -> None:
    """Registering a side-effect tool says nothing yet (``@tools.reconciler`` may follow);
    problems() lists it until a hook arrives; definitions() warns once per tool, at the
    tool's own def line (not at whoever asked for the definitions, such as the CLI)."""
    tools = FunctionTools()
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @tools.function(side_effects=True)
        def refund(order_id: str) -> str:
            """Refund."""
            return order_id

        @tools.function(side_effects=True)
        def charge(amount: int) -> str:
            """Charge."""
            return "ok"

    [first, second] = tools.problems()
    assert isinstance(first, ToolProblem)
    assert (first.tool, first.code, second.tool) == ("refund", "no_reconcile", "charge")
    assert str(first) == first.message
    assert "quarantined" in first.message and "@tools.reconciler('refund')" in first.message

    tools.reconciler("charge")(_nothing)
    assert [p.tool for p in tools.problems()] == ["refund"]
    with pytest.warns(ToolDefinitionWarning) as said:
        tools.definitions()
    assert [str(w.message) for w in said] == [first.message]
    assert said[0].filename == __file__
    assert said[0].lineno == refund.__code__.co_firstlineno
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tools.definitions()  # once per tool: no second warning


def test_a_hook_given_up_front_or_afterwards_leaves_no_problem() -> None:
    """``reconcile=`` at registration and ``@tools.reconciler`` afterwards both count."""
    tools = FunctionTools()

    @tools.function(side_effects=True, reconcile=_nothing)
    def refund(order_id: str) -> str:
        """Refund."""
        return order_id

    assert tools.problems() == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tools.definitions()
