"""Latency statistics: percentiles the way numpy's default ("linear") method computes them, in pure Python.

The load generator keeps plain lists of floats; these functions summarise them without numpy so the hot
process stays small. `tests/test_bench_stats.py` checks them against numpy on known samples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of an ascending sequence, linear between the two closest ranks
    (numpy.percentile's default). NaN for an empty sequence."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    pos = (n - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    frac = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    # numpy's lerp: a + (b - a) * frac, computed from the nearer end for accuracy.
    return a + (b - a) * frac if frac < 0.5 else b - (b - a) * (1.0 - frac)


@dataclass(frozen=True)
class Summary:
    """min/avg/percentiles/max of a sample; every field NaN when it is empty."""

    count: int
    min: float
    avg: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float


def summarize(values: Sequence[float]) -> Summary:
    """Summarise a sample (any order)."""
    if not values:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan)
    s = sorted(values)
    p50, p90, p95, p99 = (percentile(s, q) for q in PERCENTILES)
    return Summary(len(s), s[0], math.fsum(s) / len(s), p50, p90, p95, p99, s[-1])


def mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else math.nan


def median_call_seconds(call: Callable[[], object], calls: int = 200, warmup: int = 20) -> float:
    """The median wall time of `calls` calls of `call`, after `warmup` untimed ones (the GPU scripts' timer:
    scripts/gpu-probe.py, gpu-graphs.py, gpu-peers.py)."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return percentile(sorted(times), 50.0)
