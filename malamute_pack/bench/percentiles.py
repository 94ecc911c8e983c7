"""
Latency figures for the benchmarks: percentiles by nearest rank, in
microseconds, named as every benchmark line prints them.

Tests: ``tests/system/test_bench_floor.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# Each figure's name and its fraction of the ordered samples.
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50_us", 0.50),
    ("p99_us", 0.99),
    ("p999_us", 0.999),
    ("max_us", 1.0),
)


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """The nearest-rank C{fraction} (0 < fraction <= 1) of C{ordered}, sorted, not empty."""
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_figures(seconds: Sequence[float]) -> dict[str, str]:
    """p50, p99, p99.9 and max of C{seconds}, in whole microseconds (all 0 with no sample)."""
    if not seconds:
        return {name: "0" for name, _ in PERCENTILES}
    ordered = sorted(seconds)
    return {name: f"{percentile(ordered, f) * 1e6:.0f}" for name, f in PERCENTILES}
