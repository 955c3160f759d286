"""The app's side of worker tools (agentfn_asgi.jobs): completion tokens, jobs, the completion
endpoint and the job deadline policy, in process against FakeAgentsAPI."""

from __future__ import annotations

import datetime
import json
import threading
import time
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from itsdangerous import URLSafeTimedSerializer
from pydantic import BaseModel

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.errors import (
    CompletionTokenError,
    CompletionTokenExpiredError,
    ConfigurationError,
    StoreError,
    ToolDefinitionError,
)
from agentfn_asgi.jobs import (
    TOKEN_SALT,
    CompletionTokens,
    bearer_token,
    build_job,
    mount_of,
    parse_completion,
)
from agentfn_asgi.messages import ENQUEUE_FAILED_MESSAGE, JOB_DEADLINE_MESSAGE
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tools import FunctionTools, derive_idempotency_key
from agentfn_asgi.worker import (
    Completion,
    CompletionResult,
    Job,
    complete_call,
    complete_job,
    run_job,
)

from .support.clock import FakeClock
from .support.jobs import (
    COMPLETE_URL,
    COMPLETION_SECRET,
    KEY,
    OTHER_SECRET,
    app_options,
    first_call,
    next_job,
    queue_of_jobs,
    record_of,
    wait_state,
    worker_tools,
)
from .support.stack import running_stack


def test_a_token_round_trips_and_names_exactly_one_call() -> None:
    """verify() gives back the session, turn, call, owner and tool the token was issued for."""
    tokens = CompletionTokens(COMPLETION_SECRET)
    claims = tokens.verify(tokens.issue(KEY, owner="host:1:ab", tool_name="report", attempt=1))
    assert claims.key == KEY
    assert (claims.owner, claims.tool_name) == ("host:1:ab", "report")


def test_a_token_carries_ids_only() -> None:
    """Anyone may read a token: it holds the call's ids, owner, tool, expiry and attempt, no
    secret."""
    token = CompletionTokens(COMPLETION_SECRET).issue(KEY, owner="o", tool_name="report", attempt=1)
    ok, payload = URLSafeTimedSerializer("x" * 16, salt=TOKEN_SALT).loads_unsafe(token)
    assert ok is False  # readable without the secret, but not verifiable
    assert set(payload) == {"s", "t", "c", "o", "n", "x", "a"}
    assert COMPLETION_SECRET not in token


def test_an_altered_token_is_refused_as_invalid_not_expired() -> None:
    """Changing any one character of the payload or signature is refused as invalid."""
    tokens = CompletionTokens(COMPLETION_SECRET)
    token = tokens.issue(KEY, owner="o", tool_name="report", attempt=1)
    # Not the very last character: it also carries base64 padding bits, and a change there
    # can decode to the same signature bytes (the token is then, correctly, still valid).
    for index in (0, len(token) // 2, len(token) - 3):
        swapped = "A" if token[index] != "A" else "B"
        altered = token[:index] + swapped + token[index + 1 :]
        with pytest.raises(CompletionTokenError) as caught:
            tokens.verify(altered)
        assert not isinstance(caught.value, CompletionTokenExpiredError)
    for junk in ("", "abc", token[:-5], token + "x", "x" * 10_000):
        with pytest.raises(CompletionTokenError):
            tokens.verify(junk)


def test_a_foreign_token_is_refused() -> None:
    """Signed with another secret, or by itsdangerous with the same secret for another
    purpose (other salt), a token is refused."""
    ours = CompletionTokens(COMPLETION_SECRET)
    foreign = CompletionTokens(OTHER_SECRET).issue(KEY, owner="o", tool_name="report", attempt=1)
    with pytest.raises(CompletionTokenError):
        ours.verify(foreign)
    other_use = URLSafeTimedSerializer(COMPLETION_SECRET).dumps(
        {"s": "sess_1", "t": "turn_1", "c": "call_1", "o": "o", "n": "report", "x": 2e9}
    )
    with pytest.raises(CompletionTokenError):
        ours.verify(other_use)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=600))
def test_any_string_is_refused_with_a_completion_token_error(text: str) -> None:
    """Hostile input never raises anything but CompletionTokenError."""
    with pytest.raises(CompletionTokenError):
        CompletionTokens(COMPLETION_SECRET).verify(text)


