"""Signed links that decide one approval request, for people who get them by chat or email.

A link carries the request's id, the digest of the arguments it was made for and the link's
own expiry, signed (itsdangerous) with a key of the operator page
(:attr:`~agentfn_asgi.admin.auth.Gate.link_key`). It needs no login: the link is the
permission, for that one request only, so it must never reach a log.

**The token travels in the URL fragment** (``/approval#<token>``), which browsers never send
to a server: access logs, proxies and log pipelines record ``GET /approval`` and nothing
else, and the ``Referer`` never carries it. The page a link opens moves the token from the
fragment into a form and posts it (the page's one script, allowed by its hash; without
scripts the person pastes the link into the same form), and every later step carries it in
POST bodies, which are not logged. Opening shows the request and the arguments and asks for
a second POST to decide. Someone who read a log holds nothing that decides.

A link expires ``max_age`` after it was made (default one hour), or with its request if that
is sooner; a waiting request's link is sent again from the call's page. A link works once,
because a decision is taken once; a decided or expired request refuses it; a link whose
digest is not the request's (the arguments it was made for) is refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from itsdangerous import BadData, URLSafeSerializer

from ..errors import ConfigurationError

__all__ = ["LINK_MAX_AGE", "ApprovalLink", "ApprovalLinks"]

_SALT = b"agentfn-approval-link"
#: How long a link lasts by default (seconds): far less than a request's 24 h.
LINK_MAX_AGE = 3600.0


@dataclass(frozen=True, slots=True)
class ApprovalLink:
    """What a link says: the request, its arguments' digest, its expiry (Unix time)."""

    approval_id: str
    digest: str
    expires_at: float


class ApprovalLinks:
    """Makes and reads the signed links of one operator page mounted at ``base_url``."""

    def __init__(
        self,
        key: bytes,
        *,
        base_url: str,
        clock: Callable[[], float],
        max_age: float = LINK_MAX_AGE,
    ) -> None:
        if not max_age > 0:
            raise ConfigurationError(f"link_max_age must be positive, got {max_age!r}")
        self._serializer = URLSafeSerializer(key, salt=_SALT)
        self.base_url = base_url.rstrip("/")
        self.max_age = max_age
        self._clock = clock

    def token(self, approval_id: str, digest: str, expires_at: float) -> str:
        """The signed token of one request, valid until ``expires_at`` at the latest."""
        expires_at = min(expires_at, self._clock() + self.max_age)
        return str(self._serializer.dumps([approval_id, digest, expires_at]))

    def url(self, approval_id: str, digest: str, expires_at: float) -> str:
        """The link a person opens: the page's ``/approval``, the token in the fragment."""
        return f"{self.base_url}/approval#{self.token(approval_id, digest, expires_at)}"

    def read(self, token: str) -> ApprovalLink:
        """The link's content (from its token, or the whole link pasted); ValueError when it
        is forged, damaged or expired."""
        token = token.strip().rpartition("#")[2]
        try:
            approval_id, digest, expires_at = self._serializer.loads(token)
            link = ApprovalLink(str(approval_id), str(digest), float(expires_at))
        except (BadData, TypeError, ValueError):
            raise ValueError("this approval link is not valid (damaged or not ours)") from None
        if self._clock() >= link.expires_at:
            raise ValueError(
                "this approval link has expired: if the request still waits, an operator can "
                "send a new link from the call's page"
            )
        return link
