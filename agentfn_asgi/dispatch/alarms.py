"""Configuration problems the Agents API reports, logged at ERROR once per cause.

A 401 or 403 from the API is not a transient fault: the key is wrong, revoked, or not
allowed into the session's project. Every call would hit it again, so it is logged once
per cause (status and code), with the fix, instead of once per request; the work stays
recorded for the recovery sweep, which succeeds once the configuration is fixed. A later
success re-arms the alarm.

Also here: :func:`call_fields`, the structured fields (``record.agentfn``) of the dispatcher's
log lines about one call, for JSON log formatters.
"""

from __future__ import annotations

import logging
from typing import Any, TypeGuard

from ..calls.records import CallKey
from ..errors import APIStatusError, AuthenticationError, PermissionDeniedError

__all__ = ["ConfigurationAlarm", "call_fields", "is_configuration_error"]

logger = logging.getLogger("agentfn_asgi.dispatch.alarms")

_HINTS = {
    401: "check OPENAI_API_KEY (wrong, revoked or for another organization)",
    403: (
        "the key may not use this session: check OPENAI_PROJECT_ID / OPENAI_ORG_ID and the "
        "key's permissions (webhooks are sent per project)"
    ),
}


def call_fields(key: CallKey, tool: str, **more: Any) -> dict[str, Any]:
    """The fields naming the call ``key`` of ``tool`` in a log line, then ``more``."""
    ids = {"session_id": key.session_id, "turn_id": key.turn_id, "call_id": key.call_id}
    return {"tool": tool, **ids, **more}


def is_configuration_error(exc: BaseException) -> TypeGuard[APIStatusError]:
    """A 401 or 403 from the API: our configuration, not a passing fault."""
    return isinstance(exc, AuthenticationError | PermissionDeniedError)


class ConfigurationAlarm:
    """Logs each distinct configuration error once until something succeeds again."""

    def __init__(self) -> None:
        self._seen: set[tuple[int | None, str | None]] = set()

    def report(self, exc: APIStatusError, *, doing: str) -> None:
        """Log ``exc`` (met while ``doing`` something) unless its cause was logged already."""
        cause = (exc.status, exc.code)
        if cause in self._seen:
            logger.debug("%s failed again (%s)", doing, exc.status)
            return
        self._seen.add(cause)
        logger.error(
            "the Agents API refused %s: HTTP %s %s; %s. The work stays recorded and is retried "
            "by the recovery sweep. (Logged once per cause.)",
            doing,
            exc.status,
            exc.code or "",
            _HINTS.get(exc.status or 0, "check the API configuration"),
        )

    def cleared(self) -> None:
        """A request succeeded: report the next problem again."""
        self._seen.clear()
