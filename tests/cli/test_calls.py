"""``calls``, ``calls show``, ``calls settle``, ``deliveries`` and ``status`` by id: real
SQLite stores in a temp folder, the fake Agents API over loopback, the CLI's own ``main``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.calls.records import CallKey, SavedResult
from agentfn_asgi.cli import main
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

HOUR = 3600.0
TOOLS = "agentfn_asgi.demo.tools:tools"


async def run_cli(*argv: str) -> int:
    """Run ``main`` in a worker thread: it calls ``asyncio.run`` itself."""
    return await anyio.to_thread.run_sync(main, list(argv))


async def seed(url: str, *, age: float = HOUR) -> None:
    """A store an operator has to look at: a quarantined call, an in-doubt one (its lease
    ran out an hour ago), a running one, a submitted success, a submitted failure, and a
    delivery the sweep keeps failing on. Everything happened ``age`` seconds ago."""
    past = open_store(url, clock=lambda: time.time() - age)
    await past.open()
    try:
        await past.record_delivery("wh_ok", "sess_a")
        await past.mark_delivery_resolved("wh_ok")
        await past.record_delivery("wh_bad", "sess_gone")
        await past.delivery_failed("wh_bad", error="404 session not found", retry_at=time.time())
        await past.delivery_failed("wh_bad", error="404 session not found", retry_at=time.time())

        held = CallKey("sess_a", "turn_1", "call_held")
        await past.claim_call(held, tool_name="create_refund", owner="r1", lease_seconds=30)
        await past.quarantine(held, owner="r1", attempt=1, reason="in doubt: no reconcile hook")

        doubt = CallKey("sess_a", "turn_1", "call_doubt")
        await past.claim_call(doubt, tool_name="get_customer", owner="r1", lease_seconds=30)

        done = CallKey("sess_b", "turn_1", "call_done")
        await past.claim_call(done, tool_name="get_customer", owner="r1", lease_seconds=30)
        await past.save_result(
            done, owner="r1", attempt=1, result=SavedResult(True, '{"output":"{}"}', "k1")
        )
        await past.mark_submitted(done)

        failed = CallKey("sess_b", "turn_1", "call_failed")
        await past.claim_call(failed, tool_name="create_refund", owner="r1", lease_seconds=30)
        await past.save_result(
            failed,
            owner="r1",
            attempt=1,
            result=SavedResult(False, '{"error":"no"}', "k2", error_type="ValueError"),
        )
        await past.mark_submitted(failed)
    finally:
        await past.close()
    now = open_store(url)
    await now.open()
    try:
        running = CallKey("sess_b", "turn_2", "call_running")
        await now.claim_call(running, tool_name="get_customer", owner="r2", lease_seconds=600)
    finally:
        await now.close()


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'store.sqlite3'}"


# -- calls -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_calls_lists_one_line_per_call_with_state_and_error(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``calls`` prints a header and one line per call; expired claims show as in doubt."""
    await seed(store_url)
    assert await run_cli("calls", "--store", store_url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "SESSION",
        "TURN",
        "CALL",
        "TOOL",
        "STATE",
        "ATTEMPT",
        "AGE",
        "ERROR",
    ]
    rows = {line.split()[2]: line.split() for line in lines[1:]}
    assert set(rows) == {"call_held", "call_doubt", "call_done", "call_failed", "call_running"}
    assert rows["call_held"][4] == "quarantined"
    assert rows["call_doubt"][4] == "in_doubt"
    assert rows["call_running"][4] == "claimed"
    assert rows["call_failed"][-1] == "ValueError"


