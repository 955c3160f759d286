"""``connect()``: an app and a fake wired both ways in process, at the app's mount path,
closing what it made and leaving a fake passed in to the caller."""

from __future__ import annotations

import anyio
import pytest

from agentfn_asgi import AgentWebhookApp, FunctionTools, NotRun, Ran, ToolContext, Unknown
from agentfn_asgi.testing import (
    FakeAgentsAPI,
    FakeCall,
    action_required_event,
    connect,
    signed_delivery,
)

pytestmark = pytest.mark.anyio


def customer_tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def get_customer(customer_id: str) -> dict[str, bool]:
        """Look up a customer by ID."""
        return {"found": customer_id == "123"}

    return tools


def lookup(customer_id: str = "123", call_id: str | None = None) -> list[list[FakeCall]]:
    return [[FakeCall("get_customer", {"customer_id": customer_id}, call_id=call_id)]]


async def test_a_session_runs_end_to_end_and_everything_closes() -> None:
    """The fake's signed webhook reaches the app, the app reads and answers through its
    client; on exit the app is stopped and the clients ``connect`` made are closed."""
    async with connect(customer_tools()) as connection:
        app, fake = connection
        assert isinstance(app, AgentWebhookApp) and isinstance(fake, FakeAgentsAPI)
        assert connection.client is app.client and connection.store is app.store
        session = fake.create_session(lookup())
        await fake.wait_idle(session)
    [result] = fake.submissions
    assert result.success and result.output == '{"found":true}'
    assert [d.status for d in fake.deliveries if d.event_type.endswith("action_required")] == [200]
    assert not app.dispatcher.started
    assert connection.webhook_http.is_closed


async def test_the_mount_path_is_honoured() -> None:
    """Deliveries go to the mount path, where the app sees itself mounted (its health
    check answers below it); a path outside the mount is not the app's."""
    async with connect(customer_tools(), mount_path="/hooks/agents/") as connection:
        fake = connection.fake
        session = fake.create_session(lookup())
        await fake.wait_idle(session)
        assert {d.url for d in fake.deliveries} == {"http://app.test/hooks/agents"}
    async with connect(customer_tools(), mount_path="/hooks/agents") as connection:
        health = await connection.webhook_http.get(connection.webhook_url + "/healthz")
        outside = await connection.webhook_http.post("/openai/webhooks", content=b"{}")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert outside.status_code == 404


async def test_webhooks_false_leaves_delivery_to_the_test() -> None:
    """With ``webhooks=False`` the fake sends nothing; a delivery posted by hand (signed
    with the fake's secret, which the app was given) is accepted and answered."""
    async with connect(customer_tools(), webhooks=False) as connection:
        fake = connection.fake
        session = fake.create_session(lookup())
        body, headers = signed_delivery(fake.webhook_secret, action_required_event(session))
        answer = await connection.post_webhook(body, headers)
        await fake.wait_idle(session)
    assert answer.status_code == 200
    assert fake.deliveries == []
    assert [s.output for s in fake.submissions] == ['{"found":true}']


