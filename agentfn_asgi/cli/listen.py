"""``agentfn-asgi listen``: develop without a public URL.

Like ``stripe listen``: follow sessions' event streams (:mod:`agentfn_asgi.stream`) and,
whenever a session requires action, POST a locally signed ``agent.session.action_required``
delivery to the local app, which runs unchanged (it verifies, records, reads the session
and answers as for OpenAI's own webhooks). One line per forwarded delivery and its answer
on stdout; progress on stderr; Ctrl-C (or SIGTERM) stops it with exit 0.

The delivery's ``webhook-id`` names the pending actions (:func:`stream_delivery_id`): a
re-read after a reconnect that finds the same calls pending is not forwarded again once the
app took it, and the app's own de-duplication covers the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

import httpx

from ..backoff import Backoff
from ..client import AgentsClient
from ..config import Config
from ..errors import APIStatusError, CLIError
from ..signing import parse_secrets, signed_headers
from ..stream import RECONNECT, FollowEnd, SessionWatcher, stream_delivery_id
from ..wire import AgentSession
from .common import EXIT_OK, progress, seconds_type, secret_from

__all__ = ["Forwarder", "listen", "pending_summary", "register"]

ACTION_REQUIRED = "agent.session.action_required"
#: Answers worth another try, as a webhook sender would retry them.
_RETRY_STATUSES = frozenset({408, 429})


class Forwarder:
    """Signs and POSTs an ``action_required`` delivery for a session to ``url``.

    A delivery the app did not take (no answer, 408, 429, 5xx) is tried again after
    ``backoff`` up to ``attempts`` times, with the same ``webhook-id`` and a fresh
    timestamp, as a webhook sender does. Each answer is one line on ``out``.
    """

    def __init__(
        self,
        url: str,
        secrets: Sequence[str],
        http: httpx.AsyncClient,
        *,
        out: TextIO | None = None,
        attempts: int = 5,
        backoff: Backoff | None = None,
    ) -> None:
        self.url = url
        self.secrets = tuple(secrets)
        self.http = http
        self.out = out or sys.stdout
        self.attempts = attempts
        self.backoff = backoff or RECONNECT
        self.forwarded = 0
        self._taken: set[str] = set()

    async def __call__(self, session: AgentSession) -> None:
        """Forward what ``session`` (freshly read) requires, unless the app took it."""
        delivery_id = stream_delivery_id(session)
        if delivery_id in self._taken:
            return
        kinds = [action.type for action in session.required_actions]
        kind = "function_call" if "function_call" in kinds else kinds[0]
        event = {
            "id": "evt_" + delivery_id.removeprefix("wh_"),
            "object": "event",
            "created_at": int(time.time()),
            "type": ACTION_REQUIRED,
            "data": {
                "id": session.id,
                "required_action": {"type": kind},
            },
        }
        body = json.dumps(event, separators=(",", ":")).encode()
        what = f"{session.id} action_required ({pending_summary(session)})"
        for attempt in range(1, self.attempts + 1):
            headers = {
                "content-type": "application/json",
                "user-agent": "agentfn-asgi-listen",
                **signed_headers(self.secrets, body, msg_id=delivery_id),
            }
            try:
                response = await self.http.post(self.url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                answer, retry = f"no answer ({type(exc).__name__}: is the app running?)", True
            else:
                answer = _describe(response)
                retry = response.status_code in _RETRY_STATUSES or response.status_code >= 500
                if response.is_success:
                    self._taken.add(delivery_id)
            if attempt == 1:
                self.forwarded += 1
            again = retry and attempt < self.attempts
            suffix = f" (attempt {attempt}, retrying)" if again else ""
            print(f"{_now()}  {what} -> {answer}{suffix}", file=self.out, flush=True)
            if not again:
                return
            await asyncio.sleep(self.backoff.delay(attempt))


def pending_summary(session: AgentSession) -> str:
    """``2 calls: get_customer, slow_echo`` (what a forwarded delivery is about)."""
    names = [action.name for action in session.function_calls]
    others = len(session.required_actions) - len(names)
    parts = []
    if names:
        parts.append(f"{len(names)} call{'s' if len(names) != 1 else ''}: {', '.join(names)}")
    if others:
        parts.append(f"{others} other action{'s' if others != 1 else ''}")
    return "; ".join(parts) or "nothing pending"


def _describe(response: httpx.Response) -> str:
    """``200 accepted``: the status and the app's ``status`` (or error) field."""
    detail = response.reason_phrase
    with contextlib.suppress(ValueError):
        payload = response.json()
        if isinstance(payload, dict):
            detail = str(payload.get("status") or payload.get("error") or detail)
    text = f"{response.status_code} {detail}".strip()
    if response.status_code == 401:
        text += " (the app refused the signature: give listen the app's OPENAI_WEBHOOK_SECRET)"
    elif response.is_redirect:
        text += f" (a redirect to {response.headers.get('location', '?')}: use the exact URL)"
    return text


