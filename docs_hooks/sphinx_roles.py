"""The package's Sphinx cross-reference roles, as links in the API reference.

The docstrings cite other objects the Sphinx way (``:class:`~agentfn_asgi.Config```,
``:meth:`check```), which mkdocstrings would show as written. This griffe extension (the
python handler's ``extensions`` in mkdocs.yml) rewrites each role, once the package is
loaded, into an autorefs cross-reference to the object it names: resolved in the
docstring's own scope, as Sphinx resolves it, and shown as its last name when written with
``~``. The reference is optional: an object the site does not render stays plain code.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

import griffe

#: ``:role:`name```, ``:role:`~name``` or ``:role:`title <name>``` (the name's own ``()`` aside).
ROLE = re.compile(
    r":(class|meth|func|attr|mod|data|exc|obj):`(~?)([\w.]+?)(?:\(\))?(?:\s*<([\w.]+)>)?`"
)


def _objects(parent: griffe.Object) -> Iterator[griffe.Object]:
    """``parent`` and everything defined in it (not what it imports: that is rewritten where
    it is defined)."""
    yield parent
    for member in parent.members.values():
        if not member.is_alias:
            yield from _objects(member)  # type: ignore[arg-type]


def _identifier(scope: griffe.Object, name: str) -> str:
    """The full path ``name`` stands for in ``scope`` (``name`` itself when unresolvable)."""
    first, _, rest = name.partition(".")
    try:
        resolved = scope.resolve(first)
    except griffe.NameResolutionError:
        return name
    return f"{resolved}.{rest}" if rest else resolved


def _link(scope: griffe.Object, match: re.Match[str]) -> str:
    role, short, name, target = match.groups()
    if target:  # an explicit title: shown as written
        shown, name = name, target
    else:
        shown = name.rsplit(".", 1)[-1] if short else name
        shown += "()" if role in ("meth", "func") else ""
    identifier = html.escape(_identifier(scope, name), quote=True)
    code = f"<code>{html.escape(shown)}</code>"
    return f'<autoref identifier="{identifier}" optional>{code}</autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrite the roles in every docstring of the loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(partial(_link, obj), obj.docstring.value)
