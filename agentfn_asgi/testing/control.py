"""The fake served for local development (``agentfn-asgi fake-api``).

:class:`FakeControlApp` puts a small control API under ``/_fake/`` in front of a
:class:`~agentfn_asgi.testing.FakeAgentsAPI`; :func:`serve_fake_api` serves it on a port
and prints what happens (each delivery, each result, a webhook it gave up on).

A session script, the body of ``POST /_fake/sessions``, is :data:`SESSION_SCRIPT_SHAPE`:
each step is a batch of parallel calls, pending together; the next step's calls come once
every call of the step has a result (:meth:`FakeAgentsAPI.create_session`).
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import signal
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import request_response
from starlette.types import Receive, Scope, Send

from agentfn_asgi._asgi import exact_router
from agentfn_asgi.integrations.starlette import not_found_hint
from agentfn_asgi.testing.fake import FakeAgentsAPI
from agentfn_asgi.testing.fake_state import FakeCall
from agentfn_asgi.testing.fake_validation import json_type
from agentfn_asgi.testing.fake_webhooks import DeliveryAttempt, webhook_backoff
from agentfn_asgi.testing.server import serve_app

__all__ = [
    "DEV_WEBHOOK_RETRY_WINDOW",
    "ONE_STEP_SHAPE",
    "SESSION_SCRIPT_SHAPE",
    "FakeControlApp",
    "SessionScriptError",
    "parse_session_script",
    "serve_fake_api",
]

#: The body of ``POST /_fake/sessions``: ``call_id`` is optional, ``arguments`` defaults to
#: ``{}``; ``{"calls": [...]}`` (:data:`ONE_STEP_SHAPE`) is the same for a single step.
SESSION_SCRIPT_SHAPE = (
    '{"steps": [[{"name": "...", "arguments": {...}, "call_id": "..."}, ...], ...]}'
)
ONE_STEP_SHAPE = '{"calls": [...]}'

#: How long ``fake-api`` keeps retrying a webhook by default (OpenAI's sender: 72 hours).
DEV_WEBHOOK_RETRY_WINDOW = 300.0

_SCRIPT_KEYS = ("steps", "calls", "idle")
_CALL_KEYS = ("name", "arguments", "call_id")


class SessionScriptError(ValueError):
    """A session script that does not have :data:`SESSION_SCRIPT_SHAPE`; says what is wrong."""


def _json_type(value: object) -> str:
    return json_type(type(value))


def _unknown_keys(found: dict[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in found:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise SessionScriptError(f'{where} has an unknown key "{key}"{hint}')


def _call(raw: object, where: str) -> FakeCall:
    if not isinstance(raw, dict):
        raise SessionScriptError(
            f'{where} must be an object like {{"name": "get_customer", "arguments": {{...}}}}, '
            f"got {_json_type(raw)}"
        )
    _unknown_keys(raw, _CALL_KEYS, where)
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        found = "nothing" if "name" not in raw else _json_type(name)
        raise SessionScriptError(f"{where}.name must be the tool's name (a string), got {found}")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        raise SessionScriptError(
            f"{where}.arguments must be an object of the tool's arguments, "
            f"got {_json_type(arguments)}"
        )
    call_id = raw.get("call_id")
    if call_id is not None and (not isinstance(call_id, str) or not call_id):
        raise SessionScriptError(f"{where}.call_id must be a non-empty string when given")
    return FakeCall(name, arguments, call_id=call_id)


def _step(raw: object, where: str) -> list[FakeCall]:
    if not isinstance(raw, list):
        raise SessionScriptError(f"{where} must be an array of calls, got {_json_type(raw)}")
    if not raw:
        raise SessionScriptError(f"{where} is empty: a step needs at least one call")
    return [_call(call, f"{where}[{index}]") for index, call in enumerate(raw)]


def parse_session_script(payload: object) -> list[list[FakeCall]]:
    """The steps of a session script (:data:`SESSION_SCRIPT_SHAPE`), decoded JSON.

    Raises :class:`SessionScriptError` naming the first thing that is wrong and where
    (``steps[0][1].arguments must be an object ...``). ``{"idle": true}`` is a session whose
    one turn asks for nothing: idle at once, nothing pending (``agentfn-asgi send`` makes one
    to name in its delivery); it has no steps.
    """
    if not isinstance(payload, dict):
        raise SessionScriptError(f"the body must be a JSON object, got {_json_type(payload)}")
    _unknown_keys(payload, _SCRIPT_KEYS, "the body")
    if "idle" in payload:
        if payload["idle"] is not True or len(payload) > 1:
            raise SessionScriptError('"idle" comes alone, as {"idle": true}')
        return []
    if "steps" in payload and "calls" in payload:
        raise SessionScriptError('give either "steps" or "calls", not both')
    if "calls" in payload:
        return [_step(payload["calls"], "calls")]
    if "steps" not in payload:
        raise SessionScriptError('the body needs "steps" (several steps) or "calls" (one step)')
    steps = payload["steps"]
    if not isinstance(steps, list):
        raise SessionScriptError(
            f'"steps" must be an array of steps, each an array of calls; got {_json_type(steps)}'
        )
    if not steps:
        raise SessionScriptError('"steps" is empty: a session needs at least one step')
    return [_step(step, f"steps[{index}]") for index, step in enumerate(steps)]


class FakeControlApp:
    """The fake plus a small control API under ``/_fake/`` for local development.

    - ``POST /_fake/sessions`` with a session script (:data:`SESSION_SCRIPT_SHAPE`) creates a
      session and answers ``201 {"id": ...}``; a bad script answers ``400`` with
      ``{"error": what is wrong, "expected": the shape}``. ``{"idle": true}`` creates a
      session with nothing pending.
    - ``POST /_fake/sessions/{id}/redeliver`` sends the session's ``action_required``
      webhook again (a new webhook-id), e.g. after the fake gave up on the app:
      ``202 {"webhook_id": ...}``; ``404`` for an unknown session, ``409`` when nothing is
      pending or no webhook URL is set.
    - ``POST /_fake/sessions/{id}/cancel`` cancels the session's active turn (what
      ``agent.session.input.cancel`` does; the webhook URL gets ``agent.session.idle``);
      ``POST /_fake/sessions/{id}/fail`` fails it, with an optional body ``{"code": ...,
      "message": ...}`` (default ``internal_error``; the URL gets ``agent.session.failed``):
      ``200 {"status": "cancelled" | "failed"}``, ``404`` for an unknown session, ``409``
      when no turn is active.
    - ``POST /_fake/sessions/{id}/budget`` pauses the session on its spending limit, with
      an optional body ``{"limit": cents, "consumed": cents}`` (default 100, and consumed
      the limit; the stream gets ``agent.session.budget_reached``, no webhook exists for
      it): ``200 {"status": "budget_reached"}``, ``404`` for an unknown session, ``400``
      for a body that is not whole numbers with consumed at least the limit.
    - ``GET /_fake/submissions`` lists the results the fake accepted.

    Everything else goes to the fake (``/v1/agents/sessions/...``).
    """

    def __init__(self, fake: FakeAgentsAPI) -> None:
        self.fake = fake
        routes = [
            ("/_fake/sessions", self._create, "POST"),
            ("/_fake/sessions/{session_id}/redeliver", self._redeliver, "POST"),
            ("/_fake/sessions/{session_id}/cancel", self._end_turn, "POST"),
            ("/_fake/sessions/{session_id}/fail", self._end_turn, "POST"),
            ("/_fake/sessions/{session_id}/budget", self._pause_on_budget, "POST"),
            ("/_fake/submissions", self._submissions, "GET"),
        ]
        listed = [f"{allow} {path.replace('{session_id}', '{id}')}" for path, _, allow in routes]

        async def no_endpoint(request: Request) -> JSONResponse:
            where = f"{request.method} {request.url.path}"
            return _error(404, f"no control endpoint {where}", endpoints=listed)

        self._router = exact_router(
            [(path, request_response(answer), allow) for path, answer, allow in routes],
            request_response(no_endpoint),
            _refuse,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/_fake/"):
            await self._router(scope, receive, send)
            return
        await self.fake(scope, receive, send)

    async def _submissions(self, request: Request) -> JSONResponse:
        fields = ("session_id", "call_id", "success", "output", "error")
        return JSONResponse([{f: getattr(s, f) for f in fields} for s in self.fake.submissions])

    async def _create(self, request: Request) -> JSONResponse:
        try:
            try:
                payload = json.loads(await request.body())
            except ValueError as exc:
                raise SessionScriptError(f"the body is not JSON ({exc})") from None
            steps = parse_session_script(payload)
            # A call id used twice is only known once the session plans its turn.
            session_id = self.fake.create_session(steps)
        except ValueError as exc:
            expected = f"{SESSION_SCRIPT_SHAPE} or {ONE_STEP_SHAPE} for one step"
            return _error(400, f"bad session script: {exc}", expected=expected)
        return JSONResponse({"id": session_id}, status_code=201)

    async def _end_turn(self, request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if session_id not in self.fake.sessions:
            return _error(404, f"no session {session_id}")
        if request.url.path.endswith("/cancel"):
            status, ended = "cancelled", self.fake.cancel_turn(session_id)
        else:
            try:
                body = json.loads(await request.body() or b"{}")
                code = str(body.get("code", "internal_error"))
                message = str(body.get("message", "The turn failed."))
            except (ValueError, AttributeError):
                return _error(400, 'the body is not {"code": ..., "message": ...}')
            status, ended = "failed", self.fake.fail_turn(session_id, code, message)
        if not ended:
            return _error(409, f"session {session_id} has no active turn")
        return JSONResponse({"status": status})

    async def _pause_on_budget(self, request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if session_id not in self.fake.sessions:
            return _error(404, f"no session {session_id}")
        shape = '{"limit": cents, "consumed": cents} (whole numbers, consumed >= limit)'
        try:
            body = json.loads(await request.body() or b"{}")
            limit, consumed = body.get("limit", 100), body.get("consumed")
            if not all(
                isinstance(n, int) and not isinstance(n, bool)
                for n in (limit, limit if consumed is None else consumed)
            ):
                raise ValueError("not whole numbers")
            self.fake.pause_on_budget(session_id, limit=limit, consumed=consumed)
        except (ValueError, AttributeError):
            return _error(400, f"the body is not {shape}")
        return JSONResponse({"status": "budget_reached"})

    async def _redeliver(self, request: Request) -> JSONResponse:
        session_id = request.path_params["session_id"]
        if session_id not in self.fake.sessions:
            return _error(404, f"no session {session_id}")
        if not self.fake.webhooks.urls:
            return _error(409, "no webhook URL is set (start fake-api with --webhook-url)")
        webhook_id = self.fake.redeliver(session_id)
        if webhook_id is None:
            return _error(409, f"session {session_id} has no pending calls: nothing to redeliver")
        return JSONResponse({"webhook_id": webhook_id}, status_code=202)


def _error(status: int, message: str, **fields: Any) -> JSONResponse:
    """The control API's error answer: ``{"error": message, **fields}``."""
    return JSONResponse({"error": message, **fields}, status_code=status)


