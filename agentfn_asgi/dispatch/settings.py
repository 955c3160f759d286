"""How the dispatcher runs calls: :class:`DispatchSettings`, and its one merge with a tool's
policy (:func:`resolve`).

A plain value with safe defaults; :mod:`agentfn_asgi.config` builds one from the ``AGENTFN_*``
environment variables (docs/configuration.md lists them, generated from the code).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ..backoff import Backoff
from ..errors import ConfigurationError
from ..policy import RetryPolicy, ToolPolicy
from ..results import DEFAULT_SAFETY_MARGIN, TOOL_RESULT_LIMIT

__all__ = ["DispatchSettings", "ResolvedPolicy", "check_limits", "resolve"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchSettings:
    """How calls are run. Every field has a safe default; see docs/configuration.md.

    ``lease_seconds`` bounds how long a crashed replica's calls wait before another replica
    takes them over; live calls renew their lease every third of it. ``lease_margin`` is the
    clock-skew allowance of fencing (default: a sixth of the lease): a holder that could not
    renew its lease stops its work that long *before* the lease ends, and another replica
    takes the call over only that long *after* it. ``max_attempts``
    bounds how often one call is started: a call that keeps coming back in doubt (its
    process dies every time it runs) is then answered with a failure, or held for an
    operator when it has side effects and ``in_doubt="hold"``. ``not_found_grace``: how long
    after its webhook a session the API does not find (404) is read again before it is
    treated as deleted, and how long after a result was saved a refused submission (404
    included) leaves the result for the sweep while the session cannot be read: only past it
    is the call stale; ``not_found_retries`` are the pauses before reading it again at once.
    ``retry_base``/``retry_cap``: the recovery sweep retries a record that failed (a
    session read, a submission) after ``retry_base`` seconds, doubling per failure up to
    ``retry_cap``; ``sweep_budget`` bounds the records one pass takes.
    ``thread_wait``: how long a sync handler may wait for a free thread (all
    ``thread_pool_size`` threads busy, hung handlers included) before its call fails saying
    so; its ``timeout`` only starts once it runs.
    ``reread_interval``: a session with a call in flight here for longer than this is read
    again every interval, so a cancelled or failed turn stops its calls even when no
    ``agent.session.idle``/``failed`` webhook reaches this app (0 turns it off).
    """

    lease_seconds: float = 30.0
    lease_margin: float | None = None
    max_concurrency: int = 1024
    thread_pool_size: int = 32
    thread_wait: float = 60.0
    default_timeout: float | None = 300.0
    unknown_tools: Literal["fail", "ignore"] = "fail"
    in_doubt: Literal["fail", "hold"] = "fail"
    max_attempts: int = 5
    recovery_interval: float = 10.0
    recovery_grace: float = 5.0
    retry_base: float = 5.0
    retry_cap: float = 600.0
    sweep_budget: int = 1000
    not_found_grace: float = 60.0
    not_found_retries: tuple[float, ...] = (0.25, 0.5, 1.0)
    dedup_window: float = 72 * 3600.0
    call_retention: float = 7 * 86400.0
    result_limit: int = TOOL_RESULT_LIMIT
    result_margin: int = DEFAULT_SAFETY_MARGIN
    max_queued_sessions: int = 10_000
    approval_timeout: float = 24 * 3600.0
    approval_poll_interval: float = 1.0
    reread_interval: float = 15.0

    @property
    def fence_margin(self) -> float:
        """``lease_margin``, or a sixth of the lease when it is not set."""
        return self.lease_seconds / 6 if self.lease_margin is None else self.lease_margin

    def retry_delay(self, failures: int) -> float:
        """Seconds before the next try of a record that failed ``failures`` times."""
        return Backoff(base=self.retry_base, cap=self.retry_cap).delay(failures)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedPolicy:
    """A tool's policy merged with the dispatcher's settings (:func:`resolve`): what a call
    of it runs under, nothing left to look up."""

    policy: ToolPolicy
    timeout: float | None
    in_doubt: Literal["fail", "hold"]
    max_attempts: int
    thread_wait: float
    approval_timeout: float

    @property
    def max_wait(self) -> float | None:
        """Seconds a call of a limited tool may wait for its limiter (None: no bound)."""
        return self.policy.max_wait if self.policy.limited else None

    @property
    def retry(self) -> RetryPolicy | None:
        """The tool's retry policy, if any."""
        return self.policy.retry


def resolve(policy: ToolPolicy, settings: DispatchSettings) -> ResolvedPolicy:
    """The one merge of a tool's policy with the dispatcher's settings: the tool's own value
    where it sets one, the setting otherwise."""
    return ResolvedPolicy(
        policy=policy,
        timeout=policy.timeout if policy.timeout is not None else settings.default_timeout,
        in_doubt=policy.in_doubt if policy.in_doubt is not None else settings.in_doubt,
        max_attempts=(
            policy.max_attempts if policy.max_attempts is not None else settings.max_attempts
        ),
        thread_wait=settings.thread_wait,
        approval_timeout=(
            policy.approval_timeout
            if policy.approval_timeout is not None
            else settings.approval_timeout
        ),
    )


def check_limits(policies: Iterable[tuple[str, ToolPolicy]], settings: DispatchSettings) -> None:
    """Refuse at start-up, in one line with the fix, a tool whose limits cannot work with
    these settings (what registration alone cannot judge: the app's defaults). A retry
    deadline shorter than the tool's timeout would end retries before one attempt may
    finish; a retry policy allowing fewer attempts than asked is fine."""
    for name, policy in policies:
        resolved = resolve(policy, settings)
        deadline = None if policy.retry is None else policy.retry.deadline
        timeout = resolved.timeout
        if deadline is not None and (timeout is None or deadline < timeout):
            where = "its timeout=" if policy.timeout is not None else "the app's default_timeout"
            limit = "no timeout" if timeout is None else f"{timeout:g} s"
            raise ConfigurationError(
                f"tool {name!r}: its retry deadline ({deadline:g} s) is shorter than one"
                f" attempt may run ({limit}, {where}); raise RetryPolicy(deadline=...) above"
                " it or give the tool a shorter timeout="
            )
