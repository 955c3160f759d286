"""The escaping helper: values become text, only templates are markup."""

from __future__ import annotations

import pytest

from agentfn_asgi.admin.html import Safe, escape, join, render

HOSTILE = "<img src=x onerror=alert(1)>\"'&"


def test_render_escapes_every_value_including_quotes() -> None:
    """A value can neither open a tag nor leave an attribute."""
    html = render('<a title="{t}">{t}</a>', t=HOSTILE)
    assert html == (
        '<a title="&lt;img src=x onerror=alert(1)&gt;&quot;&#x27;&amp;">'
        "&lt;img src=x onerror=alert(1)&gt;&quot;&#x27;&amp;</a>"
    )
    assert isinstance(html, Safe)


def test_safe_fragments_are_not_escaped_twice() -> None:
    """Nested renders compose: the inner result is already safe."""
    inner = render("<b>{x}</b>", x="<i>")
    assert render("<p>{inner}</p>", inner=inner) == "<p><b>&lt;i&gt;</b></p>"
    assert escape(inner) is inner


def test_join_refuses_plain_strings() -> None:
    """Joining raw text is the mistake the helper exists to prevent."""
    assert join([Safe("<br>"), render("{x}", x="<")], "|") == "<br>|&lt;"
    with pytest.raises(TypeError, match="Safe fragments only"):
        join(["<script>"])  # type: ignore[list-item]


@pytest.mark.parametrize("template", ["{x.upper}", "{x[0]}", "{x!r}", "{x:>10}"])
def test_templates_take_plain_field_names_only(template: str) -> None:
    """No attribute access, indexing, conversion or spec: a template cannot reach into a
    value or print its repr."""
    with pytest.raises(ValueError, match="plain names"):
        render(template, x="value")
