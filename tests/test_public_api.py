"""The curated public namespace: sorted, complete, importable (as httpx checks its own)."""

from __future__ import annotations

import agentfn_asgi


def test_all_is_sorted_and_importable() -> None:
    """Every name in __all__ exists, and the list stays sorted so diffs stay readable."""
    names = agentfn_asgi.__all__

    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    def rank(name: str) -> tuple[int, str]:
        kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
        return kind, name

    assert names == sorted(names, key=rank)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(agentfn_asgi, name), name


def test_every_public_error_is_in_the_tree() -> None:
    """Every exported exception derives from AgentFnError (one tree to catch), and every
    exported warning from AgentFnWarning (one filter to silence or escalate)."""
    for name in agentfn_asgi.__all__:
        value = getattr(agentfn_asgi, name)
        if isinstance(value, type) and issubclass(value, Warning):
            assert issubclass(value, agentfn_asgi.AgentFnWarning), name
        elif isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, agentfn_asgi.AgentFnError), name
