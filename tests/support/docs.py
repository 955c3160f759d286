"""The code blocks of the README and the documentation pages, for the tests that run them.

Every fenced block is preceded by a marker: ``<!-- block: NAME -->`` when a test runs it
(reading it here by that name), or ``<!-- not run: REASON -->``. Blocks inside a generated
part of a page (between ``<!-- ...:begin`` and ``<!-- ...:end -->`` markers) are exempt:
the generator's own test checks them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DOCS", "README", "ROOT", "Block", "block", "blocks", "pages"]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

_MARKER = re.compile(r"^<!-- (block|not run): (.*?) -->$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced code block: where it is, its language, its text and its marker."""

    path: Path
    line: int
    language: str
    code: str
    #: ``"block"``, ``"not run"``, ``"generated"``, or ``""`` when the marker is missing.
    kind: str
    #: The block's name, or the reason it is not run.
    value: str

    def where(self) -> str:
        """``path:line`` for messages."""
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the documentation."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one page, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    generated = False
    index = 0
    while index < len(lines):
        line = lines[index]
        if re.match(r"^<!-- [a-z-]+:begin", line):
            generated = True
        elif re.match(r"^<!-- [a-z-]+:end -->", line):
            generated = False
        if not line.startswith("```"):
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = next((text for text in reversed(lines[:index]) if text.strip()), "")
        marker = _MARKER.match(before)
        kind, value = (marker.group(1), marker.group(2)) if marker else ("", "")
        if generated and not marker:
            kind = "generated"
        found.append(
            Block(
                path=path,
                line=index + 1,
                language=line[3:].strip(),
                code="\n".join(lines[index + 1 : end]) + "\n",
                kind=kind,
                value=value,
            )
        )
        index = end + 1
    return found


def block(name: str) -> str:
    """The code of the block marked ``<!-- block: name -->``, on whichever page it is."""
    matches = [b for path in pages() for b in blocks(path) if b.kind == "block" and b.value == name]
    assert len(matches) == 1, f"{len(matches)} blocks named {name!r}"
    return matches[0].code