def test_tokens_expire_at_their_deadline_and_at_max_age() -> None:
    """expires_at is honoured to the second, max_age caps every token; both raise the
    distinct CompletionTokenExpiredError."""
    clock = FakeClock()
    tokens = CompletionTokens(COMPLETION_SECRET, max_age=100, clock=clock)
    token = tokens.issue(KEY, owner="o", tool_name="report", attempt=1, expires_at=clock.now + 60)
    clock.now += 59
    assert tokens.verify(token).key == KEY
    clock.now += 2
    with pytest.raises(CompletionTokenExpiredError):
        tokens.verify(token)
    capped = tokens.issue(
        KEY, owner="o", tool_name="report", attempt=1, expires_at=clock.now + 10_000
    )
    clock.now += 101
    with pytest.raises(CompletionTokenExpiredError):
        tokens.verify(capped)


def test_a_token_from_a_replica_whose_clock_runs_ahead_is_accepted() -> None:
    """A few seconds of skew between replicas must not refuse tokens (itsdangerous alone
    would call a token "from the future" expired)."""
    ahead = CompletionTokens(COMPLETION_SECRET, clock=lambda: 1_000_010.0)
    behind = CompletionTokens(COMPLETION_SECRET, clock=lambda: 1_000_000.0)
    token = ahead.issue(KEY, owner="o", tool_name="report", attempt=1, expires_at=1_000_100.0)
    assert behind.verify(token).key == KEY


def test_secret_rotation_verifies_old_and_new_and_signs_with_the_newest() -> None:
    """With "old new" configured, tokens signed by either verify; new tokens use the new
    secret, so they keep verifying once the old one is dropped."""
    old_secret, new_secret = "old-secret-0123456789abcdef", "new-secret-0123456789abcdef"
    before = CompletionTokens(old_secret).issue(KEY, owner="o", tool_name="report", attempt=1)
    during = CompletionTokens(f"{old_secret} {new_secret}")
    assert during.verify(before).key == KEY
    issued = during.issue(KEY, owner="o", tool_name="report", attempt=1)
    assert CompletionTokens([new_secret]).verify(issued).key == KEY
    with pytest.raises(CompletionTokenError):
        CompletionTokens(old_secret).verify(issued)


def test_a_token_is_bound_to_its_namespace_and_mount() -> None:
    """A token verifies at any instance with the same secret, namespace and mount (another
    replica, the CLI); a different namespace or mount refuses it as not authentic, even
    with the same secret."""
    mine = CompletionTokens(COMPLETION_SECRET, namespace="proj_a", mount="/openai/a")
    token = mine.issue(KEY, owner="o", tool_name="report", attempt=1)
    replica = CompletionTokens(COMPLETION_SECRET, namespace="proj_a", mount="/openai/a")
    assert replica.verify(token).key == KEY
    for other in (
        CompletionTokens(COMPLETION_SECRET, namespace="proj_b", mount="/openai/a"),
        CompletionTokens(COMPLETION_SECRET, namespace="proj_a", mount="/openai/b"),
        CompletionTokens(COMPLETION_SECRET),
        # no ambiguity between the two parts
        CompletionTokens(COMPLETION_SECRET, namespace='proj_a", "/openai/a', mount=""),
    ):
        with pytest.raises(CompletionTokenError) as caught:
            other.verify(token)
        assert not isinstance(caught.value, CompletionTokenExpiredError)


def test_a_token_names_its_attempt_and_its_app_or_is_refused() -> None:
    """Every token is signed with its claim's attempt and bound to its app (namespace and
    mount, both empty here): a payload without the attempt, or signed with the bare salt,
    is refused as not authentic."""
    payload = {"s": "sess_1", "t": "turn_1", "c": "call_1", "o": "o", "n": "r", "x": 9e9}
    tokens = CompletionTokens(COMPLETION_SECRET)
    claims = tokens.verify(tokens.issue(KEY, owner="o", tool_name="r", attempt=3))
    assert claims.attempt == 3
    bound = URLSafeTimedSerializer(COMPLETION_SECRET, salt=TOKEN_SALT + ':["", ""]')
    assert tokens.verify(bound.dumps({**payload, "a": 1})).attempt == 1
    for token in (
        bound.dumps(payload),
        bound.dumps({**payload, "a": True}),
        URLSafeTimedSerializer(COMPLETION_SECRET, salt=TOKEN_SALT).dumps({**payload, "a": 1}),
    ):
        with pytest.raises(CompletionTokenError) as caught:
            tokens.verify(token)
        assert not isinstance(caught.value, CompletionTokenExpiredError)


