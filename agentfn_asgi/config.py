"""Configuration from the environment: the one module that reads it.

Every entry point (the app, ``agentfn-asgi recover``/``status``/``calls``, workers) builds
its settings with :meth:`Config.from_env`, so they all agree on the store, the keys and the
``AGENTFN_*`` dispatch settings. Everything below this edge takes explicit arguments.

=====================================================  ===========================================
variable                                               :class:`Config` field
=====================================================  ===========================================
``OPENAI_API_KEY``, ``OPENAI_BASE_URL``                 ``api_key``, ``base_url``
``OPENAI_PROJECT_ID``, ``OPENAI_ORG_ID``                ``project``, ``organization`` (sent as
                                                       ``OpenAI-Project``/``OpenAI-Organization``)
``OPENAI_WEBHOOK_SECRET`` (several: spaces or commas)  ``webhook_secrets``
``AGENTFN_STORE_URL``                                  ``store_url``
``AGENTFN_STORE_NAMESPACE`` (default the project id)   ``store_namespace``
``AGENTFN_COMPLETION_SECRET``, ``AGENTFN_PUBLIC_URL``  ``completion_secrets``, ``public_url``
``AGENTFN_ADMIN_TOKEN`` (several: spaces or commas)    ``admin_tokens``
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``  ``capture_content``
``AGENTFN_LEASE_SECONDS`` … (see :data:`DISPATCH_ENV`)  ``dispatch`` (a :class:`DispatchSettings`)
=====================================================  ===========================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .client import AgentsClient
from .dispatch.settings import DispatchSettings
from .errors import ConfigurationError
from .signing import parse_secrets
from .store import DEFAULT_STORE_URL, Store, open_store

__all__ = ["DISPATCH_ENV", "Config", "dispatch_settings"]

#: ``AGENTFN_*`` variable → (``DispatchSettings`` field, type, allowed values or None).
DISPATCH_ENV: Final[dict[str, tuple[str, type, tuple[str, ...] | None]]] = {
    "AGENTFN_LEASE_SECONDS": ("lease_seconds", float, None),
    "AGENTFN_LEASE_MARGIN": ("lease_margin", float, None),
    "AGENTFN_MAX_CONCURRENCY": ("max_concurrency", int, None),
    "AGENTFN_THREAD_POOL_SIZE": ("thread_pool_size", int, None),
    "AGENTFN_THREAD_WAIT": ("thread_wait", float, None),
    "AGENTFN_TOOL_TIMEOUT": ("default_timeout", float, None),
    "AGENTFN_RECOVERY_INTERVAL": ("recovery_interval", float, None),
    "AGENTFN_UNKNOWN_TOOLS": ("unknown_tools", str, ("fail", "ignore")),
    "AGENTFN_IN_DOUBT": ("in_doubt", str, ("fail", "hold")),
    "AGENTFN_MAX_ATTEMPTS": ("max_attempts", int, None),
    "AGENTFN_APPROVAL_TIMEOUT": ("approval_timeout", float, None),
}
_CAPTURE_VALUES: Final = frozenset({"true", "1", "span_only", "span_and_event"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """What the environment says; every field has the default an empty environment gives."""

    api_key: str | None = None
    base_url: str | None = None
    project: str | None = None
    organization: str | None = None
    webhook_secrets: tuple[str, ...] = ()
    store_url: str = DEFAULT_STORE_URL
    store_namespace: str = ""
    completion_secrets: tuple[str, ...] = ()
    public_url: str | None = None
    admin_tokens: tuple[str, ...] = ()
    capture_content: bool = False
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read ``environ`` (default: this process's environment).

        Raises ConfigurationError naming the variable when a value cannot be used.
        """
        env = os.environ if environ is None else environ

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        return cls(
            api_key=text("OPENAI_API_KEY"),
            base_url=text("OPENAI_BASE_URL"),
            project=text("OPENAI_PROJECT_ID"),
            organization=text("OPENAI_ORG_ID"),
            webhook_secrets=parse_secrets(env.get("OPENAI_WEBHOOK_SECRET", "")),
            store_url=text("AGENTFN_STORE_URL") or DEFAULT_STORE_URL,
            store_namespace=text("AGENTFN_STORE_NAMESPACE") or text("OPENAI_PROJECT_ID") or "",
            completion_secrets=parse_secrets(env.get("AGENTFN_COMPLETION_SECRET", "")),
            public_url=text("AGENTFN_PUBLIC_URL"),
            admin_tokens=parse_secrets(env.get("AGENTFN_ADMIN_TOKEN", "")),
            capture_content=(
                env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower()
                in _CAPTURE_VALUES
            ),
            dispatch=dispatch_settings(env),
        )

    def open_store(self, url: str | None = None, **options: Any) -> Store:
        """The store at ``url`` (default :attr:`store_url`) in :attr:`store_namespace`:
        several apps (one per OpenAI project) can share one database, each seeing only
        its own deliveries and calls."""
        options.setdefault("namespace", self.store_namespace)
        return open_store(url if url is not None else self.store_url, **options)

    def client(self, **options: Any) -> AgentsClient:
        """An :class:`AgentsClient` for this configuration (``options`` go to it as well).

        Raises ConfigurationError when no API key is configured.
        """
        if not self.api_key and "api_key" not in options:
            raise ConfigurationError(
                "no API key: set the OPENAI_API_KEY environment variable (or pass client= "
                "an AgentsClient(api_key=...))"
            )
        options.setdefault("api_key", self.api_key)
        options.setdefault("base_url", self.base_url)
        options.setdefault("project", self.project)
        options.setdefault("organization", self.organization)
        return AgentsClient(**options)


def dispatch_settings(env: Mapping[str, str]) -> DispatchSettings:
    """:class:`DispatchSettings` with the ``AGENTFN_*`` variables of :data:`DISPATCH_ENV`."""
    values: dict[str, Any] = {}
    for var, (field_name, kind, choices) in DISPATCH_ENV.items():
        raw = env.get(var, "").strip()
        if not raw:
            continue
        try:
            value: Any = kind(raw)
        except ValueError:
            raise ConfigurationError(f"{var}={raw!r} is not a valid {kind.__name__}") from None
        if choices is not None and value not in choices:
            raise ConfigurationError(f"{var}={raw!r}: expected one of {', '.join(choices)}")
        if choices is None and value <= 0:
            raise ConfigurationError(f"{var}={raw!r} must be positive")
        values[field_name] = value
    return DispatchSettings(**values)