async def test_a_fake_passed_in_outlives_the_app_and_meets_the_next() -> None:
    """A fake of the caller's is neither started nor closed by ``connect``: after the first
    app stops it no longer delivers there, and a second app (a restart) gets its webhooks."""
    async with FakeAgentsAPI(webhook_secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") as fake:
        async with connect(customer_tools(), fake):
            first = fake.create_session(lookup(call_id="c1"))
            await fake.wait_idle(first)
        assert fake.webhooks.urls == []
        waiting = fake.create_session(lookup("7", call_id="c2"))  # no app is listening
        await fake.drain_webhooks()
        assert fake.session(waiting)["status"] == "requires_action"
        async with connect(customer_tools(), fake):
            assert fake.redeliver(waiting) is not None
            await fake.wait_idle(waiting)
    assert [(s.call_id, s.output) for s in fake.submissions] == [
        ("c1", '{"found":true}'),
        ("c2", '{"found":false}'),
    ]


async def test_client_options_reach_the_client() -> None:
    """``client_options`` build the app's client: a wrong key is refused by the fake (401)
    and nothing is answered."""
    async with connect(
        customer_tools(), client_options={"api_key": "sk-wrong", "max_retries": 0}
    ) as (app, fake):
        fake.create_session(lookup())
        await fake.drain_webhooks()
        with anyio.fail_after(5):
            while not fake.requests:
                await anyio.sleep(0.01)
    assert app.client.max_retries == 0
    assert {r.status for r in fake.requests} == {401}
    assert fake.submissions == []


@pytest.mark.slow
async def test_loopback_serves_the_fake_over_real_sockets() -> None:
    """With ``loopback`` the client reaches the fake through uvicorn on 127.0.0.1."""
    async with connect(customer_tools(), loopback=True) as (app, fake):
        assert app.client.base_url.startswith("http://127.0.0.1:")
        session = fake.create_session(lookup())
        await fake.wait_idle(session)
    assert [s.output for s in fake.submissions] == ['{"found":true}']


@pytest.mark.exclusive
async def test_loopback_answers_without_waiting_for_delayed_acks() -> None:
    """The server's sockets send at once (``TCP_NODELAY``): without it each answer waited
    for the client's delayed ACK, about 40 ms a request (25 reads took 1.1 s, now ~15 ms)."""
    async with connect(customer_tools(), loopback=True, webhooks=False) as (app, fake):
        session = fake.create_session(lookup())
        with anyio.fail_after(0.5):
            for _ in range(25):
                await app.client.retrieve_session(session)


# -- a call in doubt: how a reconcile hook is tested ----------------------------------------


def refund_tools(decision: str, ran: list[str]) -> FunctionTools:
    """A side-effect tool whose reconcile hook answers ``decision`` (ran, not_run, unknown);
    ``ran`` records each real execution of the handler."""
    tools = FunctionTools()

    def reconcile(ctx: ToolContext, arguments: dict[str, object]) -> Ran | NotRun | Unknown:
        if decision == "ran":
            return Ran({"refunded": arguments["order_id"], "found_by": "reconcile"})
        if decision == "not_run":
            return NotRun()
        return Unknown("the payment provider does not say")

    @tools.function(side_effects=True, reconcile=reconcile)
    def refund(order_id: str) -> dict[str, str]:
        """Refund an order."""
        ran.append(order_id)
        return {"refunded": order_id, "found_by": "handler"}

    return tools


@pytest.mark.parametrize(
    ("decision", "handler_runs", "success", "output"),
    [
        ("ran", [], True, '{"refunded":"o1","found_by":"reconcile"}'),
        ("not_run", ["o1"], True, '{"refunded":"o1","found_by":"handler"}'),
        ("unknown", [], False, None),
    ],
)
async def test_a_call_in_doubt_is_decided_by_the_reconcile_hook(
    decision: str, handler_runs: list[str], success: bool, output: str | None
) -> None:
    """``create_session_in_doubt`` leaves each call as a replica that died mid-call would:
    the app finds it in doubt and asks the reconcile hook, which decides whether the
    handler runs; the session gets one result either way."""
    ran: list[str] = []
    async with connect(refund_tools(decision, ran)) as connection:
        fake = connection.fake
        session = await connection.create_session_in_doubt(
            [[FakeCall("refund", {"order_id": "o1"}, call_id="call_1")]]
        )
        await fake.wait_idle(session)
        [record] = await connection.store.find_calls("call_1")
    assert ran == handler_runs
    [result] = fake.submissions
    assert result.success is success
    if output is not None:
        assert result.output == output
    assert [e.kind for e in record.history][:2] == ["claimed", "taken_over"]
    assert record.history[0].owner != record.history[1].owner
    assert not [d for d in fake.deliveries if d.event_type.endswith("action_required")]


async def test_a_plain_tool_in_doubt_runs_again() -> None:
    """A tool without side effects is simply run again from in doubt."""
    async with connect(customer_tools()) as connection:
        session = await connection.create_session_in_doubt(lookup(call_id="call_1"))
        await connection.fake.wait_idle(session)
    [result] = connection.fake.submissions
    assert result.success and result.output == '{"found":true}'
