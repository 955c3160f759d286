"""Handlers written for the openai SDK's ``sessions.stream(tool_handlers=...)``, adopted as
they are (the pure part behind :meth:`~agentfn_asgi.tools.FunctionTool.from_sdk`).

The SDK takes ``tool_handlers={"name": handler}`` where a handler is either a
``FunctionTool`` built by ``function_tool()`` / ``pydantic_function_tool()`` (it carries its
own ``definition``) or a plain callable, whose definition the user wrote into ``agent.tools``.
Either way the SDK calls ``handler(arguments)`` with the decoded argument object, one
positional dict, and awaits the result when it is awaitable.

The ``openai`` package is never imported here: its objects are recognised by their public
surface (``name``, ``definition``, callable), so the runtime does not depend on it.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from ._checks import label_of
from .errors import ArgumentValidationError, ToolDefinitionError
from .messages import validation_error_message

__all__ = [
    "DEFINITION_KEYS",
    "MappingArguments",
    "SdkTool",
    "adopted_definition",
    "checked_definition",
    "looks_like_sdk_tool",
    "pair_handlers",
    "read_sdk_tool",
]

#: The keys of a function tool in ``agent.tools`` (openai's ``AgentToolConfigParamFunction``).
DEFINITION_KEYS = frozenset({"type", "name", "description", "parameters", "defer_loading", "async"})


@dataclass(frozen=True, slots=True)
class SdkTool:
    """What an openai ``FunctionTool`` offers: its exact definition, and hints for running it."""

    definition: dict[str, Any]
    # Its argument model, when it shows one: arguments are then validated before the call,
    # so the model is told which field is wrong (the SDK itself only says the handler failed).
    model: type[BaseModel] | None
    # Whether calling it returns a coroutine without blocking (an async handler inside).
    is_async: bool


def read_sdk_tool(obj: object) -> SdkTool | None:
    """``obj`` as an openai ``FunctionTool``, or None when it is something else.

    Recognised by duck typing: a callable object (not a function) with a ``name`` string and
    a ``definition`` mapping of ``type: "function"``. ``_model`` and ``_handler`` are read
    only as optional refinements (a precise validation message, no thread hop for an async
    handler); without them the tool still runs exactly as the SDK would call it.
    """
    if not looks_like_sdk_tool(obj):
        return None
    definition = typing.cast(Mapping[str, Any], getattr(obj, "definition", None))
    model = getattr(obj, "_model", None)
    handler = getattr(obj, "_handler", None)
    return SdkTool(
        definition=dict(definition),  # checked_definition() makes the deep, JSON-only copy
        model=model if isinstance(model, type) and issubclass(model, BaseModel) else None,
        is_async=inspect.iscoroutinefunction(handler)
        or inspect.iscoroutinefunction(getattr(type(obj), "__call__", None)),  # noqa: B004
    )


def looks_like_sdk_tool(obj: object) -> bool:
    """True for an object shaped like openai's ``FunctionTool`` (see :func:`read_sdk_tool`)."""
    if isinstance(obj, type) or inspect.isroutine(obj) or not callable(obj):
        return False
    definition = getattr(obj, "definition", None)
    return (
        isinstance(definition, Mapping)
        and definition.get("type") == "function"
        and isinstance(getattr(obj, "name", None), str)
    )


