"""Handler output encoding, tool_result events, the size budget and model-facing errors."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import json
import math
from typing import Any

import pytest
from openai.types.beta.agent_session_input_param import (
    SessionInputParamAgentSessionInputToolResult,
)
from pydantic import BaseModel, TypeAdapter

from agentfn_asgi.errors import (
    ResultEncodingError,
    ResultTooLargeError,
)
from agentfn_asgi.results import (
    DEFAULT_SAFETY_MARGIN,
    TOOL_RESULT_LIMIT,
    ImagePart,
    TextPart,
    check_size,
    encode_output,
    encoded_size,
    event_json,
    failure_event,
    fit_text_output,
    image_from_bytes,
    image_part,
    success_event,
    text_part,
    truncate_text,
)

SECRET = "sk-live-SECRET0123456789"


class Invoice(BaseModel):
    """A model with a value that needs JSON mode."""

    number: int
    issued: datetime.date
    total: float = 0.0


@dataclasses.dataclass
class Line:
    """A dataclass holding a model, to check nested conversion."""

    label: str
    invoice: Invoice
    tags: tuple[str, ...] = ()


def _check_event_against_openai(event: dict[str, Any]) -> None:
    """Validate an event with openai's own tool_result TypedDict, refusing unknown keys."""
    typed = SessionInputParamAgentSessionInputToolResult
    assert set(event) <= typed.__required_keys__ | typed.__optional_keys__
    assert typed.__required_keys__ <= set(event)
    validated = TypeAdapter(typed).validate_python(event)
    output = validated.get("output")
    if output is not None and not isinstance(output, str):
        list(output)  # Iterable members are validated lazily


# --------------------------------------------------------------------------- encoding


def test_strings_are_sent_as_written() -> None:
    """A str is the output itself, even when it looks like JSON or is empty."""
    for text in ("plain", '{"a": 1}', "", "ünïcödé\n\t"):
        assert encode_output(text) == text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "null"),
        (True, "true"),
        (0, "0"),
        (10**30, "1" + "0" * 30),
        (1.5, "1.5"),
        ({"a": [1, 2], "b": {"c": None}}, '{"a":[1,2],"b":{"c":null}}'),
        ([1, "x"], '[1,"x"]'),
        ((1, 2), "[1,2]"),
        ([], "[]"),
        ({"naïve": "日本"}, '{"naïve":"日本"}'),
        ({1: "int key"}, '{"1":"int key"}'),
    ],
)
def test_json_values_become_compact_json(value: Any, expected: str) -> None:
    """Plain JSON values are compact, with non-ASCII kept as is."""
    assert encode_output(value) == expected


def test_models_and_dataclasses_become_json() -> None:
    """Models dump in JSON mode; dataclasses (even holding models) become objects."""
    invoice = Invoice(number=7, issued=datetime.date(2026, 1, 2), total=9.5)
    assert encode_output(invoice) == '{"number":7,"issued":"2026-01-02","total":9.5}'
    line = Line(label="l", invoice=invoice, tags=("a",))
    assert json.loads(str(encode_output(line))) == {
        "label": "l",
        "invoice": {"number": 7, "issued": "2026-01-02", "total": 9.5},
        "tags": ["a"],
    }
    assert json.loads(str(encode_output({"lines": [line]})))["lines"][0]["label"] == "l"


@pytest.mark.parametrize(
    ("value", "pattern"),
    [
        (math.nan, "NaN or infinity"),
        ({"x": [math.inf]}, "NaN or infinity"),
        (Invoice(number=1, issued=datetime.date(2026, 1, 1), total=math.nan), "NaN"),
        (SECRET.encode(), "type bytes"),
        ({"k": bytearray(SECRET.encode())}, "type bytearray"),
        ({SECRET}, "type set"),
        ([frozenset()], "type frozenset"),
        (object(), "type object"),
        ({"when": datetime.datetime(2026, 1, 1)}, "type datetime"),
        ({(SECRET,): 1}, "dict key"),
        (Line, "type type"),
    ],
)
def test_unserialisable_values_are_refused_by_type(value: Any, pattern: str) -> None:
    """NaN/inf, bytes, sets and arbitrary objects raise ResultEncodingError naming the type,
    never quoting the value."""
    with pytest.raises(ResultEncodingError, match=pattern) as info:
        encode_output(value)
    assert SECRET not in str(info.value)
    assert info.value.__cause__ is None


