"""AgentsClient: requests, headers, error mapping, every retry rule and SSE decoding.

Retry tests run against ``FakeAgentsAPI`` in-process with an injected instant ``sleep``
that records each delay and ``random=lambda: 0.0`` (jitter factor 1.0), so the policy is
checked exactly and fast. Crafted byte streams go through ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from agentfn_asgi._sse import iter_sse_data
from agentfn_asgi.client import (
    DEFAULT_BASE_URL,
    AgentsClient,
    RetryEvent,
    RetryState,
    parse_retry_after,
    status_error,
)
from agentfn_asgi.errors import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConfigurationError,
    ConflictError,
    InternalServerError,
    NotFoundError,
    PermissionDeniedError,
    RateLimitError,
    UnknownPendingToolCallError,
)
from agentfn_asgi.session_events import (
    ErrorEvent,
    GenericSessionEvent,
    SessionIdleEvent,
    SessionInProgressEvent,
    SessionRequiresActionEvent,
    UnreadableEvent,
)
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.clock import FakeClock
from .support.ports import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
async def fake() -> AsyncIterator[FakeAgentsAPI]:
    async with FakeAgentsAPI() as api:
        yield api


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def make_client(
    fake: FakeAgentsAPI, clock: FakeClock
) -> AsyncIterator[Callable[..., AgentsClient]]:
    """Build clients on the fake with instant, recorded sleeps; options override."""
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))

    def build(**options: Any) -> AgentsClient:
        settings: dict[str, Any] = {
            "api_key": "sk-test",
            "base_url": "http://fake/v1",
            "http_client": http,
            "sleep": clock.sleep,
            "random": lambda: 0.0,
            "monotonic": clock,
        }
        settings.update(options)
        return AgentsClient(**settings)

    yield build
    await http.aclose()


def one_call_session(fake: FakeAgentsAPI) -> tuple[str, dict[str, Any]]:
    sid = fake.create_session([[FakeCall("lookup", {"id": 1})]])
    action = fake.required_actions(sid)[0]
    return sid, {
        "type": "agent.session.input.tool_result",
        "turn_id": action["turn_id"],
        "call_id": action["call_id"],
        "success": True,
        "output": "found",
    }


def requests_of(fake: FakeAgentsAPI, route: str) -> list[Any]:
    return [r for r in fake.requests if r.route == route]


# -- basics -----------------------------------------------------------------------------------


async def test_retrieve_session_sends_the_documented_headers(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """GET carries bearer auth, ``OpenAI-Beta: agents=v1`` and a User-Agent naming us."""
    sid, _ = one_call_session(fake)
    session = await make_client().retrieve_session(sid)
    assert session.id == sid
    assert session.status == "requires_action"
    assert [c.name for c in session.function_calls] == ["lookup"]
    headers = fake.requests[-1].headers
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["openai-beta"] == "agents=v1"
    assert headers["user-agent"].startswith("agentfn-asgi/")


async def test_submit_events_posts_json_with_idempotency_key(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """A submission is JSON ``{"events": [...]}`` with the given Idempotency-Key; 202 is success."""
    sid, event = one_call_session(fake)
    await make_client().submit_events(sid, [event], idempotency_key="key-1")
    assert fake.requests[-1].status == 202
    assert fake.requests[-1].idempotency_key == "key-1"
    assert fake.requests[-1].headers["content-type"] == "application/json"
    assert [s.call_id for s in fake.submissions] == [event["call_id"]]
    assert fake.submissions[0].idempotency_key == "key-1"


async def test_submit_events_without_key_generates_one(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """Without a key the client mints a UUID (and keeps it across retries)."""
    sid, event = one_call_session(fake)
    fake.fail_next("submit", 1, 503)
    await make_client().submit_events(sid, [event])
    keys = [r.idempotency_key for r in requests_of(fake, "submit")]
    assert len(keys) == 2
    assert keys[0] == keys[1]
    assert keys[0] is not None
    assert len(keys[0]) == 36


async def test_submit_raw_events_sends_identical_bytes(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """The stored body goes out byte for byte, so a resubmission is the identical request."""
    sid, event = one_call_session(fake)
    body = json.dumps({"events": [event]}, indent=1).encode()
    await make_client().submit_raw_events(sid, body, idempotency_key="k")
    assert fake.idempotency["k"] == (sid, body)


async def test_a_bytearray_body_reaches_an_httpx_client_as_bytes(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """A large body built in place (a bytearray) is sent as its bytes by an httpx client."""
    sid, event = one_call_session(fake)
    body = json.dumps({"events": [event]}).encode()
    await make_client().submit_raw_events(sid, bytearray(body), idempotency_key="k")
    assert fake.idempotency["k"] == (sid, body)


async def test_owned_client_is_closed_and_injected_one_is_not() -> None:
    """aclose closes the client it created and leaves an injected one open."""
    owned = AgentsClient(api_key="k")
    async with owned:
        pass
    assert owned._http.is_closed
    injected = httpx.AsyncClient()
    async with AgentsClient(api_key="k", http_client=injected):
        pass
    assert not injected.is_closed
    await injected.aclose()


def test_configuration_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client reads no environment: a missing key fails early, naming the variable the
    app and CLI read; the base URL defaults to OpenAI's; project and organization become
    the SDK's headers."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        AgentsClient()
    assert AgentsClient(api_key="sk-x").base_url == DEFAULT_BASE_URL
    client = AgentsClient(
        api_key="sk-x", base_url="http://other/v1/", project="proj_1", organization="org_1"
    )
    assert client.base_url == "http://other/v1"
    assert client._headers["Authorization"] == "Bearer sk-x"
    assert client._headers["OpenAI-Project"] == "proj_1"
    assert client._headers["OpenAI-Organization"] == "org_1"


# -- error mapping ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (403, PermissionDeniedError),
        (404, NotFoundError),
        (422, APIStatusError),
    ],
)
async def test_non_retryable_statuses_raise_at_once(
    fake: FakeAgentsAPI,
    make_client: Callable[..., AgentsClient],
    clock: FakeClock,
    status: int,
    cls: type[APIStatusError],
) -> None:
    """4xx other than 408/409/429 map to their error class with no retry."""
    sid, _ = one_call_session(fake)
    body = {"error": {"message": "nope", "type": "t", "param": "p", "code": "c"}}
    fake.fail_next("retrieve", 1, status, body=body)
    with pytest.raises(cls) as caught:
        await make_client().retrieve_session(sid)
    assert type(caught.value) is cls
    error = caught.value
    assert (error.status, error.message, error.code, error.param, error.type) == (
        status,
        "nope",
        "c",
        "p",
        "t",
    )
    assert error.request_id is not None
    assert error.request_id.startswith("req_")
    assert clock.sleeps == []


def test_status_error_escapes_text_that_is_not_valid_unicode() -> None:
    """JSON may escape a lone surrogate; the error's fields are always valid UTF-8 (stores
    and logs write them), the rest of the text as it was."""
    body = b'{"error":{"message":"caf\xc3\xa9 \\ud800","code":"c\\udfff","param":"p"}}'
    error = status_error(500, body, {})
    assert (error.message, error.code, error.param) == ("caf\u00e9 \\ud800", "c\\udfff", "p")
    for text in (error.message, error.code, str(error)):
        assert text is not None
        text.encode("utf-8")


def test_status_error_tolerates_odd_bodies() -> None:
    """Non-JSON, empty and flat JSON bodies still give a useful error."""
    html = status_error(502, b"<html>Bad gateway</html>", {})
    assert isinstance(html, InternalServerError)
    assert html.message == "<html>Bad gateway</html>"
    assert status_error(503, b"", {}).message == "HTTP 503"
    flat = status_error(429, b'{"message":"slow down","code":"rate"}', {"x-request-id": "r"})
    assert isinstance(flat, RateLimitError)
    assert (flat.message, flat.code, flat.request_id) == ("slow down", "rate", "r")
    assert isinstance(status_error(409, b"{}", {}), ConflictError)
    race = status_error(
        400,
        b'{"error":{"message":"Unknown pending tool call: c1","code":"invalid_request_error"}}',
        {},
    )
    assert isinstance(race, UnknownPendingToolCallError)
    other_code = status_error(
        400, b'{"error":{"message":"Unknown pending tool call: c1","code":"other"}}', {}
    )
    assert type(other_code) is BadRequestError


async def test_real_fake_errors_map(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """The fake's own 404 and 401 arrive as NotFoundError and AuthenticationError."""
    with pytest.raises(NotFoundError, match="sess_missing"):
        await make_client().retrieve_session("sess_missing")
    with pytest.raises(AuthenticationError) as caught:
        await make_client(api_key="sk-wrong").retrieve_session("sess_missing")
    assert caught.value.code == "invalid_api_key"


