"""Every name the documentation cites exists: a reader who copies one from the README or a
page of docs/ gets something the package has.

- ``AGENTFN_*`` variables: those ``agentfn_asgi/config.py`` reads (the only reader of the
  environment), plus the test suite's own knobs (read by ``os.environ.get`` in tests/ and by
  the test-only crash hook);
- ``agentfn-asgi`` commands and flags, in code (blocks and inline): walked through the CLI's
  argparse parser, so a command, a sub-command or a flag it does not have is caught, also
  when a page names a sub-command without the program (```calls show```);
- Python names: every dotted ``agentfn_asgi.…`` name imports or resolves to an attribute,
  and every ``from agentfn_asgi… import …`` imports.

The generated list of common mistakes is left out: its entries are mistakes on purpose, each
one run by ``tests/test_common_mistakes.py``.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Iterator
from pathlib import Path

from agentfn_asgi.cli import build_parser
from agentfn_asgi.integrations.celery import TASK_NAME
from tests.support.docs import ROOT, blocks, pages

PROGRAM = "agentfn-asgi"


def _text(path: Path) -> str:
    """The page, with the common mistakes' generated entries blanked (lines kept)."""
    text = path.read_text(encoding="utf-8")
    mistakes = r"^<!-- mistakes:begin.*?^<!-- mistakes:end -->"
    return re.sub(mistakes, lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)


def _where(path: Path, text: str, offset: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}"


# -- environment variables ------------------------------------------------------------------


def _variables_read() -> set[str]:
    """What config.py reads, and the knobs the test suite reads for itself."""
    config = (ROOT / "agentfn_asgi" / "config.py").read_text(encoding="utf-8")
    known = set(re.findall(r'"(AGENTFN_[A-Z0-9_]+)"', config))
    test_only = [ROOT / "agentfn_asgi" / "_crash.py", *(ROOT / "tests").rglob("*.py")]
    for path in test_only:
        source = path.read_text(encoding="utf-8")
        known |= set(re.findall(r'environ\.get\(\s*"(AGENTFN_[A-Z0-9_]+)"', source))
    return known


def test_every_agentfn_variable_the_docs_cite_is_read() -> None:
    """A variable on a page that nothing reads would be silently ignored by the app."""
    known = _variables_read()
    assert "AGENTFN_STORE_URL" in known and "AGENTFN_LEASE_MARGIN" in known
    unknown = [
        f"{_where(path, text, match.start())}: {match.group(0)}"
        for path in pages()
        for text in [_text(path)]
        for match in re.finditer(r"\bAGENTFN_[A-Z0-9_]*[A-Z0-9]\b", text)
        if match.group(0) not in known
    ]
    assert unknown == []


# -- the command line -----------------------------------------------------------------------


def _code(path: Path) -> Iterator[tuple[int, str]]:
    """Each piece of code on a page, with its line: a shell block's lines (a trailing
    backslash joins the next line; ``text`` blocks are output) and each inline code span
    (which may span lines)."""
    text = _text(path)
    for found in blocks(path):
        if found.language not in ("bash", "console", "sh") or found.kind == "generated":
            continue
        lines = found.code.replace("\\\n", " ").splitlines()
        for number, line in enumerate(lines):
            yield found.line + 1 + number, line
    prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    for match in re.finditer(r"`([^`]+)`", prose):
        yield prose.count("\n", 0, match.start()) + 1, match.group(1).replace("\n", " ")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _check_command(words: list[str]) -> str | None:
    """What is wrong with ``agentfn-asgi WORDS...`` (None: every command and flag exists).

    Only names are checked, not values: a bare word right after a command that has
    sub-commands must be one of them (``approve|deny``: each of them); every ``-flag`` must
    be an option of the (sub-)command it follows (or of the program: ``--version``)."""
    root = build_parser()
    parser, path = root, [PROGRAM]
    expect_command = True
    for raw in words:
        word = raw.strip("[](){}.,;…'\"")
        if not word or word.startswith("<"):
            continue
        commands = _subcommands(parser)
        if word.startswith("-"):
            expect_command = False
            flag = word.split("=", 1)[0]
            if flag not in _options(parser) | _options(root):
                return f"{' '.join(path)} has no option {flag}"
        elif expect_command and commands and re.fullmatch(r"[a-z][a-z|-]*", word):
            missing = [name for name in word.split("|") if name not in commands]
            if missing:
                known = ", ".join(commands)
                return f"{' '.join(path)} has no command {missing[0]!r} (it has: {known})"
            name = word.split("|")[0]
            parser, path = commands[name], [*path, name]
        else:
            expect_command = False
    return None


