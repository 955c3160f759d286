"""The curated public namespace: sorted, complete, importable (as httpx checks its own)."""

from __future__ import annotations

import re
from pathlib import Path

import agentfn_asgi
import agentfn_asgi.errors
import agentfn_asgi.worker


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


def _documented(section: str) -> set[str]:
    """The backticked names of one marked section of the API reference page."""
    page = Path(__file__).resolve().parents[1] / "docs" / "reference.md"
    text = page.read_text(encoding="utf-8")
    start = text.index(f"<!-- {section}:start -->")
    end = text.index(f"<!-- {section}:end -->", start)
    return set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", text[start:end]))


def test_all_matches_the_documented_api() -> None:
    """The API reference's table names exactly agentfn_asgi.__all__: nothing exported
    is undocumented, nothing documented is missing."""
    assert _documented("api") == set(agentfn_asgi.__all__)


def test_every_error_class_is_exported() -> None:
    """Every class of the error tree is in __all__ (a family is exported whole or not at all)."""
    for name in agentfn_asgi.errors.__all__:
        assert name in agentfn_asgi.__all__, name


def test_the_worker_module_exports_what_a_worker_calls() -> None:
    """agentfn_asgi.worker exports the worker's side only (no tokens, no app internals)."""
    assert sorted(agentfn_asgi.worker.__all__) == [
        "Completion",
        "CompletionResult",
        "Job",
        "complete_call",
        "complete_call_sync",
        "complete_job",
        "job_context",
        "run_job",
    ]
