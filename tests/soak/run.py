"""One soak run: start the replicas and the fake, drive the sessions, let the nemesis loose,
drain, collect the record and check it (:func:`soak`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from agentfn_asgi import DispatchSettings
from agentfn_asgi.demo import free_port
from agentfn_asgi.demo.tools import Ledger
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import (
    FakeAgentsAPI,
    FakeCall,
    FakeConnectionDropped,
    serve_fake,
    webhook_backoff,
)

from ..support.backends import store_url_for
from .approver import Approver
from .checker import History, PlannedCall, Report, check
from .cluster import Replica, StoreCutter, named_url
from .config import SoakConfig
from .nemesis import Nemesis, schedule
from .workload import SIDE_EFFECT_TOOLS, SessionPlan, plans

__all__ = ["SECRET", "soak"]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

#: How often a progress line is printed during a run.
PROGRESS_EVERY = 30.0

#: How often the ledger is read for new lines (when each was first seen).
TAIL_EVERY = 0.2


async def soak(config: SoakConfig, out: TextIO = sys.stdout) -> Report:
    """Run the soak ``config`` describes; print its progress and its final line to ``out``."""
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="agentfn-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    tag = f"afn-soak-{secrets.token_hex(3)}"
    print(
        f"soak: SOAK_STORE={config.store} SOAK_SECONDS={config.seconds:g} "
        f"SOAK_SEED={config.seed} rate={config.rate:g}/s fault_interval={config.fault_interval:g}s "
        f"logs in {workdir}",
        file=out,
        flush=True,
    )
    faults = schedule(
        config.seed,
        config.seconds,
        replicas=config.replicas,
        lease_seconds=config.lease_seconds,
        mean_interval=config.fault_interval,
        connections=config.store != "sqlite",
    )
    planned = collections.Counter(fault.kind for fault in faults)
    await asyncio.to_thread(
        (workdir / "schedule.txt").write_text, "".join(f.describe() + "\n" for f in faults)
    )
    print(f"soak: {len(faults)} faults planned {dict(sorted(planned.items()))}", file=out)
    sessions = plans(config.seed, config.seconds, config.rate)
    ledger = Ledger(workdir / "ledger.jsonl")
    ports = [free_port() for _ in range(config.replicas)]
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{port}/openai/webhooks" for port in ports],
        # Deliveries to a stopped replica hang until the 5 s timeout: room for them.
        webhook_concurrency=64,
        webhook_retry_delays=webhook_backoff(60),
    )
    created: dict[int, tuple[str, float]] = {}
    tail = _LedgerTail(ledger.path)
    # The fake's injected dropped connections are logged by uvicorn with a traceback: they
    # are the soak's own doing, not news.
    logging.getLogger("uvicorn.error").addFilter(_not_injected)
    async with store_url_for(config.store, workdir) as url, fake, serve_fake(fake) as base_url:
        cutter = StoreCutter(config.store, url, tag)
        replicas = [
            Replica(
                index,
                port,
                {
                    "OPENAI_API_KEY": "sk-test",
                    "OPENAI_BASE_URL": base_url,
                    "OPENAI_WEBHOOK_SECRET": SECRET,
                    "AGENTFN_STORE_URL": named_url(url, config.store, cutter.name(index)),
                    "EXAMPLE_LEDGER": str(ledger.path),
                    "AGENTFN_LEASE_SECONDS": str(config.lease_seconds),
                    "AGENTFN_RECOVERY_INTERVAL": "1",
                },
                workdir,
            )
            for index, port in enumerate(ports)
        ]
        nemesis = Nemesis(fake, replicas, cutter, config.lease_seconds, config.seed)
        # The approver: the replicas' environment (its store, the fake a denial goes to),
        # with connections of its own name, which the nemesis never cuts.
        approver = Approver(
            config.seed,
            {
                **os.environ,
                **replicas[0].env,
                "AGENTFN_STORE_URL": named_url(url, config.store, f"{tag}-a"),
            },
        )
        deciding: asyncio.Task[None] | None = None
        try:
            await asyncio.gather(*(replica.start() for replica in replicas))
            started = time.monotonic()
            deciding = asyncio.create_task(approver.run())
            load = asyncio.create_task(_drive(fake, sessions, started, created))
            chaos = asyncio.create_task(nemesis.run(faults, started))
            progress = asyncio.create_task(_progress(fake, nemesis, created, started, out))
            tailing = asyncio.create_task(tail.run())
            await asyncio.sleep(max(started + config.seconds - time.monotonic(), 0))
            chaos.cancel()
            await load
            await nemesis.settle()
            print("soak: load and faults over, draining", file=out, flush=True)
            drained = time.monotonic()
            # A failed turn leaves its session failed, never idle: nothing to wait for there.
            ended = {c.session_id for c in nemesis.cancellations}
            waiting = await _drain(
                fake, [sid for sid, _ in created.values() if sid not in ended], config.drain_seconds
            )
            drain_seconds = time.monotonic() - drained
            progress.cancel()
            tailing.cancel()
            deciding.cancel()
            states = await _store_states(url, [sid for sid, _ in created.values()])
            await _diagnose(url, fake, waiting, workdir / "waiting.txt")
        finally:
            if deciding is not None:
                deciding.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await deciding
            for replica in replicas:
                with contextlib.suppress(Exception):
                    await replica.stop()
    history = History(
        calls=_planned_calls(sessions, created),
        submissions=list(fake.submissions),
        duplicate_submissions=list(fake.duplicate_submissions),
        requests=list(fake.requests),
        deliveries=list(fake.deliveries),
        ledger=tail.poll(),
        store_states=states,
        logs={
            path.name: path.read_text(errors="replace")
            for replica in replicas
            for path in replica.log_paths()
            if path.exists()
        },
        outages=list(nemesis.outages),
        replica_urls={replica.webhook_url: replica.index for replica in replicas},
        injected=dict(nemesis.injected),
        side_effect_tools=SIDE_EFFECT_TOOLS,
        waiting_at_end=waiting,
        drain_seconds=drain_seconds,
        nemesis_errors=list(nemesis.errors),
        decisions=dict(approver.decisions),
        cancellations=list(nemesis.cancellations),
        ledger_seen=list(tail.seen),
        reread_interval=DispatchSettings().reread_interval,  # the replicas leave it as is
    )
    await asyncio.to_thread(
        (workdir / "faults.txt").write_text, "".join(line + "\n" for line in nemesis.log)
    )
    report = check(history)
    print(
        f"soak: approver ran {approver.commands} commands, {approver.refused} refused, "
        f"{len(approver.errors)} failed",
        file=out,
    )
    for error in approver.errors[:10]:
        print(f"soak: approver {error}", file=out)
    for failed in report.failed_results[:10]:
        print(f"soak: failed result {failed}", file=out)
    for excused in report.cancel_excused[:10]:
        print(f"soak: excused {excused}", file=out)
    for violation in report.violations:
        print(f"soak: VIOLATION {violation}", file=out)
    print(
        f"soak: SOAK_STORE={config.store} SOAK_SEED={config.seed} "
        f"SOAK_SECONDS={config.seconds:g}: {report.final_line()}",
        file=out,
        flush=True,
    )
    return report


class _LedgerTail:
    """The ledger's lines as they appear, each stamped with when it was first seen (wall
    clock), so the checker can tell when a handler stopped; the lines themselves stay exactly
    as the example writes them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.entries: list[dict[str, Any]] = []
        self.seen: list[float] = []

    def poll(self) -> list[dict[str, Any]]:
        """Read the complete lines added since the last poll; return every line so far (the
        same lines as :meth:`Ledger.entries <agentfn_asgi.demo.tools.Ledger.entries>`)."""
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return self.entries
        now = time.time()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    self.entries.append(entry)
                    self.seen.append(now)
        return self.entries

    async def run(self) -> None:
        """Poll every :data:`TAIL_EVERY` seconds (a small file read: no thread needed)."""
        while True:
            self.poll()
            await asyncio.sleep(TAIL_EVERY)