@pytest.mark.anyio
async def test_calls_json_and_filters(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--json`` gives objects with the documented keys; ``--state``, ``--session``,
    ``--tool``, ``--since`` and ``--limit`` narrow the list."""
    await seed(store_url)

    async def listed(*flags: str) -> list[dict[str, object]]:
        assert await run_cli("calls", "--store", store_url, "--json", *flags) == 0
        found = json.loads(capsys.readouterr().out)
        assert isinstance(found, list)
        return found

    everything = await listed()
    for key in ("session_id", "turn_id", "call_id", "tool_name", "state", "attempt", "error_type"):
        assert all(key in call for call in everything)
    assert [c["call_id"] for c in await listed("--state", "in_doubt")] == ["call_doubt"]
    assert {c["call_id"] for c in await listed("--session", "sess_b")} == {
        "call_done",
        "call_failed",
        "call_running",
    }
    assert {c["call_id"] for c in await listed("--tool", "create_refund")} == {
        "call_held",
        "call_failed",
    }
    assert [c["call_id"] for c in await listed("--since", "10m")] == ["call_running"]
    assert len(await listed("--limit", "2")) == 2


@pytest.mark.anyio
async def test_calls_usage_mistakes(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad ``--since`` and an unknown state are usage mistakes (exit 2), the first with
    the expected form."""
    await seed(store_url)
    assert await run_cli("calls", "--store", store_url, "--since", "yesterday") == 2
    err = capsys.readouterr().err
    assert "15m" in err or "duration" in err
    assert "Traceback" not in err
    with pytest.raises(SystemExit) as exit_info:
        main(["calls", "--store", store_url, "--state", "lost"])
    assert exit_info.value.code == 2


# -- calls show ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_show_prints_the_timeline_and_how_to_settle(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``calls show`` prints the call's history (claimed by its owner, then quarantined with
    the reason) and, for a held call, the settle command."""
    await seed(store_url)
    assert await run_cli("calls", "show", "call_held", "--store", store_url) == 0
    out = capsys.readouterr().out
    assert "create_refund" in out
    assert "quarantined" in out
    kinds = [line.split()[2] for line in out.splitlines() if line[:4].isdigit()]
    assert kinds[0] in ("seen", "claimed")
    assert "quarantined" in kinds
    assert "no reconcile hook" in out
    assert "agentfn-asgi calls settle call_held --session sess_a" in out

    assert await run_cli("calls", "show", "call_done", "--store", store_url, "--json") == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["summary"]["state"] == "submitted"
    assert detail["settleable"] is False
    assert [e["kind"] for e in detail["history"]][-1] == "submitted"


@pytest.mark.anyio
async def test_show_unknown_and_ambiguous_ids(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown id is exit 1 naming it; an id in two sessions asks for ``--session``."""
    await seed(store_url)
    store = open_store(store_url)
    await store.open()
    await store.claim_call(
        CallKey("sess_z", "turn_9", "call_held"), tool_name="x", owner="o", lease_seconds=5
    )
    await store.close()
    assert await run_cli("calls", "show", "call_nope", "--store", store_url) == 1
    assert "no call call_nope" in capsys.readouterr().err
    assert await run_cli("calls", "show", "call_held", "--store", store_url) == 1
    err = capsys.readouterr().err
    assert "sess_a" in err and "sess_z" in err and "session" in err
    assert "Traceback" not in err
    assert (
        await run_cli("calls", "show", "call_held", "--session", "sess_z", "--store", store_url)
        == 0
    )


# -- deliveries and status -------------------------------------------------------------------


