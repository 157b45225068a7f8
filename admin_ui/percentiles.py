"""How the console prints a latency percentile: with a "~" in front when the point had too few answers for it.

A percentile needs answers: p50 2, p90 10, p95 20, p99 100. With 93 answers "p99" is about the slowest of them,
so every page (Results, History, the progress line, the headline) marks it the same way, through `latency_text`.
"""

from __future__ import annotations

import math

from admin_ui.tables import cell, figure

PERCENTILES = ("p50", "p90", "p95", "p99")
APPROXIMATE = "~"  # marks a percentile from fewer answers than it needs


def num(x: float | None, digits: int = 2) -> float | None:
    """A figure rounded for a table or a CSV; None for nothing (None or NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), digits)


def needed_answers(percentile: str) -> int:
    """Answers a percentile needs before it is one: p50 2, p90 10, p95 20, p99 100 (below that, p99 is just
    the slowest answer, interpolated)."""
    q = float(percentile.removeprefix("p"))
    return math.ceil(100 / (100 - q) - 1e-9)


def resolved(percentile: str, answers: int) -> bool:
    return answers >= needed_answers(percentile)


def latency_text(value: float | None, percentile: str, answers: int) -> str:
    """A latency cell: "~" in front of a percentile the point has too few answers for."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return cell(None)
    mark = APPROXIMATE if percentile in PERCENTILES and not resolved(percentile, answers) else ""
    return mark + figure(float(value))
