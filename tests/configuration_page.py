"""The documentation's configuration tables, generated from the code that reads the settings.

``python -m tests.configuration_page`` prints the generated part of ``docs/configuration.md``
(and of ``docs/tools.md``: the per-tool options, from ``ToolOptions`` and ``ToolPolicy``);
``--write`` puts each between its page's markers. ``tests/test_docs.py`` fails when a page is
stale, when a :class:`~agentfn_asgi.Config` or :class:`~agentfn_asgi.DispatchSettings` field
has no entry in ``CONFIG_DOCS`` / ``DISPATCH_DOCS`` (:mod:`agentfn_asgi.config`), or when
an ``AgentWebhookApp`` option is missing from its docstring's ``Args:``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import ForwardRef

from agentfn_asgi import AgentWebhookApp, Config, DispatchSettings, FunctionTool
from agentfn_asgi.config import CONFIG_DOCS, DISPATCH_DOCS, DISPATCH_ENV, SettingDoc
from agentfn_asgi.policy import DEFINITION_OPTIONS, ToolPolicy
from agentfn_asgi.tools import ToolOptions

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
BEGIN = "<!-- configuration:begin (generated: python -m tests.configuration_page --write) -->"
END = "<!-- configuration:end -->"
TOOLS_PAGE = PAGE.with_name("tools.md")
OPTIONS_BEGIN = "<!-- options:begin (generated: python -m tests.configuration_page --write) -->"
OPTIONS_END = "<!-- options:end -->"
#: Options of AgentWebhookApp that exist for tests, not for users.
UNDOCUMENTED_OPTIONS = frozenset({"clock"})


def _seconds(value: float) -> str:
    for size, unit in ((86400, " days"), (3600, " h"), (1, " s")):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g} s"


def _default(value: object, doc: SettingDoc) -> str:
    if doc.default is not None:
        return doc.default
    if value is None or value == () or value == "":
        return "none"
    if isinstance(value, tuple):
        return ", ".join(_default(item, doc) for item in value)
    if doc.unit == "s" and isinstance(value, int | float) and not isinstance(value, bool):
        return _seconds(float(value))
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return f"{value:,}"
    return f"`{value!r}`"


def _cell(text: str) -> str:
    """Markdown for a table cell, from docstring text (reST roles and literals)."""
    text = re.sub(r":\w+:`~?(?:[\w.]+\.)?([\w]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return text.replace("|", "\\|").replace("\n", " ")


def app_options() -> dict[str, tuple[str, str]]:
    """``AgentWebhookApp`` keyword option -> (its default as written, its ``Args:`` text)."""
    doc = inspect.getdoc(AgentWebhookApp) or ""
    args = doc.split("Args:", 1)[1]
    described: dict[str, str] = {}
    current = None
    for line in args.splitlines():
        match = re.match(r"^    (\w+): (.*)$", line)
        if match:
            current = match.group(1)
            described[current] = match.group(2)
        elif current and line.startswith("        "):
            described[current] += " " + line.strip()
        elif line.strip():
            current = None
    options: dict[str, tuple[str, str]] = {}
    for name, parameter in inspect.signature(AgentWebhookApp).parameters.items():
        if name in UNDOCUMENTED_OPTIONS or parameter.kind is not parameter.KEYWORD_ONLY:
            continue
        default = "" if parameter.default is parameter.empty else repr(parameter.default)
        options[name] = (default, described.get(name, ""))
    return options


def markdown() -> str:
    """The generated part of the page, markers included."""
    defaults = Config()
    lines = [
        BEGIN,
        "",
        "### Environment variables",
        "",
        "Read by `Config.from_env()`; each is also an argument of `AgentWebhookApp` (below).",
        "",
        "| variable | `Config` field | default | meaning |",
        "|---|---|---|---|",
    ]
    for field in dataclasses.fields(Config):
        doc = CONFIG_DOCS[field.name]
        if doc.variable is None:
            continue
        default = _default(getattr(defaults, field.name), doc)
        lines.append(f"| `{doc.variable}` | `{field.name}` | {default} | {_cell(doc.meaning)} |")
    variables = {name: var for var, (name, _kind, _choices) in DISPATCH_ENV.items()}
    lines += [
        "",
        "### How calls run: `DispatchSettings`",
        "",
        "`AgentWebhookApp(settings=DispatchSettings(...))`, or the variables.",
        "",
        "| `DispatchSettings` field | variable | default | meaning |",
        "|---|---|---|---|",
    ]
    settings = DispatchSettings()
    for field in dataclasses.fields(DispatchSettings):
        doc = DISPATCH_DOCS[field.name]
        variable = f"`{variables[field.name]}`" if field.name in variables else ""
        default = _default(getattr(settings, field.name), doc)
        lines.append(f"| `{field.name}` | {variable} | {default} | {_cell(doc.meaning)} |")
    lines += [
        "",
        "### Options of `AgentWebhookApp`",
        "",
        "Every option left out comes from the environment (the tables above).",
        "",
        "| option | default | meaning |",
        "|---|---|---|",
    ]
    for name, (default, meaning) in app_options().items():
        shown = f"`{default}`" if default else ""
        lines.append(f"| `{name}=` | {shown} | {_cell(meaning)} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"


def _option_type(annotation: object) -> str:
    """``str | None`` as written in ``ToolOptions``, shown as "`str` or `None`" (a pipe would
    end the table's cell)."""
    text = annotation.__forward_arg__ if isinstance(annotation, ForwardRef) else str(annotation)
    return " or ".join(f"`{part.strip()}`" for part in text.split(" | "))


def _option_default(name: str) -> str:
    """The option's default: the policy field's, else the tool's definition field's."""
    fields = {
        f.name: f for f in (*dataclasses.fields(ToolPolicy), *dataclasses.fields(FunctionTool))
    }
    spec = fields.get(name)
    default = None if spec is None or spec.default is dataclasses.MISSING else spec.default
    return _seconds(default) if isinstance(default, float) else f"`{default!r}`"


def tool_options_markdown() -> str:
    """The per-tool options table of ``docs/tools.md``, markers included."""
    docs = dict(DEFINITION_OPTIONS)
    docs.update({f.name: f.metadata["doc"] for f in dataclasses.fields(ToolPolicy)})
    lines = [OPTIONS_BEGIN, "", "| option | type | default | meaning |", "|---|---|---|---|"]
    for name, annotation in ToolOptions.__annotations__.items():
        kind, default = _option_type(annotation), _option_default(name)
        lines.append(f"| `{name}=` | {kind} | {default} | {_cell(docs[name])} |")
    lines += ["", OPTIONS_END]
    return "\n".join(lines) + "\n"


#: Each generated part: its page, its markers and what writes it.
GENERATED: tuple[tuple[Path, str, str, Callable[[], str]], ...] = (
    (PAGE, BEGIN, END, markdown),
    (TOOLS_PAGE, OPTIONS_BEGIN, OPTIONS_END, tool_options_markdown),
)


def page_section(text: str, begin: str = BEGIN, end: str = END) -> str:
    """The generated part of ``text`` (a page) between ``begin`` and ``end``, markers
    included."""
    start = text.index(begin)
    stop = text.index(end, start) + len(end)
    return text[start:stop] + "\n"


def write() -> None:
    """Replace each page's generated part with what its function writes now."""
    for page, begin, end, generate in GENERATED:
        text = page.read_text(encoding="utf-8")
        start = text.index(begin)
        stop = text.index(end, start) + len(end) + 1
        page.write_text(text[:start] + generate() + text[stop:], encoding="utf-8")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        sys.stdout.write("".join(generate() for _page, _begin, _end, generate in GENERATED))