def _command_lines(code: str, top: set[str]) -> Iterator[list[str]]:
    """The words of each command line in ``code``: after ``agentfn-asgi``, or a span that
    starts with a top-level command and goes on (```calls show ID```)."""
    code = code.replace("\\|", " ")  # an alternative inside a markdown table cell
    for match in re.finditer(rf"(?<![\w/.-]){re.escape(PROGRAM)}(?![\w.\[-])", code):
        if code[: match.start()].rstrip().endswith("install"):
            continue  # the package, not the program
        rest = re.split(r"\s(?:#|\||;|&&|>)|$", code[match.end() :], maxsplit=1)[0]
        # A message, not a command: "agentfn-asgi status: ...", "agentfn-asgi cannot start: ..."
        if not any(word.endswith(":") for word in rest.split()[:2]):
            yield rest.split()
    words = code.split()
    if PROGRAM not in code and len(words) > 1 and words[0] in top:
        yield words


def test_every_command_and_flag_the_docs_cite_exists() -> None:
    """``agentfn-asgi`` commands, sub-commands and flags in the README and docs/ are the
    CLI's: a renamed command or a misspelled flag fails here, with the page and line."""
    top = set(_subcommands(build_parser()))
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: `{code.strip()}`: {problem}"
        for path in pages()
        for line, code in _code(path)
        for words in _command_lines(code, top)
        for problem in [_check_command(words)]
        if problem
    ]
    assert wrong == []


# -- Python names ---------------------------------------------------------------------------


def _resolves(dotted: str) -> bool:
    """``agentfn_asgi.a.b`` (or ``module:attribute``) is a module or an attribute of one."""
    dotted = dotted.replace(":", ".")
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_every_python_name_the_docs_cite_exists() -> None:
    """Every ``agentfn_asgi.x.y`` a page names, and every name it imports from the package,
    exists (the Celery task's name, a string, is the one dotted name that is no attribute)."""
    wrong: list[str] = []
    for path in pages():
        text = _text(path)
        for match in re.finditer(r"\bagentfn_asgi(?:\.\w+)+(?::\w+)?", text):
            if match.group(0) != TASK_NAME and not _resolves(match.group(0)):
                wrong.append(f"{_where(path, text, match.start())}: {match.group(0)}")
        imports = r"from (agentfn_asgi[\w.]*) import (\([^)]*\)|[^\n]+)"
        for match in re.finditer(imports, text):
            names = re.sub(r"#[^\n]*", "", match.group(2)).strip("() \n")
            for item in names.split(","):
                name = item.split(" as ")[0].strip().strip("`")
                if name and not _resolves(f"{match.group(1)}.{name}"):
                    wrong.append(f"{_where(path, text, match.start())}: {match.group(1)}.{name}")
    assert wrong == []


def test_the_getting_started_page_names_every_tool_the_demo_serves() -> None:
    """The demo section lists the demo's tools by name: a tool added to the demo (and to
    the examples, which serve the same registry) shows up there."""
    from agentfn_asgi.demo.tools import tools

    text = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    section = text.split("## The demo", 1)[1].split("\n## ", 1)[0]
    assert [tool.name for tool in tools if f"`{tool.name}`" not in section] == []
