"""Signed links that decide one approval request, for people who get them by chat or email.

A link carries the request's id, the digest of the arguments it was made for and the
request's expiry, signed (itsdangerous) with a key of the operator page
(:attr:`~agentfn_asgi.admin.auth.Gate.link_key`). Opening it (``GET /approval?t=...``)
shows the request and the arguments and asks for a POST to confirm; it needs no login:
the link is the permission, for that one request only. It works once, because a decision
is taken once; a decided or expired request refuses it; a link whose digest is not the
request's (the arguments it was made for) is refused too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from itsdangerous import BadData, URLSafeSerializer

__all__ = ["ApprovalLink", "ApprovalLinks"]

_SALT = b"agentfn-approval-link"


@dataclass(frozen=True, slots=True)
class ApprovalLink:
    """What a link says: the request, its arguments' digest, its expiry (Unix time)."""

    approval_id: str
    digest: str
    expires_at: float


class ApprovalLinks:
    """Makes and reads the signed links of one operator page mounted at ``base_url``."""

    def __init__(self, key: bytes, *, base_url: str, clock: Callable[[], float]) -> None:
        self._serializer = URLSafeSerializer(key, salt=_SALT)
        self.base_url = base_url.rstrip("/")
        self._clock = clock

    def token(self, approval_id: str, digest: str, expires_at: float) -> str:
        """The signed token of one request."""
        return str(self._serializer.dumps([approval_id, digest, expires_at]))

    def url(self, approval_id: str, digest: str, expires_at: float) -> str:
        """The link a person opens: the page's ``/approval`` with the token."""
        return f"{self.base_url}/approval?t={self.token(approval_id, digest, expires_at)}"

    def read(self, token: str) -> ApprovalLink:
        """The link's content; ValueError when it is forged, damaged or expired."""
        try:
            approval_id, digest, expires_at = self._serializer.loads(token)
            link = ApprovalLink(str(approval_id), str(digest), float(expires_at))
        except (BadData, TypeError, ValueError):
            raise ValueError("this approval link is not valid (damaged or not ours)") from None
        if self._clock() >= link.expires_at:
            raise ValueError("this approval link has expired: the request expired with it")
        return link
