"""What the model is told (``agentfn_asgi.messages``): tool errors as written, validation
errors without the submitted values, everything else a fixed text that never quotes the
exception."""

from __future__ import annotations

from typing import Any

import pytest

from agentfn_asgi.errors import (
    ArgumentValidationError,
    ResultEncodingError,
    ResultTooLargeError,
    ToolError,
)
from agentfn_asgi.messages import (
    INTERNAL_ERROR_MESSAGE,
    error_type_for,
    model_error_message,
    timeout_message,
    too_large_message,
    validation_error_message,
)

from .test_results import SECRET


def test_model_error_messages() -> None:
    """ToolError text is passed through; validation errors are prefixed with the tool name;
    anything else is a fixed message that never includes the exception text."""
    assert model_error_message(ToolError("order 42 is refunded"), tool_name="t") == (
        "order 42 is refunded"
    )
    assert model_error_message(ArgumentValidationError("x: Field required"), tool_name="t") == (
        "Invalid arguments for t: x: Field required"
    )
    assert model_error_message(RuntimeError(SECRET), tool_name="t") == INTERNAL_ERROR_MESSAGE
    assert model_error_message(KeyError(SECRET), tool_name="t") == INTERNAL_ERROR_MESSAGE
    assert "could not be sent" in model_error_message(ResultEncodingError(SECRET), tool_name="t")
    assert SECRET not in model_error_message(ResultEncodingError(SECRET), tool_name="t")
    assert model_error_message(ResultTooLargeError(5, 4), tool_name="t") == too_large_message(5, 4)
    assert model_error_message(TimeoutError(), tool_name="t", timeout=2.5) == (
        "Tool 't' timed out after 2.5 seconds."
    )


def test_timeout_and_too_large_texts() -> None:
    """The texts tell the model the facts it needs to ask for less or try later."""
    assert timeout_message("slow", 30.0) == "Tool 'slow' timed out after 30 seconds."
    assert timeout_message("slow", None) == "Tool 'slow' timed out."
    message = too_large_message(5_000_123, 4_177_920)
    assert "5000123 bytes" in message
    assert "4177920-byte limit" in message


@pytest.mark.parametrize(
    ("exc", "label"),
    [
        (ToolError("x"), "tool_error"),
        (ArgumentValidationError("x"), "validation_error"),
        (TimeoutError(), "timeout"),
        (ResultTooLargeError(2, 1), "too_large"),
        (ResultEncodingError("x"), "encoding_error"),
        (ValueError("x"), "handler_error"),
    ],
)
def test_error_type_labels(exc: BaseException, label: str) -> None:
    """Each failure maps to one low-cardinality ``error.type`` label."""
    assert error_type_for(exc) == label


def test_validation_error_message_from_raw_error_dicts() -> None:
    """Custom error types fall back to a fixed text; odd keys in paths are placeholders."""
    too_short = "String should have at least 2 characters"
    errors: list[Any] = [
        {"type": "my_custom", "loc": ("a", 0), "msg": f"bad {SECRET}", "input": SECRET},
        {"type": "int_parsing", "loc": ("m", "weird key!"), "msg": "Input should be an int"},
        {"type": "string_too_short", "loc": (), "msg": too_short, "ctx": {"min_length": 2}},
        {"type": "timezone_offset", "loc": ("t",), "msg": SECRET, "ctx": {"tz_actual": SECRET}},
    ]
    assert validation_error_message(errors) == (
        "a[0]: Invalid value (my_custom); m[<key>]: Input should be an int; "
        "String should have at least 2 characters; t: Wrong timezone offset"
    )
    assert validation_error_message([]) == "arguments are not valid"
