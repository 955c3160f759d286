"""The webhook sender of :class:`~agentfn_asgi.testing.FakeAgentsAPI`.

It behaves like OpenAI's sender as far as it is documented (wire protocol §8.4): a signed
``POST`` per event and endpoint, any 2xx is success and anything else, 3xx included, is
retried with exponential backoff, keeping the same ``webhook-id`` (the receiver's idempotency
key) while each attempt is signed with a fresh timestamp. By default deliveries go out one at
a time, in order, from one background task, unless a fault asks for duplicates or
reordering; with ``concurrency`` > 1 up to that many are in flight at once.

OpenAI keeps retrying for up to 72 hours. The default schedule here is fast (tests);
:func:`webhook_backoff` builds a realistic one over a window of your choice (``fake-api``
retries for five minutes by default). Each :class:`DeliveryAttempt` says whether another
attempt follows (``next_retry``) or the sender gave up (``gave_up``).

asyncio only: the sender uses the running loop's timers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from agentfn_asgi.testing.deliveries import new_webhook_id, signed_delivery, webhook_event
from agentfn_asgi.testing.fake_endpoints import FakeEndpoints, sample_data

__all__ = [
    "DEFAULT_WEBHOOK_RETRY_DELAYS",
    "DeliveryAttempt",
    "WebhookSender",
    "webhook_backoff",
]

#: Fast backoff for tests: 6 attempts over about a second and a half.
DEFAULT_WEBHOOK_RETRY_DELAYS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4, 0.8)


def webhook_backoff(
    window: float, *, first: float = 1.0, factor: float = 2.0, cap: float = 60.0
) -> tuple[float, ...]:
    """Retry delays for a sender that keeps trying for ``window`` seconds.

    The delays start at ``first`` and grow by ``factor`` up to ``cap`` (exponential backoff,
    as OpenAI's sender does over 72 hours); the last one is shortened so that they add up
    to ``window``. ``webhook_backoff(300)`` is 1, 2, 4, ... 32, 60, 60, 60, 57 s: eleven
    attempts over five minutes. A ``window`` below ``first`` means no retry at all.
    """
    if first <= 0 or factor < 1 or cap < first:
        raise ValueError("need first > 0, factor >= 1 and cap >= first")
    delays: list[float] = []
    delay, total = first, 0.0
    while total + delay <= window:
        delays.append(delay)
        total += delay
        delay = min(delay * factor, cap)
    if window - total >= first:
        delays.append(window - total)  # the window is what the banner and the docs promise
    return tuple(delays)


#: How long a held delivery waits for a successor to swap with when reordering.
_REORDER_HOLD = 0.05


@dataclass(frozen=True, slots=True)
class DeliveryAttempt:
    """One attempt to deliver one webhook to one URL.

    ``status`` is None when no response came back (``error`` then says why); ``attempt``
    counts from 1 per delivery; ``webhook_id`` is the same on every attempt (and on a
    duplicate), while the body's ``event_id`` names the event. ``next_retry`` is the delay
    before the next attempt, None when no attempt follows (this one succeeded, or the
    sender gave up: see :attr:`gave_up`). ``test`` marks the one attempt of a
    ``POST /webhook_endpoints/{id}/test`` sample (never retried, never "given up").
    """

    webhook_id: str
    event_id: str
    event_type: str
    session_id: str | None
    url: str
    attempt: int
    status: int | None
    error: str | None
    at: float
    next_retry: float | None = None
    test: bool = False

    @property
    def ok(self) -> bool:
        """True for a 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def gave_up(self) -> bool:
        """True when this attempt failed and was the last: the webhook was not delivered."""
        return not self.ok and self.next_retry is None and not self.test


@dataclass(slots=True)
class _Delivery:
    webhook_id: str
    event_id: str
    event_type: str
    session_id: str | None
    url: str
    body: bytes
    attempt: int = 0
    #: Set for an endpoint created through the API: its URL and secrets are looked up at
    #: each attempt (a rotation or an update applies to retries; a deletion drops them).
    endpoint_id: str | None = None

    @property
    def ids(self) -> tuple[str, str, str, str | None, str]:
        """The first fields of an attempt's record: webhook id, event id and type, session, URL."""
        return (self.webhook_id, self.event_id, self.event_type, self.session_id, self.url)


class WebhookSender:
    """Queues, signs, sends and retries webhook deliveries (see the module docstring)."""

    def __init__(
        self,
        *,
        secrets: Sequence[str],
        urls: Sequence[str],
        client: httpx.AsyncClient | None = None,
        retry_delays: Sequence[float] = DEFAULT_WEBHOOK_RETRY_DELAYS,
        concurrency: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self._sending: set[asyncio.Task[None]] = set()
        self.secrets = tuple(secrets)
        self.urls = list(urls)
        """Where every event goes. A delivery to a URL removed meanwhile is dropped."""
        #: Sessions whose events are not delivered right now (:meth:`FakeAgentsAPI.create_session`
        #: with ``deliver=False``).
        self.muted: set[str] = set()
        self._url_clients: dict[str, httpx.AsyncClient] = {}
        self.retry_delays = tuple(retry_delays)
        self.attempts: list[DeliveryAttempt] = []
        self.duplicate = False
        self.reorder = False
        self._given_client = client
        self._client: httpx.AsyncClient | None = client
        self._clock = clock
        self._queue: collections.deque[_Delivery] = collections.deque()
        self._held: _Delivery | None = None
        self._busy = 0  # deliveries in flight or waiting on a retry timer
        self._timers: set[asyncio.TimerHandle] = set()
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.endpoints = FakeEndpoints(clock)
        """Endpoints created through the API: each gets the events it subscribes to,
        signed with its own secret(s)."""

    def add_url(self, url: str, client: httpx.AsyncClient | None = None) -> None:
        """Send future events to ``url`` too, through ``client`` (the caller's) when given."""
        if url not in self.urls:
            self.urls.append(url)
        if client is not None:
            self._url_clients[url] = client

    def remove_url(self, url: str) -> None:
        """Stop sending to ``url``; its queued deliveries and pending retries are dropped."""
        if url in self.urls:
            self.urls.remove(url)
        self._url_clients.pop(url, None)

    @property
    def max_attempts(self) -> int:
        """Attempts per delivery: the first plus one per retry delay."""
        return len(self.retry_delays) + 1

    def emit(
        self, event_type: str, data: dict[str, Any], *, session_id: str | None = None
    ) -> str | None:
        """Queue one event for every URL and every endpoint subscribed to ``event_type``;
        return its ``webhook-id`` (None when it goes nowhere, or for a muted session)."""
        if session_id is not None and session_id in self.muted:
            return None
        subscribed = self.endpoints.subscribed(event_type)
        if not self.urls and not subscribed:
            return None
        event = webhook_event(event_type, data, clock=self._clock)
        body = json.dumps(event, separators=(",", ":")).encode()
        webhook_id = new_webhook_id()
        targets: list[tuple[str, str | None]] = [(url, None) for url in self.urls]
        targets += [(endpoint.url, endpoint.id) for endpoint in subscribed]
        for url, endpoint_id in targets:
            delivery = _Delivery(
                webhook_id, event["id"], event_type, session_id, url, body, 0, endpoint_id
            )
            self._enqueue(delivery)
            if self.duplicate:
                self._enqueue(replace(delivery))
        self.ensure_started()
        return webhook_id

    @property
    def idle(self) -> bool:
        """True when nothing is queued, held, in flight or waiting to be retried."""
        return not self._queue and self._held is None and self._busy == 0

    def ensure_started(self) -> None:
        """Start the sender task on the running loop (no-op outside a loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is not None and not self._task.done() and self._loop is loop:
            return
        if self._loop is not loop:
            # A new event loop (a new test): state bound to the old loop cannot be reused.
            self._timers.clear()
            self._busy = 0
            if self._given_client is None:
                self._client = None
        self._loop = loop
        self._slots = None
        self._wakeup = asyncio.Event()
        self._task = loop.create_task(self._run(), name="fake-agents-webhook-sender")
        if self._queue:
            self._wakeup.set()

    async def drain(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109 - promised API
        """Wait until every queued delivery has succeeded or used up its attempts."""
        self.ensure_started()
        async with asyncio.timeout(timeout):
            # Idleness changes in several places (send, timers, hold); polling keeps it simple.
            while not self.idle:
                self._flush_held()
                await asyncio.sleep(0.005)

    async def aclose(self) -> None:
        """Stop the sender, drop pending retries and close the HTTP client it created."""
        for timer in self._timers:
            timer.cancel()
        self._busy -= len(self._timers)
        self._timers.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)
        self._sending.clear()
        if self._given_client is None and self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- internals ----------------------------------------------------------------------------

    def _enqueue(self, delivery: _Delivery) -> None:
        if not self.reorder:
            self._flush_held()
            self._push(delivery)
        elif self._held is None:
            # Hold this one back; the next delivery overtakes it (or a timer releases it).
            self._held = delivery
            with contextlib.suppress(RuntimeError):  # no running loop: drain() flushes it
                asyncio.get_running_loop().call_later(_REORDER_HOLD, self._flush_held)
        else:
            held, self._held = self._held, None
            self._push(delivery)
            self._push(held)

    def _flush_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._push(held)

    def _push(self, delivery: _Delivery) -> None:
        self._queue.append(delivery)
        if self._wakeup is not None:
            self._wakeup.set()

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            delivery = self._queue.popleft()
            self._busy += 1
            if self.concurrency == 1:
                await self._deliver(delivery)
                continue
            slots = self._slots
            if slots is None:
                slots = self._slots = asyncio.Semaphore(self.concurrency)
            await slots.acquire()
            task = asyncio.get_running_loop().create_task(self._deliver(delivery, slots))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _deliver(self, delivery: _Delivery, slots: asyncio.Semaphore | None = None) -> None:
        retry_in: float | None = None
        try:
            retry_in = await self._send(delivery)
        finally:
            if slots is not None:
                slots.release()
            if retry_in is not None:
                self._schedule_retry(delivery, retry_in)
            else:
                self._busy -= 1

    def _client_for(self, url: str) -> httpx.AsyncClient:
        client = self._url_clients.get(url)
        if client is not None:
            return client
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=5.0)
        return self._client

    async def _send(self, delivery: _Delivery) -> float | None:
        """Make one attempt; return the delay before a retry, or None if none follows."""
        secrets = self.secrets
        if delivery.endpoint_id is not None:
            endpoint = self.endpoints.by_id.get(delivery.endpoint_id)
            if endpoint is None:
                return None  # the endpoint was deleted: nothing is sent there any more
            delivery.url = endpoint.url
            secrets = endpoint.signing_secrets(self._clock())
        elif delivery.url not in self.urls:
            return None  # the URL was removed: nothing is sent there any more
        delivery.attempt += 1
        status, error = await self._post_signed(delivery, secrets)
        retry_in: float | None = None
        ok = status is not None and 200 <= status < 300
        if not ok and delivery.attempt < self.max_attempts:
            retry_in = self.retry_delays[delivery.attempt - 1]
        self.attempts.append(
            DeliveryAttempt(*delivery.ids, delivery.attempt, status, error, self._clock(), retry_in)
        )
        return retry_in

    async def send_test(self, endpoint_id: str, event_type: str) -> int | None:
        """Sign a sample ``event_type`` event with the endpoint's secret(s) and post it once,
        recorded as a ``test`` attempt; the status it got. KeyError for an unknown endpoint."""
        endpoint = self.endpoints.by_id[endpoint_id]
        event = webhook_event(event_type, sample_data(event_type), clock=self._clock)
        body = json.dumps(event, separators=(",", ":")).encode()
        delivery = _Delivery(new_webhook_id(), event["id"], event_type, None, endpoint.url, body)
        status, error = await self._post_signed(delivery, endpoint.signing_secrets(self._clock()))
        now = self._clock()
        self.attempts.append(DeliveryAttempt(*delivery.ids, 1, status, error, now, test=True))
        return status

    async def _post_signed(
        self, delivery: _Delivery, secrets: Sequence[str]
    ) -> tuple[int | None, str | None]:
        """POST the delivery once, signed with every one of ``secrets`` (one ``v1,``
        signature each); return the status, or None and what went wrong."""
        url, body = delivery.url, delivery.body
        timestamp = int(self._clock())
        _, headers = signed_delivery(secrets, body, msg_id=delivery.webhook_id, timestamp=timestamp)
        try:
            # Redirects are not followed: a sender counts a 3xx as a failed delivery.
            response = await self._client_for(url).post(
                url, content=body, headers=headers, follow_redirects=False
            )
        except Exception as exc:  # the fake must survive any receiver, even a crashing one
            return None, f"{type(exc).__name__}: {exc}"
        return response.status_code, None

    def _schedule_retry(self, delivery: _Delivery, delay: float) -> None:
        assert self._loop is not None

        def requeue() -> None:
            self._timers.discard(timer)
            self._busy -= 1
            self._push(delivery)

        timer = self._loop.call_later(delay, requeue)
        self._timers.add(timer)
