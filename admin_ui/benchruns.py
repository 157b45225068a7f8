"""The History tab's logic: the run list, run names for the pickers, and two runs side by side.

Reads `bench.store` types only; nothing here touches Streamlit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from admin_ui.percentiles import APPROXIMATE, latency_text, num
from admin_ui.tables import numeric_columns, text_rows
from bench.records import seq_label
from bench.store import Comparison, Point, Run


def run_rows(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """The run history table, newest first as the store returns it: why a run failed or was cancelled comes
    right after its status; the task and the machine are in the run pickers and the run's details."""
    return [
        {
            "id": f"#{r.id}",
            "created": r.created_at.replace("T", " ")[:16],
            "status": r.status,
            "message": r.message,
            "name": r.name,
            "target": r.target,
        }
        for r in runs
    ]


def run_outcome(run: Run) -> str:
    """Why a failed or cancelled run ended, as the Results tab says it."""
    message = run.message or "no reason recorded"
    if message.startswith(run.status):
        return f"Run #{run.id} {message}."
    return f"Run #{run.id} {run.status}: {message}."


def run_label(run: Run) -> str:
    """How a run is named in pickers, short enough for an 800-pixel window: `#7 nightly · done · 2025-01-01
    10:00` (the task and the target are in the History table)."""
    head = f"#{run.id} {run.name}".strip()
    return " · ".join(p for p in (head, run.status, run.created_at.replace("T", " ")[:16]) if p)


TARGET_ORDER = ("hare", "vanilla", "comet", "model-only")  # as the bench measures them
FASTER = "B/A p50 (below 1: B faster)"
MORE = "B/A req/s (above 1: B more)"


def setting_order(value: Any) -> tuple[int, float, str]:
    """A sort key that puts 8 before 32 (the store sorts settings as text) and words such as "comet" last."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(value))


def comparison_key(c: Comparison) -> tuple[Any, ...]:
    rank = TARGET_ORDER.index(c.target) if c.target in TARGET_ORDER else len(TARGET_ORDER)
    settings = [setting_order(c.key.get(k)) for k in ("load", "seq_len", "batch", "concurrency", "rate")]
    return (rank, c.target, *settings, [setting_order(v) for v in c.key.values()])


def comparison_rows(comparisons: Iterable[Comparison]) -> list[dict[str, Any]]:
    """Two runs side by side at matching settings, ordered by target then by number (8 before 32 tokens);
    ratios are B over A, their columns say which way is better. Figures as numbers (the CSV's rows)."""
    rows = []
    for c in sorted(comparisons, key=comparison_key):
        a, b = c.a, c.b
        rows.append(
            {
                "target": c.target,
                "seq len": seq_label(c.key["seq_len"], c.key.get("inputs", "exact")),
                "batch": c.key.get("batch"),
                "concurrency": c.key.get("concurrency"),
                "A req/s": num(a.req_s, 1) if a else None,
                "B req/s": num(b.req_s, 1) if b else None,
                MORE: num(c.req_s_ratio),
                "A p50 ms": num(a.lat_p50) if a else None,
                "B p50 ms": num(b.lat_p50) if b else None,
                "A p99 ms": num(a.lat_p99) if a else None,
                "B p99 ms": num(b.lat_p99) if b else None,
                FASTER: num(c.p50_ratio),
            }
        )
    return rows


def comparison_table(
    comparisons: Iterable[Comparison], cut: Iterable[Point | None] = ()
) -> tuple[list[dict[str, str]], list[str], list[str]]:
    """The comparison as the History tab shows it: (text rows, right-aligned columns, notes). Percentiles of
    too few answers carry "~" as everywhere else, and a point a cancel cut short (`cut`: each run's, from
    benchpoints.cut_short) is marked in its target, each with a sentence saying so."""
    ordered = sorted(comparisons, key=comparison_key)
    raw = comparison_rows(ordered)
    numeric = numeric_columns(raw)
    rows = text_rows(raw)
    partial = [p for p in cut if p is not None]
    few = marked = False
    for c, row in zip(ordered, rows, strict=True):
        for side, point in (("A", c.a), ("B", c.b)):
            if point is None:
                continue
            if point in partial:
                row["target"] += f" ({side} cancelled)"
                marked = True
            for q in ("p50", "p99"):
                row[f"{side} {q} ms"] = latency_text(num(getattr(point, f"lat_{q}")), q, point.ok)
                few = few or row[f"{side} {q} ms"].startswith(APPROXIMATE)
    notes = []
    if marked:
        notes.append("(A cancelled), (B cancelled): that run's point was stopped by a cancel before its time was up.")
    if few:
        notes.append(
            f"{APPROXIMATE} marks a percentile from fewer answers than it needs (p50: 2, p99: 100): a p99 from "
            "fewer than 100 answers is about the slowest of them."
        )
    return rows, numeric, notes
