"""Function tools: registration, JSON Schema and argument validation (the definition side;
how calls run is :mod:`agentfn_asgi.running` and :mod:`agentfn_asgi.policy`).

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
- What registers but will hurt later (a parameter whose schema tells the model nothing, a
  side-effect tool without a reconcile hook) is a :class:`ToolProblem`:
  :meth:`FunctionTools.problems` lists them and a ``ToolDefinitionWarning`` says each once.
- Handlers written for the openai SDK's ``sessions.stream(tool_handlers=...)`` are adopted
  as they are (:meth:`FunctionTools.from_sdk`), without importing ``openai``.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Literal, TypeAlias, TypedDict, TypeVar, Unpack, overload

from pydantic import ValidationError

from ._checks import (
    ToolProblem,
    check_option_names,
    label_of,
    no_reconcile_problem,
    untyped_problems,
    warn_at,
)
from ._context import (
    Cancellation,
    NotRun,
    Ran,
    ReconcileHook,
    ReconcileOutcome,
    ToolContext,
    Unknown,
    derive_idempotency_key,
)
from ._schema import (
    ArgumentSpec,
    build_arguments,
    check_returns_once,
    decode_arguments,
    doc_of,
    parse_docstring,
)
from ._sdk import (
    MappingArguments,
    adopted_definition,
    looks_like_sdk_tool,
    pair_handlers,
    read_sdk_tool,
)
from .calls.records import Job
from .errors import ArgumentValidationError, ToolDefinitionError
from .messages import validation_error_message
from .policy import (
    DEFAULT_JOB_DEADLINE,
    DEFINITION_OPTIONS,
    POLICY_OPTIONS,
    RetryPolicy,
    ToolPolicy,
    option_docs,
)
from .running import invoke, is_async_callable, needs_approval, run_reconcile

__all__ = [
    "DEFAULT_JOB_DEADLINE",
    "TOOL_DEFINITIONS_LIMIT",
    "Cancellation",
    "EnqueueHook",
    "FunctionTool",
    "FunctionTools",
    "NotRun",
    "Ran",
    "ReconcileHook",
    "ReconcileOutcome",
    "ToolContext",
    "ToolOptions",
    "ToolPolicy",
    "ToolProblem",
    "Unknown",
    "derive_idempotency_key",
]

logger = logging.getLogger("agentfn_asgi.tools")

#: The Agents API refuses a resolved tool list over 3 MiB of compact UTF-8 JSON.
TOOL_DEFINITIONS_LIMIT = 3 * 1024 * 1024

_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

F = TypeVar("F", bound=Callable[..., Any])
_T = TypeVar("_T")


#: ``approval(ctx, arguments) -> bool``, sync or async: does this call need a person's yes?
ApprovalPredicate: TypeAlias = Callable[[ToolContext, dict[str, Any]], Any]

#: ``concurrency_key(ctx, arguments) -> str``, sync or async: the limiter a call counts against.
ConcurrencyKey: TypeAlias = Callable[[ToolContext, dict[str, Any]], Any]

#: ``enqueue(job)``, sync or async: hands a call to the host's queue (agentfn_asgi.jobs).
EnqueueHook: TypeAlias = Callable[[Job], Any]


class ToolOptions(TypedDict, total=False):
    # The keys are DEFINITION_OPTIONS and the fields of ToolPolicy (agentfn_asgi.policy),
    # where each run option is declared once with its default, check and documentation; a
    # test holds these keys to them. The docstring is generated from them below.
    name: str | None
    description: str | None
    defer_loading: bool
    background: bool
    side_effects: bool
    reconcile: ReconcileHook | None
    timeout: float | None
    in_doubt: Literal["fail", "hold"] | None
    max_attempts: int | None
    retry: RetryPolicy | int | None
    truncate_oversize: bool
    enqueue: EnqueueHook | None
    job_deadline: float
    approval: bool | ApprovalPredicate
    approval_timeout: float | None
    concurrency: int | None
    concurrency_key: ConcurrencyKey | None
    rate: str | float | None
    burst: int
    max_wait: float | None
    max_calls_per_session: int | None


ToolOptions.__doc__ = (
    "The options of :meth:`FunctionTools.function`, :meth:`FunctionTools.add`,"
    " :meth:`FunctionTool.from_function` and the ``from_sdk`` constructors. An unknown option"
    " is refused with the closest valid name.\n\n" + option_docs()
)

_OPTION_NAMES = frozenset(ToolOptions.__optional_keys__)
assert {*DEFINITION_OPTIONS, *POLICY_OPTIONS} == _OPTION_NAMES, "ToolOptions and ToolPolicy differ"


class _PolicyOption(Generic[_T]):
    """A tool attribute that reads the run option of the same name from its policy."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, tool: FunctionTool | None, owner: type | None = None) -> _T:
        # On the class itself (documentation tools), the descriptor.
        return typing.cast(_T, self if tool is None else getattr(tool.policy, self.name))


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One registered function tool. Build it with :meth:`FunctionTools.function`,
    :meth:`FunctionTool.from_function` or :meth:`FunctionTool.from_sdk`; ``parameters`` is
    the JSON Schema sent to the API."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    is_async: bool
    defer_loading: bool = False
    background: bool = False
    #: How its calls run (timeout, in-doubt handling, retries, approval...); see
    #: agentfn_asgi.policy.
    policy: ToolPolicy = field(default_factory=ToolPolicy)
    _spec: ArgumentSpec | MappingArguments | None = field(default=None, repr=False, compare=False)
    # The exact definition of a tool adopted from the openai SDK, sent as it is.
    _source: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _findings: tuple[ToolProblem, ...] = field(default=(), repr=False, compare=False)

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], /, **options: Unpack[ToolOptions]
    ) -> FunctionTool:
        """Build a tool from ``fn``, refusing anything the API or a call could not handle.

        An openai SDK ``FunctionTool`` (from ``function_tool()``) is adopted with
        :meth:`from_sdk`. Warns (:class:`~agentfn_asgi.errors.ToolDefinitionWarning`) about a
        parameter whose schema tells the model nothing, such as one typed ``Any``.
        """
        if looks_like_sdk_tool(fn):
            return cls.from_sdk(fn, **options)
        label = label_of(fn, placed=True)
        settled = _settle(label, options)
        check_returns_once(fn, label)
        name = options.get("name")
        tool_name = _checked_name(
            label, name if name is not None else getattr(fn, "__name__", None)
        )
        summary, arg_docs = parse_docstring(doc_of(fn))
        description = options.get("description")
        text = description if description is not None else summary
        if not text or not text.strip():
            raise ToolDefinitionError(
                f"{label}: the Agents API requires a description; add a docstring or pass"
                " description=..."
            )
        spec, parameters = build_arguments(fn, tool_name, arg_docs, label, context_type=ToolContext)
        findings = untyped_problems(tool_name, label_of(fn), parameters)
        for finding in findings:
            warn_at(fn, finding.message)
        return cls(
            name=tool_name,
            description=text.strip(),
            parameters=parameters,
            fn=fn,
            is_async=is_async_callable(fn),
            _spec=spec,
            _findings=findings,
            **settled,
        )

    # The run options, read through the policy (kept as attributes: hosts and hooks read them).
    #: The tool changes the world (see :class:`~agentfn_asgi.policy.ToolPolicy`).
    side_effects = _PolicyOption[bool]()
    #: The reconcile hook of a side-effect tool, if any.
    reconcile = _PolicyOption[ReconcileHook | None]()
    #: The tool's own timeout in seconds (None: the app's default).
    timeout = _PolicyOption[float | None]()
    #: Cut an oversized text result instead of failing the call.
    truncate_oversize = _PolicyOption[bool]()
    #: The hook handing calls to a worker queue, if any.
    enqueue = _PolicyOption[EnqueueHook | None]()
    #: Seconds a queued call's worker has to complete it.
    job_deadline = _PolicyOption[float]()
    #: Whether (or a predicate saying when) a call waits for a person's approval.
    approval = _PolicyOption[bool | ApprovalPredicate]()
    #: Seconds a call waits for approval (None: the app's ``approval_timeout``).
    approval_timeout = _PolicyOption[float | None]()

    @classmethod
    def from_sdk(
        cls,
        handler: Callable[..., Any],
        /,
        *,
        definition: Mapping[str, Any] | None = None,
        **options: Unpack[ToolOptions],
    ) -> FunctionTool:
        """Adopt a handler written for the openai SDK's ``sessions.stream(tool_handlers=)``.

        ``handler`` is an openai ``FunctionTool`` (from ``function_tool()`` or
        ``pydantic_function_tool()``), whose own definition is sent byte for byte, or a
        plain callable taking the argument dict, with ``definition=`` the function tool you
        put in ``agent.tools``. The handler is called as the SDK calls it: with the argument
        object as one dict, awaited when it returns an awaitable (a sync one runs in a
        thread). Options apply as for :meth:`from_function`; ``defer_loading`` and
        ``background`` can only switch on what the definition leaves off.
        """
        label = label_of(handler, placed=True)
        sdk = read_sdk_tool(handler)
        source = adopted_definition(label, handler, sdk, definition)
        check_returns_once(handler, label)
        settled = _settle(label, options)
        name, description = options.get("name"), options.get("description")
        tool_name = _checked_name(label, source["name"] if name is None else name)
        settled["defer_loading"] = settled["defer_loading"] or source.get("defer_loading") is True
        settled["background"] = settled["background"] or source.get("async") is True
        findings = untyped_problems(tool_name, label_of(handler), source["parameters"])
        for finding in findings:
            warn_at(handler, finding.message)
        return cls(
            name=tool_name,
            description=source["description"] if description is None else description,
            parameters=json.loads(json.dumps(source["parameters"])),
            fn=handler,
            is_async=sdk.is_async if sdk is not None else is_async_callable(handler),
            _spec=MappingArguments(sdk.model if sdk is not None else None),
            _source=source,
            _findings=findings,
            **settled,
        )

    def definition(self) -> dict[str, Any]:
        """This tool as the Agents API takes it in ``agent.tools`` (a fresh copy).

        A tool adopted from the openai SDK gives the SDK's definition unchanged, unless an
        option changed it.
        """
        definition: dict[str, Any]
        if self._source is not None:
            definition = json.loads(json.dumps(self._source))
            definition["name"] = self.name
            definition["description"] = self.description
        else:
            definition = {
                "type": "function",
                "name": self.name,
                "description": self.description,
                "parameters": json.loads(json.dumps(self.parameters)),
            }
        if self.defer_loading:
            definition["defer_loading"] = True
        if self.background:
            definition["async"] = True
        return definition

    def parse_arguments(self, raw: object) -> dict[str, Any]:
        """Validate the model's ``arguments`` (an object, or a JSON string of one) and return
        keyword arguments for the handler, without the context.

        ``None`` and an empty string count as ``{}``. Raises ArgumentValidationError whose
        message lists field paths and what was expected, never the submitted values. A tool
        adopted from the openai SDK gets the argument object itself (checked against its own
        model when it shows one).
        """
        spec = self._require_spec()
        data = decode_arguments(raw)
        if isinstance(spec, MappingArguments):
            return spec.parse(data)
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
        if isinstance(spec, MappingArguments):
            return spec.dump(arguments)
        if spec.whole_param is not None:
            instance = arguments[spec.whole_param]
        else:
            instance = spec.model.model_validate(
                {param: arguments[param] for _, param in spec.field_params if param in arguments}
            )
        return typing.cast(dict[str, Any], instance.model_dump(mode="json", by_alias=True))

    def bind(self, arguments: Mapping[str, Any], context: ToolContext) -> Callable[[], Any]:
        """The handler called with ``arguments`` (from :meth:`parse_arguments`) and the
        context, as a call of no arguments (how arguments map onto the handler is the
        definition's business; :mod:`agentfn_asgi.running` runs it)."""
        spec = self._require_spec()
        if isinstance(spec, MappingArguments):
            # The openai SDK's convention: the argument object as one positional dict.
            return functools.partial(self.fn, dict(arguments))
        kwargs = dict(arguments)
        if spec.context_param is not None:
            kwargs[spec.context_param] = context
        bound: Callable[[], Any] = functools.partial(self.fn, **kwargs)
        return bound

    # The run side (agentfn_asgi.running) as methods: each says how the handler runs, times
    # out, asks for approval or reconciles.
    invoke = invoke
    needs_approval = needs_approval
    run_reconcile = run_reconcile

    def _require_spec(self) -> ArgumentSpec | MappingArguments:
        if self._spec is None:
            raise ToolDefinitionError(
                f"tool {self.name!r} was not built with FunctionTool.from_function"
            )
        return self._spec


