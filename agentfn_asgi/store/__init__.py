"""Durable stores: the :class:`Store` protocol and :func:`open_store` to pick one by URL.

===================================  ==============================================
``memory://``                        :class:`MemoryStore`: tests, one process
``sqlite:///relative/path.sqlite3``  :class:`SQLiteStore`: one host (the default)
``sqlite:////absolute/path.sqlite3``
``redis://…``, ``rediss://…``        ``RedisStore``: several replicas (extra ``redis``)
``postgresql://…``, ``postgres://…`` ``PostgresStore``: several replicas (extra
                                     ``postgres``)
===================================  ==============================================

Redis and PostgreSQL backends are imported only when their URL is opened, so their
drivers stay optional.
"""

from __future__ import annotations

import difflib
import importlib
import time
from collections.abc import Callable, Iterable
from typing import Any, Final
from urllib.parse import parse_qsl, unquote, urlencode

from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.store.base import Store
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.store.sql.sqlite import SQLiteStore

__all__ = [
    "DEFAULT_STORE_URL",
    "MemoryStore",
    "SQLiteStore",
    "Store",
    "open_store",
    "redact_url",
    "store_location",
    "unknown_url_parameter",
]

#: Used when neither an argument nor ``AGENTFN_STORE_URL`` names a store: a file in the
#: working directory.
DEFAULT_STORE_URL: Final = "sqlite:///agentfn.sqlite3"

# scheme -> (module, class, pip extra, top-level driver package)
_LAZY_BACKENDS: Final = {
    "redis": ("agentfn_asgi.store.redis.store", "RedisStore", "redis", "redis"),
    "rediss": ("agentfn_asgi.store.redis.store", "RedisStore", "redis", "redis"),
    "postgresql": ("agentfn_asgi.store.sql.postgres", "PostgresStore", "postgres", "asyncpg"),
    "postgres": ("agentfn_asgi.store.sql.postgres", "PostgresStore", "postgres", "asyncpg"),
}
_SQLITE_QUERY_OPTIONS: Final = {"synchronous": str, "busy_timeout": float}


def open_store(
    url: str | None = None, *, clock: Callable[[], float] = time.time, **options: Any
) -> Store:
    """Create the store named by ``url`` (not yet connected: the first use opens it).

    ``url`` defaults to :data:`DEFAULT_STORE_URL` (the app and the CLI read
    ``AGENTFN_STORE_URL`` through :mod:`agentfn_asgi.config`). ``clock`` (Unix seconds) is
    shared by every backend; ``options`` go to the backend's constructor as keywords
    (``synchronous=``, ``busy_timeout=`` for SQLite, which also accepts them as URL query
    parameters; ``key_prefix=`` for Redis and ``schema=`` for PostgreSQL, also accepted as URL query
    parameters: ``redis://host/0?key_prefix=app1:``, ``postgresql://host/db?schema=app1``).

    Raises :class:`ConfigurationError` for an unknown scheme, a malformed URL, an unknown
    option, or a backend whose optional driver is not installed.
    """
    if url is None:
        url = DEFAULT_STORE_URL
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or not scheme:
        raise ConfigurationError(_malformed(url))
    if scheme == "memory":
        return _construct(MemoryStore, url, clock=clock, **options)
    if scheme == "sqlite":
        path, query = _parse_sqlite(url, rest)
        return _construct(SQLiteStore, url, path, clock=clock, **{**query, **options})
    backend = _LAZY_BACKENDS.get(scheme)
    if backend is None:
        raise ConfigurationError(
            f"unknown store scheme {scheme!r} in {redact_url(url)!r}: use memory://, "
            "sqlite:///path, redis://, rediss://, postgresql:// or postgres://"
        )
    module_name, class_name, extra, driver = backend
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and exc.name.partition(".")[0] == driver:
            raise ConfigurationError(
                f"{scheme}:// stores need the {driver!r} driver: "
                f"pip install 'agentfn-asgi[{extra}]'"
            ) from exc
        raise ConfigurationError(f"cannot load the {scheme}:// store: {exc}") from exc
    store_class = getattr(module, class_name)
    url, query_options = _pop_store_options(url, _URL_OPTIONS[extra])
    return _construct(store_class, url, url, clock=clock, **{**query_options, **options})


#: Options a Redis/PostgreSQL URL may carry for us (removed before the driver sees the URL),
#: so several apps can share one server from configuration alone (``AGENTFN_STORE_URL``).
_URL_OPTIONS: Final = {"redis": ("key_prefix",), "postgres": ("schema",)}


#: The form each scheme's URL takes, for messages about a malformed one.
_EXPECTED: Final = {
    "memory": "memory://",
    "sqlite": "sqlite:///relative.db (from the working directory) or sqlite:////abs/path.db",
    "redis": "redis://host:6379/0",
    "rediss": "rediss://host:6380/0",
    "postgresql": "postgresql://user@host/db",
    "postgres": "postgres://user@host/db",
}


