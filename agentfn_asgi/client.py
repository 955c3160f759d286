"""``AgentsClient``: the few Agents API calls the middleware makes, with careful retries.

One long-lived HTTP client carries every request: an injected :class:`httpx.AsyncClient`
(or ``httpx2.AsyncClient``, API-compatible for what this client needs), used as is and left
open, or one the client owns and closes in ``aclose``. The owned one is the cheapest
installed, by CPU per request measured with ``benchmarks/http_clients.py`` (64 in flight,
relative to httpx2): with ``aiohttp`` (a dependency) a small adapter onto an aiohttp
session (:mod:`agentfn_asgi._aiohttp`, 0.17×; httpx on the ``httpx-aiohttp`` transport
measured 0.52×), else httpx2 (1×), else httpx 0.29/httpcore 1.0.9 (3.3×: its pool
bookkeeping grows with concurrency); behind a proxy named by the environment, httpx2 or
httpx, which read the proxy variables as the ``openai`` SDK does. ``sniffio`` is a
dependency because httpx retries a failed import of it on every request when it is
missing. The retry policy follows the official client (wire protocol §10.2) with a tighter
cap and a total deadline:

- retried: connection errors, timeouts, and statuses 408, 409, 429 and 5xx;
- ``x-should-retry: true|false`` overrides the status rule;
- ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date) is honoured up to
  ``max_retry_after`` (60 s); a longer demand gives up at once, as the official client does
  above 120 s;
- otherwise exponential backoff (:mod:`agentfn_asgi.backoff`): 0.25 s doubling, capped at
  8 s, less a jitter of up to a quarter (a factor in [0.75, 1.0]);
- at most ``max_retries`` retries and never past ``total_deadline`` seconds from the first
  attempt (the client never sleeps past it, and cuts a request short when it is reached);
- every retry of a submission carries the same ``Idempotency-Key``;
- the calls the API takes no key for and that must not happen twice (creating a webhook
  endpoint, rotating its secret, sending it a test event) are retried only when the
  request cannot have been acted on: the connection was never made, or the answer was 429.
  Otherwise their failure is raised at once (the official client retries them blindly).

The registration race (wire protocol §4.2: 400 ``invalid_request_error`` "Unknown pending tool
call: <id>") is retried after 0.1, 0.3 and 0.6 s with the same key, then raised as
:class:`~agentfn_asgi.errors.UnknownPendingToolCallError` so the caller re-reads the session.
"""

from __future__ import annotations

import asyncio
import email.utils
import importlib
import json
import math
import random as _random
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any, Self, TypeVar, cast

import anyio
import httpx

