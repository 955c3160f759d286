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
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, TypeAdapter
from pydantic import create_model as _create_model
from pydantic.errors import PydanticUserError
from pydantic.fields import FieldInfo
from pydantic.json_schema import PydanticJsonSchemaWarning

from .errors import ArgumentValidationError, ToolDefinitionError

__all__ = ["ArgumentSpec", "build_arguments", "decode_arguments", "doc_of", "parse_docstring"]

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
    for param in signature.parameters.values():
        where = f"{label}: parameter {param.name!r}"
        if param.kind is param.VAR_POSITIONAL or param.kind is param.VAR_KEYWORD:
            raise ToolDefinitionError(f"{where}: *args and **kwargs cannot be described")
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolDefinitionError(f"{where}: positional-only parameters are not supported")
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
        schema = _finish_root(_json_schema(model, label), label)
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
    except (PydanticUserError, TypeError, ValueError, NameError) as exc:
        raise ToolDefinitionError(_culprit(params, label) or f"{label}: {exc}") from exc
    schema = _json_schema(model, label, params)
    spec = ArgumentSpec(model, None, tuple(field_params), context_param, None)
    return spec, _finish_root(schema, label)


def _json_schema(
    model: type[BaseModel], label: str, params: list[tuple[str, Any, Any]] | None = None
) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            # A default pydantic cannot put in the schema would silently vanish from it.
            warnings.simplefilter("error", PydanticJsonSchemaWarning)
            schema = model.model_json_schema(mode="validation")
        json.dumps(schema, allow_nan=False)
    except (PydanticUserError, PydanticJsonSchemaWarning, TypeError, ValueError) as exc:
        raise ToolDefinitionError(
            (_culprit(params, label) if params else None)
            or f"{label}: cannot build a JSON Schema for its arguments ({exc})"
        ) from exc
    return typing.cast(dict[str, Any], _clean_schema(schema))


def _culprit(params: list[tuple[str, Any, Any]], label: str) -> str | None:
    """Name the first parameter pydantic cannot validate or describe, for a precise error."""
    for name, hint, default in params:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", PydanticJsonSchemaWarning)
                adapter: TypeAdapter[Any] = TypeAdapter(hint)
                adapter.json_schema()
                if default is not inspect.Parameter.empty and not isinstance(default, FieldInfo):
                    json.dumps(adapter.dump_python(default, mode="json"), allow_nan=False)
        except Exception as exc:
            return f"{label}: parameter {name!r} cannot be described in JSON Schema ({exc})"
    return None


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
        raise ToolDefinitionError(f"{where}: cannot resolve annotation {annotation!r}") from exc


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
