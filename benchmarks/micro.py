"""Micro-benchmarks of the per-call building blocks (``python -m benchmarks.micro``).

Each is timed with :mod:`timeit`-style repetitions: the best of ``repeat`` runs of
``number`` iterations (the least disturbed by other work on a shared machine), reported
in microseconds per operation, with the median of the runs beside it.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentfn_asgi.calls.records import CallKey, SavedResult
from agentfn_asgi.results import encode_output, event_json, success_event
from agentfn_asgi.signing import WebhookVerifier, signed_headers
from agentfn_asgi.store import MemoryStore, SQLiteStore, Store
from agentfn_asgi.tools import FunctionTools
from agentfn_asgi.wire import AgentSession, parse_webhook_event
from benchmarks.handlers import get_customer

__all__ = ["run_micro"]

SECRET = "whsec_" + "a" * 43 + "="

Row = dict[str, float | str]


def _sync(name: str, fn: Callable[[], object], *, number: int, repeat: int = 5) -> Row:
    runs = [t / number * 1e6 for t in timeit.repeat(fn, number=number, repeat=repeat)]
    return {"name": name, "best_us": min(runs), "median_us": statistics.median(runs)}


async def _async(
    name: str, fn: Callable[[int], Awaitable[object]], *, number: int, repeat: int = 5
) -> Row:
    runs = []
    for r in range(repeat):
        started = time.perf_counter()
        for i in range(number):
            await fn(r * number + i)
        runs.append((time.perf_counter() - started) / number * 1e6)
    return {"name": name, "best_us": min(runs), "median_us": statistics.median(runs)}


def _session_body(calls: int) -> bytes:
    return json.dumps(
        {
            "id": "sess_1",
            "object": "agent.session",
            "status": "requires_action",
            "required_actions": [
                {
                    "type": "function_call",
                    "turn_id": "turn_1",
                    "call_id": f"call_{i}",
                    "name": "get_customer",
                    "arguments": {"customer_id": str(i)},
                }
                for i in range(calls)
            ],
        }
    ).encode()


def sync_rows(scale: float = 1.0) -> list[Row]:
    """Signature verification, parsing, argument validation and result encoding."""
    n = max(1, int(2000 * scale))
    body = json.dumps(
        {
            "id": "evt_1",
            "object": "event",
            "created_at": int(time.time()),
            "type": "agent.session.action_required",
            "data": {"id": "sess_1", "required_action": {"type": "function_call"}, "pad": ""},
        }
    ).encode()
    body = body.replace(b'"pad": ""', b'"pad": "' + b"x" * max(0, 1024 - len(body)) + b'"')
    headers = signed_headers(SECRET, body, msg_id="wh_1")
    verifier = WebhookVerifier(SECRET)
    tools = FunctionTools()
    tools.function(get_customer)
    tool = tools.get("get_customer")
    assert tool is not None
    value = {"found": True, "customer": {"id": "cus_1", "name": "Example", "plan": "pro"}}
    one, many = _session_body(1), _session_body(64)
    big = "r" * (4 * 1024 * 1024 - 32 * 1024)
    return [
        _sync("verify signature (1 KiB body)", lambda: verifier.verify(body, headers), number=n),
        _sync("parse webhook envelope", lambda: parse_webhook_event(body), number=n),
        _sync("parse session (1 call)", lambda: AgentSession.model_validate_json(one), number=n),
        _sync(
            "parse session (64 calls)",
            lambda: AgentSession.model_validate_json(many),
            number=max(1, n // 20),
        ),
        _sync(
            "validate arguments (get_customer)",
            lambda: tool.parse_arguments({"customer_id": "123"}),
            number=n,
        ),
        _sync(
            "encode result (dict → tool_result JSON)",
            lambda: event_json(success_event("turn_1", "call_1", encode_output(value))),
            number=n,
        ),
        _sync(
            "encode result (4 MiB str)",
            lambda: event_json(success_event("turn_1", "call_1", encode_output(big))),
            number=max(1, int(20 * scale)),
        ),
    ]


async def store_rows(store: Store, label: str, *, number: int) -> list[Row]:
    """Each store operation, awaited one at a time (no group commit)."""
    await store.open()
    prefix = f"{label}-{time.monotonic_ns()}"
    keys = [CallKey(f"sess_{prefix}_{i}", "turn_1", f"call_{i}") for i in range(6 * number)]
    result = SavedResult(True, '{"type":"agent.session.input.tool_result"}', "afn-submit-x")

    async def record(i: int) -> None:
        await store.record_delivery(f"wh_{prefix}_{i}", keys[i].session_id)

    async def claim(i: int) -> None:
        await store.claim_call(keys[i], tool_name="get_customer", owner="me", lease_seconds=30)

    async def save(i: int) -> None:
        await store.save_result(keys[i], owner="me", attempt=1, result=result)

    async def submitted(i: int) -> None:
        await store.mark_submitted(keys[i])

    async def resolved(i: int) -> None:
        await store.mark_delivery_resolved(f"wh_{prefix}_{i}")

    async def for_session(i: int) -> None:
        await store.calls_for_session(keys[i].session_id)

    rows = []
    for name, fn in (
        ("record_delivery", record),
        ("claim_call", claim),
        ("save_result", save),
        ("mark_submitted", submitted),
        ("mark_delivery_resolved", resolved),
        ("calls_for_session", for_session),
    ):
        rows.append(await _async(f"{label} {name}", fn, number=number, repeat=5))
    await store.close()
    return rows


async def run_micro(scale: float = 1.0) -> list[Row]:
    """Every micro-benchmark; ``scale`` < 1 shortens them (``--quick``)."""
    rows = sync_rows(scale)
    number = max(20, int(400 * scale))
    rows += await store_rows(MemoryStore(), "memory", number=number)
    with tempfile.TemporaryDirectory() as tmp:
        rows += await store_rows(SQLiteStore(str(Path(tmp, "m.sqlite3"))), "sqlite", number=number)
    return rows


def _print(rows: list[Row]) -> None:
    print("| operation | best µs | median µs |\n|---|---:|---:|")
    for row in rows:
        print(f"| {row['name']} | {row['best_us']:.1f} | {row['median_us']:.1f} |")


def main(argv: Any = None) -> None:
    _print(asyncio.run(run_micro()))


if __name__ == "__main__":
    main()
