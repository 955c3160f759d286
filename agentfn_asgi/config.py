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
``AGENTFN_ALLOW_UNKNOWN`` (names; ``PREFIX_*``)          ``allow_unknown``
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``  ``capture_content``
``AGENTFN_LEASE_SECONDS`` … (see :data:`DISPATCH_ENV`)  ``dispatch`` (a :class:`DispatchSettings`)
=====================================================  ===========================================

Any other ``AGENTFN_*`` variable is refused, with the closest name ("did you mean"): a
misspelled ``AGENTFN_STORE_ULR`` would otherwise start every replica on its own SQLite file.
Variables the host owns under our prefix are listed in ``AGENTFN_ALLOW_UNKNOWN``.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .client import AgentsClient
from .dispatch.settings import DispatchSettings
from .errors import ConfigurationError
from .signing import parse_secrets
from .store import DEFAULT_STORE_URL, Store, open_store

__all__ = [
    "CONFIG_DOCS",
    "DISPATCH_DOCS",
    "DISPATCH_ENV",
    "Config",
    "SettingDoc",
    "dispatch_settings",
]

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
    "AGENTFN_REREAD_INTERVAL": ("reread_interval", float, None),
}
_CAPTURE_VALUES: Final = frozenset({"true", "1", "span_only", "span_and_event"})
#: Ours, read elsewhere: the test-only crash hook (:mod:`agentfn_asgi._crash`).
_HOOK_VARIABLES: Final = ("AGENTFN_CRASH_AT", "AGENTFN_TEST_ONLY_ENABLE_CRASH_HOOK")


@dataclass(frozen=True, slots=True)
class SettingDoc:
    """What one setting means, for the documentation's configuration page, which is
    generated from :data:`CONFIG_DOCS` and :data:`DISPATCH_DOCS` with the dataclasses'
    defaults (``python -m tests.configuration_page --write``; a test keeps it current and
    every field documented)."""

    meaning: str
    #: The environment variable, for a :class:`Config` field (dispatch settings take theirs
    #: from :data:`DISPATCH_ENV`).
    variable: str | None = None
    #: ``"s"`` for seconds: the default is shown as ``30 s``, ``72 h``, ``7 days``.
    unit: str = ""
    #: How the default reads, when the value alone does not say it.
    default: str | None = None


