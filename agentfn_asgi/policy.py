"""How a tool's calls are run: :class:`ToolPolicy`, the one home of the per-tool run options.

Every option of ``@tools.function`` that shapes how a call runs (not what the model sees) is a
field of :class:`ToolPolicy`, declared once with its default, its check and its
documentation. Registration builds the policy from the options (:meth:`ToolPolicy.build`),
the option names and the documentation of
:class:`~agentfn_asgi.tools.ToolOptions` come from these fields, and the dispatcher merges the
policy with its settings in one place (:func:`agentfn_asgi.dispatch.settings.resolve`).
Adding a run option means adding one field here (and its key to ``ToolOptions``, which a
test holds to these fields, since static typing needs it spelled).

This module imports only the error tree, the tool context types and the backoff.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Final, Literal

from ._context import ReconcileHook
from .backoff import Backoff
from .errors import ToolDefinitionError

__all__ = [
    "DEFAULT_JOB_DEADLINE",
    "DEFAULT_MAX_WAIT",
    "DEFINITION_OPTIONS",
    "POLICY_OPTIONS",
    "RetryPolicy",
    "ToolPolicy",
    "option_docs",
    "parse_rate",
]

#: Seconds a job handed to ``enqueue=`` may take before its call fails (see agentfn_asgi.jobs).
DEFAULT_JOB_DEADLINE = 3600.0

#: Seconds a call of a limited tool (``concurrency=`` / ``rate=``) may wait for its limiter
#: before it fails: past five minutes the model is better told the tool is busy (it can try
#: again later, another way, or tell the user) than kept waiting with nothing to show.
DEFAULT_MAX_WAIT = 300.0

#: ``rate=`` units: seconds per unit.
_RATE_UNITS: Final = {"s": 1.0, "min": 60.0, "h": 3600.0}

#: ``(label, option name, value) -> the value to keep``, raising ToolDefinitionError.
_Check = Callable[[str, str, Any], Any]


def _positive(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _seconds(label: str, name: str, value: Any) -> float:
    if not _positive(value):
        raise ToolDefinitionError(f"{label}: {name} must be a positive number of seconds")
    return float(value)


def _seconds_or_none(label: str, name: str, value: Any) -> float | None:
    return None if value is None else _seconds(label, name, value)


def _count_or_none(label: str, name: str, value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ToolDefinitionError(f"{label}: {name} must be a whole number of at least 1")
    return value


def _flag(label: str, name: str, value: Any) -> bool:
    return bool(value)


def _callable_or_none(label: str, name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise ToolDefinitionError(f"{label}: {name} must be callable")
    return value


def _in_doubt(label: str, name: str, value: Any) -> Any:
    if value not in (None, "fail", "hold"):
        raise ToolDefinitionError(f"{label}: {name} must be 'fail' or 'hold', not {value!r}")
    return value


def _approval(label: str, name: str, value: Any) -> Any:
    if not isinstance(value, bool) and not callable(value):
        raise ToolDefinitionError(
            f"{label}: {name} must be True, False or a callable (ctx, arguments) -> bool"
        )
    return value


def _retry(label: str, name: str, value: Any) -> RetryPolicy | None:
    if value is None or isinstance(value, RetryPolicy):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return RetryPolicy(attempts=value)  # retry=3: three attempts with the defaults
    raise ToolDefinitionError(
        f"{label}: {name} must be a RetryPolicy(...) or a number of attempts, not {value!r}"
    )


def _concurrency(label: str, name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        raise ToolDefinitionError(
            f"{label}: concurrency=0 would never run a call; set concurrency=1 or more, or drop"
            " it for no bound"
        )
    return _count_or_none(label, name, value)


def _count(label: str, name: str, value: Any) -> int:
    checked = _count_or_none(label, name, value)
    if checked is None:
        raise ToolDefinitionError(f"{label}: {name} must be a whole number of at least 1")
    return checked


def parse_rate(text: str | float) -> float:
    """``rate=`` in tokens per second: ``"N/s"``, ``"N/min"``, ``"N/h"`` (N a positive
    number) or a positive number (per second). Raises ValueError naming the accepted forms."""
    forms = "a rate such as '5/s', '30/min' or '100/h', or a number per second"
    if isinstance(text, int | float) and not isinstance(text, bool):
        count, per = float(text), 1.0
    elif isinstance(text, str) and text.count("/") == 1:
        number, unit = (part.strip() for part in text.split("/"))
        if unit not in _RATE_UNITS:
            raise ValueError(f"unknown unit {unit!r}: use {forms}")
        try:
            count = float(number)
        except ValueError:
            raise ValueError(f"{number!r} is not a number: use {forms}") from None
        per = _RATE_UNITS[unit]
    else:
        raise ValueError(f"{text!r} is not {forms}")
    if not math.isfinite(count) or count < 0:
        raise ValueError(f"{text!r} is not {forms}")
    return count / per


def _rate(label: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    try:
        rate = parse_rate(value)
    except ValueError as exc:
        raise ToolDefinitionError(f"{label}: rate={value!r}: {exc}") from None
    if rate == 0:
        raise ToolDefinitionError(
            f"{label}: rate={value!r} would never run a call; give a positive rate such as"
            " rate='5/s', or drop it for no bound"
        )
    return rate


def _option(default: Any, check: _Check, doc: str) -> Any:
    """A policy field: its default, the check registration applies, its documentation."""
    return field(default=default, metadata={"check": check, "doc": doc})


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """When a plain tool's failed call is tried again (``@tools.function(retry=...)``).

    A call whose handler raises one of ``transient`` is tried again, up to ``attempts``
    executions in all, after ``initial_backoff`` seconds, multiplied by ``multiplier`` per
    failure up to ``max_backoff``; ``jitter`` (a fraction) only takes from that wait, a
    random part of up to ``jitter`` times it, so replicas retrying together spread out and
    no retry comes later than the backoff says (:mod:`agentfn_asgi.backoff`). ``deadline``:
    no attempt starts later than that many seconds after the call was first claimed (None:
    no bound beyond ``attempts``). The wait is kept in the store, so a restart or another
    replica resumes the call at that time.
    Side-effect tools take no ``retry=``: only :class:`~agentfn_asgi.errors.RetryLater` raised
    by the handler itself retries them (the handler knows nothing happened).
    """

    attempts: int = 3
    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    multiplier: float = 2.0
    jitter: float = 0.0
    transient: tuple[type[BaseException], ...] = (ConnectionError,)
    deadline: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
            raise ToolDefinitionError("RetryPolicy: attempts must be a whole number")
        if self.attempts < 1:
            raise ToolDefinitionError(
                "RetryPolicy: attempts must be at least 1 (1 means no retry); set attempts=2"
                " or more"
            )
        for name in ("initial_backoff", "max_backoff", "multiplier"):
            if not _positive(getattr(self, name)):
                raise ToolDefinitionError(f"RetryPolicy: {name} must be a positive number")
        if self.multiplier < 1:
            raise ToolDefinitionError("RetryPolicy: multiplier must be at least 1")
        if not isinstance(self.jitter, int | float) or not 0 <= self.jitter <= 1:
            raise ToolDefinitionError("RetryPolicy: jitter must be a fraction from 0 to 1")
        if self.deadline is not None and not _positive(self.deadline):
            raise ToolDefinitionError("RetryPolicy: deadline must be a positive number of seconds")
        transient = self.transient
        if isinstance(transient, type):
            object.__setattr__(self, "transient", (transient,))
        elif not all(isinstance(t, type) and issubclass(t, BaseException) for t in transient):
            raise ToolDefinitionError("RetryPolicy: transient must be exception classes")
        else:
            object.__setattr__(self, "transient", tuple(transient))

    def backoff(self, failures: int, random: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed attempt (1 for the first);
        ``random`` in [0, 1) picks the jitter, which only shortens it."""
        backoff = Backoff(self.initial_backoff, self.max_backoff, self.multiplier, self.jitter)
        return backoff.delay(failures, random)

    def is_transient(self, exc: BaseException) -> bool:
        """Is ``exc`` one of the exception types this policy retries?"""
        return isinstance(exc, self.transient)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolPolicy:
    """The run options of one tool, checked at registration. ``None`` means "the
    dispatcher's setting" (:class:`~agentfn_asgi.dispatch.DispatchSettings`); :func:`resolve`
    merges the two. Build it with :meth:`build` (registration does)."""

    # Each field is ``_option(default, check, doc)``: a ``field()`` (RUF009 cannot tell).
    side_effects: bool = _option(
        False,
        _flag,
        "the handler changes the world: an in-doubt call is never re-run blindly; its"
        " ``reconcile`` hook decides, else it is quarantined",
    )
    reconcile: ReconcileHook | None = _option(  # noqa: RUF009
        None,
        _callable_or_none,
        "``(ctx, arguments) -> Ran | NotRun | Unknown``, asked whether an in-doubt call of a"
        " side-effect tool already ran (or ``@tools.reconciler``)",
    )
    timeout: float | None = _option(
        None, _seconds_or_none, "seconds a call may run (None: the app's ``default_timeout``)"
    )
    in_doubt: Literal["fail", "hold"] | None = _option(
        None,
        _in_doubt,
        "what an in-doubt side-effect call that cannot be reconciled becomes: ``fail`` answers"
        " the model, ``hold`` waits for an operator (None: the app's ``in_doubt``)",
    )
    max_attempts: int | None = _option(
        None,
        _count_or_none,
        "how often one call may be started before it is answered with a failure (None: the"
        " app's ``max_attempts``)",
    )
    retry: RetryPolicy | None = _option(  # noqa: RUF009
        None,
        _retry,
        "a :class:`~agentfn_asgi.policy.RetryPolicy` (or a number of attempts): a plain tool's"
        " call failing with a transient error is tried again after a backoff kept in the store",
    )
    approval: bool | Callable[..., Any] = _option(  # noqa: RUF009
        False,
        _approval,
        "``True`` (or a callable ``(ctx, arguments) -> bool``, sync or async, for calls that"
        " need it only sometimes) holds each call, once its arguments are valid, until a"
        " person approves or denies it (see ``AgentWebhookApp.approve``)",
    )
    approval_timeout: float | None = _option(
        None,
        _seconds_or_none,
        "seconds a call waits for approval before it fails (None: the app's"
        " ``approval_timeout``, ``AGENTFN_APPROVAL_TIMEOUT``, 24 h)",
    )
    truncate_oversize: bool = _option(
        False, _flag, "cut an oversized text result instead of failing the call"
    )
    enqueue: Callable[..., Any] | None = _option(  # noqa: RUF009
        None,
        _callable_or_none,
        "``enqueue(job)``: hand each call to your queue as a"
        " :class:`~agentfn_asgi.worker.Job` instead of running it here",
    )
    job_deadline: float = _option(
        DEFAULT_JOB_DEADLINE,
        _seconds,
        "seconds a queued call's worker has to complete it before the call fails",
    )

    concurrency: int | None = _option(
        None,
        _concurrency,
        "at most this many calls of the tool run at once across every replica sharing the"
        " store; the others wait in the order they arrived, holding no slot and no thread"
        " (None: no bound)",
    )
    concurrency_key: Callable[..., Any] | None = _option(  # noqa: RUF009
        None,
        _callable_or_none,
        "``(ctx, arguments) -> str``, sync or async: the limits (``concurrency=``,"
        " ``rate=``) apply per value it returns (a tenant, an account) instead of to the"
        " whole tool; ``ctx`` has attempt 0 and no deadline, asked before the call is"
        " claimed; a key function that raises fails the call",
    )
    rate: float | None = _option(
        None,
        _rate,
        "``'N/s'``, ``'N/min'``, ``'N/h'`` (or a number per second): calls start at most at"
        " this rate across every replica, a token bucket kept in the store; kept as tokens"
        " per second (None: no bound)",
    )
    burst: int = _option(
        1,
        _count,
        "how many calls of a rated tool may start at once after a quiet spell (the"
        " bucket's size); 1 keeps every window within the rate, which is what a"
        " downstream's per-second quota checks",
    )
    max_wait: float | None = _option(
        DEFAULT_MAX_WAIT,
        _seconds_or_none,
        "seconds a call of a limited tool may wait for its turn before it fails with a"
        " message telling the model the tool is busy (None: no bound); past five minutes"
        " the model is better told than kept waiting",
    )

    max_calls_per_session: int | None = _option(
        None,
        _count_or_none,
        "at most this many calls of the tool run per session, counted in the store across"
        " every replica: a call is counted once, before it first runs (its arguments"
        " valid), and a retry, a takeover or an operator's re-run of it never counts"
        " again; a call past the budget does not run and fails with a message naming"
        " the budget (None: no budget)",
    )

    @property
    def limited(self) -> bool:
        """Calls of the tool wait for a limiter (``concurrency=`` or ``rate=``)."""
        return self.concurrency is not None or self.rate is not None

    @classmethod
    def build(cls, label: str, options: Mapping[str, Any]) -> ToolPolicy:
        """The policy the run options among ``options`` describe, every one checked, and the
        combinations refused that cannot work (each message says the fix)."""
        values: dict[str, Any] = {}
        for spec in fields(cls):
            if spec.name in options:
                values[spec.name] = spec.metadata["check"](label, spec.name, options[spec.name])
        policy = cls(**values)
        if policy.reconcile is not None and not policy.side_effects:
            raise ToolDefinitionError(f"{label}: reconcile= only applies with side_effects=True")
        if policy.retry is not None and policy.side_effects:
            raise ToolDefinitionError(
                f"{label}: retry= would run a side-effect tool again after an error it may have"
                " caused half-way; raise RetryLater(after=...) from the handler when you know"
                " nothing happened, or drop side_effects=True"
            )
        if policy.approval_timeout is not None and policy.approval is False:
            raise ToolDefinitionError(f"{label}: approval_timeout= only applies with approval=")
        if policy.retry is not None and policy.enqueue is not None:
            raise ToolDefinitionError(
                f"{label}: retry= applies to calls run here; a queued tool's worker retries"
            )
        _check_flow_control(label, policy, options)
        check_deadline = getattr(policy.enqueue, "check_job_deadline", None)
        if callable(check_deadline):
            # An enqueue that knows its queue's limits (the Celery integration's) refuses a
            # deadline the queue cannot keep at registration, not at the first call.
            check_deadline(policy.job_deadline, label)
        return policy