@pytest.mark.parametrize(
    ("public_url", "mount"),
    [
        (None, ""),
        ("https://api.example.com", ""),
        ("https://api.example.com/", ""),
        ("https://api.example.com/openai/a/webhooks/", "/openai/a/webhooks"),
        ("http://10.0.0.5:8000/openai/a/webhooks", "/openai/a/webhooks"),
    ],
)
def test_the_mount_is_the_path_of_the_public_url(public_url: str | None, mount: str) -> None:
    """Only the path binds: a new host or scheme keeps outstanding tokens valid."""
    assert mount_of(public_url) == mount


@pytest.mark.parametrize("secret", ["", " , ", "short", ["ok-secret-0123456789abcdef", "tiny"]])
def test_weak_or_missing_secrets_are_refused(secret: str | list[str]) -> None:
    """No secret, or one under 16 characters, is a configuration error."""
    with pytest.raises(ConfigurationError):
        CompletionTokens(secret)


def test_bearer_token_reads_the_authorization_header() -> None:
    """Only ``Authorization: Bearer <token>`` (any case) carries the token."""
    assert bearer_token([(b"authorization", b"Bearer abc.def")]) == "abc.def"
    assert bearer_token([(b"authorization", b"bearer  abc ")]) == "abc"
    assert bearer_token([(b"authorization", b"Basic abc")]) is None
    assert bearer_token([(b"x-other", b"Bearer abc")]) is None


# -- jobs and tool options -----------------------------------------------------------------


class Window(BaseModel):
    start: datetime.date
    days: int = 7


def test_a_job_round_trips_as_json_with_reparseable_arguments() -> None:
    """Validated arguments (a model, a date) travel as JSON and parse back to the same
    keyword arguments; the job rebuilds from its JSON."""
    tools = FunctionTools()

    @tools.function(enqueue=lambda job: None)
    def report(topic: str, window: Window, when: datetime.date) -> str:
        """Build a report."""
        return topic

    tool = tools.get("report")
    assert tool is not None
    kwargs = tool.parse_arguments(
        {"topic": "sales", "window": {"start": "2025-01-31"}, "when": "2025-02-01"}
    )
    now = time.time()
    job = build_job(
        KEY,
        tool,
        kwargs,
        tokens=CompletionTokens(COMPLETION_SECRET),
        owner="o",
        attempt=2,
        idempotency_key="afn_x",
        now=now,
        complete_url=COMPLETE_URL,
    )
    assert job.arguments == {
        "topic": "sales",
        "window": {"start": "2025-01-31", "days": 7},
        "when": "2025-02-01",
    }
    assert Job.from_json(job.to_json()) == job
    assert tool.parse_arguments(job.arguments) == kwargs
    assert job.deadline == now + tool.job_deadline
    assert CompletionTokens(COMPLETION_SECRET).verify(job.completion_token).key == KEY


def test_a_whole_model_tool_dumps_its_argument_object() -> None:
    """A single-model tool's job carries the model's fields at the top level, as the model
    sent them."""
    tools = FunctionTools()

    @tools.function(enqueue=lambda job: None)
    def report(window: Window) -> str:
        """Build a report."""
        return "ok"

    tool = tools.get("report")
    assert tool is not None
    kwargs = tool.parse_arguments({"start": "2025-03-01", "days": 3})
    assert tool.dump_arguments(kwargs) == {"start": "2025-03-01", "days": 3}
    assert tool.parse_arguments(tool.dump_arguments(kwargs)) == kwargs


