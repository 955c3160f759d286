"""The one home of per-tool run options (agentfn_asgi/policy.py): every option is declared
once, checked at registration, documented from its declaration and merged with the
dispatcher's settings in one function."""

from __future__ import annotations

import pytest

from agentfn_asgi import ConfigurationError, DispatchSettings, FunctionTools, ToolDefinitionError
from agentfn_asgi.dispatch.settings import check_limits, resolve
from agentfn_asgi.policy import (
    DEFAULT_MAX_WAIT,
    DEFINITION_OPTIONS,
    POLICY_OPTIONS,
    RetryPolicy,
    ToolPolicy,
    parse_rate,
)
from agentfn_asgi.tools import ToolOptions


def _lookup(key: str) -> str:
    """Look a key up."""
    return key


def test_the_options_are_the_definition_options_and_the_policy_fields() -> None:
    """Typing's TypedDict and the policy cannot drift apart: same names, each documented."""
    assert set(ToolOptions.__optional_keys__) == {*DEFINITION_OPTIONS, *POLICY_OPTIONS}
    doc = ToolOptions.__doc__ or ""
    for name in (*DEFINITION_OPTIONS, *POLICY_OPTIONS):
        assert f"``{name}``:" in doc


def test_registration_builds_the_policy() -> None:
    """The run options land in the tool's policy; the old attributes read through it."""
    tools = FunctionTools()
    tool = tools.add(_lookup, timeout=5, in_doubt="hold", max_attempts=2, retry=4)
    assert tool.policy == ToolPolicy(
        timeout=5.0, in_doubt="hold", max_attempts=2, retry=RetryPolicy(attempts=4)
    )
    assert tool.timeout == 5.0 and not tool.side_effects and tool.reconcile is None


def test_resolve_merges_the_tool_over_the_settings() -> None:
    """A tool's own value wins; None takes the dispatcher's setting."""
    settings = DispatchSettings(default_timeout=9.0, in_doubt="fail", max_attempts=7)
    plain = resolve(ToolPolicy(), settings)
    assert (plain.timeout, plain.in_doubt, plain.max_attempts) == (9.0, "fail", 7)
    own = resolve(ToolPolicy(timeout=1.0, in_doubt="hold", max_attempts=2), settings)
    assert (own.timeout, own.in_doubt, own.max_attempts) == (1.0, "hold", 2)


@pytest.mark.parametrize(
    ("options", "pattern"),
    [
        ({"in_doubt": "later"}, "in_doubt must be 'fail' or 'hold'"),
        ({"max_attempts": 0}, "max_attempts must be a whole number of at least 1"),
        ({"max_attempts": True}, "max_attempts must be a whole number"),
        ({"retry": "often"}, "retry must be a RetryPolicy"),
        ({"retry": 3, "side_effects": True}, r"raise RetryLater\(after=\.\.\.\)"),
        ({"job_deadline": 0}, "job_deadline must be a positive number of seconds"),
        ({"concurrency": 0}, "concurrency=0 would never run a call; set concurrency=1 or more"),
        ({"concurrency": 1.5}, "concurrency must be a whole number of at least 1"),
        ({"rate": "0/s"}, r"rate='0/s' would never run a call; give a positive rate"),
        ({"rate": 0}, "rate=0 would never run a call"),
        ({"rate": "5/day"}, r"unknown unit 'day': use a rate such as '5/s'"),
        ({"rate": "many/s"}, r"'many' is not a number"),
        ({"rate": "-1/s"}, r"'-1/s' is not a rate such as"),
        ({"rate": True}, r"True is not a rate such as"),
        ({"rate": "2/s", "burst": 0}, "burst must be a whole number of at least 1"),
        ({"burst": 2}, r"burst= only applies with rate=; add rate='N/s'"),
        ({"concurrency": 2, "burst": 2}, r"burst= only applies with rate="),
        ({"max_wait": 10}, "max_wait= only applies with concurrency= or rate="),
        ({"concurrency_key": lambda c, a: "k"}, "concurrency_key= only applies with"),
        ({"concurrency": 1, "concurrency_key": "tenant"}, "concurrency_key must be callable"),
        ({"concurrency": 1, "max_wait": 0}, "max_wait must be a positive number of seconds"),
        (
            {"max_calls_per_session": 0},
            "max_calls_per_session must be a whole number of at least 1",
        ),
        ({"max_calls_per_session": 2.5}, "max_calls_per_session must be a whole number"),
        ({"max_calls_per_session": True}, "max_calls_per_session must be a whole number"),
        (
            {"concurrency": 1, "enqueue": lambda job: None},
            "a queued tool's worker is limited by its queue",
        ),
        ({"rate": "1/s", "enqueue": lambda job: None}, "drop them or drop enqueue="),
    ],
)
def test_bad_run_options_are_refused_naming_the_fix(
    options: dict[str, object], pattern: str
) -> None:
    """Each run option is checked by its declaration; combinations that cannot work too."""
    with pytest.raises(ToolDefinitionError, match=pattern):
        FunctionTools().add(_lookup, **options)  # type: ignore[arg-type]