async def _refuse(scope: Scope, receive: Receive, send: Send, allow: str) -> None:
    answer = {"error": f"method not allowed (use {allow})"}
    await JSONResponse(answer, status_code=405, headers={"allow": allow})(scope, receive, send)


async def serve_fake_api(
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    webhook_urls: Sequence[str] = (),
    webhook_secret: str | None = None,
    api_key: str = "sk-test",
    webhook_retry_delays: Sequence[float] | None = None,
    calls: Sequence[tuple[str, dict[str, Any]]] = (),
    out: TextIO | None = None,
    ready: asyncio.Event | None = None,
    stop_on_sigterm: bool = False,
) -> int:
    """Serve :class:`FakeControlApp` until cancelled (Ctrl-C), logging what happens.

    ``webhook_retry_delays`` defaults to :func:`webhook_backoff` over
    :data:`DEV_WEBHOOK_RETRY_WINDOW` (a few minutes to start the app). With
    ``stop_on_sigterm`` (the CLI) a SIGTERM stops the server cleanly too.
    """
    stop = asyncio.Event()
    if stop_on_sigterm:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    stream = out or sys.stdout
    delays = (
        tuple(webhook_retry_delays)
        if webhook_retry_delays is not None
        else webhook_backoff(DEV_WEBHOOK_RETRY_WINDOW)
    )
    fake = FakeAgentsAPI(
        api_key=api_key,
        webhook_secret=webhook_secret,
        webhook_url=list(webhook_urls),
        webhook_retry_delays=delays,
    )
    async with fake, serve_app(FakeControlApp(fake), host=host, port=port, lifespan="off") as root:
        base_url = root + "/v1"
        targets = ", ".join(webhook_urls) or (
            "nowhere (pass --webhook-url, create an endpoint with agentfn-asgi webhooks "
            "create --url URL, or forward from the event streams with agentfn-asgi listen "
            "--forward-to URL)"
        )
        banner = [
            f"FakeAgentsAPI listening on {base_url}",
            f"  OPENAI_BASE_URL={base_url}",
            f"  OPENAI_API_KEY={api_key}",
            f"  OPENAI_WEBHOOK_SECRET={fake.webhook_secret}",
            f"  webhooks go to {targets}",
            f"  a failed webhook is retried {len(delays)} time(s) over {sum(delays):g} s",
            f"  create sessions: agentfn-asgi fake-api session --url {root} "
            """--call 'get_customer:{"customer_id":"123"}'""",
        ]
        print("\n".join(banner), file=stream, flush=True)
        if calls:
            session_id = fake.create_session([[FakeCall(name, args) for name, args in calls]])
            print(
                f"session {session_id} created with {len(calls)} call(s)", file=stream, flush=True
            )
        if ready is not None:
            ready.set()
        await _log_until(stop, fake, root, stream)
    print("stopped", file=stream, flush=True)
    return 0


