"""Reading the page's query strings and forms into checked values (pure: no I/O).

Everything here is untrusted input. A value that does not fit raises :class:`FormError`
with a message the page shows as a 400, never a 500.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..operator import OUTCOMES, CallFilter, DisplayState, json_or_text
from ..operator import parse_duration as operator_parse_duration

__all__ = [
    "DISPLAY_STATES",
    "MAX_LIMIT",
    "CallQuery",
    "FormError",
    "SettleRequest",
    "parse_duration",
    "parse_pairs",
]

#: The states the ``state`` filter accepts, in the order an operator reads them.
DISPLAY_STATES: tuple[str, ...] = get_args(DisplayState)
#: Largest page the calls list serves (the CLI's ``--limit`` has the same meaning).
MAX_LIMIT = 500
DEFAULT_LIMIT = 50
# Ids and tool names are short; a longer filter value is a mistake or an attack.
MAX_TEXT = 512
MAX_FIELDS = 32


class FormError(ValueError):
    """A query, form or body the page refuses; ``status`` is the HTTP answer (400 unless
    the body is too large, 413, or not a form, 415)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def parse_duration(text: str) -> float:
    """``15m``, ``2h``, ``3d`` (also ``s`` and ``w``) → seconds. Anything else: FormError."""
    try:
        return operator_parse_duration(text)
    except ValueError as exc:
        raise FormError(str(exc)) from None


def parse_pairs(encoded: str) -> dict[str, str]:
    """A query string or form body (already text) → first value of each field."""
    try:
        pairs = urllib.parse.parse_qsl(
            encoded, keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS
        )
    except ValueError as exc:  # UnicodeDecodeError included: bad %-escapes
        raise FormError(f"malformed query or form: {exc}") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        fields.setdefault(name, value)
    return fields


def _text(fields: Mapping[str, str], name: str) -> str | None:
    value = fields.get(name, "").strip()
    if len(value) > MAX_TEXT:
        raise FormError(f"{name!r} is longer than {MAX_TEXT} characters")
    return value or None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallQuery:
    """The calls list's filters as the operator typed them (kept to refill the form)."""

    state: str | None = None
    outcome: str | None = None
    session: str | None = None
    tool: str | None = None
    since: str | None = None
    limit: int = DEFAULT_LIMIT
    cursor: str | None = None

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> CallQuery:
        """Check the filters of ``/calls`` (the same ones as ``agentfn-asgi calls``)."""
        state = _text(fields, "state")
        if state is not None and state not in DISPLAY_STATES:
            raise FormError(f"unknown state {state!r}; one of: {', '.join(DISPLAY_STATES)}")
        outcome = _text(fields, "outcome")
        if outcome is not None and outcome not in OUTCOMES:
            raise FormError(f"unknown outcome {outcome!r}; one of: {', '.join(OUTCOMES)}")
        if outcome is not None and state is not None:
            raise FormError("filter by state or by outcome, not both")
        since = _text(fields, "since")
        if since is not None:
            parse_duration(since)
        raw_limit = _text(fields, "limit")
        limit = DEFAULT_LIMIT
        if raw_limit is not None:
            if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
                raise FormError(f"'limit' must be a whole number from 1 to {MAX_LIMIT}")
            limit = int(raw_limit)
        return cls(
            state=state,
            outcome=outcome,
            session=_text(fields, "session"),
            tool=_text(fields, "tool"),
            since=since,
            limit=limit,
            cursor=_text(fields, "cursor"),
        )

    def to_filter(self, now: float) -> CallFilter:
        """The :class:`CallFilter` to ask the view for (``since`` counted back from ``now``)."""
        return CallFilter(
            state=self.state,
            outcome=self.outcome,
            session_id=self.session,
            tool_name=self.tool,
            since=None if self.since is None else now - parse_duration(self.since),
            limit=self.limit,
            cursor=self.cursor,
        )

    def params(self, *, cursor: str | None = None) -> dict[str, str]:
        """Query parameters that reproduce these filters (for links), with ``cursor``."""
        params = {
            "state": self.state,
            "outcome": self.outcome,
            "session": self.session,
            "tool": self.tool,
            "since": self.since,
            "limit": None if self.limit == DEFAULT_LIMIT else str(self.limit),
            "cursor": cursor,
        }
        return {name: value for name, value in params.items() if value is not None}


SettleMode = Literal["output", "error", "rerun"]
_MODES: dict[str, SettleMode] = {"output": "output", "error": "error", "rerun": "rerun"}


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleRequest:
    """What the settle form asks for: one call, and output, error text, or a re-run."""

    call_id: str
    session_id: str
    mode: SettleMode
    value: str = ""
    confirmed: bool = False

    @classmethod
    def parse(cls, fields: Mapping[str, str]) -> SettleRequest:
        """Check a settle form; the value of ``output``/``error`` is kept as typed."""
        call_id = _text(fields, "call")
        session_id = _text(fields, "session")
        if call_id is None or session_id is None:
            raise FormError("the settle form needs the call and its session")
        mode = _MODES.get(fields.get("mode", ""))
        if mode is None:
            raise FormError("choose how to settle: output, error or rerun")
        value = "" if mode == "rerun" else fields.get("value", "")
        if mode == "error" and not value.strip():
            raise FormError("settling with an error needs the error text the model will see")
        return cls(
            call_id=call_id,
            session_id=session_id,
            mode=mode,
            value=value,
            confirmed=fields.get("confirm") == "yes",
        )

    def output(self) -> Any:
        """The output to save: JSON when the text parses as JSON, the text itself otherwise
        (the CLI's ``--output JSON_OR_TEXT`` rule). JSON ``null`` stays the text ``null``:
        the view reads ``output=None`` as "no output given". FormError for JSON nested too
        deeply to send."""
        value = self._read()[1]
        return self.value if value is None else value

    @property
    def output_is_json(self) -> bool:
        """Whether :meth:`output` reads the value as JSON (shown on the confirmation step)."""
        return self._read()[0]

    def _read(self) -> tuple[bool, Any]:
        try:
            return json_or_text(self.value)
        except ValueError as exc:
            raise FormError(str(exc)) from None
