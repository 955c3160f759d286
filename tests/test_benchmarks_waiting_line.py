"""Smoke run of ``benchmarks.waiting_line``: a tiny line of each tool on SQLite starts every
call it counts, and counts the store's admission requests. No timing is asserted (machines
are shared and noisy); the curves are the benchmark's to report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.waiting_line import _table, measure

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.mark.parametrize(("tool", "waited"), [("rate", 5), ("concurrency", 4)])
async def test_a_small_line_starts_every_counted_call(
    tool: str, waited: int, tmp_path: Path
) -> None:
    """Six calls: the one the rate lets through at once (the two of the concurrency) start
    as they are claimed; every other one waits in the line, is counted and starts once."""
    row = await measure("sqlite", tool, 6, starts=6, tmp=tmp_path)
    assert row.starts == waited
    assert math.isfinite(row.starts_per_s) and row.starts_per_s > 0
    assert row.polls_per_start > 0  # the waiting calls asked for their turn
    assert f"| sqlite | {tool} | 6 |" in _table([row])
