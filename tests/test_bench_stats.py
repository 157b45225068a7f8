"""The load generator's statistics against numpy on known samples."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from bench.loadgen import parse_server_timing
from bench.stats import PERCENTILES, percentile, summarize

SAMPLES = [
    [1.0],
    [1.0, 2.0],
    [3.0, 1.0, 2.0],
    [5.0] * 7,
    [0.5, 0.5, 0.7, 0.7, 0.7, 9.0],
    list(range(1, 101)),
    [random.Random(1).lognormvariate(0, 1) for _ in range(1000)],
    [random.Random(2).expovariate(3.0) for _ in range(997)],
]


@pytest.mark.parametrize("values", SAMPLES, ids=lambda v: f"n{len(v)}")
@pytest.mark.parametrize("q", [0, 1, 10, 25, 50, 90, 95, 99, 99.9, 100])
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    ours = percentile(sorted(values), q)
    assert ours == pytest.approx(float(np.percentile(values, q)), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("values", SAMPLES, ids=lambda v: f"n{len(v)}")
def test_summary_matches_numpy(values: list[float]) -> None:
    s = summarize(values)
    assert s.count == len(values)
    assert s.min == min(values) and s.max == max(values)
    assert s.avg == pytest.approx(float(np.mean(values)))
    for q, got in zip(PERCENTILES, (s.p50, s.p90, s.p95, s.p99), strict=True):
        assert got == pytest.approx(float(np.percentile(values, q)))
    assert s.min <= s.p50 <= s.p90 <= s.p95 <= s.p99 <= s.max


def test_empty_and_bad_input() -> None:
    assert math.isnan(percentile([], 50))
    assert math.isnan(summarize([]).p99)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_server_timing_header() -> None:
    header = b'tokenize;dur=0.105, queue;dur=0.020, inference;desc="ort";dur=1.234, postprocess;dur=x, bad'
    assert parse_server_timing(header) == [("tokenize", 0.105), ("queue", 0.02), ("inference", 1.234)]