def _not_injected(record: logging.LogRecord) -> bool:
    return not (record.exc_info and isinstance(record.exc_info[1], FakeConnectionDropped))


async def _drive(
    fake: FakeAgentsAPI,
    sessions: list[SessionPlan],
    started: float,
    created: dict[int, tuple[str, float]],
) -> None:
    """Create each planned session at its time (a steady rate)."""
    for plan in sessions:
        delay = started + plan.at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        session_id = fake.create_session(plan.steps, metadata={"soak": str(plan.index)})
        created[plan.index] = (session_id, time.time())


async def _progress(
    fake: FakeAgentsAPI,
    nemesis: Nemesis,
    created: dict[int, tuple[str, float]],
    started: float,
    out: TextIO,
) -> None:
    while True:
        await asyncio.sleep(PROGRESS_EVERY)
        print(
            f"soak: t={time.monotonic() - started:.0f}s sessions={len(created)} "
            f"results={len(fake.submissions)} faults={sum(nemesis.injected.values())}",
            file=out,
            flush=True,
        )


async def _drain(fake: FakeAgentsAPI, session_ids: list[str], limit: float) -> list[str]:
    """Wait up to ``limit`` seconds for every session to be idle; the call ids still
    waited for then."""
    deadline = time.monotonic() + limit
    for session_id in session_ids:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        with contextlib.suppress(TimeoutError):
            await fake.wait_idle(session_id, timeout=remaining)
    return [
        action["call_id"]
        for session_id in session_ids
        for action in fake.required_actions(session_id)
    ]