def test_circular_and_deep_values_are_refused() -> None:
    """Self-containing and absurdly deep structures fail cleanly, not with a crash."""
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(ResultEncodingError, match="circular"):
        encode_output({"loop": loop})
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ResultEncodingError):
        encode_output({"deep": deep})


def test_content_parts_become_a_content_array() -> None:
    """Lists made only of content parts (typed or dicts) are sent as a content array."""
    parts = [TextPart("hello"), ImagePart("https://example.test/a.png"), text_part("bye")]
    assert encode_output(parts) == [
        {"type": "input_text", "text": "hello"},
        {"type": "input_image", "image_url": "https://example.test/a.png"},
        {"type": "input_text", "text": "bye"},
    ]
    assert encode_output(TextPart("alone")) == [{"type": "input_text", "text": "alone"}]
    assert encode_output((image_part("data:image/png;base64,AA"),)) == [
        {"type": "input_image", "image_url": "data:image/png;base64,AA"}
    ]


@pytest.mark.parametrize(
    "value",
    [
        [TextPart("a"), 1],
        [{"type": "input_text", "text": "a", "extra": 1}],
        [{"type": "input_text", "text": 5}],
        [{"type": "input_file", "file_id": "f"}],
        [{"text": "no type"}],
    ],
)
def test_lists_that_are_not_all_content_parts_become_json(value: Any) -> None:
    """Anything short of a clean content-part list is sent as a JSON string."""
    encoded = encode_output(value)
    assert isinstance(encoded, str)
    assert isinstance(json.loads(encoded), list)


def test_image_from_bytes_is_a_data_url() -> None:
    """Raw bytes become a base64 data URL that decodes back to the same bytes."""
    data = bytes(range(256))
    part = image_from_bytes(data, "image/webp")
    assert part["type"] == "input_image"
    prefix = "data:image/webp;base64,"
    assert part["image_url"].startswith(prefix)
    assert base64.b64decode(part["image_url"][len(prefix) :]) == data
    assert image_from_bytes(b"x")["image_url"].startswith("data:image/png;base64,")
    with pytest.raises(ResultEncodingError, match="mime type"):
        image_from_bytes(b"x", "text/html")


def test_huge_strings_are_encoded_unchanged() -> None:
    """A 5 MB string passes through encoding untouched (the size check is separate)."""
    text = "x" * 5_000_000
    assert encode_output(text) is text


# --------------------------------------------------------------------------- events


def test_success_and_failure_events_match_the_openai_type() -> None:
    """Success carries only ``output``, failure only ``error``; both validate against the
    ``openai`` package's own tool_result input type."""
    success = success_event("turn_1", "call_1", encode_output({"ok": True}))
    assert success == {
        "type": "agent.session.input.tool_result",
        "turn_id": "turn_1",
        "call_id": "call_1",
        "success": True,
        "output": '{"ok":true}',
    }
    parts = success_event("turn_1", "call_1", encode_output([TextPart("a"), ImagePart("u")]))
    failure = failure_event("turn_1", "call_1", "nope")
    assert failure == {
        "type": "agent.session.input.tool_result",
        "turn_id": "turn_1",
        "call_id": "call_1",
        "success": False,
        "error": "nope",
    }
    for event in (success, parts, failure):
        _check_event_against_openai(event)


def test_event_json_and_encoded_size() -> None:
    """Events serialise compactly; the size is UTF-8 bytes of the whole request body."""
    event = success_event("t", "c", "é")
    text = event_json(event)
    assert " " not in text
    assert "é" in text
    body = json.dumps({"events": [event]}, separators=(",", ":"), ensure_ascii=False)
    assert encoded_size(text) == len(body.encode("utf-8"))


