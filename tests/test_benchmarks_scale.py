"""Smoke run of ``benchmarks.scale --quick``: each of the four curves runs at a toy size
on SQLite and prints its table. No timing is asserted (machines are shared and noisy);
the curves are the benchmark's to report."""

from __future__ import annotations

import math

import pytest

from benchmarks.scale import CURVES, failing_curve, run

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_the_quick_run_prints_one_table_per_curve() -> None:
    """``--quick``: four tables, in the order of the curves, each with its rows."""
    tables = await run(CURVES, quick=True, stores=("sqlite",))
    assert [t.splitlines()[0] for t in tables] == [
        "### CPU per call against stored calls",
        "### Starts per second against line length",
        "### Ack latency while the page is read",
        "### Healthy sessions behind failing ones",
    ]
    assert all(len(t.strip().splitlines()) >= 5 for t in tables)  # title, header, a row


async def test_a_healthy_session_behind_failing_ones_is_answered() -> None:
    """Ten failing deliveries first: the healthy one is answered (a finite time)."""
    [row] = await failing_curve((10,))
    assert row.failing == 10 and math.isfinite(row.answered_s)