async def _store_states(url: str, session_ids: list[str]) -> dict[str, str]:
    store = open_store(url)
    try:
        return {
            record.key.call_id: str(record.state)
            for session_id in session_ids
            for record in await store.calls_for_session(session_id)
        }
    finally:
        await store.close()


async def _diagnose(url: str, fake: FakeAgentsAPI, waiting: list[str], path: Path) -> None:
    """Write what is known of each session still waiting after the drain (its store records
    with their history, the fake's requests and webhooks about it) for a post-mortem."""
    sessions = sorted(
        {
            sid
            for sid in fake.sessions
            for a in fake.required_actions(sid)
            if a["call_id"] in waiting
        }
    )
    if not sessions:
        return
    store = open_store(url)
    lines: list[str] = []
    try:
        for session_id in sessions:
            lines.append(f"== {session_id} waiting for {fake.required_actions(session_id)}")
            for record in await store.calls_for_session(session_id):
                full = await store.get_call(record.key, history=True) or record
                lines.append(
                    f"  record {record.key.call_id} {record.tool_name} {record.state} "
                    f"attempt={record.attempt} owner={record.owner} "
                    f"lease_expires_at={record.lease_expires_at:.3f} failures={record.failures}"
                )
                lines.extend(f"    {event}" for event in full.history)
            for request in fake.requests:
                if session_id in request.path:
                    lines.append(
                        f"  request {request.at:.3f} {request.method} {request.route} "
                        f"{request.status}"
                    )
            for delivery in fake.deliveries:
                if delivery.session_id == session_id:
                    lines.append(
                        f"  webhook {delivery.at:.3f} {delivery.webhook_id} {delivery.event_type} "
                        f"{delivery.url} attempt={delivery.attempt} {delivery.status} "
                        f"{delivery.error or ''}"
                    )
    finally:
        await store.close()
    await asyncio.to_thread(path.write_text, "\n".join(lines) + "\n")


def _planned_calls(
    sessions: list[SessionPlan], created: dict[int, tuple[str, float]]
) -> list[PlannedCall]:
    """Every call of every session that was created."""
    found = []
    for plan in sessions:
        if plan.index not in created:
            continue
        session_id, at = created[plan.index]
        for step, calls in enumerate(plan.steps):
            for call in calls:
                assert call.call_id is not None
                found.append(
                    PlannedCall(call.call_id, call.name, step, session_id, at, _arguments(call))
                )
    return found


def _arguments(call: FakeCall) -> dict[str, Any]:
    """A planned call's arguments (the soak never plans raw JSON)."""
    return dict(call.arguments) if isinstance(call.arguments, Mapping) else {}
