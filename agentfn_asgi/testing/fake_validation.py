"""Request validation and error bodies of :class:`~agentfn_asgi.testing.FakeAgentsAPI`.

``POST /agents/sessions/{id}/events`` is checked field by field as wire protocol §4
documents it, answering 400 ``invalid_request_error`` with ``param`` naming the first bad
field (``events[0].output[1].text``), as the real service names fields in its errors.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentfn_asgi.wire import INPUT_EVENT_TYPES

__all__ = [
    "MAX_REQUEST_BYTES",
    "InvalidRequestError",
    "Rejection",
    "answer_approves",
    "check_answer",
    "error_body",
    "json_type",
    "list_page",
    "normalised_result",
    "parse_events_body",
]

#: Largest accepted request body: 4 MiB (wire protocol §9.1).
MAX_REQUEST_BYTES = 4_194_304

TOOL_RESULT = "agent.session.input.tool_result"


class Rejection(Exception):  # noqa: N818 - an answer to send, not a failure of the fake
    """An error response to send: ``status`` and the fields of the error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, param=param, code=code)


class InvalidRequestError(Rejection):
    """A 400 ``invalid_request_error``; ``param`` names the field at fault."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(400, message, param=param)


def _missing(param: str) -> InvalidRequestError:
    return InvalidRequestError(f"Missing required parameter: '{param}'.", param=param)


def _invalid(param: str, problem: str, what: str = "value") -> InvalidRequestError:
    """``Invalid value for 'param': problem`` (``what="type"``: ``Invalid type ...``)."""
    return InvalidRequestError(f"Invalid {what} for '{param}': {problem}", param=param)


def _not_object(param: str) -> InvalidRequestError:
    return InvalidRequestError(f"'{param}' must be an object.", param=param)


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The standard error envelope ``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def list_page(
    items: Sequence[Any],
    query: Mapping[str, list[str]],
    to_json: Callable[[Any], dict[str, Any]],
    missing: str,
    *,
    ordered: bool = False,
) -> tuple[int, dict[str, Any]]:
    """The answer of a list route (wire protocol §2): a page of ``items`` (each with an
    ``id``, in creation order) after ``after`` (the last id of the previous page;
    ``missing`` formats the 400 for an unknown one), ``limit`` (1-100, default 20) long,
    and with ``ordered`` in the ``order`` asked (``desc``, newest first, by default)."""
    try:
        limit = int(query.get("limit", ["20"])[-1])
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        return 400, error_body("limit must be between 1 and 100.", param="limit")
    order = query.get("order", ["desc"])[-1] if ordered else "asc"
    if order not in ("asc", "desc"):
        return 400, error_body("order must be 'asc' or 'desc'.", param="order")
    items = list(reversed(items)) if order == "desc" else list(items)
    after = query.get("after", [None])[-1]
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            return 400, error_body(missing.format(after), param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return 200, {
        "object": "list",
        "data": [to_json(item) for item in page],
        "first_id": page[0].id if page else None,
        "last_id": page[-1].id if page else None,
        "has_more": len(items) > limit,
    }


def parse_events_body(body: bytes) -> list[dict[str, Any]]:
    """Decode and validate a submission body; return its events.

    Raises :class:`InvalidRequestError` for a body over 4 MiB ("too large"), a body that is
    not a JSON object, a missing, non-list or empty ``events``, and any event that breaks
    its type's documented shape.
    """
    if len(body) > MAX_REQUEST_BYTES:
        raise InvalidRequestError(
            f"Request body too large: {len(body)} bytes, over the {MAX_REQUEST_BYTES}-byte limit."
        )
    try:
        payload = json.loads(body)
    except ValueError:
        raise InvalidRequestError("The request body is not valid JSON.") from None
    if not isinstance(payload, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    if "events" not in payload:
        raise _missing("events")
    events = payload["events"]
    if not isinstance(events, list):
        raise InvalidRequestError("'events' must be an array.", param="events")
    if not events:
        raise InvalidRequestError("'events' must contain at least one event.", param="events")
    for index, event in enumerate(events):
        _check_event(event, f"events[{index}]")
    return events


def _check_event(event: object, where: str) -> None:
    if not isinstance(event, dict):
        raise _not_object(where)
    kind = event.get("type")
    if not isinstance(kind, str):
        raise _missing(f"{where}.type")
    if kind not in INPUT_EVENT_TYPES:
        raise _invalid(f"{where}.type", f"{kind!r} is not a supported input event.")
    if kind == TOOL_RESULT:
        _check_tool_result(event, where)
    elif kind == "agent.session.input.message":
        _require(event, where, "input", list)
    elif kind in (
        "agent.session.input.mcp_approval_request_result",
        "agent.session.input.computer_use_approval_request_result",
    ):
        _require(event, where, "request_id", str)
        _require(event, where, "response", dict)


def _require(event: dict[str, Any], where: str, name: str, kind: type) -> None:
    if name not in event:
        raise _missing(f"{where}.{name}")
    value = event[name]
    # bool is an int subclass in Python; JSON keeps them apart, so must we.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _invalid(f"{where}.{name}", f"expected {json_type(kind)}.", "type")


_JSON_TYPES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def json_type(kind: type) -> str:
    """What JSON calls values of the Python type ``kind`` ("an object", "a string"...)."""
    return _JSON_TYPES.get(kind, kind.__name__)


def _check_tool_result(event: dict[str, Any], where: str) -> None:
    _require(event, where, "turn_id", str)
    _require(event, where, "call_id", str)
    _require(event, where, "success", bool)
    output = event.get("output")
    if output is not None and not isinstance(output, str):
        if not isinstance(output, list):
            expected = "expected a string, an array of content parts, or null."
            raise _invalid(f"{where}.output", expected, "type")
        for index, part in enumerate(output):
            _check_part(part, f"{where}.output[{index}]")
    error = event.get("error")
    if error is not None and not isinstance(error, str):
        raise _invalid(f"{where}.error", "expected a string or null.", "type")


def _check_part(part: object, where: str) -> None:
    if not isinstance(part, dict):
        raise _not_object(where)
    kind = part.get("type")
    if kind == "input_text":
        _require(part, where, "text", str)
    elif kind == "input_image":
        _require(part, where, "image_url", str)
    else:
        raise _invalid(f"{where}.type", "expected 'input_text' or 'input_image'.")


def normalised_result(event: dict[str, Any]) -> tuple[bool, str]:
    """``(success, canonical JSON of output and error)``: equal for equal results."""
    return bool(event["success"]), json.dumps(
        [event.get("output"), event.get("error")], sort_keys=True, separators=(",", ":")
    )


_DECISIONS = ("approve", "deny", "cancel")
#: Most fields a sign-in answer may carry, and the most bytes of its values (openai 3.63).
_SIGN_IN_FIELDS = 6
_SIGN_IN_BYTES = 120 * 1024


def check_answer(request: dict[str, Any], event: dict[str, Any], where: str) -> tuple[bool, str]:
    """Check the answer ``event`` against the pending ``request`` it answers, as the API
    does (400 naming the field); return it normalised (equal for equal answers)."""
    kind = request.get("type")
    expected = (
        "agent.session.input.mcp_approval_request_result"
        if kind == "mcp_tool_call"
        else "agent.session.input.computer_use_approval_request_result"
    )
    if event["type"] != expected:
        raise InvalidRequestError(
            f"Approval request {event['request_id']} is answered with {expected}.",
            param=f"{where}.type",
        )
    response = event["response"]
    param = f"{where}.response"
    if response.get("type") != kind:
        raise _invalid(f"{param}.type", f"expected {kind!r}.")
    if kind == "browser_authentication":
        _check_sign_in(request, response, param)
    elif response.get("decision") not in _DECISIONS:
        raise _invalid(f"{param}.decision", f"expected one of {', '.join(_DECISIONS)}.")
    return answer_approves(event), json.dumps(response, sort_keys=True, separators=(",", ":"))


def _check_sign_in(request: dict[str, Any], response: dict[str, Any], param: str) -> None:
    action = response.get("action")
    if action == "cancel":
        return
    if action != "submit":
        raise _invalid(f"{param}.action", "expected 'submit' or 'cancel'.")
    fields = response.get("fields")
    if not isinstance(fields, list) or len(fields) > _SIGN_IN_FIELDS:
        raise _invalid(f"{param}.fields", f"expected at most {_SIGN_IN_FIELDS} fields.")
    known = {f.get("id") for f in request.get("fields") or [] if isinstance(f, dict)}
    size = 0
    for index, item in enumerate(fields):
        here = f"{param}.fields[{index}]"
        if not isinstance(item, dict):
            raise _not_object(here)
        _require(item, here, "field_id", str)
        _require(item, here, "value", str)
        if item["field_id"] not in known:
            message = f"Unknown field id {item['field_id']!r}."
            raise InvalidRequestError(message, param=f"{here}.field_id")
        size += len(item["value"].encode("utf-8", "surrogatepass"))
    if size > _SIGN_IN_BYTES:
        raise InvalidRequestError(
            f"'{param}.fields' values are too large.", param=f"{param}.fields"
        )


def answer_approves(event: dict[str, Any]) -> bool:
    """Does the answer ``event`` approve (a sign-in: submit) its request?"""
    response = event.get("response")
    if not isinstance(response, dict):
        return False
    return response.get("decision") == "approve" or response.get("action") == "submit"
