"""A pipe inside code in a table cell, as GitHub and the site both show it.

GitHub's tables need the ``\\|`` escape even inside a code span (else the pipe ends the
cell), and show it as ``|``; Python-Markdown's tables already keep a code span's pipes in
their cell, and would show the backslash. This MkDocs hook (``hooks:`` in mkdocs.yml) drops
the escape inside the code spans of table rows before the page is converted, so a page
written for GitHub renders the same on the site.
"""

from __future__ import annotations

import re
from typing import Any

_CODE = re.compile(r"`[^`\n]*`")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Unescape ``\\|`` inside the code spans of every table row."""
    return "\n".join(
        _CODE.sub(lambda m: m.group(0).replace("\\|", "|"), line) if line.startswith("|") else line
        for line in markdown.split("\n")
    )