@pytest.mark.anyio
async def test_deliveries_show_the_sweeps_failures(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``deliveries`` lists both; ``--unresolved`` only the failing one, with its count and
    last error; ``--json`` gives the same fields."""
    await seed(store_url)
    assert await run_cli("deliveries", "--store", store_url) == 0
    out = capsys.readouterr().out
    assert "wh_ok" in out and "wh_bad" in out
    assert await run_cli("deliveries", "--unresolved", "--store", store_url) == 0
    out = capsys.readouterr().out
    assert "wh_ok" not in out
    assert "failed 2x: 404 session not found" in out
    assert await run_cli("deliveries", "--unresolved", "--json", "--store", store_url) == 0
    (only,) = json.loads(capsys.readouterr().out)
    assert only["delivery_id"] == "wh_bad"
    assert only["attempts"] == 2


@pytest.mark.anyio
async def test_status_names_the_calls_that_need_a_person(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``status`` counts successes and failures apart, names in-doubt and quarantined calls
    by id, and the delivery the sweep keeps failing on."""
    await seed(store_url)
    assert await run_cli("status", "--store", store_url) == 0
    out = capsys.readouterr().out
    assert "1 succeeded, 1 failed" in out
    assert "in_doubt" in out and "call_doubt" in out
    assert "quarantined" in out and "call_held" in out
    assert "wh_bad" in out and "failed 2x" in out
    assert await run_cli("status", "--store", store_url, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert {c["call_id"] for c in report["needs_attention"]} == {"call_held", "call_doubt"}
    assert report["calls_by_state"]["in_doubt"] == 1


# -- calls settle ----------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.slow
async def test_settle_submits_once_and_refuses_what_is_not_owed(
    store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Settling a held call saves the operator's output and submits it once under its key;
    settling it again, or a running call, is refused (exit 1) with the reason."""
    fake = FakeAgentsAPI()
    async with fake, serve_fake(fake) as base_url:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        session_id = fake.create_session(
            [[FakeCall("create_refund", {"order_id": "o1", "amount_cents": 5}, call_id="call_r")]]
        )
        (action,) = fake.required_actions(session_id)
        key = CallKey(session_id, action["turn_id"], "call_r")
        store = open_store(store_url)
        await store.open()
        await store.claim_call(key, tool_name="create_refund", owner="r1", lease_seconds=30)
        await store.quarantine(key, owner="r1", attempt=1, reason="in doubt")
        await store.close()

        code = await run_cli(
            "calls", "settle", "call_r", "--output", '{"refund": "manual"}', "--store", store_url
        )
        out = capsys.readouterr().out
        assert code == 0, out
        assert out.startswith("submitted:")
        (submission,) = fake.submissions
        assert submission.success and json.loads(submission.output) == {"refund": "manual"}

        assert await run_cli("calls", "settle", "call_r", "--error", "x", "--store", store_url) == 1
        assert "refused" in capsys.readouterr().out
        assert len(fake.submissions) == 1

    await seed(store_url)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never reached
    assert (
        await run_cli("calls", "settle", "call_running", "--error", "x", "--store", store_url) == 1
    )
    assert "running" in capsys.readouterr().out


@pytest.mark.anyio
@pytest.mark.parametrize("depth", [201, 100_000])
async def test_settle_refuses_output_nested_too_deeply_in_one_line(
    depth: int, store_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--output`` that is JSON nested deeper than the limit (or than the parser's stack)
    is a usage error: exit 2, the reason on one line, no traceback, the call still held."""
    await seed(store_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # never reached
    deep = "[" * depth + "]" * depth
    code = await run_cli("calls", "settle", "call_held", "--output", deep, "--store", store_url)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert "--output: the output is JSON nested more than 200 levels deep" in captured.err
    store = open_store(store_url)
    await store.open()
    try:
        (held,) = await store.find_calls("call_held")
    finally:
        await store.close()
    assert held.state.value == "quarantined"


@pytest.mark.anyio
@pytest.mark.slow
async def test_settle_rerun_runs_the_handler_with_the_next_attempt(
    tmp_path: Path,
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--rerun`` (with ``--tools``) claims an in-doubt call with the next attempt, runs the
    handler and submits its result; without ``--tools`` it says what is missing."""
    fake = FakeAgentsAPI()
    async with fake, serve_fake(fake) as base_url:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        monkeypatch.setenv("EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
        session_id = fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "123"}, call_id="call_g")]]
        )
        (action,) = fake.required_actions(session_id)
        key = CallKey(session_id, action["turn_id"], "call_g")
        past = open_store(store_url, clock=lambda: time.time() - HOUR)
        await past.open()
        await past.claim_call(key, tool_name="get_customer", owner="r1", lease_seconds=30)
        await past.close()

        assert await run_cli("calls", "settle", "call_g", "--rerun", "--store", store_url) == 2
        assert "--tools" in capsys.readouterr().err

        code = await run_cli(
            "calls", "settle", "call_g", "--rerun", "--tools", TOOLS, "--store", store_url
        )
        out = capsys.readouterr().out
        assert code == 0, out
        assert "attempt 2" in out
        (submission,) = fake.submissions
        assert submission.call_id == "call_g" and submission.success

    assert await run_cli("calls", "show", "call_g", "--store", store_url, "--json") == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["summary"]["state"] == "submitted"
    assert detail["summary"]["attempt"] == 2


@pytest.mark.anyio
async def test_what_tools_and_people_wrote_reaches_the_terminal_escaped(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tool's output and a hold reason carrying terminal escape sequences (clear the
    screen, retitle the window, a carriage return that overwrites the line) were printed
    raw by ``calls`` and ``calls show``: they are shown escaped, lines and tabs kept."""
    hostile = "\x1b[2J\x1b]0;pwned\x07ok\rforged\u202e"
    store = open_store(store_url)
    await store.open()
    try:
        held = CallKey("sess_x", "turn_1", "call_x")
        await store.claim_call(held, tool_name="create_refund", owner="r1", lease_seconds=30)
        await store.quarantine(held, owner="r1", attempt=1, reason=f"held: {hostile}")
        done = CallKey("sess_x", "turn_1", "call_y")
        await store.claim_call(done, tool_name="get_customer", owner="r1", lease_seconds=30)
        output = json.dumps({"output": f"line one\n\t{hostile}"})
        await store.save_result(done, owner="r1", attempt=1, result=SavedResult(True, output, "k"))
    finally:
        await store.close()
    assert await run_cli("calls", "--store", store_url) == 0
    assert await run_cli("calls", "show", "call_x", "--store", store_url) == 0
    assert await run_cli("calls", "show", "call_y", "--store", store_url, "--content") == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\x1b\x07\r\u202e"), repr(out)
    assert "held: \\x1b[2J\\x1b]0;pwned\\x07ok\\x0dforged\\u202e" in out
    assert "line one\n\t\\x1b[2J" in out
