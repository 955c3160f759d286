"""A JSON reader that never fails on one strange value: the session parser's fallback.

pydantic's JSON parser (and Python's ``json``) refuse a whole document for one value nested
hundreds of levels deep, an integer of thousands of digits, or a lone ``\\ud800`` escape. In a
session read that would leave every pending call unanswered because of one call's arguments.
:func:`lenient_loads` reads such a document anyway, iteratively (no recursion), and puts an
:class:`Unreadable` marker where a value cannot be represented safely, so the caller can fail
that one call and answer its siblings. It is only used after the fast parser refused a body.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["LenientJSONError", "Unreadable", "find_unreadable", "lenient_loads"]

#: Values deeper than this (counted from the document's root) are replaced by an
#: :class:`Unreadable` marker and their text is skipped: the limit of pydantic's own JSON
#: parser, so the fallback keeps exactly what the fast path could not.
MAX_DEPTH = 200
#: Python refuses to convert longer integer strings (sys.get_int_max_str_digits()).
MAX_INT_DIGITS = 4300

_WHITESPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_STRING_CHUNK = re.compile(r'[^"\\\x00-\x1f]*')
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = (("true", True), ("false", False), ("null", None))


class LenientJSONError(ValueError):
    """The document is not JSON at all (a syntax error), with its position."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Stands for a value that cannot be represented safely; ``reason`` says why."""

    reason: str


def lenient_loads(text: str | bytes) -> Any:
    """Parse ``text``; values too deep, too large or not valid Unicode become
    :class:`Unreadable`. Raises LenientJSONError for a syntax error."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", errors="replace")
    parser = _Parser(text)
    value = parser.value()
    parser.skip_whitespace()
    if parser.pos != len(text):
        raise parser.error("extra data after the document")
    return value


def find_unreadable(value: Any) -> Unreadable | None:
    """The first :class:`Unreadable` marker inside ``value`` (iteratively), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Unreadable):
            return item
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str) -> LenientJSONError:
        return LenientJSONError(f"{message} at character {self.pos}")

    def skip_whitespace(self) -> None:
        match = _WHITESPACE.match(self.text, self.pos)
        self.pos = match.end() if match else self.pos

    def value(self) -> Any:
        """One value, containers built with an explicit stack."""
        # Each frame: [container, pending key or None]
        stack: list[list[Any]] = []
        while True:
            self.skip_whitespace()
            if len(stack) >= MAX_DEPTH and self._peek() in "[{":
                item: Any = self._skip_container()
            else:
                item = self._scalar_or_open(stack)
                if item is _OPENED:
                    continue
            # A complete value: attach it, closing every container it completes.
            while True:
                if not stack:
                    return item
                frame = stack[-1]
                container = frame[0]
                if isinstance(container, list):
                    container.append(item)
                else:
                    container[frame[1]] = item
                self.skip_whitespace()
                closing = "]" if isinstance(container, list) else "}"
                if self._peek() == ",":
                    self.pos += 1
                    if isinstance(container, dict):
                        frame[1] = self._key()
                    break
                if self._peek() == closing:
                    self.pos += 1
                    item = stack.pop()[0]
                    continue
                raise self.error(f"expected ',' or {closing!r}")

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _scalar_or_open(self, stack: list[list[Any]]) -> Any:
        char = self._peek()
        if char == "[":
            self.pos += 1
            self.skip_whitespace()
            if self._peek() == "]":
                self.pos += 1
                return []
            stack.append([[], None])
            return _OPENED
        if char == "{":
            self.pos += 1
            self.skip_whitespace()
            if self._peek() == "}":
                self.pos += 1
                return {}
            frame: list[Any] = [{}, None]
            stack.append(frame)
            frame[1] = self._key(first=True)
            return _OPENED
        if char == '"':
            return self._string()
        for word, literal in _LITERALS:
            if self.text.startswith(word, self.pos):
                self.pos += len(word)
                return literal
        return self._number()

    def _key(self, *, first: bool = False) -> str:
        self.skip_whitespace()
        if self._peek() != '"':
            raise self.error("expected a string key")
        key = self._string()
        self.skip_whitespace()
        if self._peek() != ":":
            raise self.error("expected ':'")
        self.pos += 1
        return key if isinstance(key, str) else f"<unreadable key {self.pos}>"

    def _number(self) -> Any:
        match = _NUMBER.match(self.text, self.pos)
        if match is None or match.end() == self.pos:
            raise self.error("expected a value")
        self.pos = match.end()
        raw = match.group(0)
        if match.group(1) is None and match.group(2) is None:
            if len(raw.lstrip("-")) > MAX_INT_DIGITS:
                return Unreadable(f"an integer of {len(raw)} digits")
            return int(raw)
        number = float(raw)
        if number in (float("inf"), float("-inf")):
            return Unreadable("a number too large for a float")
        return number

    def _string(self) -> Any:
        self.pos += 1  # the opening quote
        parts: list[str] = []
        while True:
            match = _STRING_CHUNK.match(self.text, self.pos)
            assert match is not None  # the pattern matches the empty string
            parts.append(match.group(0))
            self.pos = match.end()
            char = self._peek()
            if char == '"':
                self.pos += 1
                break
            if char != "\\":
                raise self.error("unterminated string" if not char else "control character")
            escape = self.text[self.pos + 1 : self.pos + 2]
            if escape in _ESCAPES:
                parts.append(_ESCAPES[escape])
                self.pos += 2
            elif escape == "u":
                digits = self.text[self.pos + 2 : self.pos + 6]
                if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
                    raise self.error("bad \\u escape")
                parts.append(chr(int(digits, 16)))
                self.pos += 6
            else:
                raise self.error("bad escape")
        text = "".join(parts)
        try:
            # A surrogate pair escaped as two \u escapes becomes one character; a lone one
            # cannot be encoded and marks the value unreadable.
            text = text.encode("utf-16", "surrogatepass").decode("utf-16")
        except UnicodeDecodeError:
            return Unreadable("a string with a lone surrogate escape")
        return text

    def _skip_container(self) -> Unreadable:
        """Skip a value nested too deeply (brackets counted outside strings)."""
        depth = 0
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self._string()
                continue
            if char in "[{":
                depth += 1
            elif char in "]}":
                depth -= 1
                if depth == 0:
                    self.pos += 1
                    return Unreadable(f"a value nested more than {MAX_DEPTH} levels deep")
            self.pos += 1
        raise self.error("unterminated container")


_OPENED = object()
