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
import typing
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeAlias, TypedDict, TypeVar, Unpack, overload

import anyio
import anyio.to_thread
from pydantic import ValidationError

from ._schema import ArgumentSpec, build_arguments, decode_arguments, doc_of, parse_docstring
from .errors import ArgumentValidationError, ToolDefinitionError
from .records import Job
from .results import validation_error_message

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
    "ToolOptions",
    "Unknown",
    "derive_idempotency_key",
]

#: Seconds a job handed to ``enqueue=`` may take before its call fails (see agentfn_asgi.jobs).
DEFAULT_JOB_DEADLINE = 3600.0

logger = logging.getLogger("agentfn_asgi.tools")

#: The Agents API refuses a resolved tool list over 3 MiB of compact UTF-8 JSON.
TOOL_DEFINITIONS_LIMIT = 3 * 1024 * 1024

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

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
#: ``enqueue(job)``, sync or async: hands a call to the host's queue (agentfn_asgi.jobs).
EnqueueHook: TypeAlias = Callable[[Job], Any]


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
    _spec: ArgumentSpec | None = field(default=None, repr=False, compare=False)

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
        summary, arg_docs = parse_docstring(doc_of(fn))
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
        spec, parameters = build_arguments(fn, tool_name, arg_docs, label, context_type=ToolContext)
        return cls(
            name=tool_name,
            description=text.strip(),
            parameters=parameters,
            fn=fn,
            is_async=is_async_callable(fn),
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
        data = decode_arguments(raw)
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
            if is_async_callable(hook):
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

    def _require_spec(self) -> ArgumentSpec:
        if self._spec is None:
            raise ToolDefinitionError(
                f"tool {self.name!r} was not built with FunctionTool.from_function"
            )
        return self._spec


class ToolOptions(TypedDict, total=False):
    """The options of :meth:`FunctionTools.function` and :meth:`FunctionTools.add`; their
    defaults are those of :meth:`FunctionTool.from_function` (``timeout`` None: the app's
    default; ``job_deadline`` one hour; every flag False)."""

    name: str | None
    description: str | None
    defer_loading: bool
    side_effects: bool
    reconcile: ReconcileHook | None
    timeout: float | None
    truncate_oversize: bool
    enqueue: EnqueueHook | None
    job_deadline: float


class FunctionTools:
    """A registry of function tools, answering one agent's ``function_call`` actions."""

    def __init__(self) -> None:
        self._tools: dict[str, FunctionTool] = {}

    @overload
    def function(self, fn: F, /) -> F: ...

    @overload
    def function(self, fn: None = None, /, **options: Unpack[ToolOptions]) -> Callable[[F], F]: ...

    def function(
        self, fn: F | None = None, /, **options: Unpack[ToolOptions]
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
            self.add(target, **options)
            return target

        return register if fn is None else register(fn)

    def add(self, fn: Callable[..., Any], **options: Unpack[ToolOptions]) -> FunctionTool:
        """Register ``fn`` without decorating it; returns the built tool."""
        tool = FunctionTool.from_function(fn, **options)
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


def is_async_callable(fn: object) -> bool:
    """True for coroutine functions, partials of them, and objects with an async __call__
    (shared with the worker hand-off, which calls ``enqueue`` hooks the same way)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable instance's own __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _label(fn: object) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not inspect.isroutine(fn):
        fn = type(fn)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"tool function {module}.{name}" if module else f"tool function {name}"
