"""Handler output → the saved ``tool_result`` event, its request body, key and size budget.

Everything the package sends as a tool result is built here, and only here: the event
(:func:`success_event`, :func:`failure_event`), its compact JSON (:func:`event_json`), the
request body that carries it (:func:`events_body`), the idempotency key it travels under
(:func:`submission_key`), and the :class:`~agentfn_asgi.calls.records.SavedResult` the dispatcher
saves before submitting (:func:`encode_result`, :func:`failure_result`). Pure functions: no I/O.

Encoding rules (:func:`encode_output`):

- ``str`` is sent as written.
- ``None``, booleans, numbers, dicts, lists, tuples, pydantic models and dataclasses become
  compact JSON. NaN/infinity, bytes, sets and arbitrary objects are refused with
  :class:`~agentfn_asgi.errors.ResultEncodingError` naming the type, never the value.
- A list of content parts (:class:`TextPart`, :class:`ImagePart`, or the equivalent
  ``input_text``/``input_image`` dicts) is sent as a content array.

The texts the model sees when a call fails are in :mod:`agentfn_asgi.messages`.

The Agents API asks that a result stays under 4 MiB (4,194,304 bytes) with room left for
its metadata; :func:`check_size` measures the whole request body the event travels in.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

from .calls.records import CallKey, SavedResult
from .errors import (
    ResultEncodingError,
    ResultTooLargeError,
)
from .messages import model_error_message, too_large_message

__all__ = [
    "DEFAULT_SAFETY_MARGIN",
    "TOOL_RESULT_LIMIT",
    "TOOL_RESULT_TYPE",
    "ImagePart",
    "TextPart",
    "answer_result",
    "batch_body",
    "batch_key",
    "check_size",
    "encode_output",
    "encode_result",
    "encoded_size",
    "escape_surrogates",
    "event_json",
    "events_body",
    "failure_event",
    "failure_result",
    "fit_text_output",
    "image_from_bytes",
    "image_part",
    "submission_key",
    "success_event",
    "text_part",
    "truncate_text",
]

#: The API's size limit for one tool result (wire protocol §9.1).
TOOL_RESULT_LIMIT = 4_194_304
#: Bytes kept free under the limit. The API asks for "room for API metadata" without saying
#: how much; 16 KiB covers ids, the event envelope and server-side wrapping with a wide
#: margin while costing under 0.4% of the budget.
DEFAULT_SAFETY_MARGIN = 16_384
TOOL_RESULT_TYPE = "agent.session.input.tool_result"
logger = logging.getLogger("agentfn_asgi.results")

# The request body is `{"events":[<event>]}`; the limit applies to all of it.
_BODY_PREFIX = '{"events":['
_BODY_SUFFIX = "]}"
_BODY_HEAD = _BODY_PREFIX.encode()
_BODY_TAIL = _BODY_SUFFIX.encode()
_MIME_RE = re.compile(r"image/[A-Za-z0-9.+-]+")


@dataclass(frozen=True, slots=True)
class TextPart:
    """An ``input_text`` content part. Return a list of parts to send a content array."""

    text: str
    type: str = field(default="input_text", init=False)

    def to_dict(self) -> dict[str, str]:
        """The part as the API takes it."""
        return {"type": "input_text", "text": self.text}


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An ``input_image`` content part; ``image_url`` may be an https or a ``data:`` URL."""

    image_url: str
    type: str = field(default="input_image", init=False)

    def to_dict(self) -> dict[str, str]:
        """The part as the API takes it."""
        return {"type": "input_image", "image_url": self.image_url}


def text_part(text: str) -> dict[str, str]:
    """An ``input_text`` content part as a dict."""
    return TextPart(text).to_dict()


def image_part(url: str) -> dict[str, str]:
    """An ``input_image`` content part as a dict."""
    return ImagePart(url).to_dict()


def image_from_bytes(data: bytes, mime_type: str = "image/png") -> dict[str, str]:
    """An ``input_image`` part carrying ``data`` inline as a base64 ``data:`` URL.

    Base64 grows the image by a third; mind the 4 MiB result limit.
    """
    if not _MIME_RE.fullmatch(mime_type):
        raise ResultEncodingError(f"image mime type must look like 'image/png', not {mime_type!r}")
    encoded = base64.b64encode(bytes(data)).decode("ascii")
    return image_part(f"data:{mime_type};base64,{encoded}")


