"""Checking the page's query strings and forms: durations, filters, settle requests."""

from __future__ import annotations

import pytest

from agentfn_asgi.admin.forms import (
    CallQuery,
    FormError,
    SettleRequest,
    parse_duration,
    parse_pairs,
)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("15m", 900), ("2h", 7200), ("3d", 259200), ("1w", 604800)]
)
def test_durations_the_cli_accepts(text: str, seconds: float) -> None:
    """The same duration syntax as ``agentfn-asgi calls --since``."""
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "m", "-5m", "1.5h", "2 hours", "1e9d", "9999999999s"])
def test_bad_durations_are_refused_with_the_syntax(text: str) -> None:
    """A duration that is not NUMBER+UNIT is refused, saying what is expected."""
    with pytest.raises(FormError, match="like 15m, 2h or 3d"):
        parse_duration(text)


def test_call_query_turns_since_into_a_time_and_keeps_links_stable() -> None:
    """``since`` counts back from the page's clock; ``params`` reproduces the filters."""
    query = CallQuery.parse(
        {"state": "in_doubt", "session": " s1 ", "tool": "t", "since": "2h", "limit": "10"}
    )
    flt = query.to_filter(now=10_000.0)
    assert (flt.state, flt.session_id, flt.tool_name, flt.since, flt.limit) == (
        "in_doubt",
        "s1",
        "t",
        10_000.0 - 7200,
        10,
    )
    assert query.params(cursor="c2") == {
        "state": "in_doubt",
        "session": "s1",
        "tool": "t",
        "since": "2h",
        "limit": "10",
        "cursor": "c2",
    }
    assert CallQuery.parse({"state": "", "limit": ""}).params() == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"state": "running"}, "unknown state"),
        ({"since": "yesterday"}, "'since' must be"),
        ({"limit": "0"}, "from 1 to 500"),
        ({"limit": "501"}, "from 1 to 500"),
        ({"limit": "ten"}, "from 1 to 500"),
        ({"session": "s" * 513}, "longer than 512"),
    ],
)
def test_call_query_refusals_say_why(fields: dict[str, str], message: str) -> None:
    """Each refused filter names the field and what it accepts."""
    with pytest.raises(FormError, match=message):
        CallQuery.parse(fields)


def test_parse_pairs_refuses_bad_percent_escapes_and_floods() -> None:
    """Invalid UTF-8 escapes and too many fields are a 400, not an exception."""
    assert parse_pairs("a=1&a=2&b=%3Cx%3E") == {"a": "1", "b": "<x>"}
    with pytest.raises(FormError):
        parse_pairs("a=%ff%fe")
    with pytest.raises(FormError):
        parse_pairs("&".join(f"f{i}=1" for i in range(100)))


def test_settle_output_is_json_when_it_parses_else_text() -> None:
    """The CLI's JSON_OR_TEXT rule; NaN and JSON null stay text."""

    def output(value: str) -> object:
        request = SettleRequest.parse(
            {"call": "c", "session": "s", "mode": "output", "value": value}
        )
        return request.output()

    assert output('{"refund_id": "r1"}') == {"refund_id": "r1"}
    assert output("42") == 42
    assert output("refunded by hand") == "refunded by hand"
    assert output("NaN") == "NaN"
    assert output("null") == "null"


def test_settle_requests_need_a_call_a_mode_and_error_text() -> None:
    """Missing call/session, unknown mode, or an empty error are refused; a re-run drops any
    text; only ``confirm=yes`` confirms."""
    base = {"call": "c", "session": "s"}
    with pytest.raises(FormError, match="the call and its session"):
        SettleRequest.parse({"mode": "rerun"})
    with pytest.raises(FormError, match="output, error or rerun"):
        SettleRequest.parse({**base, "mode": "delete"})
    with pytest.raises(FormError, match="error text"):
        SettleRequest.parse({**base, "mode": "error", "value": "  "})
    rerun = SettleRequest.parse({**base, "mode": "rerun", "value": "ignored", "confirm": "yes"})
    assert (rerun.value, rerun.confirmed) == ("", True)
    assert not SettleRequest.parse({**base, "mode": "rerun", "confirm": "1"}).confirmed