from agentfn_asgi._sse import EventStream
from agentfn_asgi._version import __version__
from agentfn_asgi.backoff import Backoff
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
from agentfn_asgi.results import escape_surrogates
from agentfn_asgi.session_events import SessionEvent
from agentfn_asgi.wire import (
    SESSION_ID_RE,
    AgentSession,
    SessionList,
    SessionTurn,
    WebhookEndpoint,
    WebhookEndpointDeleted,
    WebhookEndpointList,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
    WireModel,
    parse_session,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_TIMEOUT",
    "RACE_RETRY_DELAYS",
    "AgentsClient",
    "RetryEvent",
    "RetryState",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
DEFAULT_LIMITS = httpx.Limits(max_connections=64, max_keepalive_connections=32)
#: Delays before re-sending a result that hit the registration race (the official helper's).
RACE_RETRY_DELAYS: tuple[float, ...] = (0.1, 0.3, 0.6)
_RACE_PREFIX = "Unknown pending tool call"

_M = TypeVar("_M", bound=WireModel)
_T = TypeVar("_T")

USER_AGENT = f"agentfn-asgi/{__version__} httpx/{httpx.__version__}"


def _optional_httpx2() -> ModuleType | None:
    """httpx2 if installed (the fallback where aiohttp cannot be imported); see the module
    docstring."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:  # pragma: no cover - depends on the environment
        return None


_httpx2 = _optional_httpx2()

_STATUS_ERRORS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    429: RateLimitError,
}


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """Told to ``on_retry`` before each retry sleep.

    ``attempt`` is the 1-based number of the attempt that just failed, ``delay`` the sleep
    before the next one, ``reason`` one of ``"status"``, ``"connection"``, ``"timeout"`` or
    ``"pending_call_race"``, and ``status`` the HTTP status (None without a response).
    """

    attempt: int
    delay: float
    reason: str
    status: int | None


@dataclass(slots=True)
class RetryState:
    """Where one request stands in the retry policy when its caller waits between tries
    itself (the dispatcher, so that a failing read does not hold a worker while it waits):
    pass the same state to every try.

    A try that fails in a way the policy retries raises its error with ``delay`` set to the
    wait the policy asks for (the backoff, the server's ``Retry-After``, a race delay);
    ``delay`` is None when the policy gives up. The tries, waits and total deadline are the
    client's own loop's, counted from the first try; only who waits differs.
    """

    deadline: float | None = None
    attempts: int = 0
    retries: int = 0
    races: int = 0
    delay: float | None = None


class _AttemptFailedError(Exception):
    """Internal: one failed attempt, why, and whether the retry policy may retry it."""

    def __init__(
        self,
        error: APIError,
        reason: str,
        *,
        retryable: bool,
        retry_after: float | None = None,
        maybe_acted: bool = True,
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.reason = reason
        self.retryable = retryable
        self.retry_after = retry_after
        #: False when the API cannot have acted on the request (never connected, or 429).
        self.maybe_acted = maybe_acted


class AgentsClient:
    """Async client for ``/agents/sessions`` (retrieve, list, submit and stream) and the
    project's ``/webhook_endpoints`` (create, list, update, delete, rotate, test).

    ``api_key`` is required (a missing one raises
    :class:`~agentfn_asgi.errors.ConfigurationError` here, not at the first request);
    ``base_url`` defaults to ``https://api.openai.com/v1``. ``project`` and ``organization``
    are sent as ``OpenAI-Project`` / ``OpenAI-Organization``, as the official SDK does
    (webhooks are project-scoped, so a key with several projects must name the one).
    :meth:`agentfn_asgi.config.Config.client` builds one from the environment.
    ``http_client`` is used as is and left open by :meth:`aclose`; without one the client
    owns a pooled client using ``timeout`` (on aiohttp when installed, see the module
    docstring). ``sleep``, ``random`` and
    ``monotonic`` exist so tests can run the retry policy instantly and deterministically.
    Every failure raises an :class:`~agentfn_asgi.errors.APIError` subclass.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        project: str | None = None,
        organization: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        max_retries: int = 4,
        total_deadline: float = 60.0,
        timeout: httpx.Timeout | float = DEFAULT_TIMEOUT,
        on_retry: Callable[[RetryEvent], None] | None = None,
        backoff_base: float = 0.25,
        backoff_cap: float = 8.0,
        max_retry_after: float = 60.0,
        race_delays: Sequence[float] = RACE_RETRY_DELAYS,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        random: Callable[[], float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not api_key:
            raise ConfigurationError(
                "no API key: pass api_key= (the app and the CLI read OPENAI_API_KEY)"
            )
        self._base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self._owns_http = http_client is None
        self._http = http_client or _owned_http_client(timeout)
        self._timeout_errors, self._transport_errors, self._unsent_errors = _error_classes(
            self._http
        )
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "OpenAI-Beta": "agents=v1",
            "User-Agent": USER_AGENT,
        }
        if project:
            self._headers["OpenAI-Project"] = project
        if organization:
            self._headers["OpenAI-Organization"] = organization
        if max_retries < 0 or total_deadline <= 0:
            raise ConfigurationError("max_retries must be >= 0 and total_deadline > 0")
        self.max_retries = max_retries
        self.total_deadline = total_deadline
        self._on_retry = on_retry
        self._backoff = Backoff(base=backoff_base, cap=backoff_cap, jitter=0.25)
        self._max_retry_after = max_retry_after
        self._race_delays = tuple(race_delays)
        self._sleep = sleep or anyio.sleep
        self._random = random or _random.random
        self._monotonic = monotonic

    @property
    def base_url(self) -> str:
        """The API base URL, without a trailing slash (e.g. ``https://api.openai.com/v1``)."""
        return self._base_url

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` as the client waits between its own tries (a test's sleep, if
        given): how a caller using :class:`RetryState` waits for its ``delay``."""
        await self._sleep(seconds)

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it; an injected one is left open."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- API calls ----------------------------------------------------------------------------

    async def retrieve_session(
        self, session_id: str, *, retry: RetryState | None = None
    ) -> AgentSession:
        """``GET /agents/sessions/{id}``: the session with its ``required_actions``.

        With ``retry``, one try of the retry policy: the caller waits between tries
        (:class:`RetryState`)."""
        response = await self._request("GET", _session_path(session_id), retry=retry)
        return _parsed(response, parse_session, "session body")

    async def retrieve_turn(self, session_id: str, turn_id: str) -> SessionTurn:
        """``GET /agents/sessions/{id}/turns/{turn_id}``: the turn's status and error (why
        the calls it waited for stopped being owed)."""
        turn = _checked_id(turn_id, "turn id")
        response = await self._request("GET", f"{_session_path(session_id)}/turns/{turn}")
        return _parsed(response, SessionTurn.model_validate_json, "turn body")

    async def submit_events(
        self,
        session_id: str,
        events: Sequence[Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> None:
        """``POST /agents/sessions/{id}/events`` with ``{"events": [...]}`` (202 expected).

        Without ``idempotency_key`` a fresh UUID is used, the same for every retry.
        """
        body = json.dumps({"events": list(events)}, separators=(",", ":")).encode()
        await self.submit_raw_events(
            session_id, body, idempotency_key=idempotency_key or str(uuid.uuid4())
        )

    async def submit_raw_events(
        self, session_id: str, body: bytes | bytearray, *, idempotency_key: str
    ) -> None:
        """Send ``body`` (already ``{"events": [...]}`` JSON) byte for byte.

        The dispatcher stores the exact event JSON with its key, so every resubmission, from
        any replica, is the identical request. A ``bytearray`` (a large body built in place,
        :func:`~agentfn_asgi.results.events_body`) is sent as it is by the package's aiohttp
        client and as ``bytes`` of it by an httpx client.
        """
        if isinstance(body, bytearray) and not getattr(self._http, "sends_bytearray", False):
            body = bytes(body)
        await self._request(
            "POST",
            _session_path(session_id) + "/events",
            content=body,
            headers={
                "Content-Type": "application/json",
                "Accept": "*/*",
                "Idempotency-Key": idempotency_key,
            },
        )

    async def list_sessions(
        self, *, limit: int = 20, order: str = "desc", after: str | None = None, once: bool = False
    ) -> SessionList:
        """``GET /agents/sessions``: one page of the project's sessions (ids and statuses),
        newest first by default; ``after`` is the last id of the previous page. ``once``:
        one try, no retries (a page that must not wait)."""
        if not 1 <= limit <= 100 or order not in ("asc", "desc"):
            raise ValueError("limit must be 1..100 and order 'asc' or 'desc'")
        params = {"limit": str(limit), "order": order}
        if after is not None:
            params["after"] = after
        response = await self._request("GET", "/agents/sessions", params=params, once=once)
        return _parsed(response, SessionList.model_validate_json, "session list")

    async def open_event_stream(
        self, session_id: str, *, include_obfuscation: bool = True
    ) -> EventStream:
        """``GET /agents/sessions/{id}/events``: returns once the server has accepted the
        subscription (its headers arrived), before any event; iterate the
        :class:`~agentfn_asgi._sse.EventStream` and close it.

        Establishing the stream follows the retry policy; once events flow it is never
        re-requested (the stream has no resume cursor: re-read the session after a
        reconnect, as :func:`~agentfn_asgi.stream.follow_session` does).
        """
        params = None if include_obfuscation else {"include_obfuscation": "false"}
        response = await self._request(
            "GET",
            _session_path(session_id) + "/events",
            headers={"Accept": "text/event-stream"},
            params=params,
            stream=True,
        )
        return EventStream(
            response,
            timeout_errors=self._timeout_errors,
            transport_errors=self._transport_errors,
        )

    async def stream_events(
        self, session_id: str, *, include_obfuscation: bool = True
    ) -> AsyncIterator[SessionEvent]:
        """``GET /agents/sessions/{id}/events``: yield each streamed event, typed.

        :meth:`open_event_stream` as a plain iterator (the request is sent on the first
        step). A streamed ``error`` is yielded as :class:`~agentfn_asgi.session_events.ErrorEvent`.
        Comments, ``event:``/``id:``/``retry:`` lines and the ``obfuscation`` padding are
        tolerated; ``data: [DONE]`` or the end of the body ends iteration. Use
        ``contextlib.aclosing`` to release the connection early.
        """
        stream = await self.open_event_stream(session_id, include_obfuscation=include_obfuscation)
        async with stream:
            async for event in stream:
                yield event

    # -- webhook endpoints (wire protocol §8.5) -----------------------------------------------
    # Like the official SDK's ``client.webhooks``: no ``OpenAI-Beta`` header, the same retry
    # policy as every other call.

    async def create_webhook_endpoint(
        self, *, url: str, name: str, event_types: Sequence[str]
    ) -> WebhookEndpointWithSecret:
        """``POST /webhook_endpoints``: the answer holds ``signing_secret``, shown only now
        (and after a rotation)."""
        body = {"event_types": list(event_types), "name": name, "url": url}
        return await self._endpoint_call(
            "POST", "/webhook_endpoints", WebhookEndpointWithSecret, body=body, once=True
        )

    async def list_webhook_endpoints(
        self, *, limit: int = 20, after: str | None = None
    ) -> WebhookEndpointList:
        """``GET /webhook_endpoints``: one page; ``after`` is the previous page's ``last_id``."""
        if not 1 <= limit <= 100:
            raise ValueError("limit must be 1..100")
        params = {"limit": str(limit)}
        if after is not None:
            params["after"] = after
        return await self._endpoint_call(
            "GET", "/webhook_endpoints", WebhookEndpointList, params=params
        )

    async def retrieve_webhook_endpoint(self, endpoint_id: str) -> WebhookEndpoint:
        """``GET /webhook_endpoints/{id}`` (without the secret)."""
        return await self._endpoint_call("GET", _endpoint_path(endpoint_id), WebhookEndpoint)

    async def update_webhook_endpoint(
        self,
        endpoint_id: str,
        *,
        url: str | None = None,
        name: str | None = None,
        event_types: Sequence[str] | None = None,
    ) -> WebhookEndpoint:
        """``POST /webhook_endpoints/{id}``: only the fields given are sent; ``event_types``
        replaces the whole set."""
        body: dict[str, Any] = {}
        if event_types is not None:
            body["event_types"] = list(event_types)
        if name is not None:
            body["name"] = name
        if url is not None:
            body["url"] = url
        return await self._endpoint_call(
            "POST", _endpoint_path(endpoint_id), WebhookEndpoint, body=body
        )

    async def delete_webhook_endpoint(self, endpoint_id: str) -> WebhookEndpointDeleted:
        """``DELETE /webhook_endpoints/{id}``."""
        return await self._endpoint_call(
            "DELETE", _endpoint_path(endpoint_id), WebhookEndpointDeleted
        )

    async def rotate_webhook_secret(
        self, endpoint_id: str, *, keep_old_secret_active_for_24_hours: bool = False
    ) -> WebhookEndpointWithSecret:
        """``POST /webhook_endpoints/{id}/rotate_secret``: a new ``signing_secret``. Without
        ``keep_old_secret_active_for_24_hours`` the old one stops at once; with it, the API
        signs with both for 24 hours (an app configured with both accepts either)."""
        body = {"keep_old_secret_active_for_24_hours": keep_old_secret_active_for_24_hours}
        return await self._endpoint_call(
            "POST",
            _endpoint_path(endpoint_id) + "/rotate_secret",
            WebhookEndpointWithSecret,
            body=body,
            once=True,
        )

    async def test_webhook_endpoint(
        self, endpoint_id: str, *, event_type: str
    ) -> WebhookEndpointTestResult:
        """``POST /webhook_endpoints/{id}/test``: the API sends a signed sample of
        ``event_type`` and reports the ``status_code`` the endpoint answered."""
        return await self._endpoint_call(
            "POST",
            _endpoint_path(endpoint_id) + "/test",
            WebhookEndpointTestResult,
            body={"event_type": event_type},
            once=True,
        )

    async def list_webhook_event_types(self) -> WebhookEventTypeList:
        """``GET /webhook_event_types``: what the project can subscribe to."""
        return await self._endpoint_call("GET", "/webhook_event_types", WebhookEventTypeList)

    async def _endpoint_call(
        self,
        method: str,
        path: str,
        model: type[_M],
        *,
        body: Mapping[str, Any] | None = None,
        params: Mapping[str, str] | None = None,
        once: bool = False,
    ) -> _M:
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            content = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        response = await self._request(
            method, path, content=content, headers=headers, params=params, beta=False, once=once
        )
        return _parsed(response, model.model_validate_json, f"{model.__name__} body")

    # -- request loop -------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | bytearray | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        stream: bool = False,
        beta: bool = True,
        once: bool = False,
        retry: RetryState | None = None,
    ) -> httpx.Response:
        """Send with the retry policy; ``once``: retried only if the API cannot have acted;
        ``retry``: one try only, the caller waits (see :class:`RetryState`)."""
        sent = {**self._headers, **(headers or {})}
        if not beta:
            del sent["OpenAI-Beta"]
        request = self._http.build_request(
            method,
            self._base_url + path,
            # A bytearray only reaches a client that sends one (submit_raw_events).
            content=cast("bytes | None", content),
            headers=sent,
            params=params,
        )
        # The success path allocates nothing: the state is made at the first failure.
        state = retry
        if retry is not None:
            retry.delay = None
        deadline = (
            state.deadline
            if state is not None and state.deadline is not None
            else self._monotonic() + self.total_deadline
        )
        while True:
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                raise APITimeoutError(f"total deadline of {self.total_deadline}s exceeded")
            try:
                return await self._attempt(request, remaining, stream=stream)
            except _AttemptFailedError as failed:
                if state is None:
                    state = RetryState()
                state.deadline = deadline
                state.attempts += 1
                state.delay = None
                delay = self._next_delay(failed, state, once=once)  # or raises
                if self._on_retry is not None:
                    self._on_retry(
                        RetryEvent(state.attempts, delay, failed.reason, failed.error.status)
                    )
                if retry is not None:
                    retry.delay = delay  # the caller waits, then tries again
                    raise failed.error from failed.__cause__
            await self._sleep(delay)

    def _next_delay(self, failed: _AttemptFailedError, state: RetryState, *, once: bool) -> float:
        """The wait before trying again after ``failed``; raises its error when the policy
        gives up (``once``: retried only if the API cannot have acted)."""
        error = failed.error
        if failed.reason == "pending_call_race":
            if state.races >= len(self._race_delays):
                raise error from None
            delay = self._race_delays[state.races]
            state.races += 1
        elif (
            not failed.retryable
            or state.retries >= self.max_retries
            or (once and failed.maybe_acted)
        ):
            raise error from failed.__cause__
        else:
            delay = failed.retry_after or self._backoff.delay(state.retries + 1, self._random())
            state.retries += 1
        if state.deadline is not None and self._monotonic() + delay > state.deadline:
            # Sleeping would pass the deadline: report the real failure instead.
            raise error from failed.__cause__
        return delay

    async def _attempt(
        self, request: httpx.Request, remaining: float, *, stream: bool
    ) -> httpx.Response:
        """Send once; return a 2xx response or raise ``_AttemptFailedError``."""
        try:
            response = await self._send_within(request, remaining, stream=stream)
        except TimeoutError as exc:
            # The total deadline cut the request short: nothing is left to retry with.
            raise APITimeoutError(f"total deadline of {self.total_deadline}s exceeded") from exc
        except self._transport_errors as exc:  # timeouts included
            timed_out = isinstance(exc, self._timeout_errors)
            err: APIError = (
                APITimeoutError(f"request timed out: {exc!r}")
                if timed_out
                else APIConnectionError(f"connection error: {exc!r}")
            )
            raise _AttemptFailedError(
                err,
                "timeout" if timed_out else "connection",
                retryable=True,
                maybe_acted=not isinstance(exc, self._unsent_errors),
            ) from exc
        if response.is_success:
            return response
        try:
            body = await response.aread()
        except self._transport_errors as exc:
            err = APIConnectionError(f"connection error reading error body: {exc!r}")
            raise _AttemptFailedError(err, "connection", retryable=True) from exc
        finally:
            await response.aclose()
        error = status_error(response.status_code, body, response.headers)
        if isinstance(error, UnknownPendingToolCallError):
            raise _AttemptFailedError(error, "pending_call_race", retryable=True)
        retryable, retry_after = self._retry_rule(response, error.code)
        raise _AttemptFailedError(
            error,
            "status",
            retryable=retryable,
            retry_after=retry_after,
            maybe_acted=response.status_code != 429,  # refused by the rate limiter
        )

    async def _send_within(
        self, request: httpx.Request, seconds: float, *, stream: bool
    ) -> httpx.Response:
        """Send, cut short with TimeoutError after ``seconds``: asyncio's own timeout on
        asyncio (a third of the cost of an anyio cancel scope), anyio's elsewhere (trio)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            with anyio.fail_after(seconds):
                return await self._http.send(request, stream=stream)
        async with asyncio.timeout(seconds):
            return await self._http.send(request, stream=stream)

    def _retry_rule(
        self, response: httpx.Response, code: str | None = None
    ) -> tuple[bool, float | None]:
        """Whether ``response`` may be retried, and the server-asked delay if any."""
        retry_after = parse_retry_after(response.headers, now=time.time())
        if retry_after is not None and retry_after > self._max_retry_after:
            return False, None
        verdict = response.headers.get("x-should-retry")
        status = response.status_code
        if verdict == "true":
            retryable = True
        elif verdict == "false":
            retryable = False
        elif status == 409 and code in _PERMANENT_CONFLICTS:
            # A different answer is already recorded: retrying the same body cannot help.
            retryable = False
        else:
            retryable = status in (408, 409, 429) or status >= 500
        if retry_after is not None and retry_after <= 0:
            retry_after = None
        return retryable, retry_after


#: 409 codes that say the request conflicts with recorded state, not with a transient lock.
_PERMANENT_CONFLICTS = frozenset({"conflict_error", "idempotency_conflict"})


def _owned_http_client(timeout: httpx.Timeout | float) -> httpx.AsyncClient:
    """A pooled client, the cheapest installed (see the module docstring): aiohttp's pool
    behind the few ``httpx.AsyncClient`` methods used here, else httpx2's, else httpx's.

    Behind a proxy named by the environment (``HTTPS_PROXY``, ``ALL_PROXY``...), httpx's:
    it reads those variables as the ``openai`` SDK does, where aiohttp ignores
    ``ALL_PROXY`` and ``https://`` proxies and adds ``~/.netrc`` credentials.
    """
    if not _environment_names_a_proxy():
        try:
            from agentfn_asgi._aiohttp import AiohttpClient
        except ImportError:  # pragma: no cover - depends on the environment
            pass
        else:
            # Duck-typed: it has exactly the methods and response attributes used here.
            owned = AiohttpClient(
                timeout=timeout, max_connections=DEFAULT_LIMITS.max_connections or 64
            )
            return cast("httpx.AsyncClient", owned)
    if _httpx2 is None:
        return httpx.AsyncClient(timeout=timeout, limits=DEFAULT_LIMITS)
    as_httpx = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
    timeout2 = _httpx2.Timeout(**as_httpx.as_dict())
    limits = _httpx2.Limits(
        max_connections=DEFAULT_LIMITS.max_connections,
        max_keepalive_connections=DEFAULT_LIMITS.max_keepalive_connections,
    )
    client: httpx.AsyncClient = _httpx2.AsyncClient(timeout=timeout2, limits=limits)
    return client


def _environment_names_a_proxy() -> bool:
    """Whether a proxy variable is set (``NO_PROXY`` alone names none)."""
    return any(scheme != "no" for scheme in urllib.request.getproxies())


def _error_classes(
    http: object,
) -> tuple[tuple[type[Exception], ...], tuple[type[Exception], ...], tuple[type[Exception], ...]]:
    """The timeout and transport exception classes of the library behind ``http``, and
    those that say the request was never sent (no connection was made)."""
    timeouts: list[type[Exception]] = [httpx.TimeoutException]
    # DecodingError (a body that does not decode as its Content-Encoding says) is not a
    # TransportError in httpx, but it is as much a broken answer.
    transports: list[type[Exception]] = [httpx.TransportError, httpx.DecodingError]
    unsent: list[type[Exception]] = [httpx.ConnectError, httpx.ConnectTimeout]
    if _httpx2 is not None and isinstance(http, _httpx2.AsyncClient):
        timeouts.append(_httpx2.TimeoutException)
        transports += [_httpx2.TransportError, _httpx2.DecodingError]
        unsent += [_httpx2.ConnectError, _httpx2.ConnectTimeout]
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None:
        # The aiohttp transport maps the usual failures to httpx's classes; any it leaves
        # alone (a malformed response...) is still a failure of the connection to us.
        transports.append(aiohttp.ClientError)
    return tuple(timeouts), tuple(transports), tuple(unsent)


def _parsed(response: httpx.Response, parse: Callable[[bytes], _T], what: str) -> _T:
    """``parse`` of the response's body; a body that does not parse is an
    :class:`~agentfn_asgi.errors.APIError` naming ``what``."""
    try:
        return parse(response.content)
    except ValueError as exc:
        raise APIError(
            f"malformed {what}: {exc}",
            status=response.status_code,
            request_id=response.headers.get("x-request-id"),
        ) from exc


def _checked_id(value: str, what: str) -> str:
    # Ids go into the URL path: refuse anything that could change the path or query.
    if not SESSION_ID_RE.fullmatch(value):
        raise ValueError(f"invalid {what}: {value!r}")
    return value


def _session_path(session_id: str) -> str:
    return f"/agents/sessions/{_checked_id(session_id, 'session id')}"


def _endpoint_path(endpoint_id: str) -> str:
    return f"/webhook_endpoints/{_checked_id(endpoint_id, 'webhook endpoint id')}"


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds asked for by ``retry-after-ms`` or ``Retry-After`` (number or HTTP date).

    None when absent or unreadable; an infinite or overflowing value is returned as ``inf``
    so the caller refuses it rather than falling back to a short backoff.
    """
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if math.isnan(delay):
            continue
        return delay / divisor
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return parsed.timestamp() - now


def status_error(status: int, body: bytes, headers: Mapping[str, str]) -> APIStatusError:
    """Build the error for a non-2xx response from its body's ``error`` object.

    A body that is not the JSON error envelope still gives an error, with the text (cut
    short) as the message. 400 "Unknown pending tool call: …" with code
    ``invalid_request_error`` becomes :class:`UnknownPendingToolCallError`.
    """
    detail: dict[str, Any] = {}
    try:
        decoded = json.loads(body) if body else None
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        inner = decoded.get("error")
        detail = inner if isinstance(inner, dict) else decoded
    message = detail.get("message")
    if not isinstance(message, str) or not message:
        text = body[:200].decode("utf-8", "replace").strip()
        message = text or f"HTTP {status}"
    message = escape_surrogates(message)

    def text_field(name: str) -> str | None:
        value = detail.get(name)
        return escape_surrogates(value) if isinstance(value, str) else None

    code = text_field("code")
    cls: type[APIStatusError]
    if status == 400 and code == "invalid_request_error" and message.startswith(_RACE_PREFIX):
        cls = UnknownPendingToolCallError
    elif status >= 500:
        cls = InternalServerError
    else:
        cls = _STATUS_ERRORS.get(status, APIStatusError)
    return cls(
        message,
        status=status,
        code=code,
        param=text_field("param"),
        type=text_field("type"),
        request_id=headers.get("x-request-id"),
    )
