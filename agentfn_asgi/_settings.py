"""How the dispatcher runs calls: :class:`DispatchSettings` and its ``AGENTFN_*`` variables.

Kept apart from dispatch.py (which re-exports it) so the settings and their environment table
read on their own; only :meth:`DispatchSettings.from_env` looks at the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .errors import ConfigurationError
from .results import DEFAULT_SAFETY_MARGIN, TOOL_RESULT_LIMIT

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

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DispatchSettings:
        """Defaults overridden by ``AGENTFN_*`` variables (see the README's table).

        ``AGENTFN_LEASE_SECONDS``, ``AGENTFN_MAX_CONCURRENCY``, ``AGENTFN_THREAD_POOL_SIZE``,
        ``AGENTFN_TOOL_TIMEOUT``, ``AGENTFN_RECOVERY_INTERVAL``, ``AGENTFN_UNKNOWN_TOOLS``
        (``fail``/``ignore``) and ``AGENTFN_IN_DOUBT`` (``fail``/``hold``).
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var, field_name, kind in _ENV_SETTINGS:
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                value: Any = kind(raw)
            except ValueError:
                raise ConfigurationError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
            if kind is str and value not in _ENV_CHOICES[field_name]:
                choices = ", ".join(_ENV_CHOICES[field_name])
                raise ConfigurationError(f"{var}={raw!r}: expected one of {choices}")
            if kind is not str and value <= 0:
                raise ConfigurationError(f"{var}={raw!r} must be positive")
            values[field_name] = value
        return cls(**values)


_ENV_SETTINGS: tuple[tuple[str, str, type], ...] = (
    ("AGENTFN_LEASE_SECONDS", "lease_seconds", float),
    ("AGENTFN_MAX_CONCURRENCY", "max_concurrency", int),
    ("AGENTFN_THREAD_POOL_SIZE", "thread_pool_size", int),
    ("AGENTFN_TOOL_TIMEOUT", "default_timeout", float),
    ("AGENTFN_RECOVERY_INTERVAL", "recovery_interval", float),
    ("AGENTFN_UNKNOWN_TOOLS", "unknown_tools", str),
    ("AGENTFN_IN_DOUBT", "in_doubt", str),
)
_ENV_CHOICES: dict[str, tuple[str, ...]] = {
    "unknown_tools": ("fail", "ignore"),
    "in_doubt": ("fail", "hold"),
}
