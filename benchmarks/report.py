"""Summaries (median, min–max, ratios), target verdicts and the markdown tables."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

__all__ = ["Check", "markdown", "ratio_summary", "summarise"]

# Metrics shown in the scenario tables, with their headers and formats.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("calls_per_s", "calls/s", "{:.0f}"),
    ("ack_p50_ms", "ack p50 ms", "{:.2f}"),
    ("ack_p99_ms", "ack p99 ms", "{:.1f}"),
    ("d2r_p50_ms", "d→r p50 ms", "{:.1f}"),
    ("d2r_p99_ms", "d→r p99 ms", "{:.0f}"),
    ("wall_s", "wall s", "{:.2f}"),
    ("cpu_us_per_call", "CPU µs/call", "{:.0f}"),
    ("peak_rss_mib", "peak RSS MiB", "{:.1f}"),
    ("rss_growth_mib", "RSS growth MiB", "{:.1f}"),
    ("second_half_rate_ratio", "2nd/1st half rate", "{:.2f}"),
    ("store_round_trips_per_call", "store RT/call", "{:.1f}"),
    ("store_statements_per_call", "statements/call", "{:.1f}"),
    ("store_commits_per_call", "commits/call", "{:.2f}"),
)


def summarise(values: list[float]) -> dict[str, Any]:
    """Median and min–max of one metric over rounds (NaNs dropped)."""
    clean = [v for v in values if not math.isnan(v)]
    if not clean:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "values": values}
    return {
        "median": statistics.median(clean),
        "min": min(clean),
        "max": max(clean),
        "values": values,
    }


def ratio_summary(ours: list[float], base: list[float]) -> dict[str, Any]:
    """Per-round ratios ours/base (round i of each ran back to back), summarised."""
    ratios = [a / b for a, b in zip(ours, base, strict=False) if b and not math.isnan(a / b)]
    return summarise(ratios)


@dataclass(frozen=True, slots=True)
class Check:
    """One target of the issue and whether this run met it."""

    scenario: str
    target: str
    measured: str
    met: bool | None  # None: could not be measured

    @property
    def verdict(self) -> str:
        return {True: "met", False: "NOT met", None: "n/a"}[self.met]


def _fmt(spec: str, value: float) -> str:
    return "–" if math.isnan(value) else spec.format(value)


def _cell(summary: dict[str, Any], spec: str) -> str:
    if math.isnan(summary["median"]):
        return "–"
    if summary["min"] == summary["max"]:
        return _fmt(spec, summary["median"])
    return (
        f"{_fmt(spec, summary['median'])} "
        f"({_fmt(spec, summary['min'])}–{_fmt(spec, summary['max'])})"
    )


def markdown(results: dict[str, Any], checks: list[Check]) -> str:
    """The whole report as markdown: machine, one table per scenario, ratios, verdicts."""
    out: list[str] = []
    machine = results["machine"]
    out.append(
        f"Machine: {machine['cpu']} × {machine['cores']} cores, Python {machine['python']}, "
        f"{machine['platform']}; load average {machine['load_before']} before, "
        f"{machine['load_after']} after. Versions: {machine['versions']}. "
        f"Mode: {results['mode']}; {results['elapsed_s']:.0f} s."
    )
    for name, scenario in results["scenarios"].items():
        out.append(f"\n### {name}\n\n{scenario['description']}\n")
        if "table" in scenario:  # micro-benchmarks and store growth carry their own rows
            out.append(scenario["table"])
            continue
        targets = scenario["targets"]
        shown = [
            (key, head, spec)
            for key, head, spec in COLUMNS
            if any(
                key in t["metrics"] and not math.isnan(t["metrics"][key]["median"])
                for t in targets.values()
            )
            and key in scenario.get("columns", [key])
        ]
        out.append("| target | " + " | ".join(h for _, h, _ in shown) + " | lost | dup |")
        out.append("|---|" + "---:|" * (len(shown) + 2))
        for target, data in targets.items():
            nan = {"median": math.nan}
            cells = [_cell(data["metrics"].get(key, nan), spec) for key, _, spec in shown]
            out.append(
                f"| {target} | " + " | ".join(cells) + f" | {data['lost']} | {data['duplicates']} |"
            )
        ratios = scenario.get("ratios", {})
        if ratios:
            out.append("\nRatios (per round, median (min–max)):\n")
            for label, metrics in ratios.items():
                parts = [f"{key} {_cell(summary, '{:.2f}')}" for key, summary in metrics.items()]
                out.append(f"- {label}: " + "; ".join(parts))
    out.append("\n### Targets\n")
    out.append("| scenario | target | measured | verdict |\n|---|---|---|---|")
    for check in checks:
        out.append(f"| {check.scenario} | {check.target} | {check.measured} | {check.verdict} |")
    return "\n".join(out)