@pytest.mark.parametrize(
    "change",
    [
        {"deadline": None},
        {"deadline": True},
        {"arguments": []},
        {"session_id": 5},
        {"attempt": "1"},
    ],
)
def test_a_malformed_job_is_refused_naming_the_field(change: dict[str, Any]) -> None:
    """from_dict raises ValueError naming the first wrong or missing field."""
    data = {
        "session_id": "s",
        "turn_id": "t",
        "call_id": "c",
        "tool_name": "report",
        "arguments": {},
        "idempotency_key": "afn_x",
        "completion_token": "tok",
        "deadline": 1.0,
    }
    assert Job.from_dict(data).attempt == 1
    with pytest.raises(ValueError, match=repr(next(iter(change)))):
        Job.from_dict({**data, **change})
    with pytest.raises(ValueError, match="'call_id'"):
        Job.from_dict({k: v for k, v in data.items() if k != "call_id"})


def test_enqueue_options_are_checked_at_registration() -> None:
    """A non-callable enqueue or a non-positive job deadline is refused up front."""
    tools = FunctionTools()

    def report() -> str:
        """Build a report."""
        return "ok"

    with pytest.raises(ToolDefinitionError, match="enqueue"):
        tools.add(report, enqueue="not callable")  # type: ignore[arg-type]
    for bad in (0, -1, float("inf")):
        with pytest.raises(ToolDefinitionError, match="job_deadline"):
            tools.add(report, enqueue=lambda job: None, job_deadline=bad)


def test_an_app_with_a_queued_tool_needs_a_completion_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without completion_secret= or AGENTFN_COMPLETION_SECRET, the app's check (start-up)
    fails."""
    monkeypatch.delenv("AGENTFN_COMPLETION_SECRET", raising=False)
    tools = FunctionTools()

    @tools.function(enqueue=lambda job: None)
    def report() -> str:
        """Build a report."""
        return "ok"

    webhooks = AgentWebhookApp(tools, webhook_secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    with pytest.raises(ConfigurationError, match="AGENTFN_COMPLETION_SECRET"):
        webhooks.check()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"success":true,"output":{"a":1}}', Completion(True, {"a": 1})),
        (b'{"success":true}', Completion(True, None)),
        (b'{"success":false,"error":"no paper"}', Completion(False, error="no paper")),
    ],
)
def test_parse_completion_accepts_the_documented_bodies(body: bytes, expected: Completion) -> None:
    """``{success, output}`` and ``{success: false, error}``."""
    assert parse_completion(body) == expected


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'{"success":"yes"}',
        b'{"success":false}',
        b'{"success":false,"error":"  "}',
        b'{"success":false,"error":"x","output":1}',
        b'{"success":true,"error":"x"}',
        b'{"success":true,"result":1}',
    ],
)
def test_parse_completion_refuses_anything_else(body: bytes) -> None:
    """Malformed or ambiguous bodies raise ValueError (the endpoint's 400)."""
    with pytest.raises(ValueError):  # noqa: PT011 - any reason; the endpoint shows it
        parse_completion(body)


# -- the endpoint, in process --------------------------------------------------------------


@pytest.mark.anyio
async def test_a_queued_call_is_completed_by_its_worker() -> None:
    """The handler does not run in-process; the job carries what the worker needs; the
    worker's result is submitted once, with the stable key, and repeats are harmless."""
    jobs, enqueue = queue_of_jobs()
    ran_here: list[str] = []
    async with running_stack(worker_tools(ran_here, enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("generate_report", {"topic": "q3", "pages": 2}, call_id="w1")]]
        )
        job = await next_job(jobs)
        assert ran_here == []
        assert (job.session_id, job.call_id, job.tool_name) == (sid, "w1", "generate_report")
        assert job.arguments == {"topic": "q3", "pages": 2}
        assert job.idempotency_key == derive_idempotency_key(sid, job.turn_id, "w1")
        assert job.complete_url == COMPLETE_URL
        with anyio.fail_after(5):  # the lease becomes the job deadline once the job is out
            while (record := await record_of(stack.store, sid, "w1")).lease_expires_at < (
                job.deadline - 5
            ):
                await anyio.sleep(0.01)
        assert record.state is CallState.CLAIMED

        completion = await run_job(worker_tools(), job)
        first = await complete_job(job, completion, http_client=stack.webhook_http)
        await stack.fake.wait_idle(sid, timeout=5)
        again = await complete_job(job, completion, http_client=stack.webhook_http)
        other = await complete_call(
            COMPLETE_URL,
            job.completion_token,
            success=True,
            output="something else",
            http_client=stack.webhook_http,
        )
        record = await record_of(stack.store, sid, "w1")
    assert (first, again, other) == (
        CompletionResult("accepted"),
        CompletionResult("duplicate"),
        CompletionResult("conflict"),
    )
    [submission] = stack.fake.submissions
    assert submission.output == json.dumps(
        {"topic": "q3", "pages": 2, "key": job.idempotency_key}, separators=(",", ":")
    )
    assert record.state is CallState.SUBMITTED
    assert record.result is not None and record.result.source == "worker"


