"""Configuration from the environment: one reader, the same answers for every entry point."""

from __future__ import annotations

import pytest

from agentfn_asgi import AgentWebhookApp, Config, FunctionTools
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.store import DEFAULT_STORE_URL

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def test_an_empty_environment_gives_the_defaults() -> None:
    """Nothing set: no keys, the default store, default dispatch settings, content off."""
    config = Config.from_env({})
    assert config == Config()
    assert config.store_url == DEFAULT_STORE_URL
    assert config.dispatch == DispatchSettings()
    assert config.webhook_secrets == () and config.capture_content is False


def test_every_variable_is_read() -> None:
    """Each documented variable lands in its field; lists split on spaces and commas."""
    config = Config.from_env(
        {
            "OPENAI_API_KEY": "sk-1",
            "OPENAI_BASE_URL": "http://fake/v1",
            "OPENAI_PROJECT_ID": "proj_1",
            "OPENAI_ORG_ID": "org_1",
            "OPENAI_WEBHOOK_SECRET": f"{SECRET}, whsec_b",
            "AGENTFN_STORE_URL": " memory:// ",
            "AGENTFN_COMPLETION_SECRET": "a" * 16,
            "AGENTFN_PUBLIC_URL": "https://example.com/hooks",
            "AGENTFN_ADMIN_TOKEN": "t1 t2",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "TRUE",
            "AGENTFN_LEASE_SECONDS": "12.5",
            "AGENTFN_MAX_CONCURRENCY": "7",
            "AGENTFN_THREAD_POOL_SIZE": "3",
            "AGENTFN_TOOL_TIMEOUT": "9",
            "AGENTFN_RECOVERY_INTERVAL": "2",
            "AGENTFN_UNKNOWN_TOOLS": "ignore",
            "AGENTFN_IN_DOUBT": "hold",
            "AGENTFN_APPROVAL_TIMEOUT": "600",
        }
    )
    assert (config.api_key, config.base_url) == ("sk-1", "http://fake/v1")
    assert (config.project, config.organization) == ("proj_1", "org_1")
    assert config.webhook_secrets == (SECRET, "whsec_b")
    assert config.store_url == "memory://"
    assert config.completion_secrets == ("a" * 16,)
    assert config.public_url == "https://example.com/hooks"
    assert config.admin_tokens == ("t1", "t2")
    assert config.capture_content is True
    assert config.dispatch == DispatchSettings(
        lease_seconds=12.5,
        max_concurrency=7,
        thread_pool_size=3,
        default_timeout=9.0,
        recovery_interval=2.0,
        unknown_tools="ignore",
        in_doubt="hold",
        approval_timeout=600.0,
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("TRUE", True), ("false", False), ("0", False), ("", False)],
)
def test_content_capture_follows_the_genai_variable(value: str, expected: bool) -> None:
    """The OpenTelemetry GenAI variable decides content capture (true/1 on)."""
    env = {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": value}
    assert Config.from_env(env).capture_content is expected


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("AGENTFN_LEASE_SECONDS", "soon", "AGENTFN_LEASE_SECONDS='soon' is not a valid float"),
        ("AGENTFN_MAX_CONCURRENCY", "0", "AGENTFN_MAX_CONCURRENCY='0' must be positive"),
        ("AGENTFN_IN_DOUBT", "retry", "expected one of fail, hold"),
        ("AGENTFN_UNKNOWN_TOOLS", "skip", "expected one of fail, ignore"),
    ],
)
def test_bad_values_name_the_variable(variable: str, value: str, message: str) -> None:
    """A value that cannot be used fails at start-up, naming the variable."""
    with pytest.raises(ConfigurationError, match=message):
        Config.from_env({variable: value})


def test_the_client_is_built_from_the_configuration() -> None:
    """Config.client() carries the key, base URL, project and organization; no key fails."""
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        Config().client()
    client = Config(
        api_key="sk-1", base_url="http://fake/v1", project="proj_1", organization="org_1"
    ).client()
    assert client.base_url == "http://fake/v1"
    assert client._headers["OpenAI-Project"] == "proj_1"
    assert client._headers["OpenAI-Organization"] == "org_1"


def test_the_app_takes_what_it_is_not_given_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An app built with no options reads the same Config: secret, key, store, settings,
    content capture."""
    monkeypatch.setenv("OPENAI_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-1")
    monkeypatch.setenv("AGENTFN_STORE_URL", "memory://")
    monkeypatch.setenv("AGENTFN_UNKNOWN_TOOLS", "ignore")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    app = AgentWebhookApp(FunctionTools())
    assert app.dispatcher.settings.unknown_tools == "ignore"
    assert app.telemetry.capture_content is True
    assert type(app.store).__name__ == "MemoryStore"
    explicit = AgentWebhookApp(
        FunctionTools(), config=Config(webhook_secrets=(SECRET,), api_key="sk-2")
    )
    assert explicit.dispatcher.settings == DispatchSettings()


def test_a_misspelled_variable_is_refused_with_the_name_it_meant() -> None:
    """AGENTFN_STORE_ULR was silently ignored: every replica started on its own SQLite file.
    Every unknown AGENTFN_* variable is named at once, each with the closest of ours."""
    with pytest.raises(ConfigurationError) as refused:
        Config.from_env({"AGENTFN_STORE_ULR": "redis://r", "AGENTFN_FENCE_MARGIN": "2"})
    message = str(refused.value)
    assert "AGENTFN_STORE_ULR (did you mean AGENTFN_STORE_URL?)" in message
    assert "AGENTFN_FENCE_MARGIN (did you mean AGENTFN_LEASE_MARGIN?)" in message
    assert "AGENTFN_ALLOW_UNKNOWN" in message


def test_variables_the_host_owns_are_allowed_by_name_or_prefix() -> None:
    """AGENTFN_ALLOW_UNKNOWN lists the host's own names (or PREFIX_*); OTHER_* are not ours."""
    env = {
        "AGENTFN_ALLOW_UNKNOWN": "AGENTFN_LEGACY_FLAG, AGENTFN_MYAPP_*",
        "AGENTFN_LEGACY_FLAG": "1",
        "AGENTFN_MYAPP_REGION": "eu",
        "OTHER_STORE_ULR": "x",
    }
    assert Config.from_env(env).allow_unknown == ("AGENTFN_LEGACY_FLAG", "AGENTFN_MYAPP_*")
    with pytest.raises(ConfigurationError, match="AGENTFN_MYAPP2"):
        Config.from_env({**env, "AGENTFN_MYAPP2": "1"})


def test_an_app_with_a_misspelled_variable_cannot_start_but_imports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Building the app still never fails (imports stay safe); its start-up names the fix."""
    monkeypatch.setenv("AGENTFN_STORE_ULR", "redis://r")
    app = AgentWebhookApp(FunctionTools(), webhook_secret=SECRET)
    with pytest.raises(ConfigurationError, match="did you mean AGENTFN_STORE_URL"):
        app.check()
