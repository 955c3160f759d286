"""The demo's tools, which the examples serve too: their definitions, the refund's and the
account closure's ledger lines and reconcile hooks, and the ledger's whole-line appends."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.demo.tools import (
    CAPPED_CALLS,
    LIMITED_CONCURRENCY,
    ExampleResources,
    Ledger,
    build_tools,
    tools,
)
from agentfn_asgi.errors import ToolError
from agentfn_asgi.tools import NotRun, Ran, ToolContext, derive_idempotency_key


def _context(call_id: str, ledger: Ledger) -> ToolContext:
    return ToolContext(
        session_id="sess_1",
        turn_id="turn_1",
        call_id=call_id,
        tool_name="create_refund",
        attempt=1,
        deadline=None,
        idempotency_key=derive_idempotency_key("sess_1", "turn_1", call_id),
        resources=ExampleResources(ledger=ledger),
    )


def test_definitions_match_the_contract() -> None:
    """The tools, their parameters, create_refund declared with side effects and
    close_account with side effects and approval (the examples' contract, issue 23)."""
    definitions = {d["name"]: d for d in tools.definitions()}
    assert set(definitions) == {
        "get_customer",
        "create_refund",
        "slow_echo",
        "close_account",
        "flaky_lookup",
        "limited_echo",
        "capped_lookup",
        "long_task",
        "long_task_sync",
    }
    capped = tools.get("capped_lookup")
    assert capped is not None and capped.policy.max_calls_per_session == CAPPED_CALLS == 3
    assert definitions["capped_lookup"]["parameters"]["required"] == ["key"]
    close = tools.get("close_account")
    assert close is not None and close.side_effects and close.approval is True
    assert close.reconcile is not None
    assert definitions["close_account"]["parameters"]["required"] == ["account_id"]
    assert definitions["get_customer"]["description"] == "Look up a customer by ID."
    assert definitions["get_customer"]["parameters"]["required"] == ["customer_id"]
    assert definitions["create_refund"]["parameters"]["properties"]["amount_cents"]["type"] == (
        "integer"
    )
    refund = tools.get("create_refund")
    assert refund is not None
    assert refund.side_effects
    assert refund.reconcile is not None


@pytest.mark.anyio
async def test_refund_writes_one_line_and_reconcile_reads_it(tmp_path: Path) -> None:
    """A real refund appends one ``{call_id, order_id, amount_cents}`` line; reconcile then
    answers ``Ran`` with the same result, and ``NotRun`` for a call that never ran."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    refund = tools.get("create_refund")
    assert refund is not None
    args = refund.parse_arguments({"order_id": "ord_1", "amount_cents": 1500})
    ran_ctx = _context("call_1", ledger)
    result = await refund.invoke(args, ran_ctx)
    assert result["order_id"] == "ord_1"
    assert result["amount_cents"] == 1500
    assert result["refund_id"].startswith("re_")
    assert ledger.entries() == [{"call_id": "call_1", "order_id": "ord_1", "amount_cents": 1500}]
    assert await refund.run_reconcile(args, ran_ctx) == Ran(result)
    assert await refund.run_reconcile(args, _context("call_2", ledger)) == NotRun()


@pytest.mark.anyio
async def test_close_account_writes_its_ledger_line_and_reconcile_reads_it(tmp_path: Path) -> None:
    """A real closure appends ``{call_id, account_id, tool}`` and answers ``{"closed": true,
    ...}``; reconcile answers ``Ran`` with the same result, ``NotRun`` otherwise (a refund's
    line for the same call id included)."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    close = tools.get("close_account")
    assert close is not None
    args = close.parse_arguments({"account_id": "acc_9"})
    result = await close.invoke(args, _context("call_1", ledger))
    assert result == {"closed": True, "account_id": "acc_9"}
    assert ledger.entries() == [
        {"call_id": "call_1", "account_id": "acc_9", "tool": "close_account"}
    ]
    assert await close.run_reconcile(args, _context("call_1", ledger)) == Ran(result)
    assert await close.run_reconcile(args, _context("call_2", ledger)) == NotRun()


@pytest.mark.anyio
async def test_refund_of_zero_is_a_tool_error_and_writes_nothing(tmp_path: Path) -> None:
    """``amount_cents <= 0`` raises ToolError before any side effect."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    refund = tools.get("create_refund")
    assert refund is not None
    args = refund.parse_arguments({"order_id": "ord_1", "amount_cents": 0})
    with pytest.raises(ToolError, match="must be positive"):
        await refund.invoke(args, _context("call_1", ledger))
    assert ledger.entries() == []


def test_ledger_lines_never_interleave(tmp_path: Path) -> None:
    """Concurrent appenders (threads here, processes in production) each write whole lines;
    a torn last line is skipped by readers."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    padding = "x" * 2000

    def append_many(worker: int) -> None:
        for i in range(50):
            ledger.append({"call_id": f"c{worker}_{i}", "order_id": padding, "amount_cents": i})

    threads = [threading.Thread(target=append_many, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with ledger.path.open("a", encoding="utf-8") as handle:
        handle.write('{"call_id": "torn"')
    entries = ledger.entries()
    assert len(entries) == 400
    assert len({e["call_id"] for e in entries}) == 400
    assert ledger.find("torn") is None


def test_build_tools_gives_independent_registries() -> None:
    """Each call builds a fresh registry (Django adds a tool to its own copy)."""
    assert build_tools() is not tools
    assert [t.name for t in build_tools()] == [t.name for t in tools]


@pytest.mark.anyio
async def test_refund_waits_delay_ms_before_its_side_effect(tmp_path: Path) -> None:
    """``delay_ms`` (default 0) is waited *before* the ledger line: a refund cancelled
    during the wait (its holder lost the lease) leaves no line, so reconcile says ``NotRun``.
    """
    ledger = Ledger(tmp_path / "ledger.jsonl")
    refund = tools.get("create_refund")
    assert refund is not None
    definition = next(d for d in tools.definitions() if d["name"] == "create_refund")
    assert "delay_ms" not in definition["parameters"].get("required", [])
    args = refund.parse_arguments({"order_id": "ord_1", "amount_cents": 1500, "delay_ms": 60000})
    ctx = _context("call_1", ledger)
    with anyio.move_on_after(0.05) as scope:
        await refund.invoke(args, ctx)
    assert scope.cancelled_caught
    assert ledger.entries() == []
    assert await refund.run_reconcile(args, ctx) == NotRun()
    quick = refund.parse_arguments({"order_id": "ord_1", "amount_cents": 1500, "delay_ms": 1})
    assert (await refund.invoke(quick, ctx))["order_id"] == "ord_1"
    assert [e["call_id"] for e in ledger.entries()] == ["call_1"]


@pytest.mark.anyio
async def test_capped_lookup_writes_its_line_and_returns_the_key(tmp_path: Path) -> None:
    """``capped_lookup`` appends exactly ``{call_id, tool}`` and returns ``{"key": key}``."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    capped = tools.get("capped_lookup")
    assert capped is not None
    args = capped.parse_arguments({"key": "k1"})
    assert await capped.invoke(args, _context("call_1", ledger)) == {"key": "k1"}
    assert ledger.entries() == [{"call_id": "call_1", "tool": "capped_lookup"}]


@pytest.mark.anyio
async def test_limited_echo_writes_its_interval_and_echoes(tmp_path: Path) -> None:
    """``limited_echo`` waits ``delay_ms`` without blocking others (two 200 ms calls at
    once overlap: each starts before the other ends), then appends one
    ``{call_id, tool, start, end}`` line (Unix times around the wait) and echoes the text."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    echo = tools.get("limited_echo")
    assert echo is not None
    answers: dict[str, str] = {}

    async def call(call_id: str, text: str) -> None:
        args = echo.parse_arguments({"text": text, "delay_ms": 200})
        answers[call_id] = await echo.invoke(args, _context(call_id, ledger))

    before = time.time()
    async with anyio.create_task_group() as group:
        group.start_soon(call, "call_1", "left")
        group.start_soon(call, "call_2", "right")
    after = time.time()
    assert answers == {"call_1": "left", "call_2": "right"}
    lines = sorted(ledger.entries(), key=lambda e: e["call_id"])
    assert [(e["call_id"], e["tool"]) for e in lines] == [
        ("call_1", "limited_echo"),
        ("call_2", "limited_echo"),
    ]
    for entry in lines:
        assert set(entry) == {"call_id", "tool", "start", "end"}
        assert before <= entry["start"] and entry["start"] + 0.2 <= entry["end"] <= after
    # Not a bound on the wall time (a stalled machine breaks that): the two waits overlap.
    assert max(e["start"] for e in lines) < min(e["end"] for e in lines)


def test_limited_echo_runs_two_at_once_and_example_rate_adds_a_rate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``concurrency=2``; without ``EXAMPLE_RATE`` no rate, with ``EXAMPLE_RATE=5/s`` that
    rate with a burst of 1 (read when the registry is built)."""
    echo = tools.get("limited_echo")
    assert echo is not None
    monkeypatch.delenv("EXAMPLE_RATE", raising=False)
    plain = build_tools().get("limited_echo")
    assert plain is not None
    assert plain.policy.concurrency == LIMITED_CONCURRENCY == 2
    assert plain.policy.rate is None
    monkeypatch.setenv("EXAMPLE_RATE", "5/s")
    rated = build_tools().get("limited_echo")
    assert rated is not None
    assert (rated.policy.concurrency, rated.policy.rate, rated.policy.burst) == (2, 5.0, 1)
    definition = next(d for d in tools.definitions() if d["name"] == "limited_echo")
    assert definition["parameters"]["required"] == ["text", "delay_ms"]


@pytest.mark.anyio
async def test_long_task_cancelled_as_its_sleep_ends_still_says_how_its_run_ended(
    tmp_path: Path,
) -> None:
    """A cancellation that comes due together with the end of long_task's sleep (a replica
    resumed after SIGSTOP: the sleep and the lease's fence are both overdue) still leaves
    the line saying how the run ended; it used to land on the thread hop of the ``end``
    line and leave a run with a ``start`` and nothing else (found by the soak)."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    long_task = tools.get("long_task")
    assert long_task is not None
    arguments = long_task.parse_arguments({"seconds": 0.05})
    scope = anyio.CancelScope()

    async def run() -> None:
        with scope:
            await long_task.invoke(arguments, _context("call_1", ledger))

    task = asyncio.get_running_loop().create_task(run())
    while not ledger.entries():
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)  # in its sleep now
    asyncio.get_running_loop().call_later(0.06, scope.cancel)
    # The whole loop stopped (as SIGSTOP stops it): both come due in the same iteration.
    time.sleep(0.2)  # noqa: ASYNC251
    await task
    phases = [entry["phase"] for entry in ledger.entries()]
    assert phases in (["start", "end"], ["start", "cancelled"]), phases