@pytest.mark.anyio
async def test_a_worker_failure_reaches_the_model_as_written() -> None:
    """``{"success": false, "error": ...}`` is sent as the tool's failure text."""
    jobs, enqueue = queue_of_jobs()
    async with running_stack(worker_tools(enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        answer = await complete_call(
            COMPLETE_URL,
            job.completion_token,
            success=False,
            error="The printer is on fire.",
            http_client=stack.webhook_http,
        )
        await stack.fake.wait_idle(sid, timeout=5)
        record = await record_of(stack.store, sid, job.call_id)
    assert answer.status == "accepted"
    [submission] = stack.fake.submissions
    assert (submission.success, submission.error) == (False, "The printer is on fire.")
    assert record.result is not None and record.result.error_type == "worker_error"


@pytest.mark.anyio
async def test_forged_altered_and_expired_tokens_change_nothing() -> None:
    """401 invalid_token for a missing, forged or altered token, 401 token_expired for an
    expired one (the helper raises the matching error); the call stays claimed and the
    genuine completion still works."""
    jobs, enqueue = queue_of_jobs()
    async with running_stack(worker_tools(enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        owner = stack.app.dispatcher.owner
        key = CallKey(sid, job.turn_id, job.call_id)
        forged = CompletionTokens(OTHER_SECRET).issue(
            key, owner=owner, tool_name=job.tool_name, attempt=job.attempt
        )
        altered = job.completion_token[:-3] + (
            "AAA" if job.completion_token[-3:] != "AAA" else "BBB"
        )
        expired = CompletionTokens(
            COMPLETION_SECRET,
            namespace=stack.app.store.namespace,
            mount=mount_of(COMPLETE_URL.removesuffix("/calls/complete")),
            clock=lambda: 1000.0,
        ).issue(key, owner=owner, tool_name=job.tool_name, attempt=job.attempt, expires_at=1060.0)
        body = json.dumps({"success": True, "output": "forged"})
        answers = {}
        for name, headers in {
            "missing": {},
            "not bearer": {"authorization": f"Basic {job.completion_token}"},
            "forged": {"authorization": f"Bearer {forged}"},
            "altered": {"authorization": f"Bearer {altered}"},
            "expired": {"authorization": f"Bearer {expired}"},
        }.items():
            response = await stack.webhook_http.post(COMPLETE_URL, content=body, headers=headers)
            answers[name] = (response.status_code, response.json()["error"])
            assert response.headers["www-authenticate"].startswith("Bearer")
        with pytest.raises(CompletionTokenExpiredError):
            await complete_call(
                COMPLETE_URL, expired, success=True, output="x", http_client=stack.webhook_http
            )
        with pytest.raises(CompletionTokenError) as caught:
            await complete_call(
                COMPLETE_URL, forged, success=True, output="x", http_client=stack.webhook_http
            )
        assert not isinstance(caught.value, CompletionTokenExpiredError)
        assert (await record_of(stack.store, sid, job.call_id)).state is CallState.CLAIMED
        assert stack.fake.submissions == []
        genuine = await complete_job(job, Completion(True, "real"), http_client=stack.webhook_http)
        await stack.fake.wait_idle(sid, timeout=5)
    assert answers == {
        "missing": (401, "invalid_token"),
        "not bearer": (401, "invalid_token"),
        "forged": (401, "invalid_token"),
        "altered": (401, "invalid_token"),
        "expired": (401, "token_expired"),
    }
    assert genuine.status == "accepted"
    assert [s.output for s in stack.fake.submissions] == ["real"]


@pytest.mark.anyio
async def test_malformed_completions_get_400_and_other_methods_405() -> None:
    """A valid token with a bad body is 400 (nothing saved); GET is 405."""
    jobs, enqueue = queue_of_jobs()
    async with running_stack(worker_tools(enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        auth = {"authorization": f"Bearer {job.completion_token}"}
        statuses = []
        for body in (b"nope", b'{"success":1}', b'{"success":false}', b'{"ok":true}'):
            response = await stack.webhook_http.post(COMPLETE_URL, content=body, headers=auth)
            statuses.append((response.status_code, response.json()["error"]))
        method = await stack.webhook_http.get(COMPLETE_URL, headers=auth)
        state = (await record_of(stack.store, sid, job.call_id)).state
    assert statuses == [(400, "invalid_body")] * 4
    assert method.status_code == 405
    assert state is CallState.CLAIMED


@pytest.mark.anyio
async def test_the_endpoint_is_absent_without_a_completion_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An app with no secret (and no queued tools) answers 404 there."""
    monkeypatch.delenv("AGENTFN_COMPLETION_SECRET", raising=False)
    async with running_stack(worker_tools()) as stack:
        response = await stack.webhook_http.post(COMPLETE_URL, content=b"{}")
    assert response.status_code == 404


@pytest.mark.anyio
async def test_a_completion_for_a_cancelled_turn_answers_stale() -> None:
    """The turn is cancelled while its job runs on a worker: the call is cancelled when the
    app hears it (the worker's job is not stopped), and its completion answers 200
    ``stale`` (the worker must not retry); nothing is submitted."""
    jobs, enqueue = queue_of_jobs()
    async with running_stack(worker_tools(enqueue=enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        stack.fake.cancel_turn(sid)
        await wait_state(stack, sid, job.call_id, CallState.CANCELLED)
        first = await complete_job(job, Completion(True, "late"), http_client=stack.webhook_http)
        later = await complete_job(job, Completion(True, "late"), http_client=stack.webhook_http)
    assert (first.status, later.status) == ("stale", "stale")
    assert stack.fake.submissions == []


@pytest.mark.anyio
async def test_an_enqueue_failure_fails_the_call_for_the_model() -> None:
    """enqueue raising: the model is told the job could not be queued (error_type
    ``enqueue_error``); nothing waits for a worker."""

    def broken_enqueue(job: Job) -> None:
        raise ConnectionError("broker down")

    async with running_stack(worker_tools(enqueue=broken_enqueue), **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        await stack.fake.wait_idle(sid, timeout=5)
        [submission] = stack.fake.submissions
        record = await record_of(stack.store, sid, submission.call_id)
    assert submission.error == ENQUEUE_FAILED_MESSAGE.format(name="generate_report")
    assert record.result is not None and record.result.error_type == "enqueue_error"


@pytest.mark.anyio
async def test_a_sync_enqueue_runs_off_the_event_loop() -> None:
    """A sync callable (Celery's ``delay``, RQ's ``enqueue``) runs in a worker thread."""
    threads: list[int] = []
    jobs: list[Job] = []

    def sync_enqueue(job: Job) -> None:
        threads.append(threading.get_ident())
        jobs.append(job)

    async with running_stack(worker_tools(enqueue=sync_enqueue), **app_options()) as stack:
        stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        with anyio.fail_after(5):
            while not jobs:
                await anyio.sleep(0.01)
    assert threads != [threading.get_ident()]
    assert jobs[0].tool_name == "generate_report"


@pytest.mark.anyio
async def test_a_job_past_its_deadline_fails_the_call_without_requeueing() -> None:
    """No completion within job_deadline: the claim expires, the call fails with the
    documented message (the job is not queued again), a late completion is refused as
    expired, and one with a longer-lived token gets 409."""
    jobs, enqueue = queue_of_jobs()
    tools = worker_tools(enqueue=enqueue, job_deadline=0.4)
    async with running_stack(tools, **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        await stack.fake.wait_idle(sid, timeout=10)
        with pytest.raises(CompletionTokenExpiredError):
            await complete_job(job, Completion(True, "late"), http_client=stack.webhook_http)
        assert stack.app.jobs is not None
        tokens = stack.app.jobs.tokens
        long_lived = tokens.issue(
            CallKey(sid, job.turn_id, job.call_id),
            owner=stack.app.dispatcher.owner,
            tool_name=job.tool_name,
            attempt=job.attempt,
        )
        late = await complete_call(
            COMPLETE_URL, long_lived, success=True, output="late", http_client=stack.webhook_http
        )
        record = await record_of(stack.store, sid, job.call_id)
    [submission] = stack.fake.submissions
    assert (submission.success, submission.error) == (False, JOB_DEADLINE_MESSAGE)
    assert record.result is not None and record.result.error_type == "job_deadline"
    assert jobs.empty()
    assert late.status == "conflict"


@pytest.mark.anyio
async def test_a_claim_lost_before_the_deadline_is_queued_again() -> None:
    """A process that died after claiming but before handing over the job leaves a short
    lease; once it expires (well before the job deadline) the call is queued again, as
    attempt 2, and its completion is accepted."""
    jobs, enqueue = queue_of_jobs()
    settings = DispatchSettings(lease_seconds=0.2, recovery_interval=60, recovery_grace=0.1)
    async with running_stack(
        worker_tools(enqueue=enqueue), webhooks=False, settings=settings, **app_options()
    ) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        turn_id, call_id = first_call(stack.fake.required_actions(sid))
        key = CallKey(sid, turn_id, call_id)
        await stack.store.claim_call(
            key, tool_name="generate_report", owner="dead-replica", lease_seconds=0.05
        )
        await anyio.sleep(0.1)
        await stack.app.recover(sid)
        job = await next_job(jobs)
        answer = await complete_job(job, Completion(True, "done"), http_client=stack.webhook_http)
        await stack.fake.wait_idle(sid, timeout=5)
    assert job.attempt == 2
    assert answer.status == "accepted"
    assert [s.output for s in stack.fake.submissions] == ["done"]


class _FirstExtensionFails(MemoryStore):
    """A memory store whose first extension of a lease to ``deadline`` fails as an outage
    would (StoreError, nothing written); every other operation is the real one."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline
        self.failed = 0

    async def renew_lease(
        self, key: CallKey, *, owner: str, attempt: int, lease_seconds: float
    ) -> bool:
        if lease_seconds == self._deadline and not self.failed:
            self.failed += 1
            raise StoreError("connection lost (injected)")
        return await super().renew_lease(
            key, owner=owner, attempt=attempt, lease_seconds=lease_seconds
        )


@pytest.mark.anyio
async def test_a_hand_off_whose_lease_extension_fails_queues_the_job_once() -> None:
    """The claim's extension to the job deadline fails (store outage): nothing is queued by
    that attempt; once its short lease lapses another attempt queues the job, once.

    Fails on the code before issue 14's fencing, which queued the job first and extended
    the lease after: the failed extension left the job queued under a short lease, the call
    was taken over in doubt before the deadline and its job queued a second time.
    """
    deadline = 600.0
    jobs, enqueue = queue_of_jobs()
    store = _FirstExtensionFails(deadline)
    settings = DispatchSettings(lease_seconds=0.3, recovery_interval=0.05, recovery_grace=0.05)
    tools = worker_tools(enqueue=enqueue, job_deadline=deadline)
    async with running_stack(tools, store=store, settings=settings, **app_options()) as stack:
        sid = stack.fake.create_session([[FakeCall("generate_report", {"topic": "q"})]])
        job = await next_job(jobs)
        completion = await run_job(worker_tools(), job)
        answer = await complete_job(job, completion, http_client=stack.webhook_http)
        await stack.fake.wait_idle(sid, timeout=5)
        record = await record_of(stack.store, sid, job.call_id)
    assert store.failed == 1
    assert job.attempt == 2  # the attempt whose extension failed queued nothing
    assert jobs.empty()  # and nothing after it
    assert answer.status == "accepted"
    assert record.state is CallState.SUBMITTED and record.attempt == 2
    assert len(stack.fake.submissions) == 1