#: :class:`Config` field -> its variable and meaning.
CONFIG_DOCS: Final[dict[str, SettingDoc]] = {
    "api_key": SettingDoc(
        "the Agents API key, sent as a bearer token; or pass client=AgentsClient(api_key=...)",
        "OPENAI_API_KEY",
        default="required",
    ),
    "base_url": SettingDoc(
        "the Agents API's base URL (for local development, `agentfn-asgi fake-api`'s)",
        "OPENAI_BASE_URL",
        default="`https://api.openai.com/v1`",
    ),
    "project": SettingDoc(
        "sent as `OpenAI-Project`, as the official SDK does (webhook endpoints belong to a"
        " project); also the default store namespace",
        "OPENAI_PROJECT_ID",
    ),
    "organization": SettingDoc("sent as `OpenAI-Organization`", "OPENAI_ORG_ID"),
    "webhook_secrets": SettingDoc(
        "the webhook endpoint's signing secret, `whsec_...`; several (separated by spaces or"
        " commas) during a rotation; or pass webhook_secret=",
        "OPENAI_WEBHOOK_SECRET",
        default="required",
    ),
    "store_url": SettingDoc(
        "the durable store: `memory://`, `sqlite:///relative.db` (from the working"
        " directory), `sqlite:////abs/path.db`, `redis://...`, `postgresql://...`; a SQLite"
        " file's directory must exist (it is never created, so a mistyped path cannot start"
        " an empty store); the resolved location (password hidden) is logged at start-up and"
        " is `webhooks.store_location`; or pass store=",
        "AGENTFN_STORE_URL",
    ),
    "store_namespace": SettingDoc(
        "several apps (one per OpenAI project) share one store, each listing and sweeping"
        " only its own deliveries and calls; or `open_store(url, namespace=)`",
        "AGENTFN_STORE_NAMESPACE",
        default="`OPENAI_PROJECT_ID`, else none",
    ),
    "completion_secrets": SettingDoc(
        "signs the completion tokens of worker tools (`enqueue=`): 16 characters or more,"
        " not the webhook secret; several, newest last, during a rotation; needed only when"
        " a tool hands calls to workers; or pass completion_secret=",
        "AGENTFN_COMPLETION_SECRET",
    ),
    "public_url": SettingDoc(
        "the URL where the app is mounted, put into each worker job as `complete_url`;"
        " needed when a tool hands calls to workers; or pass public_url=",
        "AGENTFN_PUBLIC_URL",
    ),
    "admin_tokens": SettingDoc(
        "the operator page's tokens (16 characters or more; several separated by spaces or"
        " commas during a rotation); the page is off without a token or an authorizer",
        "AGENTFN_ADMIN_TOKEN",
    ),
    "allow_unknown": SettingDoc(
        "other `AGENTFN_*` variables are refused at start-up (a misspelled name is not"
        " silently ignored); list here, separated by spaces or commas, those your host owns:"
        " names, or prefixes ending in `*` (`AGENTFN_MYAPP_*`)",
        "AGENTFN_ALLOW_UNKNOWN",
    ),
    "capture_content": SettingDoc(
        "record tool arguments, results and exception messages on spans (`true` or `1`);"
        " or pass telemetry=Telemetry(capture_content=True)",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        default="off",
    ),
    "dispatch": SettingDoc(
        "how calls run: the `DispatchSettings` below, each from its variable; or pass"
        " settings=DispatchSettings(...)",
        default="below",
    ),
}

