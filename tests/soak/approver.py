"""The soak's approver: a person at the terminal, deciding the waiting approval requests.

While the soak runs (and drains), :class:`Approver` lists the waiting requests with the CLI
(``agentfn-asgi approvals --json``) every :data:`POLL_SECONDS` and decides each with the CLI
too (``approvals approve ID --as soak`` or ``approvals deny ID --reason ... --as soak``), as
subprocesses with the replicas' environment: the same store, the same (fake) Agents API a
denial is submitted to. Whether a call is approved or denied is drawn from the seed and the
call id (:func:`decision_for`), so a seed replays its decisions; each decision is recorded
before its command runs, so the checker knows what was asked even if the command's own exit
is lost. A refusal (exit 1: decided already) is expected when a request is listed again
before its decision shows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sys
from dataclasses import dataclass, field

__all__ = ["POLL_SECONDS", "Approver", "Decision", "decision_for"]

#: Seconds between two listings of the waiting requests.
POLL_SECONDS = 2.0

#: How long one CLI command may take before it is given up (and tried again later).
COMMAND_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Decision:
    """What the approver decided for one call: approve, or deny with ``reason``."""

    approve: bool
    reason: str | None = None


def decision_for(seed: int, call_id: str) -> Decision:
    """The decision for ``call_id`` under ``seed``: approve about four in five."""
    if random.Random(f"approver-{seed}-{call_id}").random() < 0.8:
        return Decision(approve=True)
    return Decision(approve=False, reason=f"soak denies {call_id}")


@dataclass(slots=True)
class Approver:
    """Decides every waiting request it lists, with the CLI, until cancelled."""

    seed: int
    env: dict[str, str]
    decisions: dict[str, Decision] = field(default_factory=dict)
    """call id → the decision asked for (recorded before the command ran)."""
    errors: list[str] = field(default_factory=list)
    """Commands that failed otherwise than with a refusal (tried again at the next look)."""
    refused: int = 0
    commands: int = 0
    _done: set[str] = field(default_factory=set)

    async def run(self) -> None:
        """List and decide every :data:`POLL_SECONDS` until cancelled."""
        while True:
            await self.look()
            await asyncio.sleep(POLL_SECONDS)

    async def look(self) -> None:
        """One listing, and a decision for each waiting request not decided yet."""
        code, out, err = await self._cli("approvals", "--json", "--limit", "500")
        if code != 0:
            self.errors.append(f"approvals --json exit {code}: {err.strip()[-200:]}")
            return
        try:
            waiting = json.loads(out)
        except ValueError:
            self.errors.append(f"approvals --json printed no JSON: {out[:200]!r}")
            return
        for request in waiting:
            approval_id, call_id = str(request["approval_id"]), str(request["call_id"])
            if approval_id in self._done:
                continue
            decision = decision_for(self.seed, call_id)
            self.decisions[call_id] = decision
            if decision.approve:
                args = ["approvals", "approve", approval_id, "--as", "soak"]
            else:
                assert decision.reason is not None
                args = ["approvals", "deny", approval_id, "--reason", decision.reason]
                args += ["--as", "soak"]
            code, _, err = await self._cli(*args)
            if code == 0 or (code == 1 and "refused" in err):
                self.refused += code
                self._done.add(approval_id)
            else:
                self.errors.append(f"{' '.join(args[:2])} {call_id} exit {code}: {err[-200:]}")

    async def _cli(self, *args: str) -> tuple[int, str, str]:
        self.commands += 1
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agentfn_asgi",
            *args,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT)
        except TimeoutError:
            await _stop(process)
            return -1, "", "timed out"
        except asyncio.CancelledError:
            await _stop(process)
            raise
        assert process.returncode is not None
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Kill ``process`` if it still runs and reap it."""
    # It may have ended meanwhile: once its transport is closed, kill() raises
    # ProcessLookupError (the likely cause of a PostgreSQL soak ending with one at the end).
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()
