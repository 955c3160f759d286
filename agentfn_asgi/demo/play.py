"""The demo's scripted session, its timeline and its summary (``agentfn-asgi demo``).

:func:`run_demo` starts :class:`~agentfn_asgi.testing.FakeAgentsAPI` in this process and
the demo's app (:mod:`agentfn_asgi.demo.app`, the tools of :mod:`agentfn_asgi.demo.tools`)
under uvicorn in a child process, both on free loopback ports, with a SQLite store in a
temporary folder. It plays one session whose first step asks for six calls at once (a
customer lookup, a refund, two slow echoes, an unknown tool, a refund that fails) and whose
second step asks for one more, and a third one for ``close_account``, which needs a
person's approval: the demo itself approves it (as ``agentfn-asgi approvals approve`` would)
once it waits, and the app runs it. It prints what happens as it happens: signed
deliveries, session reads, handlers (read from the app's store), the approval, submitted
results, the turn completing. Then a summary, and everything is stopped.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from agentfn_asgi.calls.records import CallRecord, CallState
from agentfn_asgi.demo.process import WEBHOOK_PATH, free_port, run_example
from agentfn_asgi.errors import AgentFnError, DemoError
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

#: What the child process serves (``uvicorn agentfn_asgi.demo.app:app``).
DEMO_APP = "agentfn_asgi.demo.app:app"

__all__ = ["DEMO_STEPS", "run_demo"]


@dataclass(frozen=True, slots=True)
class _Expect:
    call_id: str
    tool: str
    arguments: dict[str, Any]
    step: int
    success: bool
    check: str
    """A substring the submitted output (success) or error (failure) must contain."""
    note: str = ""


DEMO_STEPS: tuple[tuple[_Expect, ...], ...] = (
    (
        _Expect(
            "call_customer",
            "get_customer",
            {"customer_id": "123"},
            1,
            True,
            '{"found":true,"customer":{"name":"Example Customer","plan":"pro"}}',
        ),
        _Expect(
            "call_refund",
            "create_refund",
            {"order_id": "ord_1", "amount_cents": 1500},
            1,
            True,
            '"order_id":"ord_1","amount_cents":1500',
        ),
        _Expect("call_echo_a", "slow_echo", {"text": "first", "delay_ms": 400}, 1, True, "first"),
        _Expect("call_echo_b", "slow_echo", {"text": "second", "delay_ms": 400}, 1, True, "second"),
        _Expect(
            "call_unknown",
            "lookup_invoice",
            {"invoice_id": "inv_9"},
            1,
            False,
            "lookup_invoice",
            "unknown tool",
        ),
        _Expect(
            "call_bad_refund",
            "create_refund",
            {"order_id": "ord_2", "amount_cents": 0},
            1,
            False,
            "amount_cents must be positive",
            "refund of 0 cents",
        ),
    ),
    (
        _Expect(
            "call_customer_2",
            "get_customer",
            {"customer_id": "999"},
            2,
            True,
            '{"found":false,"customer":null}',
        ),
    ),
    (
        _Expect(
            "call_close",
            "close_account",
            {"account_id": "acc_42"},
            3,
            True,
            '{"closed":true,"account_id":"acc_42"}',
        ),
    ),
)


@dataclass(slots=True)
class _CallView:
    expect: _Expect
    started: float | None = None
    finished: float | None = None
    success: bool | None = None
    error_type: str | None = None
    submitted: float | None = None
    submitted_text: str = ""


@dataclass(slots=True)
class _Timeline:
    out: TextIO
    t0: float
    pending: list[tuple[float, str]] = field(default_factory=list)

    def add(self, at: float, text: str) -> None:
        self.pending.append((at, text))

    def flush(self, *, lag: float = 0.05, final: bool = False) -> None:
        # Sources are polled separately; holding lines for a moment prints them in order.
        horizon = float("inf") if final else time.time() - lag
        ready = sorted(item for item in self.pending if item[0] <= horizon)
        self.pending = [item for item in self.pending if item[0] > horizon]
        for at, text in ready:
            print(f"  {at - self.t0:+8.3f}s  {text}", file=self.out, flush=True)


def _short(value: Any, width: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= width else text[: width - 3] + "..."


async def run_demo(
    *, time_limit: float = 30.0, verbose: bool = False, out: TextIO | None = None
) -> int:
    """Run the demo; print the timeline and summary to ``out``. Returns the exit code."""
    stream = out or sys.stdout
    workdir = Path(tempfile.mkdtemp(prefix="agentfn-demo-"))
    try:
        await _demo(workdir, time_limit=time_limit, verbose=verbose, out=stream)
    except (DemoError, AgentFnError, TimeoutError, OSError) as exc:
        message = str(exc) or type(exc).__name__
        print(f"\ndemo FAILED: {message}", file=stream, flush=True)
        return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\ndemo passed: every call answered as scripted; nothing left running.", file=stream)
    return 0


async def _demo(workdir: Path, *, time_limit: float, verbose: bool, out: TextIO) -> None:
    started = time.time()
    store_url = f"sqlite:///{workdir / 'agentfn.sqlite3'}"
    ledger = workdir / "ledger.jsonl"
    api_key = "sk-demo-" + secrets.token_hex(4)
    fake = FakeAgentsAPI(api_key=api_key)
    print(
        f"agentfn-asgi demo: FakeAgentsAPI -> signed webhooks -> {DEMO_APP} (Starlette)\n",
        file=out,
    )
    async with fake, serve_fake(fake) as base_url:
        print(f"  setup  FakeAgentsAPI on {base_url}", file=out, flush=True)
        # Chosen once the fake API listens: a port picked before could be the one the OS
        # then gives the fake (both "free" a moment apart), and the app could not bind it.
        app_port = free_port()
        webhook_url = f"http://127.0.0.1:{app_port}{WEBHOOK_PATH}"
        fake.add_webhook_url(webhook_url)
        env = {
            "OPENAI_API_KEY": api_key,
            "OPENAI_BASE_URL": base_url,
            "OPENAI_WEBHOOK_SECRET": fake.webhook_secret,
            "AGENTFN_STORE_URL": store_url,
            "EXAMPLE_LEDGER": str(ledger),
        }
        print(
            f"  setup  starting {DEMO_APP} (uvicorn) on {webhook_url}, store {store_url}",
            file=out,
            flush=True,
        )
        log_path = workdir / "app.log"
        # The child runs in the temporary folder: nothing but the installed package is needed.
        async with run_example(
            DEMO_APP, env=env, log_path=log_path, cwd=workdir, port=app_port
        ) as app:
            print(f"  setup  ready in {time.time() - started:.1f} s\n", file=out, flush=True)
            store = open_store(store_url)
            played = False
            try:
                views = await _play(fake, store, out=out, time_limit=time_limit)
                played = True
            finally:
                await store.close()
                # A demo that fails shows the app's side too: what the app logged is what
                # tells a stuck call from a refused one.
                if verbose or not played:
                    print("\napp log:\n" + (app.log() or "(empty)"), file=out)
        _summary(fake, views, ledger, out=out)


async def _play(
    fake: FakeAgentsAPI, store: Store, *, out: TextIO, time_limit: float
) -> dict[str, _CallView]:
    steps = [
        [FakeCall(e.tool, e.arguments, call_id=e.call_id) for e in step] for step in DEMO_STEPS
    ]
    views = {e.call_id: _CallView(e) for step in DEMO_STEPS for e in step}
    t0 = time.time()
    timeline = _Timeline(out, t0)
    session_id = fake.create_session(steps)
    timeline.add(t0, f"session    {session_id} created")
    announced: set[str] = set()
    approved: set[str] = set()
    seen_deliveries = seen_requests = seen_submissions = seen_events = 0
    status = ""
    deadline = t0 + time_limit
    while True:
        now = time.time()
        for attempt in fake.deliveries[seen_deliveries:]:
            seen_deliveries += 1
            outcome = (
                f"{attempt.status}"
                if attempt.status is not None
                else f"no answer ({attempt.error})"
            )
            meaning = ""
            if attempt.ok and attempt.event_type == "agent.session.action_required":
                meaning = "  delivery verified and recorded"
            elif attempt.ok:
                meaning = "  (acknowledged, nothing to run)"
            timeline.add(attempt.at, f"webhook    {attempt.event_type} -> {outcome}{meaning}")
        for request in fake.requests[seen_requests:]:
            seen_requests += 1
            if request.route == "retrieve":
                timeline.add(request.at, f"read       GET {request.path} -> {request.status}")
        records = await store.calls_for_session(session_id)
        for submission in fake.submissions[seen_submissions:]:
            seen_submissions += 1
            view = views.get(submission.call_id)
            if view is None:
                continue
            view.submitted = submission.received_at
            view.success = submission.success
            view.submitted_text = (
                submission.output if submission.success else (submission.error or "")
            )
            verdict = "success" if submission.success else "failure"
            timeline.add(
                submission.received_at,
                f"submitted  {view.expect.tool:<15} {view.expect.call_id:<16} {verdict}: "
                f"{_short(view.submitted_text)}",
            )
        # After the submissions: a record first seen ``submitted`` takes its save time
        # from its submission.
        for record in records:
            _observe(views, record, timeline)
            if record.state is CallState.AWAITING_APPROVAL and record.key.call_id not in approved:
                approved.add(record.key.call_id)
                await _approve(store, record, timeline)
        # From the session's own events, not a look at it now: a step the app answers
        # between two looks would otherwise never be shown.
        for event in fake.events(session_id)[seen_events:]:
            seen_events += 1
            if event.get("type") != "agent.session.requires_action":
                continue
            actions = (event.get("session") or {}).get("required_actions") or []
            pending_ids = {a["call_id"] for a in actions if "call_id" in a}
            if pending_ids - announced:
                announced |= pending_ids
                step = max(views[c].expect.step for c in pending_ids if c in views)
                timeline.add(now, f"session    step {step} asks for {len(pending_ids)} call(s)")
        current = fake.session(session_id)["status"]
        if current != status:
            status = current
            if status == "idle":
                timeline.add(now, "session    turn completed, session idle")
        timeline.flush()
        if status == "idle" and all(v.submitted for v in views.values()):
            break
        if now > deadline:
            timeline.flush(final=True)
            raise DemoError(
                f"the session was not finished after {time_limit:.0f} s (status {status})"
            )
        await asyncio.sleep(0.01)
    # Let the last handler records settle into the timeline.
    await asyncio.sleep(0.05)
    for record in await store.calls_for_session(session_id):
        _observe(views, record, timeline)
    timeline.flush(final=True)
    return views


async def _approve(store: Store, record: CallRecord, timeline: _Timeline) -> None:
    """The demo is the person: it approves the request it sees waiting (in the store, as
    ``agentfn-asgi approvals approve`` does); the app's replica polls and runs the call."""
    request = record.approval
    if request is None:
        raise DemoError(f"{record.key.call_id} waits for approval without a request")
    timeline.add(
        record.updated_at,
        f"approval   {record.tool_name:<15} {record.key.call_id:<16} waits for a person "
        f"({request.approval_id})",
    )
    decided = await store.decide_approval(
        record.key, approval_id=request.approval_id, decision="approved", by="demo", via="demo"
    )
    if decided is None:
        raise DemoError(f"the demo could not approve {request.approval_id}")
    timeline.add(
        decided.updated_at,
        f"approval   {record.tool_name:<15} {record.key.call_id:<16} approved by the demo; "
        "the app runs it",
    )


