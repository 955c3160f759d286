"""Smoke run of ``benchmarks.limits_cost``: both targets (a tool without limits, the same tool
with limits it never reaches) answer every call exactly once. No timing or ratio is
asserted (machines are shared and noisy); the ratio is the benchmark's to report."""

from __future__ import annotations

import math

import pytest

from benchmarks.limits_cost import build_tools, run

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_limits_cost_runs_with_zero_lost_and_zero_duplicates() -> None:
    """One tiny interleaved round: 0 lost, 0 duplicates, a finite ratio per round."""
    results = await run(rounds=1, sessions=12)
    assert (results["lost"], results["duplicates"]) == (0, 0)
    assert len(results["ratios"]) == 1
    assert all(math.isfinite(r) and r > 0 for r in results["ratios"])


def test_the_limited_target_registers_limits_it_never_reaches() -> None:
    """The limited target's tool is limited (its calls take the limited path) by more slots
    than the app ever runs at once; the plain target's is the same tool without limits."""
    limited = build_tools(limited=True).get("get_customer")
    plain = build_tools(limited=False).get("get_customer")
    assert limited is not None and plain is not None
    assert limited.policy.limited and not plain.policy.limited
    assert limited.policy.concurrency is not None and limited.policy.concurrency > 1024
    assert limited.definition() == plain.definition()
