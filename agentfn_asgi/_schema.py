"""Signature to argument schema: the pure core behind :class:`~agentfn_asgi.tools.FunctionTool`.

A handler's signature becomes a pydantic model (one field per parameter, or the parameter's
own model when a single pydantic model is the whole argument object); that model gives the
JSON Schema sent to the API and validates the model's arguments. Also here: reading the
description and Google-style ``Args:`` docs from a docstring, and decoding raw arguments.
Every problem with a signature raises ToolDefinitionError, at registration time.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, TypeAdapter
from pydantic import create_model as _create_model
from pydantic.errors import (
    PydanticInvalidForJsonSchema,
    PydanticSchemaGenerationError,
    PydanticUndefinedAnnotation,
    PydanticUserError,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import PydanticJsonSchemaWarning
from pydantic_core import SchemaError

from .errors import ArgumentValidationError, ToolDefinitionError

__all__ = [
    "ArgumentSpec",
    "build_arguments",
    "check_returns_once",
    "decode_arguments",
    "doc_of",
    "parse_docstring",
    "unguided_properties",
]

_ARGS_HEADER_RE = re.compile(r"(Args|Arguments|Parameters|Params)\s*:\s*")
_SECTION_HEADER_RE = re.compile(r"[A-Z][A-Za-z ]*:\s*")
_ARG_LINE_RE = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")


@dataclass(frozen=True, slots=True)
class ArgumentSpec:
    """How raw arguments become keyword arguments (kept private by
    :class:`~agentfn_asgi.tools.FunctionTool`)."""

    model: type[BaseModel]
    # Set when a single pydantic model parameter is the whole argument object.
    whole_param: str | None
    # model field name -> parameter name (fields are aliased so any parameter name works).
    field_params: tuple[tuple[str, str], ...]
    context_param: str | None
    # Top-level keys accepted in whole-model mode, whose model may not forbid extras itself.
    root_keys: frozenset[str] | None


def build_arguments(
    fn: Callable[..., Any],
    tool_name: str,
    arg_docs: dict[str, str],
    label: str,
    *,
    context_type: type,
) -> tuple[ArgumentSpec, dict[str, Any]]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"{label}: cannot read its signature") from exc
    globalns = _globals_of(fn)
    context_param: str | None = None
    params: list[tuple[str, Any, Any]] = []  # (name, resolved annotation, default)
    for position, param in enumerate(signature.parameters.values()):
        where = f"{label}: parameter {param.name!r}"
        if param.kind is param.VAR_POSITIONAL or param.kind is param.VAR_KEYWORD:
            raise ToolDefinitionError(f"{where}: *args and **kwargs cannot be described")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"{where}: positional-only parameters are not supported")
        if param.annotation is param.empty and position == 0 and param.name in {"self", "cls"}:
            # `@tools.function` inside a class body sees the plain function, before any
            # instance exists: the model would have to supply `self`.
            method = getattr(fn, "__name__", "method")
            raise ToolDefinitionError(
                f"{where}: this is a method taken from its class; register the bound method"
                f" of an instance instead: tools.add(instance.{method})"
            )
        if param.annotation is param.empty:
            raise ToolDefinitionError(f"{where}: needs a type annotation")
        hint = _resolve(param.name, param.annotation, globalns, where)
        if _strip_annotated(hint) is context_type:
            if context_param is not None:
                raise ToolDefinitionError(f"{where}: only one ToolContext parameter is allowed")
            context_param = param.name
            continue
        if _mentions_context(hint, context_type):
            raise ToolDefinitionError(f"{where}: annotate the context as plain ToolContext")
        params.append((param.name, hint, param.default))

    if len(params) == 1 and _is_plain_model(_strip_annotated(params[0][1])):
        model = typing.cast(type[BaseModel], _strip_annotated(params[0][1]))
        schema = _finish_root(_json_schema(model, label, params), label)
        root_keys = set(schema["properties"])
        config = model.model_config
        if config.get("validate_by_name") or config.get("populate_by_name"):
            root_keys.update(model.model_fields)
        spec = ArgumentSpec(model, params[0][0], (), context_param, frozenset(root_keys))
        return spec, schema

    fields: dict[str, Any] = {}
    field_params: list[tuple[str, str]] = []
    for index, (name, hint, default) in enumerate(params):
        # Aliases let any parameter name through: pydantic refuses leading underscores and
        # warns about names shadowing BaseModel attributes (`json`, `schema`, `copy`...).
        extra: dict[str, Any] = {"alias": name}
        if name in arg_docs and not _has_description(hint, default):
            extra["description"] = arg_docs[name]
        field_name = f"p{index}"
        required = default is inspect.Parameter.empty
        fields[field_name] = (Annotated[hint, Field(**extra)], ... if required else default)
        field_params.append((field_name, name))
    model_name = f"{tool_name.replace('-', '_')}_arguments"
    try:
        model = _create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
    except (PydanticUserError, SchemaError, TypeError, ValueError, NameError) as exc:
        raise ToolDefinitionError(_schema_failure(params, label, exc)) from exc
    schema = _json_schema(model, label, params)
    spec = ArgumentSpec(model, None, tuple(field_params), context_param, None)
    return spec, _finish_root(schema, label)


def _json_schema(
    model: type[BaseModel], label: str, params: list[tuple[str, Any, Any]]
) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            # A default pydantic cannot put in the schema would silently vanish from it.
            warnings.simplefilter("error", PydanticJsonSchemaWarning)
            schema = model.model_json_schema(mode="validation")
        json.dumps(schema, allow_nan=False)
    except (
        PydanticUserError,
        PydanticJsonSchemaWarning,
        SchemaError,
        TypeError,
        ValueError,
    ) as exc:
        raise ToolDefinitionError(_schema_failure(params, label, exc)) from exc
    return typing.cast(dict[str, Any], _clean_schema(schema))


# -- one line for what pydantic refused -------------------------------------------------------
# pydantic's messages run to several lines, end in a URL and sometimes advise what does not
# apply to a tool (`arbitrary_types_allowed` gives a type no JSON Schema). The line we raise
# names the parameter, its type and the fix; pydantic's error stays as ``__cause__``.

_JSON_TYPES = (
    "JSON types (str, int, float, bool, list, dict), a pydantic model, a dataclass or a TypedDict"
)
_UNDEFINED_RE = re.compile(r"you should define `([^`<]+)`")


def _schema_failure(params: list[tuple[str, Any, Any]], label: str, exc: BaseException) -> str:
    """Find the parameter pydantic cannot validate or describe and say why, in one line."""
    for name, hint, default in params:
        probe: Any = Annotated[hint, default] if isinstance(default, FieldInfo) else hint
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", PydanticJsonSchemaWarning)
                adapter: TypeAdapter[Any] = TypeAdapter(probe)
                adapter.json_schema()
        except Exception as problem:
            return _type_failure(label, name, hint, problem, exc)
        if default is inspect.Parameter.empty or isinstance(default, FieldInfo):
            continue
        try:
            json.dumps(adapter.dump_python(default, mode="json"), allow_nan=False)
        except Exception:
            return f"{label}: parameter {name!r} {_default_failure(default)}"
    return f"{label}: cannot build a JSON Schema for its arguments: {_first_line(exc)}"


def _type_failure(
    label: str, name: str, hint: Any, problem: BaseException, original: BaseException
) -> str:
    start = f"{label}: parameter {name!r} has type {_type_name(hint)}"
    undefined = _undefined_name(problem, original)
    if isinstance(problem, PydanticSchemaGenerationError):
        return f"{start}, which pydantic cannot validate or describe; use {_JSON_TYPES}"
    if isinstance(problem, PydanticInvalidForJsonSchema):
        return f"{start}, which has no JSON Schema (a model can only send JSON); use {_JSON_TYPES}"
    if undefined is not None:
        bare = _strip_annotated(hint)
        model = bare.__qualname__ if _is_plain_model(bare) else "the model that uses it"
        return (
            f"{start}, which refers to {undefined}, a name that is not defined; define or"
            f" import {undefined} at module level (if it comes after {model}, call"
            f" {model}.model_rebuild() below it)"
        )
    if isinstance(problem, SchemaError):
        return f"{start} with invalid constraints: {_last_line(problem)}"
    return f"{start}, which cannot be described in JSON Schema: {_first_line(problem)}"


def _undefined_name(*errors: BaseException) -> str | None:
    for error in errors:
        if isinstance(error, PydanticUndefinedAnnotation):
            return error.name
        match = _UNDEFINED_RE.search(str(error))
        if match:
            return match.group(1)
    return None


def _type_name(hint: Any) -> str:
    hint = _strip_annotated(hint)
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__qualname__
    # `list[mymodule.Thing]` reads better as `list[Thing]`, like the source did.
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+(?=[A-Za-z_])", "", repr(hint))


def _default_failure(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return f"has the default {value!r}, which JSON cannot hold; use a finite number or None"
    return (
        f"has a default of type {type(value).__qualname__}, which cannot be written as JSON;"
        " use a JSON value (a string, number, boolean, list, dict or None) as the default"
    )


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _last_line(exc: BaseException) -> str:
    # A SchemaError nests one "SchemaError: ..." line per level; the last one is the reason.
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    last = lines[-1] if lines else type(exc).__name__
    return re.sub(r"^\w*[Ee]rror: ", "", last)


def _finish_root(schema: dict[str, Any], label: str) -> dict[str, Any]:
    """Make the root a closed object, as the Agents API expects of ``parameters``."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and "type" not in schema:
        # A self-referencing model is emitted as a bare $ref to its own $defs entry.
        defs = schema.get("$defs", {})
        target = defs.get(ref.removeprefix("#/$defs/"))
        if not isinstance(target, dict):
            raise ToolDefinitionError(f"{label}: unsupported root schema reference {ref!r}")
        schema = {**target, "$defs": defs}
    if schema.get("type") != "object":
        raise ToolDefinitionError(f"{label}: the argument schema must be an object")
    schema.setdefault("properties", {})
    schema["additionalProperties"] = False
    return schema


