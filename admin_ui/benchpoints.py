"""The Results tab's logic: a run's measured points turned into its table, its headline figures, its chart rows
and its CSV; which point a cancel cut short.

Reads `bench.store` types only; nothing here starts a process or touches Streamlit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from admin_ui.percentiles import APPROXIMATE, PERCENTILES, latency_text, num
from admin_ui.tables import cell, figure, numeric_columns
from bench.records import seq_label
from bench.report import rows_to_csv
from bench.store import Point, Ratio, Run

LATENCY_COLUMNS = ("min", "avg", "p50", "p90", "p95", "p99", "max")
SETTING_COLUMNS = ("batch", "workers", "threads")  # shown once above the table when every point shares them
MODEL_ONLY = (
    "model-only: the bundle's model called inside the bench's own process, without HTTP or the server's "
    "batching; its concurrency is model streams side by side: 1, and at most one per core of this machine"
)
MODEL_ONLY_MAX_S = 3.0  # bench/runner.py measures the model alone for at most 3 s a point
ERROR_WORDS = {"connect": "could not connect", "timeout": "timed out"}  # the load generator's failures
CUT_SHORT = 0.9  # a point measured for less than this share of the seconds asked was stopped early


def point_rows(points: Iterable[Point]) -> list[dict[str, Any]]:
    """One row per measured point: settings, latency min/avg/p50/p90/p95/p99/max (ms) and throughput."""
    rows = []
    for p in points:
        errors = sum(p.errors.values())
        row: dict[str, Any] = {
            "target": p.target,
            "load": p.load,
            "seq len": seq_label(p.seq_len, p.inputs),
            "batch": p.batch,
            "concurrency": p.concurrency,
        }
        if p.load == "open":
            row["rate/s"] = p.rate
        row |= {
            "workers": p.workers,
            "threads": p.threads,
            "requests": p.requests,
            "errors": errors,
        }
        for name in LATENCY_COLUMNS:
            row[f"{name} ms"] = num(getattr(p, f"lat_{name}"))
        row |= {
            "req/s": num(p.req_s, 1),
            "seq/s": num(p.seq_s, 1),
            "tokens/s": num(p.tokens_s, 0),
            "server compute p50 ms": num(p.server.get("compute_p50")),
        }
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Table:
    """A table as the page shows it: text cells, the columns to right-align, the settings every row shares
    (said once above it) and the sentences under it."""

    rows: list[dict[str, str]]
    numeric: list[str]
    shared: dict[str, Any]
    notes: list[str]

    def shared_text(self) -> str:
        """The shared settings in words: "closed loop, batch 1, workers 1, threads 1"."""
        return ", ".join(str(v) if k == "load" else f"{k} {v}" for k, v in self.shared.items())


def asked_seconds(run: Run) -> float | None:
    """The seconds per point the run asked for (its grid's duration), None when its settings do not say."""
    grid = run.settings.get("grid") if isinstance(run.settings, Mapping) else None
    value = grid.get("duration_s") if isinstance(grid, Mapping) else None
    return float(value) if isinstance(value, int | float) and value > 0 else None


def cut_short(points: Sequence[Point], asked_s: float | None, cancelled: bool) -> Point | None:
    """The point a cancel stopped before its seconds were up, if any: the bench keeps what that point measured
    (its last point), so a cancelled run's last point measured for clearly less than asked is partial."""
    if not cancelled or not points or not asked_s:
        return None
    last = max(points, key=lambda p: p.idx)
    asked = min(asked_s, MODEL_ONLY_MAX_S) if last.target == "model-only" else asked_s
    return last if last.duration_s < CUT_SHORT * asked else None


def unanswered(p: Point) -> bool:
    """A point whose every request failed (a server that died: thousands of connect errors): no measurement."""
    return p.ok == 0 and sum(p.errors.values()) > 0


def complete(points: Sequence[Point], cut: Point | None) -> list[Point]:
    """The points measured in full: the headline and the charts leave out a point a cancel cut short, and one
    no request of which was answered (else charted as a real 0 req/s)."""
    return [p for p in points if p != cut and not unanswered(p)]


def unanswered_note(points: Sequence[Point]) -> str:
    """The sentence under a table with points that got no answer."""
    said = "; ".join(
        f"point {p.idx} ({point_words(p)}): "
        + ", ".join(f"{n:,} {ERROR_WORDS.get(k, f'answered {k}')}" for k, n in sorted(p.errors.items()))
        for p in points
    )
    return f'No answer at {said}. Marked "no answer" and left out of the headline and the charts.'


def cut_note(cut: Point, asked_s: float | None) -> str:
    """The sentence under a table with a point cut short."""
    asked = f" of {figure(asked_s)}" if asked_s else ""
    return (
        f"Point {cut.idx} ({point_words(cut)}) was cancelled after {figure(cut.duration_s)}{asked} s: its figures "
        'are partial, it is marked "cancelled" and left out of the headline and the charts.'
    )


def point_words(p: Point) -> str:
    """ "hare, 8 tokens, batch 1, 4 clients" ("streams" for the model alone)."""
    who = "stream" if p.target == "model-only" else "client"
    users = f"{p.concurrency} {who}{'s' if p.concurrency != 1 else ''}"
    return f"{p.target}, {seq_label(p.seq_len, p.inputs)} tokens, batch {p.batch}, {users}"


def point_table(points: Sequence[Point], cut: Point | None = None, asked_s: float | None = None) -> Table:
    """The measured points as the Results tab shows them: one column per figure a reader compares, settings
    every point shares said once, columns with nothing in them left out, percentiles of too few answers
    marked "~" with a sentence saying which, and a point a cancel cut short marked as such."""
    raw: list[dict[str, Any]] = []
    for p in points:
        target = f"{p.target} (cancelled)" if p == cut else f"{p.target} (no answer)" if unanswered(p) else p.target
        row: dict[str, Any] = {"target": target, "seq len": seq_label(p.seq_len, p.inputs)}
        row |= {k: getattr(p, k) for k in SETTING_COLUMNS}
        row["concurrency"] = p.concurrency
        if p.load == "open":
            row["rate/s"] = p.rate
        row |= {"answers": p.ok, "errors": sum(p.errors.values())}
        for name in LATENCY_COLUMNS:
            row[name] = num(getattr(p, f"lat_{name}"))
        row |= {
            "req/s": num(p.req_s, 1),
            "seq/s": num(p.seq_s, 1),
            "tokens/s": num(p.tokens_s, 0),
            "server p50": num(p.server.get("compute_p50")),
        }
        raw.append(row)
    shared = constant_settings(raw, SETTING_COLUMNS)
    loads = {p.load for p in points if p.target != "model-only"}
    if len(loads) == 1:
        shared = {"load": f"{loads.pop()} loop", **shared}
    drop = set(shared)
    if all(not r["errors"] for r in raw):
        drop.add("errors")
    if all(r["seq/s"] == r["req/s"] for r in raw):
        drop.add("seq/s")  # one sequence per request
    if all(r["server p50"] is None for r in raw):
        drop.add("server p50")
    kept = [{k: v for k, v in r.items() if k not in drop} for r in raw]
    numeric = numeric_columns(kept)
    rows = []
    marked = []
    for p, r in zip(points, kept, strict=True):
        text = {k: cell(v) for k, v in r.items()}
        for name in PERCENTILES:
            text[name] = latency_text(r[name], name, p.ok)
        if any(text[q].startswith(APPROXIMATE) for q in PERCENTILES):
            marked.append(p)
        rows.append(text)
    notes = [cut_note(cut, asked_s)] if cut is not None else []
    dead = [p for p in points if unanswered(p)]
    if dead:
        notes.append(unanswered_note(dead))
    if marked:
        notes.append(approximate_note(marked))
    if any(p.target == "model-only" for p in points):
        notes.append(MODEL_ONLY + ".")
    return Table(rows, numeric, shared, notes)


def approximate_note(points: Sequence[Point]) -> str:
    """Which points have percentiles marked "~", and why."""
    few = ", ".join(
        f"{p.target} at {seq_label(p.seq_len, p.inputs)} tokens and {p.concurrency} "
        f"user{'s' if p.concurrency != 1 else ''} ({p.ok:,})"
        for p in points[:4]
    )
    more = f" and {len(points) - 4} more" if len(points) > 4 else ""
    return (
        f"{APPROXIMATE} marks a percentile from fewer answers than it needs (p90: 10, p95: 20, p99: 100), so it "
        f"is about the slowest answer rather than a percentile. Answers of those points: {few}{more}."
    )


def drop_constant(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    """The rows without those of `columns` that hold one value throughout (shown once above the table instead)."""
    constant = {c for c in columns if len({r.get(c) for r in rows}) <= 1}
    return [{k: v for k, v in r.items() if k not in constant} for r in rows]


def constant_settings(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, Any]:
    """The settings of `columns` that every row shares: `{"load": "closed", "workers": 1}`."""
    return {c: rows[0].get(c) for c in columns if rows and c in rows[0] and len({r.get(c) for r in rows}) == 1}


def values(points: Iterable[Point], field: str) -> list[Any]:
    """The distinct values of one setting across points, sorted (the choices of a chart filter)."""
    return sorted({getattr(p, field) for p in points if p.load != "in-process"})


@dataclass(frozen=True)
class Headline:
    """The figures a reader looks for first: latency percentiles of the lightest hare point (fewest users,
    shortest input, smallest batch) and the highest throughput of any hare point."""

    point: Point
    p50: float
    p95: float
    p99: float
    peak_req_s: float
    peak_at: Point

    def latency(self, percentile: str) -> str:
        """ "4.21 ms", or "~7.62 ms" when the point has too few answers for that percentile."""
        return latency_text(getattr(self, percentile), percentile, self.point.ok) + " ms"


def headline(points: Sequence[Point]) -> Headline | None:
    """None when the run has no hare point measured over HTTP."""
    served = [p for p in points if p.target == "hare" and p.load != "in-process" and p.ok > 0]
    if not served:
        return None
    light = min(served, key=lambda p: (p.concurrency, p.rate, p.seq_len, p.batch))
    peak = max(served, key=lambda p: p.req_s)
    return Headline(light, light.lat_p50, light.lat_p95, light.lat_p99, peak.req_s, peak)


def error_summary(points: Iterable[Point]) -> dict[str, int]:
    """Failed requests by HTTP status (or connect/timeout), summed over the run's points."""
    out: dict[str, int] = {}
    for p in points:
        for status, count in p.errors.items():
            out[status] = out.get(status, 0) + int(count)
    return out


def to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows -> CSV text with a header of every column seen, in first-seen order (the bench's own writer)."""
    return rows_to_csv([dict(r) for r in rows])


def latency_rows(points: Iterable[Point]) -> list[dict[str, Any]]:
    """Long-form (target, seq len, batch, concurrency, percentile, ms) rows for a latency-vs-length chart."""
    return [
        {
            "target": p.target,
            "seq len": p.seq_len,
            "batch": p.batch,
            "concurrency": p.concurrency,
            "percentile": q,
            "ms": num(getattr(p, f"lat_{q}")),
            "answers": p.ok,
        }
        for p in points
        if p.load != "in-process"
        for q in PERCENTILES
    ]


def throughput_rows(points: Iterable[Point]) -> list[dict[str, Any]]:
    """(target, seq len, batch, concurrency, req/s, seq/s) rows for a throughput-vs-concurrency chart."""
    return [
        {
            "target": p.target,
            "seq len": p.seq_len,
            "batch": p.batch,
            "concurrency": p.concurrency,
            "req/s": num(p.req_s, 1),
            "seq/s": num(p.seq_s, 1),
        }
        for p in points
        if p.load == "closed"
    ]


def ratio_rows(ratios: Iterable[Ratio]) -> list[dict[str, Any]]:
    """hare against each baseline at the same settings: throughput and p50 speed-ups (above 1: hare wins)."""
    return [
        {
            "baseline": r.baseline,
            "seq len": seq_label(r.key["seq_len"], r.key.get("inputs", "exact")),
            "batch": r.key.get("batch"),
            "concurrency": r.key.get("concurrency"),
            "hare req/s": num(r.hare_req_s, 1),
            "baseline req/s": num(r.baseline_req_s, 1),
            "throughput ×": num(r.req_s_ratio),
            "p50 speed-up ×": num(r.p50_ratio),
        }
        for r in ratios
    ]
