"""open_store(url): schemes, the environment default, options, and configuration errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import agentfn_asgi.store as store_package
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.store import (
    MemoryStore,
    SQLiteStore,
    Store,
    open_store,
    redact_url,
    store_location,
)


def test_all_is_sorted_and_complete() -> None:
    """The package exports the protocol, the built-in stores and open_store, sorted; the
    values they share live in agentfn_asgi.calls.records, not here."""
    assert store_package.__all__ == sorted(store_package.__all__)
    for name in store_package.__all__:
        assert hasattr(store_package, name), name
    assert {"Store", "open_store", "MemoryStore", "SQLiteStore"} <= set(store_package.__all__)
    assert "CallKey" not in store_package.__all__


def test_memory_scheme() -> None:
    """memory:// gives a MemoryStore using the given clock."""
    store = open_store("memory://", clock=lambda: 42.0)
    assert isinstance(store, MemoryStore)
    assert isinstance(store, Store)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///agentfn.sqlite3", "agentfn.sqlite3"),
        ("sqlite:///data/agentfn.sqlite3", "data/agentfn.sqlite3"),
        ("sqlite:////var/lib/agentfn.sqlite3", "/var/lib/agentfn.sqlite3"),
        ("SQLITE:///with%20space.sqlite3", "with space.sqlite3"),
    ],
)
def test_sqlite_paths(url: str, expected: str) -> None:
    """Three slashes: a path relative to the working directory (resolved when the store is
    made); four: an absolute path."""
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    assert store.path == os.path.abspath(expected)


def test_sqlite_options_from_query_and_keywords() -> None:
    """synchronous/busy_timeout come from the URL query; keywords override them."""
    store = open_store("sqlite:///x.sqlite3?synchronous=FULL&busy_timeout=2.5")
    assert isinstance(store, SQLiteStore)
    assert (store.synchronous, store.busy_timeout) == ("FULL", 2.5)
    store = open_store("sqlite:///x.sqlite3?synchronous=FULL", synchronous="NORMAL")
    assert isinstance(store, SQLiteStore)
    assert store.synchronous == "NORMAL"


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite:///",
        "sqlite://relative.sqlite3",
        "sqlite:///x.sqlite3?journal=delete",
        "sqlite:///x.sqlite3?busy_timeout=soon",
        "sqlite:///x.sqlite3?synchronous=OFF",
        "mysql://localhost/db",
        "no-scheme-at-all",
        "://nothing",
    ],
)
def test_bad_urls_are_configuration_errors(url: str) -> None:
    """Malformed, unknown or unsafe store URLs raise ConfigurationError."""
    with pytest.raises(ConfigurationError):
        open_store(url)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sqlite:/x",
            "store URL 'sqlite:/x' is malformed: expected sqlite:///relative.db (from the"
            " working directory) or sqlite:////abs/path.db",
        ),
        ("memory:", "store URL 'memory:' is malformed: expected memory://"),
        ("MEMORY:/", "store URL 'MEMORY:/' is malformed: expected memory://"),
        (
            "postgresql:host/db",
            "store URL 'postgresql:host/db' is malformed: expected postgresql://user@host/db",
        ),
        (
            "agentfn.sqlite3",
            "store URL 'agentfn.sqlite3' has no scheme: for this SQLite file use"
            " sqlite:///agentfn.sqlite3 (relative to the working directory)",
        ),
        (
            "/var/lib/x.db",
            "store URL '/var/lib/x.db' has no scheme: for this SQLite file use"
            " sqlite:////var/lib/x.db (absolute)",
        ),
        (
            "sqlite://x.db",
            "SQLite store URL 'sqlite://x.db' needs a path: sqlite:///relative.db (from the"
            " working directory) or sqlite:////abs/path.db",
        ),
    ],
)
def test_malformed_urls_name_the_expected_form(url: str, expected: str) -> None:
    """A URL missing its ``//`` (or its scheme) is answered with the form it should take.
    Regression (issue 18): ``sqlite:/x`` and ``memory:`` were said to have "no scheme"."""
    with pytest.raises(ConfigurationError) as info:
        open_store(url)
    assert str(info.value) == expected


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:hunter2@db:5432/main", "postgresql://app:***@db:5432/main"),
        ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app@db/main", "postgresql://app@db/main"),
        ("redis://cache:6379/0", "redis://cache:6379/0"),
        (
            "postgresql://db/main?user=app&password=hunter2",
            "postgresql://db/main?user=app&password=***",
        ),
        ("sqlite:///data/a@b.db", "sqlite:///data/a@b.db"),
        ("memory://", "memory://"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url_hides_only_passwords(url: str, shown: str) -> None:
    """One helper shows every store URL: a password becomes ``***``; a URL without one is
    shown as it is. Regression (issue 18): the CLI showed ``user:***@`` without a password."""
    assert redact_url(url) == shown


def test_every_store_has_a_location(tmp_path: Path) -> None:
    """memory, SQLite and PostgreSQL stores say where their data is (resolved, password
    hidden); store_location falls back to the redacted URL for a store without one."""
    assert open_store("memory://").location == "memory://"
    sqlite = open_store(f"sqlite:///{tmp_path}/x.db")
    assert store_location(sqlite) == f"sqlite:///{tmp_path}/x.db"
    postgres = open_store("postgresql://app:hunter2@127.0.0.1:5432/test?schema=app1")
    assert store_location(postgres) == "postgresql://app:***@127.0.0.1:5432/test (schema app1)"

    class Bare(MemoryStore):
        location = None  # type: ignore[assignment]

    # A home-made store without a location still shows.
    assert store_location(Bare(), "redis://:pw@h/0") == "redis://:***@h/0"


def test_unknown_option_is_configuration_error() -> None:
    """An option the backend does not take is a ConfigurationError, not a TypeError."""
    with pytest.raises(ConfigurationError, match="bad options"):
        open_store("memory://", key_prefix="x")


def test_password_is_not_echoed() -> None:
    """Errors about a URL hide its password."""
    with pytest.raises(ConfigurationError) as info:
        open_store("mysql://user:hunter2@db/app")
    assert "hunter2" not in str(info.value)
    assert "user:***@db" in str(info.value)


def test_no_argument_means_the_default_file_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """open_store reads no environment (the app and CLI resolve AGENTFN_STORE_URL through
    agentfn_asgi.config): without an argument it is the default SQLite file."""
    monkeypatch.setenv("AGENTFN_STORE_URL", "memory://")
    store = open_store()
    assert isinstance(store, SQLiteStore)
    assert store.path == os.path.abspath("agentfn.sqlite3")


@pytest.mark.parametrize("value", [None, "", "  "])
def test_default_is_sqlite_in_working_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None
) -> None:
    """Without argument or environment, the store is ./agentfn.sqlite3."""
    if value is None:
        monkeypatch.delenv("AGENTFN_STORE_URL", raising=False)
    else:
        monkeypatch.setenv("AGENTFN_STORE_URL", value)
    monkeypatch.chdir(tmp_path)
    store = open_store()
    assert isinstance(store, SQLiteStore)
    assert os.path.abspath(store.path) == str(tmp_path / "agentfn.sqlite3")