def checked_definition(label: str, definition: object) -> dict[str, Any]:
    """A copy of a function tool definition as ``agent.tools`` takes it, or why not."""
    if not isinstance(definition, Mapping):
        raise ToolDefinitionError(f"{label}: the definition must be a dict")
    if isinstance(definition.get("function"), Mapping):
        raise ToolDefinitionError(
            f"{label}: the definition has the Chat Completions shape {{'type': 'function',"
            " 'function': {...}}; agent.tools takes it flat: {'type': 'function', 'name': ...,"
            " 'description': ..., 'parameters': {...}}"
        )
    if definition.get("type") != "function":
        raise ToolDefinitionError(f"{label}: the definition's type must be 'function'")
    extra = sorted(set(definition) - DEFINITION_KEYS)
    if extra:
        raise ToolDefinitionError(
            f"{label}: the definition has keys agent.tools does not take: {', '.join(extra)}"
            f" (it takes {', '.join(sorted(DEFINITION_KEYS))})"
        )
    if not isinstance(definition.get("description"), str):
        raise ToolDefinitionError(f"{label}: the definition needs a description string")
    parameters = definition.get("parameters")
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ToolDefinitionError(
            f"{label}: the definition's parameters must be a JSON Schema of type 'object'"
        )
    try:
        copy = json.loads(json.dumps(definition, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"{label}: the definition is not JSON ({exc})") from exc
    return typing.cast(dict[str, Any], copy)


def adopted_definition(
    label: str, handler: object, sdk: SdkTool | None, definition: object
) -> dict[str, Any]:
    """The definition a handler is adopted with: an SDK tool's own, or the one given for a
    plain callable (which the SDK never builds: the user wrote it into ``agent.tools``)."""
    if sdk is not None:
        if definition is not None:
            raise ToolDefinitionError(
                f"{label}: it carries its own definition; definition= is for plain handlers"
            )
        return checked_definition(label, sdk.definition)
    if not callable(handler):
        raise ToolDefinitionError(f"{label}: a handler must be callable")
    if definition is None:
        raise ToolDefinitionError(
            f"{label}: a plain handler needs the definition you give the agent:"
            " definition={'type': 'function', 'name': ..., 'description': ...,"
            " 'parameters': {...}}"
        )
    return checked_definition(label, definition)


def pair_handlers(
    where: str, handlers: object, definitions: Iterable[Mapping[str, Any]]
) -> list[tuple[Any, Mapping[str, Any] | None]]:
    """Each handler of a ``tool_handlers`` dict (or a list of SDK tools) with the definition
    a plain one needs (None for an SDK tool, which brings its own), as the SDK routes calls:
    by the dict's key, which must be the name the model calls."""
    if isinstance(handlers, str | bytes) or not isinstance(handlers, Mapping | Iterable):
        raise ToolDefinitionError(
            f"{where}: expected a tool_handlers dict or a list of openai FunctionTool"
            f" objects, not {type(handlers).__name__}"
        )
    known = {
        definition.get("name"): definition
        for definition in definitions
        if isinstance(definition, Mapping) and definition.get("type") == "function"
    }
    if isinstance(handlers, Mapping):
        keyed: list[tuple[object, Any]] = list(handlers.items())
    else:
        keyed = [(None, handler) for handler in handlers]
    pairs: list[tuple[Any, Mapping[str, Any] | None]] = []
    for key, handler in keyed:
        if looks_like_sdk_tool(handler):
            name = getattr(handler, "name", None)
            if key is not None and key != name:
                raise ToolDefinitionError(
                    f"{where}: tool_handlers[{key!r}] holds the openai tool {name!r}; the"
                    f" model calls it {name!r}, so use that as its key"
                )
            pairs.append((handler, None))
        elif key is None:
            raise ToolDefinitionError(
                f"{where}: {label_of(handler)} is a plain function, so it needs its name and"
                " definition: pass {name: handler} with definitions=..., or wrap it with"
                " openai's function_tool()"
            )
        elif key not in known:
            raise ToolDefinitionError(
                f"{where}: tool_handlers[{key!r}] is a plain function, and the SDK sends no"
                " definition for it; pass the agent's tools (definitions=agent_tools) or"
                " wrap it with openai's function_tool()"
            )
        else:
            pairs.append((handler, known[key]))
    return pairs


@dataclass(frozen=True, slots=True)
class MappingArguments:
    """The SDK's calling convention: the handler gets the whole argument object as one dict.

    Kept by :class:`~agentfn_asgi.tools.FunctionTool` in place of a signature's spec.
    """

    model: type[BaseModel] | None = None

    def parse(self, data: dict[str, Any]) -> dict[str, Any]:
        """Check ``data`` against the tool's own model when there is one; the handler still
        receives ``data`` itself, as under the SDK (which validates it again)."""
        if self.model is not None:
            try:
                self.model.model_validate(data)
            except ValidationError as exc:
                # `from None`: the pydantic error carries the submitted values.
                raise ArgumentValidationError(
                    validation_error_message(exc.errors(include_url=False))
                ) from None
        return data

    @staticmethod
    def dump(arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The argument object as JSON-safe data (it already is: it came from JSON)."""
        return dict(json.loads(json.dumps(dict(arguments))))