def _check_flow_control(label: str, policy: ToolPolicy, options: Mapping[str, Any]) -> None:
    """Refuse the flow-control options that cannot work together, each with its fix."""
    if "burst" in options and policy.rate is None:
        raise ToolDefinitionError(f"{label}: burst= only applies with rate=; add rate='N/s'")
    if not policy.limited:
        for name in ("concurrency_key", "max_wait"):
            if name in options and options[name] is not None:
                raise ToolDefinitionError(
                    f"{label}: {name}= only applies with concurrency= or rate=; add one of"
                    " them or drop it"
                )
    if policy.limited and policy.enqueue is not None:
        raise ToolDefinitionError(
            f"{label}: concurrency= and rate= limit calls run here; a queued tool's worker is"
            " limited by its queue (bound its workers), so drop them or drop enqueue="
        )


#: The run options: every field of :class:`ToolPolicy`.
POLICY_OPTIONS: Final = tuple(spec.name for spec in fields(ToolPolicy))

#: The options that shape the tool's definition (what the model sees), with their docs.
DEFINITION_OPTIONS: Final[Mapping[str, str]] = {
    "name": "the tool's name (default: the function's)",
    "description": "the tool's description (default: the docstring's summary)",
    "defer_loading": "hide the tool behind tool search (``defer_loading: true``)",
    "background": "mark the tool ``async: true``: the agent goes on without waiting for its"
    " result (natural for a tool handed to a worker)",
}


def option_docs() -> str:
    """Every option of ``@tools.function`` with its documentation, one bullet each."""
    lines = [f"- ``{name}``: {doc}" for name, doc in DEFINITION_OPTIONS.items()]
    for spec in fields(ToolPolicy):
        default = spec.default if spec.default is not MISSING else None
        suffix = "" if default in (None, False) else f" (default {default!r})"
        lines.append(f"- ``{spec.name}``: {spec.metadata['doc']}{suffix}")
    return "\n".join(lines)
