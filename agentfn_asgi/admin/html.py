"""A tiny escaping template helper: the only way the operator page builds HTML.

Tool names, arguments, errors and ids reach the page from the model and the API, so every
value is escaped on the way in. :func:`render` fills a template (a literal of this package,
never data) with values that are escaped unless they already are :class:`Safe` (the output
of an earlier :func:`render`); nothing concatenates a raw value into markup::

    render("<td>{name}</td>", name=summary.tool_name)   # '<img>' becomes '&lt;img&gt;'
    join(render("<li>{x}</li>", x=x) for x in items)     # Safe fragments joined
"""

from __future__ import annotations

import functools
import html
import string
from collections.abc import Iterable

__all__ = ["Safe", "escape", "join", "render"]


class Safe(str):
    """Markup that is already escaped (produced by :func:`render`, :func:`escape`, :func:`join`)."""

    __slots__ = ()


def escape(value: object) -> Safe:
    """``value`` as text that cannot become markup (quotes included: safe in attributes)."""
    if isinstance(value, Safe):
        return value
    return Safe(html.escape(str(value), quote=True))


def render(template: str, /, **values: object) -> Safe:
    """Fill ``template``'s ``{name}`` fields with the escaped ``values``.

    ``template`` must be a literal of this package: it is the trusted part. Field names only
    (no attribute access or indexing), so a template cannot reach into a value.
    """
    _check_template(template)
    return Safe(template.format_map({name: escape(value) for name, value in values.items()}))


@functools.lru_cache(maxsize=256)
def _check_template(template: str) -> None:
    for _literal, field, spec, conversion in string.Formatter().parse(template):
        if field is not None and (not field.isidentifier() or spec or conversion):
            raise ValueError(f"template fields must be plain names, got {{{field}}}")


def join(parts: Iterable[Safe], separator: str = "") -> Safe:
    """Concatenate already-safe fragments (``separator`` is a literal)."""
    pieces = list(parts)
    for piece in pieces:
        if not isinstance(piece, Safe):
            raise TypeError(f"join() takes Safe fragments only, got {type(piece).__name__}")
    return Safe(separator.join(pieces))
