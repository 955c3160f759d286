"""Registration checks: the newcomer mistakes caught when a tool is registered, each with a
message that names the fix (the pure part behind :mod:`agentfn_asgi.tools`).

Hard mistakes raise :class:`~agentfn_asgi.errors.ToolDefinitionError` (a misspelled option, a
hook that is not callable). Soft ones register but will hurt later: they become a
:class:`ToolProblem`, listed by ``FunctionTools.problems()`` and said once as a
:class:`~agentfn_asgi.errors.ToolDefinitionWarning`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ._schema import unguided_properties
from .errors import ToolDefinitionError, ToolDefinitionWarning

__all__ = [
    "ToolProblem",
    "check_option_names",
    "label_of",
    "no_reconcile_problem",
    "untyped_problems",
    "warn_at",
]


@dataclass(frozen=True, slots=True)
class ToolProblem:
    """Something about a registered tool that does not stop it from working but will hurt.

    ``code`` is ``"untyped_parameter"`` (a parameter's schema tells the model nothing) or
    ``"no_reconcile"`` (a side-effect tool without a reconcile hook); ``message`` says what
    happens and how to fix it. ``FunctionTools.problems()`` lists them.
    """

    tool: str
    code: str
    message: str

    def __str__(self) -> str:
        return self.message


def label_of(fn: object, *, placed: bool = False) -> str:
    """How messages name a tool's function: ``tool function module.qualname``, or
    ``openai tool 'name'`` for a tool built by the openai SDK. ``placed`` adds where it is
    defined, ``(file:line)``, for errors: where the fix goes (a traceback ends in our code;
    warnings are shown at that line anyway, :func:`warn_at`)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if isinstance(getattr(fn, "definition", None), Mapping) and hasattr(fn, "name"):
        return f"openai tool {getattr(fn, 'name', None)!r}"
    if not inspect.isroutine(fn):
        fn = type(fn)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    label = f"tool function {module}.{name}" if module else f"tool function {name}"
    code = getattr(inspect.unwrap(fn), "__code__", None) if inspect.isroutine(fn) else None
    if not placed or code is None:
        return label
    return f"{label} ({_place(code.co_filename)}:{code.co_firstlineno})"


def _place(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative


def check_option_names(where: str, options: Mapping[str, Any], valid: Collection[str]) -> None:
    """Refuse an unknown option by name, suggesting the closest valid one (``timout=``)."""
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ToolDefinitionError(
                f"{where}: unknown option {key!r}{hint}; the options are {', '.join(sorted(valid))}"
            )


def untyped_problems(
    tool_name: str, label: str, parameters: Mapping[str, Any]
) -> tuple[ToolProblem, ...]:
    """One problem per property whose schema accepts any value (``Any``, ``object``)."""
    return tuple(
        ToolProblem(
            tool_name,
            "untyped_parameter",
            f"{label}: {'field' if '.' in path else 'parameter'} {path!r} accepts any value, so"
            " its JSON Schema is empty and the model gets no guidance for it; give it a"
            " concrete type or a pydantic model, or describe the value with"
            ' Annotated[Any, Field(json_schema_extra={"type": "object"})]',
        )
        for path in unguided_properties(parameters)
    )


def no_reconcile_problem(tool_name: str) -> ToolProblem:
    """A side-effect tool without a reconcile hook: what its in-doubt calls become."""
    return ToolProblem(
        tool_name,
        "no_reconcile",
        f"tool {tool_name!r} has side_effects=True but no reconcile hook: a call left in doubt"
        " (its process died while it ran) is never run again blindly but quarantined: the"
        " model gets a failure saying the outcome is unknown, or the call waits for an"
        ' operator with DispatchSettings(in_doubt="hold"). Add a hook that checks your'
        " records and returns Ran(result) or NotRun(): reconcile=... or"
        f" @tools.reconciler({tool_name!r})",
    )


def warn_at(fn: object, message: str) -> None:
    """Warn pointing at the tool's own ``def`` line, where the fix goes, whichever of the
    registration paths (decorator, ``add``, ``from_function``) led here."""
    target = fn
    while isinstance(target, functools.partial):
        target = target.func
    if inspect.isroutine(target):
        target = inspect.unwrap(target)
    code = getattr(target, "__code__", None)
    if code is None:  # a callable instance: point at whoever registered it
        warnings.warn(message, ToolDefinitionWarning, stacklevel=4)
        return
    # No module_globals: its loader would be asked for the source, and the loader of a
    # `python -c` or REPL __main__ raises ImportError instead of answering.
    warnings.warn_explicit(
        message,
        ToolDefinitionWarning,
        code.co_filename,
        code.co_firstlineno,
        module=getattr(target, "__module__", None),
    )
