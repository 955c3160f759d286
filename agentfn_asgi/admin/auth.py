"""Who may use the operator page: tokens, a host's authorizer, session cookies, CSRF.

Three ways in, checked in this order:

- a **session cookie** from the login form: signed and timed (itsdangerous), ``HttpOnly``,
  ``SameSite=Strict``, ``Secure`` over https. It is signed with a key derived from the token
  that logged in (and from ``secret=`` when given), so adding a token keeps every session,
  removing a token ends exactly the sessions it opened, and changing ``secret=`` ends all;
- ``Authorization: Bearer <token>`` (API clients): compared in constant time with every
  configured token;
- the host's **authorizer** (its own login): ``authorizer(request) -> bool | str`` (or
  awaitable), where only ``True`` or a person's name (a non-empty string, recorded with
  their decisions) allows; if it raises, the request is denied and the error logged.

Who decides an approval is recorded: the authorizer's name, or the name given once at the
login form (a token is shared; the name says which person used it).

A POST authenticated by a cookie (ours or the host's) carries a synchronizer token bound to
our session cookie's random id; a bearer POST needs none (a browser never adds that header
on its own). When the host's authorizer lets a browser in, the page gives it a cookie that
only carries that id (it grants nothing by itself).

**Logout ends the session on the server.** A cookie is self-contained (nothing is stored at
login), so deleting it in the browser would leave a copy valid until it expires. Logging out
therefore records the cookie's random id as revoked, through the view, in the app's store
(:meth:`~agentfn_asgi.store.base.Store.revoke_token`), until the moment the cookie would
expire anyway; every request with a cookie checks that list. Why this design: it needs no
state at login and one small row per logout (forgotten at the cookie's expiry), holds for
every replica sharing the store and across restarts, and ends exactly the session that
logged out (an epoch per token would log out everybody sharing the token). A cookie is
checked against ``session_max_age`` as configured now: after raising it, log out again any
session ended before, whose revocation ends at the old expiry.

**Failed logins are throttled per client** (:class:`LoginThrottle`): after
:data:`LOGIN_FAILURES` (5) failures within :data:`LOGIN_WINDOW` (5 minutes), the login form
answers 429 with ``Retry-After`` until the oldest of them is 5 minutes old, without checking
the token. The client is, in this order:

- a **browser that logged in here before**: a good login leaves a signed cookie
  (:data:`BROWSER_COOKIE`, :data:`BROWSER_MAX_AGE`, keyed like the session by the token that
  logged in; it grants nothing by itself) and that browser's failures count on their own.
  So a guesser, who never logged in, cannot lock out the operators who have, whatever
  address they share (a proxy that forwards no client address makes it one address);
- behind a proxy listed in ``trusted_proxies``, the address it forwarded
  (``X-Forwarded-For``, read from the right, skipping the trusted proxies' own);
- else the peer address; IPv6 addresses count per /64.

At most :data:`LOGIN_CLIENTS` (10,000) clients are remembered, at most 5 timestamps each;
past that the least recently failed is forgotten. The count is per process (N replicas
allow N times as many tries). Bearer tokens and signed approval links are never
throttled. Tokens have at least 16 characters, so the throttle is a second line: it keeps a
guesser slow and visible in the log.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import ipaddress
import logging
import math
import secrets
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from itsdangerous import BadData, TimestampSigner, URLSafeTimedSerializer
from starlette.requests import Request

from ..errors import ConfigurationError

__all__ = [
    "BROWSER_COOKIE",
    "BROWSER_MAX_AGE",
    "LOGIN_CLIENTS",
    "LOGIN_FAILURES",
    "LOGIN_WINDOW",
    "MAX_NAME",
    "MIN_TOKEN_LENGTH",
    "SESSION_COOKIE",
    "Authorizer",
    "Gate",
    "LoginThrottle",
    "Session",
    "person",
]

logger = logging.getLogger("agentfn_asgi.admin")

#: ``authorizer(request)`` → ``True``, or the person's name, to allow (anything else
#: denies); may be async.
Authorizer = Callable[[Request], bool | str | Awaitable[bool | str]]
#: The longest name a login or an authorizer may give (kept in the cookie, shown in logs).
MAX_NAME = 64

#: Shorter tokens are refused at start: the page can settle calls, so it needs a real secret.
MIN_TOKEN_LENGTH = 16
SESSION_COOKIE = "agentfn_admin"
#: The cookie of a browser that logged in here (see the module docstring), and how long
#: it is recognised after its last good login.
BROWSER_COOKIE = "agentfn_admin_browser"
BROWSER_MAX_AGE = 90 * 86400
#: Failed logins from one client within LOGIN_WINDOW seconds before a 429.
LOGIN_FAILURES = 5
LOGIN_WINDOW = 300.0
#: How many clients the login throttle remembers (the least recently failed is dropped).
LOGIN_CLIENTS = 10_000

# Keys are derived, never used raw: one purpose per key (sessions, CSRF-only cookies).
_TOKEN_BASE = b"agentfn-asgi admin session"
_SALT = "agentfn-asgi.admin.session"
_BROWSER_SALT = "agentfn-asgi.admin.browser"


@dataclass(frozen=True, slots=True)
class Session:
    """A verified cookie: its random id, how it was issued, the key that signed it, and
    when (Unix time; the cookie expires ``max_age`` after)."""

    sid: str
    via: Literal["token", "host"]
    key: bytes
    issued_at: float = 0.0
    name: str = ""  # who logged in, as they said at the login form


def _derive(base: bytes, purpose: bytes, material: bytes) -> bytes:
    return hmac.new(base, purpose + b"\0" + material, hashlib.sha256).digest()


def _clocked_signer(clock: Callable[[], float]) -> type[TimestampSigner]:
    class ClockedSigner(TimestampSigner):
        # The injected clock decides expiry, so tests can move time instead of waiting.
        def get_timestamp(self) -> int:
            return int(clock())

    return ClockedSigner


def _tokens(tokens: str | Iterable[str] | None) -> tuple[bytes, ...]:
    if tokens is None:
        return ()
    listed = [tokens] if isinstance(tokens, str) else list(tokens)
    checked: list[bytes] = []
    for token in listed:
        if (
            not isinstance(token, str)
            or not token.isprintable()
            or any(c.isspace() or c == "," for c in token)
        ):
            raise ConfigurationError(
                "each operator page token must be a string without spaces, commas or control "
                "characters (pass several tokens as a list, not one joined string)"
            )
        if len(token) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"an operator page token must be at least {MIN_TOKEN_LENGTH} characters; make "
                "one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        checked.append(token.encode("utf-8"))
    return tuple(checked)


class Gate:
    """Checks tokens, cookies, CSRF tokens and the host's authorizer for :class:`AdminApp`."""

    def __init__(
        self,
        *,
        tokens: str | Iterable[str] | None,
        authorizer: Authorizer | None,
        secret: str | bytes | None,
        max_age: float,
        clock: Callable[[], float],
    ) -> None:
        self.tokens = _tokens(tokens)
        self.authorizer = authorizer
        if not self.tokens and authorizer is None:
            raise ConfigurationError(
                "the operator page is off unless configured: pass tokens=[...] (for example "
                "from AGENTFN_ADMIN_TOKEN) or authorizer=<callable(request) -> bool> to reuse "
                "your own login"
            )
        if authorizer is not None and not callable(authorizer):
            raise ConfigurationError("authorizer must be a callable(request) -> bool")
        if max_age <= 0:
            raise ConfigurationError(f"session_max_age must be positive, got {max_age!r}")
        if isinstance(secret, str):
            secret = secret.encode("utf-8")
        if secret is not None and len(secret) < MIN_TOKEN_LENGTH:
            raise ConfigurationError(
                f"the operator page secret must be at least {MIN_TOKEN_LENGTH} bytes"
            )
        self.max_age = max_age
        self._now = clock
        signer = _clocked_signer(clock)
        token_base = secret or _TOKEN_BASE
        # Without secret=, CSRF-only cookies (host logins) are signed with a per-process key:
        # several processes behind one balancer then need secret= to accept each other's forms.
        host_base = secret or secrets.token_bytes(32)
        self._token_keys = [_derive(token_base, b"session", token) for token in self.tokens]
        # Compared as digests: equal lengths, so not even a token's length leaks.
        self._token_digests = [hashlib.sha256(token).digest() for token in self.tokens]
        self._host_key = _derive(host_base, b"host", b"")
        self._serializers = {
            key: URLSafeTimedSerializer(key, salt=_SALT, signer=signer)
            for key in [*self._token_keys, self._host_key]
        }
        self._browsers = [
            URLSafeTimedSerializer(key, salt=_BROWSER_SALT, signer=signer)
            for key in self._token_keys
        ]
        # Signed approval links (admin/approval_links.py): keyed by secret=, else by the
        # first token (a rotation then invalidates links made before it), else per process.
        link_material = self.tokens[0] if self.tokens else host_base
        self.link_key = _derive(token_base, b"approval-link", link_material)

    # -- tokens ----------------------------------------------------------------------------

    def match_token(self, presented: bytes) -> bytes | None:
        """The session key of the token ``presented`` equals, or None. Constant time: every
        configured token is compared, whatever matched first."""
        digest = hashlib.sha256(presented).digest()
        found: bytes | None = None
        for expected, key in zip(self._token_digests, self._token_keys, strict=True):
            if hmac.compare_digest(expected, digest):
                found = key
        return found

    @staticmethod
    def bearer(request: Request) -> bytes | None:
        """The token of an ``Authorization: Bearer`` header, or None if there is none."""
        header = request.headers.get("authorization")
        if header is None:
            return None
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return None
        return value.strip().encode("latin-1")

    # -- cookies ---------------------------------------------------------------------------

    def open_session(self, key: bytes | None = None, *, name: str = "") -> tuple[Session, str]:
        """A new session and its cookie value: a token session when ``key`` (from
        :meth:`match_token`) is given, with the ``name`` given at login, else a CSRF-only
        session for a host login."""
        via: Literal["token", "host"] = "token" if key is not None else "host"
        key = key if key is not None else self._host_key
        name = person(name) if via == "token" else ""
        session = Session(
            sid=secrets.token_urlsafe(16), via=via, key=key, issued_at=self._now(), name=name
        )
        value = self._serializers[key].dumps({"sid": session.sid, "via": via, "name": name})
        return session, value

    def read_session(self, cookie: str | None) -> Session | None:
        """The session a cookie proves, or None (absent, forged, expired, token removed)."""
        if not cookie or len(cookie) > 1024:
            return None
        for key, serializer in self._serializers.items():
            try:
                payload, signed = serializer.loads(
                    cookie, max_age=math.ceil(self.max_age), return_timestamp=True
                )
            except BadData:
                continue
            issued_at = signed.timestamp()
            if not isinstance(payload, dict):
                return None
            sid, via = payload.get("sid"), payload.get("via")
            if not isinstance(sid, str):
                return None
            # A cookie signed with a token's key is a login; one signed with the host key
            # only ever binds CSRF tokens, whatever its payload claims.
            if via == "token" and key != self._host_key:
                name = payload.get("name")
                name = person(name) if isinstance(name, str) else ""
                return Session(sid=sid, via="token", key=key, issued_at=issued_at, name=name)
            if via == "host" and key == self._host_key:
                return Session(sid=sid, via="host", key=key, issued_at=issued_at)
            return None
        return None

    def browser_cookie(self, key: bytes) -> str:
        """The cookie of a browser that just logged in with the token of ``key``."""
        serializer = self._browsers[self._token_keys.index(key)]
        return str(serializer.dumps({"browser": secrets.token_urlsafe(16)}))

    def known_browser(self, cookie: str | None) -> str | None:
        """The client a browser cookie proves (a browser that logged in before with a token
        still configured), or None."""
        if not cookie or len(cookie) > 1024:
            return None
        for serializer in self._browsers:
            try:
                payload = serializer.loads(cookie, max_age=BROWSER_MAX_AGE)
            except BadData:
                continue
            browser = payload.get("browser") if isinstance(payload, dict) else None
            return f"browser {browser}" if isinstance(browser, str) else None
        return None

    def expires_at(self, session: Session) -> float:
        """When ``session``'s cookie stops being accepted (what a revocation must outlive)."""
        return session.issued_at + math.ceil(self.max_age) + 1

    # -- CSRF ------------------------------------------------------------------------------

    @staticmethod
    def csrf_token(session: Session) -> str:
        """The synchronizer token of ``session`` (same for every form of that session)."""
        digest = _derive(session.key, b"csrf", session.sid.encode("ascii", "replace"))
        return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")

    def check_csrf(self, session: Session | None, presented: str | None) -> bool:
        """True when ``presented`` is ``session``'s token (constant-time comparison)."""
        if session is None or not presented:
            return False
        expected = self.csrf_token(session).encode("ascii")
        return hmac.compare_digest(expected, presented.encode("utf-8", "replace"))

    # -- the host's authorizer -------------------------------------------------------------

    async def host_allows(self, request: Request) -> str | None:
        """Ask the host's authorizer: None denies, else who it let in ("" when it answered
        ``True``, not a name). Only ``True`` or a non-empty string allows; an exception
        denies."""
        if self.authorizer is None:
            return None
        try:
            verdict: object = self.authorizer(request)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception:
            logger.exception("operator page: the authorizer raised; request denied")
            return None
        if verdict is True:
            return ""
        return person(verdict) or None if isinstance(verdict, str) else None