def _now() -> str:
    return time.strftime("%H:%M:%S")


async def listen(
    forward_to: str,
    *,
    secrets: Sequence[str],
    client: AgentsClient,
    session_ids: Sequence[str] = (),
    poll_interval: float = 2.0,
    stop: asyncio.Event | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    backoff: Backoff | None = None,
) -> int:
    """Forward until ``stop`` is set (by default: SIGINT or SIGTERM); returns the exit code.

    Raises :class:`~agentfn_asgi.errors.APIStatusError` when the API refuses the key or
    the request (401, 403, 400).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    handled: list[signal.Signals] = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Only the main thread may handle signals; elsewhere the caller sets ``stop``.
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, stop.set)
            handled.append(signum)
    err = err or sys.stderr
    which = ", ".join(session_ids) if session_ids else "the project's active sessions"
    progress(f"listening to {which} (Ctrl-C to stop); forwarding to {forward_to}", stream=err)

    def ended(end: FollowEnd) -> None:
        again = f", {end.reconnects} reconnect(s)" if end.reconnects else ""
        progress(f"session {end.session_id} {end.status}{again}", stream=err)

    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            forwarder = Forwarder(forward_to, secrets, http, out=out, backoff=backoff)
            watcher = SessionWatcher(
                client,
                forwarder,
                session_ids=session_ids,
                poll_interval=poll_interval,
                backoff=backoff,
                notice=lambda line: progress(line, stream=err),
                on_start=lambda sid: progress(f"following session {sid}", stream=err),
                on_end=ended,
            )
            try:
                await watcher.run(stop)
            except APIStatusError as exc:
                hint = (
                    " (check OPENAI_API_KEY and OPENAI_BASE_URL)"
                    if exc.status in (401, 403)
                    else ""
                )
                raise CLIError(f"the Agents API refused the request: {exc}{hint}") from exc
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
    progress(f"stopped ({forwarder.forwarded} deliveries forwarded)", stream=err)
    return EXIT_OK


def _forward_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) < 10:
        raise argparse.ArgumentTypeError(
            "expected the app's webhook URL, e.g. http://127.0.0.1:8000/openai/webhooks; "
            f"got {value!r}"
        )
    return value


def _cmd_listen(args: argparse.Namespace) -> int:
    secrets = parse_secrets(secret_from(args.secret))
    signed_headers(secrets, b"")  # a malformed secret fails here, before anything runs
    config = Config.from_env()
    client = config.client()

    async def run() -> int:
        async with client:
            return await listen(
                args.forward_to,
                secrets=secrets,
                client=client,
                session_ids=args.session,
                poll_interval=args.poll_interval,
            )

    return asyncio.run(run())


def register(sub: Any) -> None:
    """Add ``listen`` to the ``agentfn-asgi`` subparsers."""
    parser = sub.add_parser(
        "listen",
        help="forward sessions' events to a local app (no public URL needed)",
        description=(
            "Follow sessions' event streams (GET /agents/sessions/{id}/events) and POST a "
            "locally signed agent.session.action_required delivery to --forward-to whenever "
            "a session requires action, so the app runs as with OpenAI's webhooks. Without "
            "--session, the project's active sessions are found by polling GET "
            "/agents/sessions (the 20 newest). Reconnects with backoff and re-reads the "
            "session after each reconnect. Uses OPENAI_API_KEY and OPENAI_BASE_URL; "
            "Ctrl-C stops it."
        ),
    )
    parser.add_argument(
        "--forward-to",
        required=True,
        type=_forward_url,
        metavar="URL",
        help="the app's webhook URL, e.g. http://127.0.0.1:8000/openai/webhooks",
    )
    parser.add_argument(
        "--session",
        action="append",
        default=[],
        metavar="ID",
        help="follow this session (repeatable; default: discover the active ones)",
    )
    parser.add_argument(
        "--secret", help="whsec_ secret the app verifies with (default: OPENAI_WEBHOOK_SECRET)"
    )
    parser.add_argument(
        "--poll-interval",
        type=seconds_type(zero=False),
        default=2.0,
        metavar="SECONDS",
        help="how often to look for sessions that became active (default 2)",
    )
    parser.set_defaults(handler=_cmd_listen)
