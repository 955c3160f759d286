"""The run side of a tool: calling its handler or its reconcile hook, and the thread pool
sync handlers run in. :mod:`agentfn_asgi.tools` is the definition side (registry, schema,
arguments); the dispatcher, the worker and the Celery integration run tools through here.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import anyio

from ._context import NotRun, Ran, ReconcileHook, ReconcileOutcome, ToolContext, Unknown
from ._threads import ThreadPool

__all__ = [
    "RunnableTool",
    "call_either",
    "default_thread_pool",
    "invoke",
    "is_async_callable",
    "needs_approval",
    "run_reconcile",
]

logger = logging.getLogger("agentfn_asgi.tools")

_DEFAULT_POOL: ThreadPool | None = None


class RunnableTool(Protocol):
    """What the run side needs of a tool (a :class:`~agentfn_asgi.tools.FunctionTool`): its
    name, whether its handler is async, its hooks, and the handler bound to arguments. The
    definition side knows how arguments map onto the handler; this module only runs it."""

    @property
    def name(self) -> str: ...

    @property
    def is_async(self) -> bool: ...

    @property
    def reconcile(self) -> ReconcileHook | None: ...

    @property
    def approval(self) -> bool | Callable[..., Any]: ...

    def bind(self, arguments: Mapping[str, Any], context: ToolContext) -> Callable[[], Any]: ...


def default_thread_pool() -> ThreadPool:
    """The pool sync handlers use when none is given (workers, tests): 32 threads."""
    global _DEFAULT_POOL
    if _DEFAULT_POOL is None:
        _DEFAULT_POOL = ThreadPool(32)
    return _DEFAULT_POOL


def is_async_callable(fn: object) -> bool:
    """True for coroutine functions, partials of them, and objects with an async __call__
    (shared with the worker hand-off, which calls ``enqueue`` hooks the same way)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - a callable instance's own __call__
    return call is not None and inspect.iscoroutinefunction(call)


async def call_either(
    fn: Callable[..., Any],
    /,
    *args: Any,
    is_async: bool | None = None,
    threads: ThreadPool | None = None,
    time_limit: float | None = None,
    wait_limit: float | None = None,
) -> Any:
    """``fn(*args)``, ``fn`` sync or async (``is_async``, else :func:`is_async_callable`):
    an async one is awaited on the loop, a sync one runs in a thread of ``threads`` (the
    shared default pool when None), and an awaitable it returns is awaited (how handlers,
    reconcile hooks and ``enqueue`` hooks are called). TimeoutError past ``time_limit``
    seconds of running; a sync one's wait for a free thread is counted apart and bounded by
    ``wait_limit`` (ThreadPoolBusyError, see :mod:`agentfn_asgi._threads`)."""
    if not (is_async_callable(fn) if is_async is None else is_async):
        pool = threads if threads is not None else default_thread_pool()
        result = await pool.run(fn, *args, time_limit=time_limit, wait_limit=wait_limit)
    elif time_limit is None:
        result = await fn(*args)
    else:
        # What ``anyio.fail_after`` does, without its two generator-based context managers
        # and their backend look-ups (17 against 12 µs a call, timed on asyncio).
        scope = anyio.CancelScope(deadline=anyio.current_time() + time_limit)
        with scope:
            result = await fn(*args)
        if scope.cancelled_caught and anyio.current_time() >= scope.deadline:
            raise TimeoutError
    if inspect.isawaitable(result):  # a sync wrapper's (or an SDK tool's) coroutine
        with anyio.fail_after(time_limit):
            result = await result
    return result


async def invoke(
    tool: RunnableTool,
    arguments: Mapping[str, Any],
    context: ToolContext,
    *,
    threads: ThreadPool | None = None,
    time_limit: float | None = None,
    wait_limit: float | None = None,
) -> Any:
    """Call ``tool``'s handler with ``arguments`` (from ``parse_arguments``) and the context
    (:func:`call_either`: async handlers on the event loop, sync ones in a thread of
    ``threads``). A sync handler that times out keeps running in its thread until it
    returns: Python cannot stop a thread.
    """
    return await call_either(
        tool.bind(arguments, context),
        is_async=tool.is_async,
        threads=threads,
        time_limit=time_limit,
        wait_limit=wait_limit,
    )


async def run_reconcile(
    tool: RunnableTool,
    arguments: Mapping[str, Any],
    context: ToolContext,
    *,
    threads: ThreadPool | None = None,
    time_limit: float | None = None,
    wait_limit: float | None = None,
) -> ReconcileOutcome:
    """Ask ``tool``'s reconcile hook whether an in-doubt call already ran.

    Never raises (except cancellation): no hook, a failing or timed-out hook or a wrong
    return value all give :class:`Unknown`, so the call is quarantined rather than run twice.
    """
    hook = tool.reconcile
    if hook is None:
        return Unknown("no reconcile hook")
    try:
        outcome = await call_either(
            hook,
            context,
            dict(arguments),
            threads=threads,
            time_limit=time_limit,
            wait_limit=wait_limit,
        )
    except Exception as exc:
        logger.warning("reconcile hook of tool %r failed", tool.name, exc_info=True)
        return Unknown(f"reconcile hook raised {type(exc).__name__}")
    if not isinstance(outcome, Ran | NotRun | Unknown):
        return Unknown(
            f"reconcile hook returned {type(outcome).__name__}, not Ran, NotRun or Unknown"
        )
    return outcome


async def needs_approval(
    tool: RunnableTool, context: ToolContext, arguments: dict[str, Any]
) -> bool:
    """Does this call of ``tool`` need a person's approval? ``approval=True`` always, a
    predicate when it says so. A predicate that raises asks for approval (the safe answer)."""
    rule = tool.approval
    if isinstance(rule, bool):
        return rule
    try:
        verdict = rule(context, arguments)
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception:
        logger.warning(
            "approval predicate of tool %r failed; asking for approval", tool.name, exc_info=True
        )
        return True
    return bool(verdict)