# -- retry rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504])
async def test_retryable_statuses_are_retried(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock, status: int
) -> None:
    """408, 409, 429 and 5xx are retried after the first backoff step (0.25 s)."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 1, status)
    events: list[RetryEvent] = []
    session = await make_client(on_retry=events.append).retrieve_session(sid)
    assert session.id == sid
    assert clock.sleeps == [0.25]
    assert events == [RetryEvent(attempt=1, delay=0.25, reason="status", status=status)]


async def test_backoff_doubles_up_to_the_cap_with_jitter(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """Backoff doubles from the base, is capped, and jitter scales it into [0.75, 1.0]."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 5, 500)
    await make_client(max_retries=5).retrieve_session(sid)
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0]
    clock.sleeps.clear()
    fake.fail_next("retrieve", 7, 500)
    await make_client(max_retries=7, random=lambda: 1.0).retrieve_session(sid)
    assert clock.sleeps == [d * 0.75 for d in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 8.0)]


async def test_max_retries_then_the_last_error(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """After ``max_retries`` retries the last failure is raised as our error type."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 10, 503)
    with pytest.raises(InternalServerError) as caught:
        await make_client(max_retries=2).retrieve_session(sid)
    assert caught.value.status == 503
    assert len(clock.sleeps) == 2
    assert len(requests_of(fake, "retrieve")) == 3


async def test_retry_after_seconds_and_ms_are_honoured(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """``Retry-After`` seconds, and ``retry-after-ms`` in preference, set the delay."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 1, 429, retry_after=3)
    fake.fail_next("retrieve", 1, 503, retry_after="7", retry_after_ms=1500)
    fake.fail_next("retrieve", 1, 503, retry_after="not-a-number")
    await make_client().retrieve_session(sid)
    # The unreadable header falls back to backoff, counted from the retries already taken.
    assert clock.sleeps == [3.0, 1.5, 1.0]


async def test_retry_after_http_date(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """An HTTP-date ``Retry-After`` becomes the seconds until that date."""
    import time

    sid, _ = one_call_session(fake)
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    fake.fail_next("retrieve", 1, 503, retry_after=when)
    await make_client().retrieve_session(sid)
    assert 27 <= clock.sleeps[0] <= 31


async def test_retry_after_over_the_cap_gives_up(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """A server asking for more than ``max_retry_after`` (60 s) is not retried at all."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 1, 429, retry_after=61)
    with pytest.raises(RateLimitError):
        await make_client().retrieve_session(sid)
    assert clock.sleeps == []
    fake.fail_next("retrieve", 1, 429, retry_after=90)
    await make_client(max_retry_after=120, total_deadline=200).retrieve_session(sid)
    assert clock.sleeps == [90.0]


async def test_x_should_retry_overrides_the_status_rule(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """``x-should-retry: true`` retries a 400; ``false`` stops a 503 from being retried."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 1, 400, should_retry=True)
    await make_client().retrieve_session(sid)
    assert clock.sleeps == [0.25]
    fake.fail_next("retrieve", 1, 503, should_retry=False)
    with pytest.raises(InternalServerError):
        await make_client().retrieve_session(sid)
    assert clock.sleeps == [0.25]


async def test_total_deadline_is_never_slept_past(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """Retries stop when the next sleep would pass the total deadline."""
    sid, _ = one_call_session(fake)
    fake.fail_next("retrieve", 20, 500)
    with pytest.raises(InternalServerError):
        await make_client(max_retries=20, total_deadline=2.0).retrieve_session(sid)
    assert clock.sleeps == [0.25, 0.5, 1.0]
    assert sum(clock.sleeps) <= 2.0


async def test_total_deadline_cuts_a_slow_request_short(fake: FakeAgentsAPI) -> None:
    """A request still running at the deadline fails as APITimeoutError, not later."""
    import time

    sid, _ = one_call_session(fake)
    fake.set_latency("retrieve", 5.0)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
    client = AgentsClient(
        api_key="sk-test", base_url="http://fake/v1", http_client=http, total_deadline=0.2
    )
    started = time.monotonic()
    with pytest.raises(APITimeoutError, match="deadline"):
        await client.retrieve_session(sid)
    assert time.monotonic() - started < 2.0


async def test_same_idempotency_key_on_every_retry(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """Status, connection and race retries all resend the same Idempotency-Key."""
    sid, event = one_call_session(fake)
    fake.fail_next("submit", 1, 500)
    fake.drop_next("submit", 1)
    fake.fail_next("submit", 1, 429)
    await make_client().submit_events(sid, [event], idempotency_key="stable")
    keys = {r.idempotency_key for r in requests_of(fake, "submit")}
    assert keys == {"stable"}
    assert len(requests_of(fake, "submit")) == 4
    assert len(fake.submissions) == 1


async def test_registration_race_is_retried_briefly(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """The race 400 is retried after 0.1 s with the same key and then succeeds."""
    sid, event = one_call_session(fake)
    fake.race_once(event["call_id"])
    events: list[RetryEvent] = []
    await make_client(on_retry=events.append).submit_events(sid, [event], idempotency_key="k")
    assert clock.sleeps == [0.1]
    assert events == [RetryEvent(1, 0.1, "pending_call_race", 400)]
    statuses = [(r.status, r.idempotency_key) for r in requests_of(fake, "submit")]
    assert statuses == [(400, "k"), (202, "k")]


async def test_persistent_race_becomes_unknown_pending_tool_call(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """A call that never becomes pending: 0.1, 0.3, 0.6 s, then UnknownPendingToolCallError."""
    sid, event = one_call_session(fake)
    event = {**event, "call_id": "call_never"}
    with pytest.raises(UnknownPendingToolCallError) as caught:
        await make_client().submit_events(sid, [event], idempotency_key="k")
    assert caught.value.message == "Unknown pending tool call: call_never"
    assert caught.value.status == 400
    assert clock.sleeps == [0.1, 0.3, 0.6]
    assert {r.idempotency_key for r in requests_of(fake, "submit")} == {"k"}
    assert len(requests_of(fake, "submit")) == 4


async def test_other_400_is_not_treated_as_the_race(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """A validation 400 is raised at once as BadRequestError with its param."""
    sid, event = one_call_session(fake)
    with pytest.raises(BadRequestError) as caught:
        await make_client().submit_events(sid, [{**event, "success": "yes"}])
    assert type(caught.value) is BadRequestError
    assert caught.value.param == "events[0].success"
    assert clock.sleeps == []


async def test_connection_drops_are_retried(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient], clock: FakeClock
) -> None:
    """A dropped connection is retried; exhausting retries raises APIConnectionError."""
    sid, _ = one_call_session(fake)
    fake.drop_next("retrieve", 2)
    events: list[RetryEvent] = []
    await make_client(on_retry=events.append).retrieve_session(sid)
    assert [e.reason for e in events] == ["connection", "connection"]
    assert events[0].status is None
    fake.drop_next("retrieve", 3)
    with pytest.raises(APIConnectionError) as caught:
        await make_client(max_retries=2).retrieve_session(sid)
    assert type(caught.value) is APIConnectionError
    assert isinstance(caught.value.__cause__, httpx.TransportError)


async def test_drop_after_processing_then_retry_is_harmless(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """The result was accepted but the answer lost: the retry with the same key is a no-op."""
    sid, event = one_call_session(fake)
    fake.drop_next("submit", 1, after_processing=True)
    await make_client().submit_events(sid, [event], idempotency_key="k")
    assert len(fake.submissions) == 1
    assert [r.status for r in requests_of(fake, "submit")] == [None, 202]
    assert fake.session(sid)["status"] == "idle"


async def test_timeouts_over_loopback_are_retried_then_raised(fake: FakeAgentsAPI) -> None:
    """A read timeout (the fake's latency over a real socket) is retried, then APITimeoutError."""
    sid, _ = one_call_session(fake)
    fake.set_latency("retrieve", 0.5)
    events: list[RetryEvent] = []
    clock = FakeClock()
    async with serve_fake(fake) as base_url:
        client = AgentsClient(
            api_key="sk-test",
            base_url=base_url,
            timeout=httpx.Timeout(0.1),
            max_retries=1,
            sleep=clock.sleep,
            on_retry=events.append,
        )
        async with client:
            with pytest.raises(APITimeoutError):
                await client.retrieve_session(sid)
    assert [e.reason for e in events] == ["timeout"]


async def test_timeout_then_success() -> None:
    """A timed-out attempt followed by a good one returns the good answer."""
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise httpx.ReadTimeout("slow", request=request)
        return httpx.Response(200, json={"id": "s", "status": "idle"})

    clock = FakeClock()
    client = AgentsClient(
        api_key="k",
        base_url="http://api/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        sleep=clock.sleep,
        random=lambda: 0.0,
    )
    assert (await client.retrieve_session("s")).status == "idle"
    assert clock.sleeps == [0.25]


async def test_malformed_session_body_is_an_api_error() -> None:
    """A 200 whose body is not a session raises APIError rather than a pydantic error."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"nope": 1}))
    client = AgentsClient(
        api_key="k", base_url="http://api/v1", http_client=httpx.AsyncClient(transport=transport)
    )
    with pytest.raises(APIError, match="malformed session"):
        await client.retrieve_session("s")


def test_parse_retry_after_values() -> None:
    """retry-after-ms wins, floats are allowed, junk is ignored, overflow is infinite."""
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}, now=0) == 0.25
    assert parse_retry_after({"retry-after": "1.5"}, now=0) == 1.5
    assert parse_retry_after({"retry-after": "soon"}, now=0) is None
    assert parse_retry_after({}, now=0) is None
    assert parse_retry_after({"retry-after": "1e999"}, now=0) == float("inf")
    date = email.utils.formatdate(1000.0, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=990.0) == 10.0


@pytest.mark.parametrize(
    ("status", "n", "retry_after", "options"),
    [
        (503, 10, None, {}),  # past max_retries
        (429, 2, 2, {}),  # Retry-After, then read
        (503, 10, None, {"total_deadline": 1.0}),  # past the total deadline
        (404, 1, None, {}),  # not retried
    ],
)
async def test_a_caller_waiting_between_tries_gets_the_loops_tries_and_waits(
    fake: FakeAgentsAPI,
    make_client: Callable[..., AgentsClient],
    clock: FakeClock,
    status: int,
    n: int,
    retry_after: float | None,
    options: dict[str, Any],
) -> None:
    """With a :class:`RetryState` each call makes one try and the caller waits its
    ``delay``: the same tries, waits, retry events, deadline and outcome as the client's
    own loop."""
    sid, _ = one_call_session(fake)

    async def run(turns: bool) -> tuple[list[RetryEvent], list[float], str, int, float]:
        fake.faults.failures.clear()
        fake.requests.clear()
        fake.fail_next("retrieve", n, status, retry_after=retry_after)
        events: list[RetryEvent] = []
        client = make_client(on_retry=events.append, **options)
        began, clock.sleeps = clock(), []
        state = RetryState() if turns else None
        while True:
            try:
                await client.retrieve_session(sid, retry=state)
                outcome = "read"
            except APIError as exc:
                if state is not None and state.delay is not None:
                    await client.pause(state.delay)
                    continue
                outcome = type(exc).__name__
            return events, clock.sleeps, outcome, len(fake.requests), clock() - began

    assert await run(turns=False) == await run(turns=True)


# -- SSE --------------------------------------------------------------------------------------


def sse_client(chunks: list[bytes], status: int = 200) -> AgentsClient:
    """A client whose stream endpoint returns ``chunks`` as separate body pieces."""

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["accept"] == "text/event-stream"
        return httpx.Response(status, headers={"content-type": "text/event-stream"}, content=body())

    return AgentsClient(
        api_key="k",
        base_url="http://api/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )


def idle_event(event_id: str = "e1") -> dict[str, Any]:
    return {
        "type": "agent.session.idle",
        "event_id": event_id,
        "session": {"id": "s", "status": "idle"},
    }


async def collect(client: AgentsClient) -> list[Any]:
    return [event async for event in client.stream_events("s")]


async def test_sse_comments_event_lines_obfuscation_and_done() -> None:
    """Comments, ``event:``/``id:``/``retry:`` lines and obfuscation are tolerated; [DONE] ends."""
    first = json.dumps({**idle_event(), "obfuscation": "aZ09"})
    stream = (
        ": connected\n\n"
        "retry: 1000\n"
        "id: 7\n"
        "event: agent.session.idle\n"
        f"data: {first}\n\n"
        ": keepalive\n\n"
        "event: ignored\n\n"
        "data: [DONE]\n\n"
        f"data: {json.dumps(idle_event('after-done'))}\n\n"
    ).encode()
    events = await collect(sse_client([stream]))
    assert [type(e) for e in events] == [SessionIdleEvent]
    assert events[0].obfuscation == "aZ09"


async def test_sse_multiline_data_crlf_and_split_chunks() -> None:
    """Multi-line data joins with newlines; CRLF and chunks split anywhere are decoded."""
    payload = json.dumps(idle_event(), indent=1).splitlines()
    text = "\ufeff" + "".join(f"data: {line}\r\n" for line in payload) + "\r\n"
    text += "data:" + json.dumps({"type": "future.kind", "event_id": "e2"}) + "\r\n\r\n"
    raw = text.encode()
    # Split into 3-byte pieces so that \r and \n and UTF-8 sequences straddle chunks.
    chunks = [raw[i : i + 3] for i in range(0, len(raw), 3)]
    events = await collect(sse_client(chunks))
    assert [type(e) for e in events] == [SessionIdleEvent, GenericSessionEvent]
    assert events[1].type == "future.kind"


async def test_sse_without_done_or_final_blank_line() -> None:
    """The stream may end without [DONE] and without the last blank line."""
    raw = f"data: {json.dumps(idle_event())}".encode()
    events = await collect(sse_client([raw]))
    assert [type(e) for e in events] == [SessionIdleEvent]


async def test_sse_error_event_is_yielded() -> None:
    """A streamed ``error`` is yielded as ErrorEvent with its code and message."""
    error = {
        "type": "error",
        "event_id": "e",
        "session_id": "s",
        "error": {"code": "server_overloaded", "message": "busy", "type": "server_error"},
    }
    events = await collect(sse_client([f"data: {json.dumps(error)}\n\n".encode()]))
    assert isinstance(events[0], ErrorEvent)
    assert events[0].error.code == "server_overloaded"


async def test_sse_malformed_data_raises_api_error() -> None:
    """Data that is not a JSON event raises APIError (not a JSON or pydantic error)."""
    with pytest.raises(APIError, match="malformed event"):
        await collect(sse_client([b"data: {oops\n\n"]))


async def test_sse_an_event_nested_too_deeply_raises_api_error() -> None:
    """Data nested 100,000 levels deep makes json raise RecursionError, not ValueError: the
    stream still raises its APIError (before, the RecursionError escaped as it was)."""
    deep = '{"type":"agent.session.idle","x":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(APIError, match="malformed event in stream: nested too deeply"):
        await collect(sse_client([f"data: {deep}\n\n".encode()]))


async def test_sse_tolerant_iteration_marks_an_unreadable_event_and_goes_on() -> None:
    """``EventStream.tolerant()`` yields an UnreadableEvent in a bad event's place (its
    reason and size, none of its text) and goes on to the next event."""
    deep = '{"type":"agent.session.idle","x":' + "[" * 100_000 + "]" * 100_000 + "}"
    chunks = [
        f"data: {deep}\n\n".encode(),
        b'data: {"type":"agent.session.idle","secret":"hunter2"}\n\n',
        b"data: {oops\n\n",
        f"data: {json.dumps(idle_event())}\n\n".encode(),
    ]
    async with sse_client(chunks) as client:
        stream = await client.open_event_stream("s")
        async with stream:
            events = [event async for event in stream.tolerant()]
    assert [type(e) for e in events] == [
        UnreadableEvent,
        UnreadableEvent,
        UnreadableEvent,
        SessionIdleEvent,
    ]
    first, second, third = events[:3]
    assert isinstance(first, UnreadableEvent) and first.reason == "nested too deeply to parse"
    assert first.size == len(deep) and first.event_id is None
    assert isinstance(second, UnreadableEvent) and "hunter2" not in second.reason
    assert isinstance(third, UnreadableEvent) and "JSON" in third.reason


async def test_sse_error_status_is_mapped() -> None:
    """A failed stream request maps to our error class like any other request."""
    client = sse_client([b'{"error":{"message":"gone"}}'], status=404)
    with pytest.raises(NotFoundError, match="gone"):
        await collect(client)


async def test_sse_iter_data_unit() -> None:
    """The decoder joins data lines, drops data-less events, and strips one leading space."""

    async def lines() -> AsyncIterator[str]:
        for line in ["data:  two spaces", "data:x", "", "event: only", "", ":c", "data"]:
            yield line

    assert [d async for d in iter_sse_data(lines())] == [" two spaces\nx", ""]


async def test_stream_events_from_the_fake(
    fake: FakeAgentsAPI, make_client: Callable[..., AgentsClient]
) -> None:
    """Streaming a fake session yields typed events until it goes idle."""
    import asyncio

    sid, event = one_call_session(fake)
    client = make_client()
    listener = asyncio.create_task(collect_session(client, sid))
    while not fake.sessions[sid].listeners:
        await asyncio.sleep(0.001)
    await client.submit_events(sid, [event])
    events = await listener
    kinds = [type(e) for e in events]
    assert SessionInProgressEvent in kinds
    assert kinds[-1] is SessionIdleEvent
    assert SessionRequiresActionEvent not in kinds  # it happened before we subscribed
    assert all(e.obfuscation is None for e in events)


async def collect_session(client: AgentsClient, sid: str) -> list[Any]:
    return [e async for e in client.stream_events(sid, include_obfuscation=False)]


@pytest.mark.anyio
async def test_an_httpx2_client_maps_its_errors_like_httpx() -> None:
    """An injected httpx2 client (what the owned client is when httpx2 is installed):
    a refused connection is retried, then raised as our APIConnectionError."""
    import httpx2

    port = free_port()  # nothing listens there
    async with httpx2.AsyncClient() as http:
        client = AgentsClient(
            api_key="sk-test",
            base_url=f"http://127.0.0.1:{port}/v1",
            http_client=http,  # type: ignore[arg-type]  # duck-compatible with httpx
            max_retries=1,
            sleep=_no_sleep_for_httpx2,
        )
        with pytest.raises(APIConnectionError):
            await client.retrieve_session("sess_1")


async def _no_sleep_for_httpx2(_: float) -> None:
    return None


@pytest.mark.parametrize(
    "call",
    [
        lambda c, eid: c.create_webhook_endpoint(
            url="https://a.test/h", name="n", event_types=["agent.session.action_required"]
        ),
        lambda c, eid: c.rotate_webhook_secret(eid),
    ],
    ids=["create", "rotate"],
)
async def test_calls_that_must_not_happen_twice_retry_only_what_was_not_acted_on(
    fake: FakeAgentsAPI,
    make_client: Callable[..., AgentsClient],
    call: Callable[[AgentsClient, str], Awaitable[object]],
) -> None:
    """No idempotency key exists for these: a 5xx, or an answer lost after the request
    went out, may mean the API acted (a second endpoint, a second rotation), so it is
    raised at once; a 429 (the rate limiter refused it) is retried. Other calls retry all."""
    client = make_client()
    endpoint = await client.create_webhook_endpoint(
        url="https://a.test/x", name="x", event_types=["agent.session.action_required"]
    )
    before = len(requests_of(fake, "webhook_endpoints"))
    fake.fail_next("webhook_endpoints", 1, 500, after_processing=True)
    with pytest.raises(InternalServerError):
        await call(client, endpoint.id)
    assert len(requests_of(fake, "webhook_endpoints")) == before + 1
    fake.fail_next("webhook_endpoints", 1, 429)
    await call(client, endpoint.id)
    assert len(requests_of(fake, "webhook_endpoints")) == before + 3
    fake.fail_next("webhook_endpoints", 1, 500)  # an idempotent call still retries a 5xx
    await client.retrieve_webhook_endpoint(endpoint.id)
    assert len(requests_of(fake, "webhook_endpoints")) == before + 5


async def test_a_body_that_does_not_decode_is_a_connection_error_and_retried() -> None:
    """An injected httpx client gets a gzip body that is not gzip: httpx raises its
    DecodingError (not a TransportError); the client retries it, then raises its own
    APIConnectionError, never httpx's exception."""
    answered: list[int] = []

    async def broken_gzip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        answered.append(1)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-encoding: gzip\r\ncontent-length: 9\r\n\r\nnot gzip!"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(broken_gzip, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as http:
            client = AgentsClient(
                api_key="k",
                base_url=f"http://127.0.0.1:{port}/v1",
                http_client=http,
                max_retries=1,
                sleep=FakeClock().sleep,
            )
            with pytest.raises(APIConnectionError):
                await client.retrieve_session("sess_1")
    finally:
        server.close()
        await server.wait_closed()
    assert len(answered) == 2