@pytest.mark.parametrize(
    ("url", "class_name"),
    [
        ("redis://127.0.0.1:6379/0", "RedisStore"),
        ("rediss://127.0.0.1:6380/0", "RedisStore"),
        ("postgresql://postgres@127.0.0.1:5432/test", "PostgresStore"),
        ("postgres://postgres@127.0.0.1:5432/test", "PostgresStore"),
    ],
)
def test_network_schemes_load_their_backend(url: str, class_name: str) -> None:
    """redis(s):// and postgres(ql):// construct the lazily imported backend classes."""
    store = open_store(url)
    assert type(store).__name__ == class_name
    assert isinstance(store, Store)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        (
            "redis://127.0.0.1:6379/0?key_prefx=a:",
            r"\?key_prefx= .* \(did you mean \?key_prefix=\?\)",
        ),
        ("redis://127.0.0.1:6379/0?sockettimeout=2", r"did you mean \?socket_timeout=\?"),
        ("redis://127.0.0.1:6379/0?color=red", r"unknown parameter \?color= in store URL"),
        ("postgresql://h/db?schem=app1", r"\?schem= .* \(did you mean \?schema=\?\)"),
    ],
)
def test_unknown_query_keys_are_refused_with_the_one_meant(url: str, message: str) -> None:
    """?key_prefx= reached redis-py (a TypeError at the first command) and ?schem= reached
    PostgreSQL as a server setting: both are refused when the URL is read."""
    with pytest.raises(ConfigurationError, match=message):
        open_store(url)


@pytest.mark.parametrize(
    ("url", "driver", "module", "extra"),
    [
        ("redis://127.0.0.1", "redis", "agentfn_asgi.store.redis.store", "redis"),
        ("postgresql://127.0.0.1/db", "asyncpg", "agentfn_asgi.store.sql.postgres", "postgres"),
    ],
)
def test_missing_driver_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, url: str, driver: str, module: str, extra: str
) -> None:
    """Without the driver installed, the error says which extra to install."""
    # A None entry in sys.modules makes `import <driver>` fail as if it were not installed.
    for name in [n for n in sys.modules if n == driver or n.startswith(f"{driver}.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, driver, None)
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.raises(ConfigurationError, match=rf"pip install 'agentfn-asgi\[{extra}\]'"):
        open_store(url)