class FunctionTools:
    """A registry of function tools, answering one agent's ``function_call`` actions."""

    def __init__(self) -> None:
        self._tools: dict[str, FunctionTool] = {}
        # (tool, code) of the problems definitions() has already warned about.
        self._warned: set[tuple[str, str]] = set()

    @classmethod
    def from_sdk(
        cls,
        handlers: Mapping[str, Any] | Iterable[Any],
        /,
        *,
        definitions: Iterable[Mapping[str, Any]] = (),
        **options: Unpack[ToolOptions],
    ) -> FunctionTools:
        """A registry of the tools you give the openai SDK, taken as they are.

        ``handlers`` is your ``tool_handlers={"name": handler}`` dict, or a list of openai
        ``FunctionTool`` objects (``function_tool()``, ``pydantic_function_tool()``). Those
        bring their own definitions; a plain callable finds its definition by name in
        ``definitions`` (the ``agent.tools`` list you already send; other entries are
        ignored). Options apply to every tool, except ``name`` and ``description``
        (per tool: ``tools.add(sdk_tool, name=...)``). See :meth:`FunctionTool.from_sdk`.
        """
        where = "FunctionTools.from_sdk"
        check_option_names(where, options, _OPTION_NAMES)
        for key in ("name", "description"):
            if options.get(key) is not None:
                raise ToolDefinitionError(
                    f"{where}: {key}= would apply to every tool; give it to one tool with"
                    f" tools.add(sdk_tool, {key}=...)"
                )
        registry = cls()
        registry._insert(
            [
                FunctionTool.from_sdk(handler, definition=definition, **options)
                for handler, definition in pair_handlers(where, handlers, definitions)
            ]
        )
        return registry

    @overload
    def function(self, fn: F, /) -> F: ...

    @overload
    def function(self, fn: None = None, /, **options: Unpack[ToolOptions]) -> Callable[[F], F]: ...

    def function(
        self, fn: F | None = None, /, **options: Unpack[ToolOptions]
    ) -> F | Callable[[F], F]:
        """Register a function as a tool; use bare (``@tools.function``) or with options.

        Returns the function unchanged. The options (:class:`ToolOptions` lists them with
        their defaults) set the definition (``name``, ``description``, ``defer_loading``,
        ``background``) and how calls run (:class:`~agentfn_asgi.policy.ToolPolicy`:
        ``side_effects`` and its ``reconcile`` hook, ``timeout``, ``retry``, ``approval``,
        ``enqueue``...).
        Stacked on openai's ``@function_tool``, it adopts that tool as it is
        (:meth:`FunctionTool.from_sdk`).
        """
        if fn is not None and not callable(fn):
            hint = f"@tools.function(name={fn!r})" if isinstance(fn, str) else "keyword options"
            raise ToolDefinitionError(
                f"@tools.function takes the function itself, not {fn!r}; pass options by"
                f" keyword: {hint}"
            )
        check_option_names("@tools.function", options, _OPTION_NAMES)

        def register(target: F) -> F:
            self.add(target, **options)
            return target

        return register if fn is None else register(fn)

    def add(self, fn: Callable[..., Any], **options: Unpack[ToolOptions]) -> FunctionTool:
        """Register ``fn`` without decorating it (an openai ``FunctionTool`` too); returns
        the built tool."""
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
            self._tools[tool.name] = replace(
                current, policy=replace(current.policy, reconcile=hook)
            )
            return hook

        return register

    def include(self, other: FunctionTools) -> None:
        """Add every tool of ``other``; refuses (adding nothing) if any name is taken."""
        self._insert(list(other))

    def get(self, name: str) -> FunctionTool | None:
        """The tool called ``name``, or None."""
        return self._tools.get(name)

    def problems(self) -> list[ToolProblem]:
        """What registers but will hurt later, judged on the complete registry: parameters
        whose schema tells the model nothing (also warned at registration) and side-effect
        tools without a reconcile hook (whose in-doubt calls are quarantined). Call it once
        registration is done, e.g. at start-up, and log each :attr:`ToolProblem.message`.
        """
        found: list[ToolProblem] = []
        for tool in self._tools.values():
            found.extend(tool._findings)
            if tool.side_effects and tool.reconcile is None:
                found.append(no_reconcile_problem(tool.name))
        return found

    def definitions(self) -> list[dict[str, Any]]:
        """The tools for ``agent.tools``: flat function tools, then ``{"type": "tool_search"}``
        when any tool is deferred (deferred tools are only reachable through it).

        Raises ToolDefinitionError when the list exceeds the API's 3 MiB limit. That limit
        covers the whole resolved list, so leave room for any other tools you add to it.
        Registration is complete by now, so this also warns once per tool about a
        :meth:`problems` entry not already warned at registration (a side-effect tool
        without a reconcile hook), pointing at the tool's ``def`` line.
        """
        for problem in self.problems():
            key = (problem.tool, problem.code)
            if problem.code == "no_reconcile" and key not in self._warned:
                self._warned.add(key)
                # At the tool's def line, where the fix goes: whoever asks for the
                # definitions (the CLI's `tools`, a test, the host) is not the place.
                warn_at(self._tools[problem.tool].fn, problem.message)
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
                    f"{label_of(tool.fn, placed=True)}: a tool named {tool.name!r} is already"
                    " registered"
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


def _settle(label: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The tool fields the options set (all but ``name`` and ``description``), checked."""
    check_option_names(label, options, _OPTION_NAMES)
    return {
        "defer_loading": bool(options.get("defer_loading", False)),
        "background": bool(options.get("background", False)),
        "policy": ToolPolicy.build(label, options),
    }


def _checked_name(label: str, name: object) -> str:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ToolDefinitionError(
            f"{label}: tool name {name!r} must be 1-64 letters, digits, '_' or '-'"
            " (pass name=... to choose another)"
        )
    return name
