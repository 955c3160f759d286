"""Nothing waits in silence, and environment connections (issue 34), end to end: the app
against the package's fake served over loopback (real sockets), on a SQLite file, read by
the ``agentfn-asgi`` CLI in processes of their own (it has no memory of the app's).

- An app whose policy leaves MCP requests of server ``crm`` (``leave``) and has no
  ``connect_environment`` hook: a session holding such a request and an
  ``environment_connection`` shows both in ``calls --state unanswered`` (kind, why, age),
  in ``status`` (count, kinds, oldest age, and that someone else must answer them) and as a
  pointer under ``approvals``; once the environment connects it retires, once the turn ends
  the request is cancelled, and nothing was ever POSTed for either.
- An app with a ``connect_environment`` hook: the hook runs once per occurrence, nothing is
  POSTed, and the next occurrence (after the environment connected) runs it again.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.actions import ActionRules, EnvironmentConnection
from agentfn_asgi.calls.records import CallKey, CallRecord, CallState
from agentfn_asgi.testing import Connection, FakeRequest

from .support.stack import running_stack
from .test_actions import SETTINGS, lookup_tools
from .test_approvals_e2e import cli

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def state_of(stack: Connection, key: CallKey, state: CallState) -> CallRecord:
    with anyio.fail_after(20):
        while True:
            record = await stack.store.get_call(key)
            if record is not None and record.state is state:
                return record
            await anyio.sleep(0.05)


async def test_unanswered_actions_are_shown_with_their_age_and_settle(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentfn.sqlite3'}"
    env = {"AGENTFN_STORE_URL": url}
    async with running_stack(
        lookup_tools(),
        settings=SETTINGS,
        store=url,
        loopback=True,
        actions=ActionRules(mcp={"crm": "leave"}, other_mcp="deny"),
    ) as stack:
        sid = stack.fake.create_session([[FakeRequest.mcp("crm", "find", request_id="req_crm")]])
        turn = stack.fake.session(sid)["required_actions"][0]["turn_id"]
        stack.fake.require_environment(sid, "env_self")
        request = CallKey(sid, turn, "req_crm")
        environment = CallKey(sid, "", "environment:env_self")
        await state_of(stack, request, CallState.UNANSWERED)
        await state_of(stack, environment, CallState.UNANSWERED)
        await anyio.sleep(1.2)  # an age to see

        code, out, err = await cli(env, "calls", "--state", "unanswered")
        assert code == 0, err
        lines = {line.split()[2]: line for line in out.splitlines()[1:]}
        assert "mcp: left by the actions= policy" in lines["req_crm"]
        assert (
            "environment_connection: no connect_environment hook" in lines["environment:env_self"]
        )
        assert all(" s ago" in line for line in lines.values())

        code, out, err = await cli(env, "calls", "--json", "--state", "unanswered")
        assert code == 0, err
        kinds = {c["call_id"]: c["kind"] for c in json.loads(out)}
        assert kinds == {"req_crm": "mcp", "environment:env_self": "environment_connection"}

        code, out, err = await cli(env, "calls", "show", "req_crm", "--session", sid)
        assert code == 0, err
        assert "kind      mcp" in out and "for someone else to answer it" in out

        code, out, err = await cli(env, "status")
        assert code == 0, err
        [row] = [line for line in out.splitlines() if line.startswith("unanswered")]
        assert "2 (environment_connection 1, mcp 1; oldest " in row and "s ago" in row
        assert "someone else must answer them" in out

        code, out, err = await cli(env, "approvals")
        assert code == 0, err
        assert "1 MCP or computer-use request left unanswered here" in out
        code, out, err = await cli(env, "approvals", "--json")
        assert code == 0 and json.loads(out) == []

        # The environment connects (the fake stops listing it): its occurrence retires.
        assert stack.fake.environment_connected(sid, "env_self")
        await stack.app.dispatcher.recover(sid)
        await state_of(stack, environment, CallState.RETIRED)
        # The turn ends: the request nobody answered is cancelled.
        assert stack.fake.cancel_turn(sid)
        cancelled = await state_of(stack, request, CallState.CANCELLED)
        assert "left unanswered here" in (cancelled.reason or "")

        code, out, err = await cli(env, "status")
        assert code == 0, err
        assert "unanswered      0" in out or "unanswered  0" in out.replace("    ", "  ")
        assert not stack.fake.submissions


async def test_the_connect_environment_hook_runs_once_per_occurrence(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agentfn.sqlite3'}"
    seen: list[EnvironmentConnection] = []

    def connect(request: EnvironmentConnection) -> None:  # sync: run in a thread
        seen.append(request)

    async with running_stack(
        lookup_tools(), settings=SETTINGS, store=url, loopback=True, connect_environment=connect
    ) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_1")
        stack.fake.require_environment(sid, "env_1")
        first = await state_of(stack, key, CallState.SUBMITTED)
        stack.fake.require_environment(sid, "env_1")  # announced again: the same occurrence
        await stack.app.dispatcher.recover(sid)
        assert len(seen) == 1
        assert stack.fake.environment_connected(sid, "env_1")
        await stack.app.dispatcher.recover(sid)
        await state_of(stack, key, CallState.RETIRED)
        stack.fake.require_environment(sid, "env_1")
        with anyio.fail_after(20):
            while len(seen) < 2:
                await anyio.sleep(0.05)
        second = await state_of(stack, key, CallState.SUBMITTED)
        code, out, err = await cli({"AGENTFN_STORE_URL": url}, "calls", "show", key.call_id)
    assert code == 0, err
    assert "kind      environment_connection" in out and "not posted" in out
    assert [s.environment_id for s in seen] == ["env_1", "env_1"]
    assert first.attempt == 1 and second.attempt == 2
    assert not stack.fake.submissions
