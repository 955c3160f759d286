"""Function tools: registration, JSON Schema, argument validation and invocation.

::

    tools = FunctionTools()

    @tools.function
    async def get_customer(customer_id: str) -> dict[str, Any]:
        \"\"\"Look up a customer by ID.\"\"\"

    @tools.function(side_effects=True, timeout=30)
    def refund(ctx: ToolContext, order_id: str, amount_cents: int) -> str:
        \"\"\"Refund part of an order.

        Args:
            order_id: The order to refund.
            amount_cents: How much to refund, in cents.
        \"\"\"

    agent_tools = tools.definitions()   # flat function tools for ``agent.tools``

Design choices worth knowing:

- ``@tools.function`` returns the decorated function **unchanged**, so it stays plain,
  directly testable Python. The registry keeps a :class:`FunctionTool` built from it
  (``tools.get("refund")``). A reconcile hook is given with ``reconcile=`` or registered
  afterwards with ``@tools.reconciler("refund")`` (or ``@tools.reconciler(refund)``).
- Everything that can be wrong with a signature is refused at registration time with
  :class:`~agentfn_asgi.errors.ToolDefinitionError`, never at call time.
- The argument object is closed: the root schema has ``additionalProperties: false`` and
  validation refuses unknown top-level keys. Nested pydantic models keep their own
  ``extra`` setting (``forbid`` shows as ``additionalProperties: false``), so the schema
  never promises more than validation enforces.
- A single pydantic-model parameter *is* the argument object: ``def f(order: Order)`` takes
  ``{"sku": ..., "qty": ...}``, not ``{"order": {...}}``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import math
import re
import time
import types
import typing
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, TypeVar, overload

import anyio
import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field, RootModel, TypeAdapter, ValidationError
from pydantic import create_model as _create_model
from pydantic.errors import PydanticUserError
from pydantic.fields import FieldInfo
from pydantic.json_schema import PydanticJsonSchemaWarning

from .errors import ArgumentValidationError, ToolDefinitionError
from .results import validation_error_message

if TYPE_CHECKING:
    from .worker import Job

__all__ = [
    "DEFAULT_JOB_DEADLINE",
    "TOOL_DEFINITIONS_LIMIT",
    "EnqueueHook",
    "FunctionTool",
    "FunctionTools",
    "NotRun",
    "Ran",
    "ReconcileHook",
    "ReconcileOutcome",
    "ToolContext",
    "Unknown",
    "derive_idempotency_key",
]

#: Seconds a job handed to ``enqueue=`` may take before its call fails (see worker.py).
DEFAULT_JOB_DEADLINE = 3600.0

logger = logging.getLogger("agentfn_asgi.tools")

#: The Agents API refuses a resolved tool list over 3 MiB of compact UTF-8 JSON.
TOOL_DEFINITIONS_LIMIT = 3 * 1024 * 1024

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ARGS_HEADER_RE = re.compile(r"(Args|Arguments|Parameters|Params)\s*:\s*")
_SECTION_HEADER_RE = re.compile(r"[A-Z][A-Za-z ]*:\s*")
_ARG_LINE_RE = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler knows about the call it is running. Declare a parameter of this type
    (any name) to receive it; it never appears in the tool's schema.

    ``attempt`` counts executions of this call (1 for the first). ``deadline`` is the Unix
    time by which the dispatcher abandons the handler (None: no timeout). Pass
    ``idempotency_key`` to downstream APIs that support one: it is the same on every attempt,
    replica and restart for this call, which closes the "ran but crashed before saving"
    window. ``resources`` is whatever the host handed to the app (a db pool, settings...).
    """

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    attempt: int
    deadline: float | None
    idempotency_key: str
    resources: Any = None

    def remaining(self, *, clock: Callable[[], float] = time.time) -> float | None:
        """Seconds left until ``deadline`` (never negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - clock())


def derive_idempotency_key(session_id: str, turn_id: str, call_id: str) -> str:
    """The stable idempotency key of one call: ``"afn_"`` + the first 40 hex digits of
    SHA-256 over ``session_id``, ``turn_id`` and ``call_id`` joined with ``"\\x1f"``.

    The unit separator cannot occur in the API's ids, so distinct triples never collide by
    concatenation. 160 bits keep collisions negligible while fitting the 64-character limits
    common in payment and messaging APIs.
    """
    digest = hashlib.sha256("\x1f".join((session_id, turn_id, call_id)).encode()).hexdigest()
    return "afn_" + digest[:40]


@dataclass(frozen=True, slots=True)
class Ran:
    """Reconcile outcome: the call's side effect already happened; ``result`` is sent as its
    output (encoded like a handler's return value)."""

    result: Any


@dataclass(frozen=True, slots=True)
class NotRun:
    """Reconcile outcome: the side effect did not happen, so the handler may run now."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """Reconcile outcome: it cannot be told whether the side effect happened; the call is
    quarantined by policy instead of being run again."""

    reason: str = ""


ReconcileOutcome: TypeAlias = Ran | NotRun | Unknown
#: ``reconcile(context, arguments)``, sync or async. ``arguments`` are the validated keyword
#: arguments the handler would receive (without the context).
ReconcileHook: TypeAlias = Callable[
    [ToolContext, dict[str, Any]], ReconcileOutcome | Awaitable[ReconcileOutcome]
]
#: ``enqueue(job)``, sync or async: hands a call to the host's queue (agentfn_asgi.worker).
EnqueueHook: TypeAlias = "Callable[[Job], Any]"


@dataclass(frozen=True, slots=True)
class _ArgumentSpec:
    """How raw arguments become keyword arguments (private to :class:`FunctionTool`)."""

    model: type[BaseModel]
    # Set when a single pydantic model parameter is the whole argument object.
    whole_param: str | None
    # model field name -> parameter name (fields are aliased so any parameter name works).
    field_params: tuple[tuple[str, str], ...]
    context_param: str | None
    # Top-level keys accepted in whole-model mode, whose model may not forbid extras itself.
    root_keys: frozenset[str] | None


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One registered function tool. Build it with :meth:`FunctionTools.function` or
    :meth:`FunctionTool.from_function`; ``parameters`` is the JSON Schema sent to the API."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    is_async: bool
    defer_loading: bool = False
    side_effects: bool = False
    reconcile: ReconcileHook | None = None
    timeout: float | None = None
    truncate_oversize: bool = False
    enqueue: EnqueueHook | None = None
    job_deadline: float = DEFAULT_JOB_DEADLINE
    _spec: _ArgumentSpec | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        defer_loading: bool = False,
        side_effects: bool = False,
        reconcile: ReconcileHook | None = None,
        timeout: float | None = None,
        truncate_oversize: bool = False,
        enqueue: EnqueueHook | None = None,
        job_deadline: float = DEFAULT_JOB_DEADLINE,
    ) -> FunctionTool:
        """Build a tool from ``fn``, refusing anything the API or a call could not handle."""
        label = _label(fn)
        tool_name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(tool_name, str) or not _NAME_RE.fullmatch(tool_name):
            raise ToolDefinitionError(
                f"{label}: tool name {tool_name!r} must be 1-64 letters, digits, '_' or '-'"
                " (pass name=... to choose another)"
            )
        summary, arg_docs = _parse_docstring(_doc_of(fn))
        text = description if description is not None else summary
        if not text or not text.strip():
            raise ToolDefinitionError(
                f"{label}: the Agents API requires a description; add a docstring or pass"
                " description=..."
            )
        if reconcile is not None and not side_effects:
            raise ToolDefinitionError(f"{label}: reconcile= only applies with side_effects=True")
        if reconcile is not None and not callable(reconcile):
            raise ToolDefinitionError(f"{label}: reconcile must be callable")
        if timeout is not None and not (
            isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0
        ):
            raise ToolDefinitionError(f"{label}: timeout must be a positive number of seconds")
        if enqueue is not None and not callable(enqueue):
            raise ToolDefinitionError(f"{label}: enqueue must be callable")
        if not (
            isinstance(job_deadline, int | float)
            and math.isfinite(job_deadline)
            and job_deadline > 0
        ):
            raise ToolDefinitionError(f"{label}: job_deadline must be a positive number of seconds")
        spec, parameters = _build_arguments(fn, tool_name, arg_docs, label)
        return cls(
            name=tool_name,
            description=text.strip(),
            parameters=parameters,
            fn=fn,
            is_async=_is_async_callable(fn),
            defer_loading=defer_loading,
            side_effects=side_effects,
            reconcile=reconcile,
            timeout=None if timeout is None else float(timeout),
            truncate_oversize=truncate_oversize,
            enqueue=enqueue,
            job_deadline=float(job_deadline),
            _spec=spec,
        )

    def definition(self) -> dict[str, Any]:
        """This tool as the Agents API takes it in ``agent.tools`` (a fresh copy)."""
        definition: dict[str, Any] = {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": json.loads(json.dumps(self.parameters)),
        }
        if self.defer_loading:
            definition["defer_loading"] = True
        return definition

    def parse_arguments(self, raw: object) -> dict[str, Any]:
        """Validate the model's ``arguments`` (an object, or a JSON string of one) and return
        keyword arguments for the handler, without the context.

        ``None`` and an empty string count as ``{}``. Raises ArgumentValidationError whose
        message lists field paths and what was expected, never the submitted values.
        """
        spec = self._require_spec()
        data = _decode_arguments(raw)
        if spec.root_keys is not None:
            unexpected = [key for key in data if key not in spec.root_keys]
            if unexpected:
                raise ArgumentValidationError(
                    validation_error_message(
                        [{"type": "extra_forbidden", "loc": (key,)} for key in unexpected]
                    )
                )
        try:
            instance = spec.model.model_validate(data)
        except ValidationError as exc:
            # `from None`: the pydantic error carries the submitted values, and a chained
            # cause ends up in logged tracebacks and span stack traces.
            raise ArgumentValidationError(
                validation_error_message(exc.errors(include_url=False))
            ) from None
        if spec.whole_param is not None:
            return {spec.whole_param: instance}
        return {param: getattr(instance, name) for name, param in spec.field_params}

    def dump_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The inverse of :meth:`parse_arguments`: the argument object as JSON-safe data.

        ``tool.parse_arguments(tool.dump_arguments(kwargs))`` gives ``kwargs`` back, so a job
        can carry validated arguments to a worker that re-parses them with the same tool.
        """
        spec = self._require_spec()
        if spec.whole_param is not None:
            instance = arguments[spec.whole_param]
        else:
            instance = spec.model.model_validate(
                {param: arguments[param] for _, param in spec.field_params if param in arguments}
            )
        return typing.cast(dict[str, Any], instance.model_dump(mode="json", by_alias=True))

    async def invoke(
        self,
        arguments: Mapping[str, Any],
        context: ToolContext,
        *,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> Any:
        """Call the handler with ``arguments`` (from :meth:`parse_arguments`) and the context.

        Async handlers run on the event loop; sync handlers run in a worker thread bounded by
        ``limiter``. No timeout is applied here. When the caller cancels (its timeout), a sync
        handler is abandoned but keeps running in its thread until it returns: Python cannot
        stop a thread.
        """
        kwargs = dict(arguments)
        spec = self._require_spec()
        if spec.context_param is not None:
            kwargs[spec.context_param] = context
        if self.is_async:
            result = await self.fn(**kwargs)
        else:
            result = await anyio.to_thread.run_sync(
                functools.partial(self.fn, **kwargs), limiter=limiter, abandon_on_cancel=True
            )
        if inspect.isawaitable(result):  # a sync wrapper that returned a coroutine
            result = await result
        return result

    async def run_reconcile(
        self,
        arguments: Mapping[str, Any],
        context: ToolContext,
        *,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> ReconcileOutcome:
        """Ask the reconcile hook whether an in-doubt call already ran.

        Never raises (except cancellation): no hook, a failing hook or a wrong return value
        all give :class:`Unknown`, so the call is quarantined rather than run twice.
        """
        hook = self.reconcile
        if hook is None:
            return Unknown("no reconcile hook")
        try:
            if _is_async_callable(hook):
                outcome: Any = await hook(context, dict(arguments))  # type: ignore[misc]
            else:
                outcome = await anyio.to_thread.run_sync(
                    functools.partial(hook, context, dict(arguments)),
                    limiter=limiter,
                    abandon_on_cancel=True,
                )
            if inspect.isawaitable(outcome):
                outcome = await outcome
        except Exception as exc:
            logger.warning("reconcile hook of tool %r failed", self.name, exc_info=True)
            return Unknown(f"reconcile hook raised {type(exc).__name__}")
        if not isinstance(outcome, Ran | NotRun | Unknown):
            return Unknown(
                f"reconcile hook returned {type(outcome).__name__}, not Ran, NotRun or Unknown"
            )
        return outcome

    def _require_spec(self) -> _ArgumentSpec:
        if self._spec is None:
            raise ToolDefinitionError(
                f"tool {self.name!r} was not built with FunctionTool.from_function"
            )
        return self._spec


class FunctionTools:
    """A registry of function tools, answering one agent's ``function_call`` actions."""

    def __init__(self) -> None:
        self._tools: dict[str, FunctionTool] = {}

    @overload
    def function(self, fn: F, /) -> F: ...

    @overload
    def function(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        defer_loading: bool = False,
        side_effects: bool = False,
        reconcile: ReconcileHook | None = None,
        timeout: float | None = None,
        truncate_oversize: bool = False,
        enqueue: EnqueueHook | None = None,
        job_deadline: float = DEFAULT_JOB_DEADLINE,
    ) -> Callable[[F], F]: ...

    def function(
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
        defer_loading: bool = False,
        side_effects: bool = False,
        reconcile: ReconcileHook | None = None,
        timeout: float | None = None,
        truncate_oversize: bool = False,
        enqueue: EnqueueHook | None = None,
        job_deadline: float = DEFAULT_JOB_DEADLINE,
    ) -> F | Callable[[F], F]:
        """Register a function as a tool; use bare (``@tools.function``) or with options.

        Returns the function unchanged. Options: ``name``/``description`` override the
        function's name and docstring summary; ``defer_loading`` hides the tool behind tool
        search; ``side_effects`` stops blind re-runs of in-doubt calls, whose ``reconcile``
        hook decides instead; ``timeout`` in seconds; ``truncate_oversize`` cuts an oversized
        text result instead of failing the call; ``enqueue`` hands each call to your queue
        as a :class:`~agentfn_asgi.worker.Job` instead of running it here, and the call fails
        if no worker completes it within ``job_deadline`` seconds.
        """

        def register(target: F) -> F:
            self.add(
                target,
                name=name,
                description=description,
                defer_loading=defer_loading,
                side_effects=side_effects,
                reconcile=reconcile,
                timeout=timeout,
                truncate_oversize=truncate_oversize,
                enqueue=enqueue,
                job_deadline=job_deadline,
            )
            return target

        return register if fn is None else register(fn)

    def add(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        defer_loading: bool = False,
        side_effects: bool = False,
        reconcile: ReconcileHook | None = None,
        timeout: float | None = None,
        truncate_oversize: bool = False,
        enqueue: EnqueueHook | None = None,
        job_deadline: float = DEFAULT_JOB_DEADLINE,
    ) -> FunctionTool:
        """Register ``fn`` without decorating it; returns the built tool."""
        tool = FunctionTool.from_function(
            fn,
            name=name,
            description=description,
            defer_loading=defer_loading,
            side_effects=side_effects,
            reconcile=reconcile,
            timeout=timeout,
            truncate_oversize=truncate_oversize,
            enqueue=enqueue,
            job_deadline=job_deadline,
        )
        self._insert([tool])
        return tool

    def reconciler(self, target: str | Callable[..., Any]) -> Callable[[F], F]:
        """Decorator registering the reconcile hook of a side-effect tool, named or given by
        its function: ``@tools.reconciler("refund")``. Returns the hook unchanged."""
        tool = self._find(target)

        def register(hook: F) -> F:
            if not tool.side_effects:
                raise ToolDefinitionError(
                    f"tool {tool.name!r}: a reconcile hook needs side_effects=True"
                )
            current = self._tools[tool.name]
            if current.reconcile is not None:
                raise ToolDefinitionError(f"tool {tool.name!r} already has a reconcile hook")
            self._tools[tool.name] = replace(current, reconcile=hook)
            return hook

        return register

    def include(self, other: FunctionTools) -> None:
        """Add every tool of ``other``; refuses (adding nothing) if any name is taken."""
        self._insert(list(other))

    def get(self, name: str) -> FunctionTool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def definitions(self) -> list[dict[str, Any]]:
        """The tools for ``agent.tools``: flat function tools, then ``{"type": "tool_search"}``
        when any tool is deferred (deferred tools are only reachable through it).

        Raises ToolDefinitionError when the list exceeds the API's 3 MiB limit. That limit
        covers the whole resolved list, so leave room for any other tools you add to it.
        """
        definitions = [tool.definition() for tool in self._tools.values()]
        if any(tool.defer_loading for tool in self._tools.values()):
            definitions.append({"type": "tool_search"})
        encoded = json.dumps(definitions, separators=(",", ":"), ensure_ascii=False)
        size = len(encoded.encode("utf-8"))
        if size > TOOL_DEFINITIONS_LIMIT:
            raise ToolDefinitionError(
                f"tool definitions are {size} bytes of compact JSON, over the Agents API limit"
                f" of {TOOL_DEFINITIONS_LIMIT} bytes; shorten descriptions or schemas"
            )
        return definitions

    def __iter__(self) -> Iterator[FunctionTool]:
        return iter(list(self._tools.values()))

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __repr__(self) -> str:
        return f"FunctionTools({sorted(self._tools)!r})"

    def _insert(self, tools: list[FunctionTool]) -> None:
        seen: set[str] = set()
        for tool in tools:
            if tool.name in self._tools or tool.name in seen:
                raise ToolDefinitionError(
                    f"{_label(tool.fn)}: a tool named {tool.name!r} is already registered"
                )
            seen.add(tool.name)
        for tool in tools:
            self._tools[tool.name] = tool

    def _find(self, target: str | Callable[..., Any]) -> FunctionTool:
        if isinstance(target, str):
            found = self._tools.get(target)
        else:
            found = next((t for t in self._tools.values() if t.fn is target), None)
        if found is None:
            raise ToolDefinitionError(f"no registered tool {target!r}")
        return found


# ---------------------------------------------------------------------------------------------
# Signature → pydantic model → JSON Schema


def _build_arguments(
    fn: Callable[..., Any], tool_name: str, arg_docs: dict[str, str], label: str
) -> tuple[_ArgumentSpec, dict[str, Any]]:
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
        if _strip_annotated(hint) is ToolContext:
            if context_param is not None:
                raise ToolDefinitionError(f"{where}: only one ToolContext parameter is allowed")
            context_param = param.name
            continue
        if _mentions_context(hint):
            raise ToolDefinitionError(f"{where}: annotate the context as plain ToolContext")
        params.append((param.name, hint, param.default))

    if len(params) == 1 and _is_plain_model(_strip_annotated(params[0][1])):
        model = typing.cast(type[BaseModel], _strip_annotated(params[0][1]))
        schema = _finish_root(_json_schema(model, label), label)
        root_keys = set(schema["properties"])
        config = model.model_config
        if config.get("validate_by_name") or config.get("populate_by_name"):
            root_keys.update(model.model_fields)
        spec = _ArgumentSpec(model, params[0][0], (), context_param, frozenset(root_keys))
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
    spec = _ArgumentSpec(model, None, tuple(field_params), context_param, None)
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


def _mentions_context(hint: Any) -> bool:
    if hint is ToolContext:
        return True
    return any(_mentions_context(arg) for arg in typing.get_args(hint))


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


def _is_async_callable(fn: object) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable instance's own __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _doc_of(fn: object) -> str | None:
    while isinstance(fn, functools.partial):
        fn = fn.func  # a partial's own __doc__ describes functools.partial
    if inspect.isroutine(fn):
        return inspect.getdoc(fn)
    # A callable instance: its __call__ documents the tool better than its class does.
    return inspect.getdoc(getattr(fn, "__call__", None)) or inspect.getdoc(type(fn))  # noqa: B004


def _label(fn: object) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not inspect.isroutine(fn):
        fn = type(fn)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"tool function {module}.{name}" if module else f"tool function {name}"


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
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


def _decode_arguments(raw: object) -> dict[str, Any]:
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
    if not isinstance(raw, Mapping):
        kind = _JSON_TYPE_NAMES.get(type(raw), type(raw).__name__)
        raise ArgumentValidationError(f"arguments must be a JSON object, not {kind}")
    return dict(raw)
