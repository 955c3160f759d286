"""Every common mistake in tests/mistakes.py produces its message, and the documentation's
"Common mistakes" page is exactly what the table generates (so neither can drift)."""

from __future__ import annotations

import logging
import warnings

import pytest

from tests import mistakes
from tests.mistakes import MISTAKES, Mistake


@pytest.mark.parametrize("row", MISTAKES, ids=[row.title for row in MISTAKES])
def test_the_mistake_produces_its_message(row: Mistake) -> None:
    """Making the mistake raises, warns or logs (as the row says) exactly its message."""
    said = mistakes.observe(row)
    assert said, f"{row.title!r}: nothing was said ({row.kind})"
    assert any(mistakes.matches(row.message, text) for text in said), (row.message, said)


def test_error_rows_raise_nothing_else_and_warning_rows_do_not_fail() -> None:
    """An error row's trigger warns nothing on its way to the error, and a warning row's
    trigger completes: each mistake is said one way, once."""
    for row in MISTAKES:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            said = mistakes.observe(row)
        if row.kind == "error":
            assert caught == [], (row.title, [str(w.message) for w in caught])
        if row.kind == "warning":
            assert len(said) == 1, (row.title, said)


def test_the_page_lists_every_mistake_as_generated() -> None:
    """docs/common-mistakes.md's generated part is `python -m tests.mistakes` output, markers
    included; run `python -m tests.mistakes --write` after changing the table."""
    text = mistakes.PAGE.read_text(encoding="utf-8")
    assert mistakes.page_section(text) == mistakes.markdown()
    for row in MISTAKES:
        assert row.title in text


def test_rows_are_complete_and_distinct() -> None:
    """Every row has an area, a title, a message and the category its kind needs; titles
    are unique so the page and test ids stay unambiguous."""
    titles = [row.title for row in MISTAKES]
    assert len(set(titles)) == len(titles)
    for row in MISTAKES:
        assert row.area and row.title and row.message
        assert (row.category is None) == (row.kind in ("log", "cli")), row.title
        assert (row.exit_code is not None) == (row.kind == "cli"), row.title


def test_matches_treats_the_ellipsis_as_any_text() -> None:
    """``…`` stands for any text; everything else must match word for word."""
    assert mistakes.matches("tool function …f: bad", "tool function a.b.<locals>.f: bad")
    assert not mistakes.matches("tool function …f: bad", "tool function a.f: bad!")
    assert not mistakes.matches("exact (text)", "exact text")


def test_the_runner_reads_log_rows() -> None:
    """A ``log`` row (start-up checks will add them) is observed from the named logger."""

    def trigger() -> None:
        logging.getLogger("agentfn_asgi.startup").warning("store at %s", "/tmp/x.sqlite3")
        logging.getLogger("agentfn_asgi.startup").info("not a warning")

    row = Mistake("Area", "title", "store at …", "log", None, trigger)
    assert mistakes.observe(row) == ["store at /tmp/x.sqlite3"]


def test_an_error_row_whose_trigger_does_not_raise_fails() -> None:
    """The runner refuses a trigger that no longer makes its mistake."""
    row = Mistake("Area", "quiet", "x", "error", ValueError, lambda: None)
    with pytest.raises(AssertionError, match="no ValueError was raised"):
        mistakes.observe(row)