def _observe(views: dict[str, _CallView], record: CallRecord, timeline: _Timeline) -> None:
    view = views.get(record.key.call_id)
    if view is None:
        return
    tool, call_id = view.expect.tool, view.expect.call_id
    if view.started is None:
        view.started = record.created_at
        if view.expect.note == "unknown tool":
            timeline.add(
                record.created_at, f"claimed    {tool:<15} {call_id:<16} no handler registered"
            )
        else:
            timeline.add(record.created_at, f"handler    {tool:<15} {call_id:<16} started")
    if (
        view.finished is None
        and record.state is not CallState.CLAIMED
        and record.result is not None
    ):
        saved_at = record.updated_at
        if record.state is CallState.SUBMITTED and view.submitted is not None:
            # Seen only once submitted: ``updated_at`` is then the submission's time, and
            # the result was saved before the API received it.
            saved_at = min(saved_at, view.submitted)
        view.finished = saved_at
        view.error_type = record.result.error_type
        took = (saved_at - record.created_at) * 1000
        result = "ok" if record.result.success else f"failed ({record.result.error_type})"
        timeline.add(saved_at, f"saved      {tool:<15} {call_id:<16} {result} in {took:.1f} ms")


def _summary(
    fake: FakeAgentsAPI, views: dict[str, _CallView], ledger: Path, *, out: TextIO
) -> None:
    problems: list[str] = []
    print("\nsummary", file=out)
    print(f"  {'call':<16} {'tool':<15} {'step':>4}  {'result':<28} {'claim->saved':>12}", file=out)
    for view in views.values():
        e = view.expect
        result = "ok" if view.success else f"failed ({view.error_type or '?'})"
        took = (
            f"{(view.finished - view.started) * 1000:7.1f} ms"
            if view.started is not None and view.finished is not None
            else "        -"
        )
        print(f"  {e.call_id:<16} {e.tool:<15} {e.step:>4}  {result:<28} {took:>12}", file=out)
        if view.success is not e.success:
            problems.append(f"{e.call_id}: expected {'success' if e.success else 'failure'}")
        elif e.check not in view.submitted_text:
            problems.append(f"{e.call_id}: {e.check!r} not in {view.submitted_text!r}")
    ok = sum(1 for v in views.values() if v.success)
    failed = [v.expect.note for v in views.values() if not v.success]
    scripted = ", ".join(failed)
    print(
        f"\n  {len(views)} calls: {ok} ok, {len(failed)} failed as scripted ({scripted})", file=out
    )
    spans = [
        (v.started, v.finished)
        for v in views.values()
        if v.expect.tool == "slow_echo" and v.started is not None and v.finished is not None
    ]
    if len(spans) == 2:
        overlap = (min(end for _, end in spans) - max(start for start, _ in spans)) * 1000
        if overlap > 0:
            print(f"  slow_echo x2 ran in parallel: {overlap:.0f} ms of overlap", file=out)
        else:
            problems.append("the two slow_echo calls did not overlap")
    deliveries = fake.deliveries
    first_try = all(d.ok for d in deliveries)
    reads = sum(1 for r in fake.requests if r.route == "retrieve")
    print(
        f"  {len(deliveries)} webhook deliveries ({'all 2xx' if first_try else 'some retried'}), "
        f"{reads} session reads, {len(fake.submissions)} results accepted, "
        f"{len(fake.duplicate_submissions)} duplicates",
        file=out,
    )
    lines = [line for line in _read_lines(ledger) if line]
    closures = [line for line in lines if '"tool":"close_account"' in line]
    refunds = len(lines) - len(closures)
    print(f"  ledger: {refunds} refund line(s) written", file=out)
    print(f"  ledger: {len(closures)} account closure line(s) written, after approval", file=out)
    if refunds != 1:
        problems.append(f"expected exactly one refund in the ledger, found {refunds}")
    if len(closures) != 1:
        problems.append(f"expected exactly one closure in the ledger, found {len(closures)}")
    if views:
        first = min(v.started or float("inf") for v in views.values())
        last = max(v.submitted or 0.0 for v in views.values())
        if first != float("inf"):
            print(f"  first claim to last result: {(last - first) * 1000:.0f} ms", file=out)
    if problems:
        raise DemoError("; ".join(problems))


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
