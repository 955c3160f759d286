"""The README's code that claims to run does run (a stale README is a bug)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_block_after(heading: str) -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"no python block after {heading!r}"
    return match.group(1)


def test_the_testing_your_tools_example_passes() -> None:
    """The "Testing your tools" snippet defines a test; running it passes."""
    namespace: dict[str, Any] = {}
    exec(compile(_python_block_after("## Testing your tools"), "README.md", "exec"), namespace)  # noqa: S102
    anyio.run(namespace["test_get_customer"])


def test_the_readme_starts_with_the_two_commands() -> None:
    """The first block is exactly `make demo` then `make test` (what DEVELOPERS.md promises)."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands == ["make demo", "make test"]