def _malformed(url: str) -> str:
    """The message for a URL without ``://``: ``sqlite:/x``, ``memory:``, a bare path."""
    shown = redact_url(url)
    scheme = url.partition(":")[0].strip().lower()
    if ":" in url and scheme in _EXPECTED:
        return f"store URL {shown!r} is malformed: expected {_EXPECTED[scheme]}"
    if url.lower().endswith((".db", ".sqlite", ".sqlite3")):
        return (
            f"store URL {shown!r} has no scheme: for this SQLite file use sqlite:///{url}"
            f" ({'absolute' if url.startswith('/') else 'relative to the working directory'})"
        )
    return (
        f"store URL {shown!r} has no scheme: use memory://, sqlite:///relative.db, "
        "sqlite:////abs/path.db, redis://host or postgresql://host/db"
    )


def unknown_url_parameter(url: str, name: str, known: Iterable[str]) -> ConfigurationError:
    """The error for a store URL's query key ``name`` that is none of ``known``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    hint = f" (did you mean ?{close[0]}=?)" if close else ""
    return ConfigurationError(
        f"unknown parameter ?{name}= in store URL {redact_url(url)!r}{hint}: fix or remove it"
        " in AGENTFN_STORE_URL (or store=)"
    )


def _pop_store_options(url: str, names: tuple[str, ...]) -> tuple[str, dict[str, Any]]:
    """``redis://h/0?key_prefix=app1:`` → (``redis://h/0``, {"key_prefix": "app1:"}).

    The rest goes to the driver; a key close to one of ours (``?schem=``) is refused here,
    where its fix is known (PostgreSQL would take it for a server setting)."""
    base, sep, query = url.partition("?")
    if not sep:
        return url, {}
    kept: list[tuple[str, str]] = []
    ours: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in names:
            ours[name] = value
        elif difflib.get_close_matches(name, names, n=1, cutoff=0.75):
            raise unknown_url_parameter(url, name, names)
        else:
            kept.append((name, value))
    return (f"{base}?{urlencode(kept)}" if kept else base), ours


def _parse_sqlite(url: str, rest: str) -> tuple[str, dict[str, Any]]:
    """``sqlite:///a/b`` → ``a/b`` (relative), ``sqlite:////a/b`` → ``/a/b`` (absolute)."""
    location, _, query = rest.partition("?")
    if not location.startswith("/") or location == "/":
        raise ConfigurationError(
            f"SQLite store URL {redact_url(url)!r} needs a path: {_EXPECTED['sqlite']}"
        )
    path = unquote(location[1:])
    if path == ":memory:":
        raise ConfigurationError(
            "sqlite:///:memory: is private to one connection and lost on restart: "
            "use memory:// for tests or give a file path"
        )
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        convert = _SQLITE_QUERY_OPTIONS.get(name)
        if convert is None:
            raise ConfigurationError(
                f"unknown SQLite store option {name!r} in {redact_url(url)!r}: "
                f"known options are {sorted(_SQLITE_QUERY_OPTIONS)}"
            )
        try:
            options[name] = convert(value)
        except ValueError as exc:
            raise ConfigurationError(
                f"bad value {value!r} for {name} in {redact_url(url)!r}"
            ) from exc
    return path, options


def _construct(factory: Callable[..., Any], url: str, *args: Any, **kwargs: Any) -> Store:
    try:
        store: Store = factory(*args, **kwargs)
    except TypeError as exc:  # an option this backend does not take
        raise ConfigurationError(f"bad options for store {redact_url(url)!r}: {exc}") from exc
    return store


def store_location(store: Store, url: str | None = None) -> str:
    """Where ``store`` keeps its data, as shown once at start-up, by ``status``/``recover``
    and on the operator page: its ``location`` (resolved, password hidden), else the
    redacted ``url`` it was opened from, else its ``repr``."""
    location = getattr(store, "location", None)
    if isinstance(location, str) and location:
        return location
    return redact_url(url) if url else repr(store)


def redact_url(url: str) -> str:
    """``url`` as it may be shown (logs, messages, ``status``, the operator page): a password
    in ``scheme://user:password@host`` or in a ``password=`` query parameter becomes ``***``.

    A URL without a password is returned unchanged (no ``***`` where nothing was hidden).
    Every place that shows a store URL goes through this function.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    credentials, at, host = netloc.rpartition("@")
    if at and ":" in credentials:
        netloc = f"{credentials.partition(':')[0]}:***@{host}"
    path, question, query = tail.partition("?")
    if question:
        hidden = [
            f"{name}=***" if name.lower() == "password" and value else pair
            for pair in query.split("&")
            for name, _, value in [pair.partition("=")]
        ]
        query = "&".join(hidden)
    return f"{scheme}://{netloc}{slash}{path}{question}{query}"
