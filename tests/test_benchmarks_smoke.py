"""Smoke run of the benchmark harness: it runs end to end and its correctness counters are zero.

Timings are never asserted (machines are shared and noisy); only that every call the driver
created got exactly one accepted submission, for agentfn-asgi and for the inline baseline.
"""

from __future__ import annotations

import base64
import math
import secrets
from pathlib import Path

import pytest

from benchmarks.bench_api import BenchAPI
from benchmarks.driver import Driver, TargetProcess
from benchmarks.report import Check, markdown, summarise
from benchmarks.run import TARGETS

pytestmark = [pytest.mark.anyio, pytest.mark.slow]


async def test_harness_runs_with_zero_lost_and_zero_duplicates(tmp_path: Path) -> None:
    """Serial, burst and a 4-call turn against ours, the httpx2 baseline and ours on uvloop +
    httptools: 0 lost, 0 dup."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    api = BenchAPI()
    api_url = await api.start()
    driver = Driver(api, secret, result_timeout=20.0)
    procs = [
        TargetProcess(name, TARGETS[name], api_url=api_url, secret=secret, store_dir=str(tmp_path))
        for name in ("ours", "inline-httpx2", "ours-uv")
    ]
    try:
        for proc in procs:
            proc.launch()
        for proc in procs:
            await proc.wait_ready()
        for proc in procs:
            rounds = [
                await driver.serial(proc, 5),
                await driver.burst(proc, sessions=12, concurrency=4),
                await driver.burst(proc, sessions=1, calls_each=4, concurrency=1),
            ]
            for result in rounds:
                assert (result.lost, result.duplicates) == (0, 0), proc.name
                assert result.metrics["calls_per_s"] > 0
                assert not math.isnan(result.metrics["ack_p50_ms"])
            # The store's driver calls are counted in ours (every call makes some), not inline.
            trips = rounds[0].metrics["store_round_trips_per_call"]
            assert trips > 0 if proc.name.startswith("ours") else math.isnan(trips)
    finally:
        for proc in procs:
            proc.stop()
        await api.stop()


def test_report_renders_a_scenario_table_and_verdicts() -> None:
    """The markdown report shows each target's row, the ratios and the verdict table."""
    metrics = {
        key: summarise([1.0, 2.0])
        for key in ("calls_per_s", "ack_p50_ms", "ack_p99_ms", "d2r_p50_ms", "d2r_p99_ms")
    }
    metrics |= {
        key: summarise([math.nan])
        for key in (
            "wall_s",
            "cpu_us_per_call",
            "peak_rss_mib",
            "rss_growth_mib",
            "second_half_rate_ratio",
        )
    }
    results = {
        "mode": "quick",
        "elapsed_s": 1.0,
        "machine": {
            "cpu": "cpu",
            "cores": 2,
            "python": "3.11",
            "platform": "linux",
            "load_before": "0",
            "load_after": "0",
            "versions": "x",
        },
        "scenarios": {
            "serial": {
                "description": "d",
                "targets": {"ours": {"metrics": metrics, "lost": 0, "duplicates": 0}},
                "ratios": {"ours / inline-httpx2": {"calls_per_s": summarise([1.2])}},
            }
        },
    }
    text = markdown(results, [Check("serial", "calls/s ≥ 1.0×", "1.20×", True)])
    assert "| ours | 2 (1–2)" in text
    assert "ours / inline-httpx2: calls_per_s 1.20" in text
    assert "| serial | calls/s ≥ 1.0× | 1.20× | met |" in text