def encode_output(value: Any) -> str | list[dict[str, str]]:
    """Turn a handler's return value into a ``tool_result`` ``output``.

    Returns the string as is, a content array for content parts, otherwise compact JSON.
    Raises ResultEncodingError for values JSON cannot carry (NaN, bytes, sets, objects) and
    for text that is not valid Unicode (a lone surrogate from an undecodable file name):
    no store or API could carry it.
    """
    if isinstance(value, str):
        return _unicode_checked(value)
    parts = _content_parts(value)
    if parts is not None:
        for part in parts:
            for text in part.values():
                _unicode_checked(text)
        return parts
    try:
        text = json.dumps(
            value,
            separators=(",", ":"),
            ensure_ascii=False,
            allow_nan=False,
            default=_json_default,
        )
    except _UnsupportedValueError as exc:
        raise ResultEncodingError(
            f"a value of type {exc.type_name} in the tool result is not JSON-serialisable"
        ) from None
    except (TypeError, ValueError, RecursionError, PydanticSerializationError) as exc:
        # `from None` and no str(exc): the messages can quote the value.
        raise ResultEncodingError(_encoding_failure(value, exc)) from None
    return _unicode_checked(text)


def _unicode_checked(text: str) -> str:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ResultEncodingError(
                "the tool result contains text that is not valid Unicode (a lone surrogate)"
            ) from None
    return text


class _UnsupportedValueError(TypeError):
    def __init__(self, type_name: str) -> None:
        super().__init__(type_name)
        self.type_name = type_name


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Shallow, so models and dataclasses nested inside come back through this hook.
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise _UnsupportedValueError(type(value).__qualname__)