def test_retry_policy_backoff_doubles_up_to_the_cap_and_jitter_only_shortens() -> None:
    """0.2 s doubling: 0.2, 0.4, 0.8; capped by max_backoff; jitter never lengthens a wait."""
    policy = RetryPolicy(attempts=4, initial_backoff=0.2, max_backoff=0.5, jitter=0.5)
    assert [policy.backoff(n, random=0.0) for n in (1, 2, 3)] == [0.2, 0.4, 0.5]
    assert policy.backoff(1, random=0.999) == pytest.approx(0.1, abs=1e-3)
    assert all(0.25 <= policy.backoff(3) <= 0.5 for _ in range(100))
    with pytest.raises(ToolDefinitionError, match="attempts must be at least 1"):
        RetryPolicy(attempts=0)


@pytest.mark.parametrize(
    ("tool_timeout", "deadline", "default_timeout", "pattern"),
    [
        (30.0, 10.0, 300.0, r"retry deadline \(10 s\) is shorter than one attempt may run \(30 s"),
        (None, 10.0, 300.0, r"\(300 s, the app's default_timeout\)"),
        (None, 10.0, None, r"\(no timeout, the app's default_timeout\)"),
    ],
)
def test_a_retry_deadline_shorter_than_the_timeout_is_refused_at_start_up(
    tool_timeout: float | None, deadline: float, default_timeout: float | None, pattern: str
) -> None:
    """One line naming the tool, both numbers and the fix."""
    tools = FunctionTools()
    tools.add(_lookup, timeout=tool_timeout, retry=RetryPolicy(deadline=deadline))
    settings = DispatchSettings(default_timeout=default_timeout)
    with pytest.raises(ConfigurationError, match=pattern) as caught:
        check_limits(((t.name, t.policy) for t in tools), settings)
    assert "\n" not in str(caught.value) and "RetryPolicy(deadline=...)" in str(caught.value)
    if tool_timeout is None:  # the same tool under a shorter default works
        check_limits(((t.name, t.policy) for t in tools), DispatchSettings(default_timeout=5.0))


@pytest.mark.parametrize(
    ("rate", "per_second"),
    [("5/s", 5.0), ("30/min", 0.5), ("90 / h", 0.025), ("2.5/s", 2.5), (3, 3.0), (0.5, 0.5)],
)
def test_a_rate_is_kept_in_tokens_per_second(rate: str | float, per_second: float) -> None:
    assert parse_rate(rate) == pytest.approx(per_second)
    tool = FunctionTools().add(_lookup, rate=rate)
    assert tool.policy.rate == pytest.approx(per_second)


def test_the_flow_control_defaults_and_what_the_dispatcher_merges() -> None:
    """burst 1 (never more than the rate in any window), max_wait 300 s for a limited tool,
    None (no bound) when asked; a tool without limits has no wait to bound."""
    limited = FunctionTools().add(_lookup, concurrency=3)
    assert (limited.policy.burst, limited.policy.max_wait) == (1, DEFAULT_MAX_WAIT)
    assert DEFAULT_MAX_WAIT == 300.0 and limited.policy.limited
    assert resolve(limited.policy, DispatchSettings()).max_wait == 300.0
    unbounded = FunctionTools().add(_lookup, rate="1/s", burst=5, max_wait=None)
    assert (
        unbounded.policy.burst == 5
        and resolve(unbounded.policy, DispatchSettings()).max_wait is None
    )
    plain = FunctionTools().add(_lookup)
    assert not plain.policy.limited and resolve(plain.policy, DispatchSettings()).max_wait is None
    assert "(default 300.0)" in (ToolOptions.__doc__ or "")