def test_check_size_refuses_a_five_megabyte_result_and_reports_it() -> None:
    """Over limit - margin, check_size raises with the real size and the budget used."""
    text = event_json(success_event("t", "c", "x" * 5_000_000))
    with pytest.raises(ResultTooLargeError) as info:
        check_size(text)
    assert info.value.size == encoded_size(text)
    assert info.value.limit == TOOL_RESULT_LIMIT - DEFAULT_SAFETY_MARGIN
    assert str(info.value.size) in str(info.value)


def test_check_size_boundary_and_custom_margin() -> None:
    """Exactly at the budget passes and returns the size; one byte over fails."""
    small = event_json(success_event("t", "c", "hello"))
    size = encoded_size(small)
    assert check_size(small, limit=size, margin=0) == size
    with pytest.raises(ResultTooLargeError):
        check_size(small, limit=size + 9, margin=10)


# --------------------------------------------------------------------------- truncation


def test_truncate_text_respects_utf8_boundaries() -> None:
    """Multibyte text is cut on a character boundary, fits max_bytes with the marker, and
    the marker states how much was kept."""
    text = "日本語テキスト😀" * 1000
    total = len(text.encode())
    for max_bytes in range(60, 200):
        cut = truncate_text(text, max_bytes)
        assert len(cut.encode("utf-8")) <= max_bytes
        body, marker = cut.rsplit("\n", 1)
        assert text.startswith(body)
        assert marker == f"[truncated: {len(body.encode())} of {total} bytes]"


def test_truncate_text_edge_cases() -> None:
    """Text that fits is unchanged; a budget smaller than the marker gives a bare prefix."""
    assert truncate_text("short", 5) == "short"
    assert truncate_text("ééé", 3) == "é"
    assert truncate_text("abc", 0) == ""


def test_fit_text_output_accounts_for_json_escaping() -> None:
    """Text full of characters JSON escapes still ends up in an event that fits."""
    text = '"\n\x01' * 50_000
    limit = 100_000
    fitted = fit_text_output("turn", "call", text, limit=limit, margin=1_000)
    size = check_size(event_json(success_event("turn", "call", fitted)), limit=limit, margin=1_000)
    assert size <= limit - 1_000
    assert fitted.endswith(f"of {len(text.encode())} bytes]")
    assert fit_text_output("turn", "call", "small") == "small"


@pytest.mark.parametrize(
    "output",
    [
        "r" * 70_000,
        "é€😀" * 30_000,
        'quote"' * 20_000,
        "back\\slash" * 10_000,
        "line\n" * 20_000,
        "tab\t" * 20_000,
        "\u2028sep" * 20_000,
        "z" * 65_536,
    ],
)
def test_a_long_text_result_is_the_same_json_whether_spliced_or_dumped(output: str) -> None:
    """Long texts that need no escaping are spliced into the event, the others dumped: the
    saved bytes are json.dumps' in every case (and so is the idempotency key)."""
    from agentfn_asgi.calls.records import CallKey
    from agentfn_asgi.results import encode_result

    key = CallKey("sess_1", "turn_1", "call_1")
    saved = encode_result(key, output, tool_name="t")
    assert saved.event_json == event_json(success_event("turn_1", "call_1", output))
    assert json.loads(saved.event_json)["output"] == output


@pytest.mark.parametrize("output", ["r" * 600_000, "é" * 300_000 + "ascii", "short"])
def test_the_request_body_is_the_saved_event_byte_for_byte(output: str) -> None:
    """``events_body`` wraps the saved event exactly (a large one built slice by slice into a
    bytearray of exactly its size)."""
    from agentfn_asgi.results import encoded_size, events_body

    text = event_json(success_event("turn_1", "call_1", output))
    body = events_body(text)
    assert bytes(body) == b'{"events":[' + text.encode() + b"]}"
    assert len(body) == encoded_size(text)