#: :class:`DispatchSettings` field -> its meaning (the variable is in :data:`DISPATCH_ENV`).
DISPATCH_DOCS: Final[dict[str, SettingDoc]] = {
    "approval_timeout": SettingDoc(
        "how long a call of a tool declared with `approval=` waits for a person's decision"
        " before it fails (a tool's own `approval_timeout=` wins)",
        unit="s",
    ),
    "approval_poll_interval": SettingDoc(
        "how often each replica looks for approved calls to run and expired requests to fail"
        " (a decision taken in the same process wakes it at once)",
        unit="s",
    ),
    "reread_interval": SettingDoc(
        "a session with a call in flight longer than this is read again at this interval, so"
        " a cancelled or failed turn stops its calls without its webhook (0: off)",
        unit="s",
    ),
    "lease_seconds": SettingDoc(
        "how long a crashed replica's calls wait before another takes them over (renewed"
        " every third of it while running)",
        unit="s",
    ),
    "lease_margin": SettingDoc(
        "clock-skew allowance of fencing: a holder that could not renew stops its work this"
        " long *before* its lease ends; another replica takes over only this long *after* it",
        unit="s",
        default="a sixth of the lease",
    ),
    "max_concurrency": SettingDoc("handlers running at once (back-pressure beyond it)"),
    "thread_pool_size": SettingDoc(
        "threads for sync handlers, reconcile hooks and `enqueue` (a hard bound: a hung"
        " handler keeps its thread, new sync work waits)"
    ),
    "thread_wait": SettingDoc(
        "how long sync work may wait for a free thread before it fails with a message saying"
        " so (a tool's `timeout` counts running time only)",
        unit="s",
    ),
    "default_timeout": SettingDoc(
        "a handler's time limit; a tool's own `timeout=` overrides it", unit="s"
    ),
    "unknown_tools": SettingDoc(
        '`"fail"`: a call of a function this app does not register gets a failure result'
        ' naming it; `"ignore"` when several services share one agent'
    ),
    "in_doubt": SettingDoc(
        "a side-effect call in doubt and not reconciled: submit a model-safe failure"
        ' (`"fail"`), or `"hold"` it for an operator'
    ),
    "max_attempts": SettingDoc(
        "a call that keeps coming back in doubt (its process dies every time) ends with a"
        ' model-facing failure (or is held, with `in_doubt="hold"`) after this many attempts'
    ),
    "recovery_interval": SettingDoc("how often the recovery sweep runs", unit="s"),
    "recovery_grace": SettingDoc(
        "how old an unresolved delivery must be before the sweep takes it (a fresh one is"
        " still being handled)",
        unit="s",
    ),
    "retry_base": SettingDoc(
        "a record the sweep failed on waits this long, doubling per failure, before its next try",
        unit="s",
    ),
    "retry_cap": SettingDoc("the longest wait between two tries of one record", unit="s"),
    "sweep_budget": SettingDoc(
        "records one sweep pass takes (oldest due first, paged with a cursor)"
    ),
    "not_found_grace": SettingDoc(
        "a session that answers 404 this soon after its webhook is read again later (it may"
        " not be readable yet); past it, it is treated as deleted",
        unit="s",
    ),
    "not_found_retries": SettingDoc(
        "the pauses before reading such a session again at once, before the sweep takes over",
        unit="s",
    ),
    "dedup_window": SettingDoc(
        "how long delivery ids are remembered (OpenAI retries for up to 72 h)", unit="s"
    ),
    "call_retention": SettingDoc(
        "how long finished calls and their results are kept (held calls are kept until an"
        " operator settles them), and the rate buckets of limiters idle that long",
        unit="s",
    ),
    "result_limit": SettingDoc("the API's size limit for one tool result event, in bytes"),
    "result_margin": SettingDoc("bytes kept free under `result_limit` for the rest of the event"),
    "max_queued_sessions": SettingDoc(
        "sessions waiting to be read at once; beyond it new deliveries wait in the store for"
        " the sweep"
    ),
}


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
    allow_unknown: tuple[str, ...] = ()
    capture_content: bool = False
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read ``environ`` (default: this process's environment).

        Raises ConfigurationError naming the variable when a value cannot be used, or an
        ``AGENTFN_*`` variable that is not ours and not in ``AGENTFN_ALLOW_UNKNOWN``.
        """
        env = os.environ if environ is None else environ
        allow_unknown = parse_secrets(env.get("AGENTFN_ALLOW_UNKNOWN", ""))
        _refuse_unknown(env, allow_unknown)

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
            allow_unknown=allow_unknown,
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
        for name in ("api_key", "base_url", "project", "organization"):
            options.setdefault(name, getattr(self, name))
        return AgentsClient(**options)


def _refuse_unknown(env: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    """Refuse the ``AGENTFN_*`` variables that are neither ours nor ``allowed``, each with
    the closest of ours."""
    known = {doc.variable for doc in CONFIG_DOCS.values() if doc.variable}
    known.update(DISPATCH_ENV, _HOOK_VARIABLES)
    unknown = sorted(
        name
        for name in env
        if name.startswith("AGENTFN_")
        and name not in known
        and not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)
    )
    if not unknown:
        return
    # Compared without the shared prefix, which would make every name look close.
    suffixes = {name.removeprefix("AGENTFN_"): name for name in known}
    named = []
    for name in unknown:
        close = difflib.get_close_matches(name.removeprefix("AGENTFN_"), suffixes, n=1)
        named.append(f"{name} (did you mean {suffixes[close[0]]}?)" if close else name)
    raise ConfigurationError(
        f"unknown variable{'s' if len(unknown) > 1 else ''} {', '.join(named)}: agentfn-asgi"
        " has no such setting. Fix the name, or, if your host owns it, list it in"
        " AGENTFN_ALLOW_UNKNOWN (names separated by commas; PREFIX_* for a prefix)"
    )


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