def _encoding_failure(value: Any, exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "the tool result is nested too deeply to serialise"
    if isinstance(exc, ValueError) and "Circular reference" in str(exc):
        return "the tool result contains a circular reference"
    if isinstance(exc, ValueError) and "Out of range float" in str(exc):
        return "the tool result contains NaN or infinity, which JSON cannot carry"
    if isinstance(exc, TypeError) and "keys must be" in str(exc):
        return "the tool result has a dict key that is not a str, int, float, bool or None"
    return f"the tool result (a {type(value).__qualname__}) is not JSON-serialisable"


def _content_parts(value: Any) -> list[dict[str, str]] | None:
    if isinstance(value, TextPart | ImagePart):
        return [value.to_dict()]
    if not isinstance(value, list | tuple) or not value:
        return None
    parts: list[dict[str, str]] = []
    for item in value:
        part = _as_part(item)
        if part is None:
            return None
        parts.append(part)
    return parts


def _as_part(item: Any) -> dict[str, str] | None:
    if isinstance(item, TextPart | ImagePart):
        return item.to_dict()
    if isinstance(item, Mapping):
        kind = item.get("type")
        key = {"input_text": "text", "input_image": "image_url"}.get(kind, "") if kind else ""
        if key and set(item) == {"type", key} and isinstance(item[key], str):
            return {"type": str(kind), key: item[key]}
    return None


def success_event(turn_id: str, call_id: str, output: str | list[dict[str, str]]) -> dict[str, Any]:
    """A successful ``tool_result`` event carrying ``output``."""
    return {
        "type": TOOL_RESULT_TYPE,
        "turn_id": turn_id,
        "call_id": call_id,
        "success": True,
        "output": output,
    }


def failure_event(turn_id: str, call_id: str, message: str) -> dict[str, Any]:
    """A failed ``tool_result`` event; ``message`` is what the model reads."""
    return {
        "type": TOOL_RESULT_TYPE,
        "turn_id": turn_id,
        "call_id": call_id,
        "success": False,
        "error": message,
    }


def event_json(event: Mapping[str, Any]) -> str:
    """Compact JSON of one event (non-ASCII kept as is: it is measured in UTF-8 bytes)."""
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def events_body(event_json_text: str) -> bytes | bytearray:
    """The submission request body carrying one saved event: ``{"events":[<event>]}``.

    A long event comes as a ``bytearray`` of exactly its size, filled slice by slice: one
    copy of the text in UTF-8 beside the saved string, where ``encode()`` and a
    concatenation would hold two. The package's aiohttp client sends it as it is; an httpx
    client gets ``bytes`` of it (see :meth:`AgentsClient.submit_raw_events`).
    """
    if len(event_json_text) < _HASH_SLICE:
        return _BODY_HEAD + event_json_text.encode() + _BODY_TAIL
    slices = range(0, len(event_json_text), _HASH_SLICE)
    if event_json_text.isascii():
        size = len(event_json_text)
    else:  # measured slice by slice too, so no full encoded copy exists even for a moment
        size = sum(len(event_json_text[i : i + _HASH_SLICE].encode()) for i in slices)
    body = bytearray(len(_BODY_HEAD) + size + len(_BODY_TAIL))
    body[: len(_BODY_HEAD)] = _BODY_HEAD
    at = len(_BODY_HEAD)
    for start in slices:
        piece = event_json_text[start : start + _HASH_SLICE].encode()
        body[at : at + len(piece)] = piece
        at += len(piece)
    body[at:] = _BODY_TAIL
    return body


def submission_key(key: CallKey, event_json_text: str) -> str:
    """The idempotency key the result ``event_json_text`` of ``key`` is submitted under."""
    # Derived from the call *and* the bytes sent: the same result always travels under the
    # same key (safe retries from any replica), a different body never reuses one.
    digest = hashlib.sha256()
    for part in (key.session_id, key.turn_id, key.call_id, event_json_text):
        # In slices, so hashing a 4 MiB result never holds a second full copy of it.
        for start in range(0, len(part), _HASH_SLICE):
            digest.update(part[start : start + _HASH_SLICE].encode())
        digest.update(b"\x1f")
    return "afn-submit-" + digest.hexdigest()[:48]


_HASH_SLICE = 256 * 1024

#: The largest event a batch takes (UTF-8 bytes of its JSON): a bigger one goes alone, in a
#: body built slice by slice (:func:`events_body`), where a batch's body is one join.
BATCH_EVENT_MAX = _HASH_SLICE


def batch_body(event_json_texts: Sequence[str]) -> bytes:
    """The request body carrying several saved events, in the order given."""
    return _BODY_HEAD + ",".join(event_json_texts).encode() + _BODY_TAIL


def batch_key(idempotency_keys: Sequence[str]) -> str:
    """The idempotency key of a batch: derived from its events' own keys (each the call and
    its bytes), in sorted order, so the same results always travel under the same key,
    whoever sends them, and a batch never shares a key with one of its events."""
    digest = hashlib.sha256("\x1f".join(sorted(idempotency_keys)).encode())
    return "afn-batch-" + digest.hexdigest()[:48]


def encoded_size(event_json: str) -> int:
    """UTF-8 size of the request body ``{"events":[<event>]}`` that carries this event."""
    # ASCII text (the common case: JSON escapes control characters) is measured without
    # encoding it: a copy of a 4 MiB result just to count its bytes is what we avoid.
    body = len(event_json) if event_json.isascii() else len(event_json.encode("utf-8"))
    return len(_BODY_PREFIX) + body + len(_BODY_SUFFIX)


def check_size(
    event_json: str, *, limit: int = TOOL_RESULT_LIMIT, margin: int = DEFAULT_SAFETY_MARGIN
) -> int:
    """Return the body size, or raise ResultTooLargeError(size, limit - margin) over it."""
    size = encoded_size(event_json)
    budget = limit - margin
    if size > budget:
        raise ResultTooLargeError(size, budget)
    return size


def truncate_text(text: str, max_bytes: int) -> str:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes, marker included.

    The cut falls on a character boundary and the marker ``\\n[truncated: N of M bytes]``
    tells the model how much it is missing. Text already within the budget is unchanged.
    """
    encoded = text.encode("utf-8")
    total = len(encoded)
    if total <= max_bytes:
        return text
    # Reserve the marker at its widest (kept has at most as many digits as total).
    reserve = len(f"\n[truncated: {total} of {total} bytes]".encode())
    if max_bytes < reserve:
        return encoded[: max(max_bytes, 0)].decode("utf-8", errors="ignore")
    kept_text = encoded[: max_bytes - reserve].decode("utf-8", errors="ignore")
    kept = len(kept_text.encode("utf-8"))
    return f"{kept_text}\n[truncated: {kept} of {total} bytes]"


def fit_text_output(
    turn_id: str,
    call_id: str,
    text: str,
    *,
    limit: int = TOOL_RESULT_LIMIT,
    margin: int = DEFAULT_SAFETY_MARGIN,
) -> str:
    """Truncate ``text`` so its success event passes :func:`check_size`.

    Accounts for JSON escaping (quotes, newlines and control characters grow when escaped),
    which a plain byte budget on the text misses.
    """
    budget = limit - margin
    max_bytes = len(text.encode("utf-8"))
    while True:
        candidate = truncate_text(text, max_bytes)
        size = encoded_size(event_json(success_event(turn_id, call_id, candidate)))
        if size <= budget or max_bytes <= 0:
            return candidate
        # Scale by budget/size (escaping grows text roughly uniformly); always shrink by at
        # least one byte so the loop ends.
        max_bytes = max(0, min(max_bytes - 1, max_bytes * budget // size))


# ---------------------------------------------------------------------------------------------
# Saved results: what the dispatcher stores before it submits.


def encode_result(
    key: CallKey,
    value: Any,
    *,
    tool_name: str,
    truncate: bool = False,
    source: str = "ran",
    limit: int = TOOL_RESULT_LIMIT,
    margin: int = DEFAULT_SAFETY_MARGIN,
) -> SavedResult:
    """``value`` returned by ``tool_name`` as the result to save: a success event, or a
    failure when it cannot be encoded or is over ``limit`` (unless ``truncate`` is set and
    the output is text, which is then cut to fit)."""
    try:
        output = encode_output(value)
    except ResultEncodingError as exc:
        logger.error("tool %s returned an unsendable value for call %s: %s", tool_name, key, exc)
        return failure_result(
            key, model_error_message(exc, tool_name=tool_name), "encoding_error", source
        )
    text = _success_event_json(key, output)
    try:
        check_size(text, limit=limit, margin=margin)
    except ResultTooLargeError as exc:
        if truncate and isinstance(output, str):
            truncated = fit_text_output(
                key.turn_id, key.call_id, output, limit=limit, margin=margin
            )
            text = event_json(success_event(key.turn_id, key.call_id, truncated))
            return SavedResult(True, text, submission_key(key, text), None, source)
        failure = failure_result(key, too_large_message(exc.size, exc.limit), "too_large")
        # Keep the full result: an operator (or a smarter retry) may still want it.
        full = output if isinstance(output, str) else event_json({"output": output})
        return SavedResult(
            False, failure.event_json, failure.idempotency_key, "too_large", source, full
        )
    return SavedResult(True, text, submission_key(key, text), None, source)


#: Text outputs at least this long that need no JSON escaping are spliced into the event.
_SPLICE_MIN = 64 * 1024


def _success_event_json(key: CallKey, output: str | list[dict[str, str]]) -> str:
    """:func:`event_json` of the success event carrying ``output``.

    A long text needing no escaping (no quote, backslash or control character: printable
    and without ``"`` or ``\\``) is spliced between the event's head and tail in one
    allocation; ``json.dumps`` would hold an escaped copy of it and the joined result at
    once, on top of the handler's own string (three copies of a 4 MiB result at the peak).
    """
    if isinstance(output, str) and len(output) >= _SPLICE_MIN and _needs_no_escaping(output):
        head = event_json(success_event(key.turn_id, key.call_id, ""))
        return "".join((head[:-2], output, '"}'))  # head ends with the empty string's ""}
    return event_json(success_event(key.turn_id, key.call_id, output))


def _needs_no_escaping(text: str) -> bool:
    # isprintable() is False for every control character (and for a few Unicode ones that
    # JSON would keep as they are: those take the json.dumps path, which is also right).
    return '"' not in text and "\\" not in text and text.isprintable()


def failure_result(key: CallKey, message: str, error_type: str, source: str = "ran") -> SavedResult:
    """A failure event telling the model ``message``, saved with ``error_type``.

    A message that is not valid Unicode (a ``ToolError`` quoting an undecodable file name)
    has its lone surrogates escaped, so the failure can always be saved and sent.
    """
    text = event_json(failure_event(key.turn_id, key.call_id, escape_surrogates(message)))
    return SavedResult(False, text, submission_key(key, text), error_type, source)


def answer_result(
    key: CallKey, event: Mapping[str, Any], *, error_type: str | None, source: str
) -> SavedResult:
    """The answer ``event`` to an approval request (``agent.session.input.*_result``, see
    :func:`agentfn_asgi.actions.answer_event`), saved like a tool's result: a success
    when nothing is refused (``error_type`` None), under its stable submission key."""
    text = event_json(event)
    return SavedResult(error_type is None, text, submission_key(key, text), error_type, source)


def escape_surrogates(text: str) -> str:
    """``text`` with its lone surrogates escaped (``\\ud800``): JSON and Python strings can
    hold them, UTF-8 (what the stores, the logs and the API take) cannot."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
