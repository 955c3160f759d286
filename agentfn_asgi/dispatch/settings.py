"""How the dispatcher runs calls: :class:`DispatchSettings`.

A plain value with safe defaults; :mod:`agentfn_asgi.config` builds one from the ``AGENTFN_*``
environment variables (the README's configuration table lists them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..results import DEFAULT_SAFETY_MARGIN, TOOL_RESULT_LIMIT

__all__ = ["DispatchSettings"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchSettings:
    """How calls are run. Every field has a safe default; see the README's configuration table.

    ``lease_seconds`` bounds how long a crashed replica's calls wait before another replica
    takes them over; live calls renew their lease every third of it.
    """

    lease_seconds: float = 30.0
    max_concurrency: int = 1024
    thread_pool_size: int = 32
    default_timeout: float | None = 300.0
    unknown_tools: Literal["fail", "ignore"] = "fail"
    in_doubt: Literal["fail", "hold"] = "fail"
    recovery_interval: float = 10.0
    recovery_grace: float = 5.0
    dedup_window: float = 72 * 3600.0
    call_retention: float = 7 * 86400.0
    result_limit: int = TOOL_RESULT_LIMIT
    result_margin: int = DEFAULT_SAFETY_MARGIN
    max_queued_sessions: int = 10_000