def person(name: str) -> str:
    """A name as recorded and shown: printable, one line, at most :data:`MAX_NAME`
    characters (anything else is dropped: it comes from a form or the host)."""
    return " ".join("".join(c for c in name if c.isprintable()).split())[:MAX_NAME]


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(values: str | Iterable[str]) -> tuple[_Network, ...]:
    listed = [values] if isinstance(values, str) else list(values)
    try:
        return tuple(ipaddress.ip_network(value.strip(), strict=False) for value in listed)
    except (AttributeError, TypeError, ValueError):
        raise ConfigurationError(
            "trusted_proxies must be IP addresses or networks (e.g. ['10.0.0.0/8', '::1']), "
            f"got {values!r}"
        ) from None


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class LoginThrottle:
    """Failed logins per client, in memory (see the module docstring for the numbers and
    what a client is). :meth:`retry_after` says whether a client must wait; :meth:`failed`
    and :meth:`succeeded` keep count. ``trusted_proxies``: addresses or networks whose
    ``X-Forwarded-For`` is believed."""

    def __init__(
        self,
        *,
        failures: int = LOGIN_FAILURES,
        window: float = LOGIN_WINDOW,
        clients: int = LOGIN_CLIENTS,
        trusted_proxies: str | Iterable[str] = (),
        clock: Callable[[], float],
    ) -> None:
        self.failures = failures
        self.window = window
        self.clients = clients
        self.trusted_proxies = _networks(trusted_proxies)
        self._clock = clock
        # address -> times of its recent failures (at most `failures`), least recent first
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def client_of(self, request: Request) -> str:
        """The address failures are counted under: the client's IP (an IPv6 one by /64),
        or behind a trusted proxy the first address from the right of ``X-Forwarded-For``
        that is not a trusted proxy's."""
        host = request.client.host if request.client is not None else ""
        address = _address(host)
        if address is None:
            return host or "unknown"
        if self._trusted(address):
            hops = ",".join(request.headers.getlist("x-forwarded-for")).split(",")
            for hop in reversed(hops):
                forwarded = _address(hop)
                if forwarded is None:
                    break  # unreadable: what lies left of it cannot be believed either
                address = forwarded
                if not self._trusted(forwarded):
                    break
        if isinstance(address, ipaddress.IPv6Address):
            # One host usually holds a whole /64: count it as one client.
            return str(ipaddress.ip_network(f"{address}/64", strict=False))
        return str(address)

    def _trusted(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        return any(address in network for network in self.trusted_proxies)

    def retry_after(self, client: str) -> int:
        """Seconds ``client`` must wait before its next try (0: it may try now)."""
        times = self._recent(client)
        if times is None or len(times) < self.failures:
            return 0
        return max(1, math.ceil(times[0] + self.window - self._clock()))

    def failed(self, client: str) -> int:
        """Count a failed login; the seconds it must now wait (0 if it may try again)."""
        times = self._recent(client)
        if times is None:
            times = deque(maxlen=self.failures)
            self._seen[client] = times
            while len(self._seen) > self.clients:
                self._seen.popitem(last=False)
        times.append(self._clock())
        self._seen.move_to_end(client)
        return self.retry_after(client)

    def succeeded(self, client: str) -> None:
        """A good login clears the address's count."""
        self._seen.pop(client, None)

    def _recent(self, client: str) -> deque[float] | None:
        times = self._seen.get(client)
        if times is None:
            return None
        cutoff = self._clock() - self.window
        while times and times[0] <= cutoff:
            times.popleft()
        if not times:
            del self._seen[client]
            return None
        return times