def check_returns_once(fn: Callable[..., Any], label: str) -> None:
    """Refuse generator functions: a tool sends one result, when its function returns, and a
    generator object is not a result (it would fail every call at run time)."""
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    if not inspect.isroutine(target):
        target = getattr(type(target), "__call__", target)  # noqa: B004 - a callable instance
    if inspect.isasyncgenfunction(target):
        raise ToolDefinitionError(
            f"{label}: an async generator function (async def with yield) cannot be a tool,"
            " which sends one result when it returns; collect the items and return them"
            " (return [item async for item in ...]) or return one string"
        )
    if inspect.isgeneratorfunction(target):
        raise ToolDefinitionError(
            f"{label}: a generator function (it uses yield) cannot be a tool, which sends one"
            " result when it returns; collect the items and return them (return list(...))"
            " or return one string"
        )


# Keywords that describe a value without constraining it: a schema made only of these lets
# the model send anything, and tells it nothing about what to send.
_ANNOTATION_KEYWORDS = frozenset(
    {"description", "default", "title", "examples", "deprecated", "readOnly", "writeOnly"}
)


def unguided_properties(schema: Mapping[str, Any]) -> list[str]:
    """The properties whose schema accepts any value (``Any``, ``object``, ``Any | None``):
    top-level ones by name, fields of nested models as ``Model.field``.

    Array items and dict values are not reported: ``list[Any]`` and ``dict[str, Any]``
    still tell the model the container's shape, and free-form payloads are a fair choice.
    """
    found = [name for name, sub in _properties(schema) if _says_nothing(sub)]
    defs = schema.get("$defs")
    if isinstance(defs, Mapping):
        for model, definition in defs.items():
            if isinstance(definition, Mapping):
                found.extend(
                    f"{model}.{name}" for name, sub in _properties(definition) if _says_nothing(sub)
                )
    return found