def _describe_attempt(attempt: DeliveryAttempt, root: str) -> list[str]:
    """The log lines of one delivery attempt (``root``: where the control API answers)."""
    answer = attempt.status if attempt.status is not None else attempt.error
    if attempt.test:
        line = f"test webhook {attempt.event_type} -> {attempt.url}: {answer}"
        return [line, f"  {not_found_hint(attempt.url)}"] if attempt.status == 404 else [line]
    line = f"webhook {attempt.event_type} -> {attempt.url}: {answer}"
    if attempt.next_retry is not None:
        line += f" (attempt {attempt.attempt}, next in {attempt.next_retry:g} s)"
    lines = [line]
    if attempt.status == 404 and attempt.attempt == 1:
        lines.append(f"  {not_found_hint(attempt.url)}")
    if attempt.gave_up:
        lines.append(
            f"gave up on webhook {attempt.webhook_id} ({attempt.event_type}) to {attempt.url} "
            f"after {attempt.attempt} attempt(s)"
        )
        if attempt.event_type == "agent.session.action_required" and attempt.session_id:
            lines.append(
                f"  once the app answers, send it again: curl -X POST "
                f"{root}/_fake/sessions/{attempt.session_id}/redeliver"
            )
    return lines


async def _log_until(stop: asyncio.Event, fake: FakeAgentsAPI, root: str, out: TextIO) -> None:
    seen = [0, 0]  # deliveries, submissions
    try:
        while not stop.is_set():
            _log_new(fake, root, out, seen)
            await asyncio.sleep(0.05)
    finally:
        # What arrived since the last look is told too when the server stops.
        _log_new(fake, root, out, seen)


def _log_new(fake: FakeAgentsAPI, root: str, out: TextIO, seen: list[int]) -> None:
    for attempt in fake.deliveries[seen[0] :]:
        seen[0] += 1
        for line in _describe_attempt(attempt, root):
            print(line, file=out, flush=True)
    for s in fake.submissions[seen[1] :]:
        seen[1] += 1
        text = s.output if s.success else f"error: {s.error or ''}"
        shown = text if isinstance(text, str) else json.dumps(text)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        print(f"result  {s.session_id}/{s.call_id}: {shown}", file=out, flush=True)
