"""The app the crash matrix runs under uvicorn in a child process (never imported by pytest).

Three tools, one per kind the in-doubt policy treats differently; each appends one line to
a JSON-lines ledger (its "side effect") and then passes ``crash_point("during_handler")``,
so a SIGKILL there lands after the side effect and before any result exists:

- ``lookup``: plain (no side effects): re-run when in doubt (at-least-once);
- ``refund_reconciled``: side effects, with a ``reconcile`` hook that reads the ledger;
- ``refund_unreconciled``: side effects, no hook: quarantined when in doubt.

Configuration comes from the environment like any deployment (``OPENAI_API_KEY``,
``OPENAI_BASE_URL``, ``OPENAI_WEBHOOK_SECRET``, ``AGENTFN_STORE_URL``) plus
``AGENTFN_TEST_LEDGER`` (the ledger path) and ``AGENTFN_CRASH_AT`` (where to die).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentfn_asgi._crash import crash_point
from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.tools import FunctionTools, NotRun, Ran, ToolContext

__all__ = [
    "LEDGER_ENV",
    "PLAIN",
    "RECONCILED",
    "SETTINGS",
    "UNRECONCILED",
    "app",
    "build_tools",
    "read_ledger",
]

LEDGER_ENV = "AGENTFN_TEST_LEDGER"
PLAIN = "lookup"
RECONCILED = "refund_reconciled"
UNRECONCILED = "refund_unreconciled"

#: Short leases so an in-doubt call is taken over about a second after the crash.
SETTINGS = DispatchSettings(
    lease_seconds=1.0, recovery_interval=0.2, recovery_grace=0.2, retry_base=0.05
)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    """Every ledger entry, in order (an absent file is an empty ledger)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _append(path: Path, ctx: ToolContext, order_id: str) -> None:
    # Closed at once: the line is in the kernel before the SIGKILL can land.
    with path.open("a") as ledger:
        entry = {
            "tool": ctx.tool_name,
            "call_id": ctx.call_id,
            "order_id": order_id,
            "attempt": ctx.attempt,
            "key": ctx.idempotency_key,
        }
        ledger.write(json.dumps(entry) + "\n")


def build_tools(ledger: Path) -> FunctionTools:
    """The three tools (see the module docstring), writing to ``ledger``."""
    tools = FunctionTools()

    @tools.function(name=PLAIN)
    def lookup(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Look an order up (sync: runs in the thread pool)."""
        _append(ledger, ctx, order_id)
        crash_point("during_handler", PLAIN)
        return {"order_id": order_id, "status": "shipped"}

    def reconcile(ctx: ToolContext, arguments: dict[str, Any]) -> Ran | NotRun:
        for entry in read_ledger(ledger):
            if entry["tool"] == ctx.tool_name and entry["call_id"] == ctx.call_id:
                return Ran({"refund_id": f"rf_{ctx.call_id}", "order_id": entry["order_id"]})
        return NotRun()

    @tools.function(name=RECONCILED, side_effects=True, reconcile=reconcile)
    async def refund_reconciled(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Refund an order; the ledger tells whether an in-doubt call already ran."""
        _append(ledger, ctx, order_id)
        crash_point("during_handler", RECONCILED)
        return {"refund_id": f"rf_{ctx.call_id}", "order_id": order_id}

    @tools.function(name=UNRECONCILED, side_effects=True)
    async def refund_unreconciled(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Refund an order with no way to check afterwards."""
        _append(ledger, ctx, order_id)
        crash_point("during_handler", UNRECONCILED)
        return {"refund_id": f"rf_{ctx.call_id}", "order_id": order_id}

    return tools


def _build_app() -> AgentWebhookApp | None:
    ledger = os.environ.get(LEDGER_ENV)
    if ledger is None:
        return None  # imported for its names (by the tests), not served
    return AgentWebhookApp(build_tools(Path(ledger)), settings=SETTINGS)


#: Served by ``uvicorn tests.reliability.crash_app:app`` (lifespan on: start-up recovery).
app = _build_app()