def _properties(schema: Mapping[str, Any]) -> list[tuple[str, Any]]:
    properties = schema.get("properties")
    return list(properties.items()) if isinstance(properties, Mapping) else []


def _says_nothing(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and any(_says_nothing(branch) for branch in branches):
            return True
    return not set(schema) - _ANNOTATION_KEYWORDS


_SCHEMA_MAPS = frozenset({"properties", "$defs", "definitions", "patternProperties"})
_SCHEMA_LISTS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})


def _clean_schema(node: Any) -> Any:
    """Drop pydantic's generated ``title`` keywords (noise for the model) while keeping
    properties that happen to be called ``title``."""
    if not isinstance(node, dict):
        return node
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            cleaned[key] = {name: _clean_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            cleaned[key] = [_clean_schema(sub) for sub in value]
        elif key in {"enum", "const", "default", "examples", "required"}:
            cleaned[key] = value
        else:
            cleaned[key] = _clean_schema(value)
    return cleaned


def _resolve(name: str, annotation: Any, globalns: dict[str, Any], where: str) -> Any:
    """Resolve one (possibly string) annotation. Parameters are resolved one at a time so an
    unresolvable *return* annotation (often a TYPE_CHECKING import) does not matter."""
    holder = types.SimpleNamespace(__annotations__={name: annotation}, __globals__=globalns)
    try:
        return typing.get_type_hints(holder, include_extras=True)[name]
    except Exception as exc:
        raise ToolDefinitionError(
            f"{where}: cannot resolve annotation {annotation!r} ({_first_line(exc)}); define or"
            " import it at module level, not under `if TYPE_CHECKING:` nor inside a function:"
            " annotations are read from the module when the tool is registered"
        ) from exc


def _globals_of(fn: Callable[..., Any]) -> dict[str, Any]:
    target: Any = fn
    while True:
        if isinstance(target, functools.partial):
            target = target.func
        elif hasattr(target, "__wrapped__"):
            target = target.__wrapped__
        else:
            break
    found = getattr(target, "__globals__", None)
    if found is None:  # a callable instance
        call = inspect.getattr_static(type(target), "__call__", None)
        found = getattr(call, "__globals__", {})
    return typing.cast(dict[str, Any], found)


def _strip_annotated(hint: Any) -> Any:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _mentions_context(hint: Any, context_type: type) -> bool:
    if hint is context_type:
        return True
    return any(_mentions_context(arg, context_type) for arg in typing.get_args(hint))


def _is_plain_model(hint: Any) -> bool:
    return (
        isinstance(hint, type) and issubclass(hint, BaseModel) and not issubclass(hint, RootModel)
    )


def _has_description(hint: Any, default: Any) -> bool:
    infos = [default] if isinstance(default, FieldInfo) else []
    while typing.get_origin(hint) is Annotated:
        infos.extend(m for m in hint.__metadata__ if isinstance(m, FieldInfo))
        hint = typing.get_args(hint)[0]
    return any(info.description for info in infos)


def doc_of(fn: object) -> str | None:
    while isinstance(fn, functools.partial):
        fn = fn.func  # a partial's own __doc__ describes functools.partial
    if inspect.isroutine(fn):
        return inspect.getdoc(fn)
    # A callable instance: its __call__ documents the tool better than its class does.
    return inspect.getdoc(getattr(fn, "__call__", None)) or inspect.getdoc(type(fn))  # noqa: B004


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The summary (first paragraph) and the Google-style ``Args:`` descriptions."""
    if not doc:
        return "", {}
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION_HEADER_RE.fullmatch(line.strip()):
            break
        summary.append(line.strip())
    args: dict[str, str] = {}
    start = next(
        (i for i, line in enumerate(lines) if _ARGS_HEADER_RE.fullmatch(line.strip())), None
    )
    if start is not None:
        header_indent = _indent(lines[start])
        entry_indent: int | None = None
        current: str | None = None
        for line in lines[start + 1 :]:
            if not line.strip():
                continue
            indent = _indent(line)
            if indent <= header_indent:
                break  # the next section
            if entry_indent is None:
                entry_indent = indent
            match = _ARG_LINE_RE.fullmatch(line.strip())
            if indent <= entry_indent and match:
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(summary), {k: v for k, v in args.items() if v}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


_JSON_TYPE_NAMES: dict[type, str] = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def decode_arguments(raw: object) -> dict[str, Any]:
    if raw is None:
        return {}
    if isinstance(raw, bytes | bytearray):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ArgumentValidationError("arguments are not valid UTF-8") from None
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            # Position only: JSONDecodeError keeps the whole document on the exception.
            raise ArgumentValidationError(
                f"arguments are not valid JSON (line {exc.lineno}, column {exc.colno})"
            ) from None
        except RecursionError:
            raise ArgumentValidationError("arguments are nested too deeply") from None
        except ValueError:
            # Not a syntax error: a number Python refuses to convert (over 4,300 digits).
            raise ArgumentValidationError("arguments hold a number that is too large") from None
    if not isinstance(raw, Mapping):
        kind = _JSON_TYPE_NAMES.get(type(raw), type(raw).__name__)
        raise ArgumentValidationError(f"arguments must be a JSON object, not {kind}")
    return dict(raw)
