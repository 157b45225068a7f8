"""The Benchmarks page's logic: bench store rows and `--progress jsonl` events turned into tables and chart data.

Reads `bench.store` types only; nothing here starts a process or touches Streamlit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.report import rows_to_csv
from bench.store import Comparison, Point, Ratio, Run

PERCENTILES = ("p50", "p90", "p95", "p99")
LATENCY_COLUMNS = ("min", "avg", "p50", "p90", "p95", "p99", "max")


def _num(x: float | None, digits: int = 2) -> float | None:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return round(float(x), digits)


def point_rows(points: Iterable[Point]) -> list[dict[str, Any]]:
    """One row per measured point: settings, latency min/avg/p50/p90/p95/p99/max (ms) and throughput."""
    rows = []
    for p in points:
        errors = sum(p.errors.values())
        row: dict[str, Any] = {
            "target": p.target,
            "load": p.load,
            "seq len": p.seq_len,
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
            row[f"{name} ms"] = _num(getattr(p, f"lat_{name}"))
        row |= {
            "req/s": _num(p.req_s, 1),
            "seq/s": _num(p.seq_s, 1),
            "tokens/s": _num(p.tokens_s, 0),
            "server compute p50 ms": _num(p.server.get("compute_p50")),
        }
        rows.append(row)
    return rows


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
            "ms": _num(getattr(p, f"lat_{q}")),
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
            "req/s": _num(p.req_s, 1),
            "seq/s": _num(p.seq_s, 1),
        }
        for p in points
        if p.load == "closed"
    ]


def ratio_rows(ratios: Iterable[Ratio]) -> list[dict[str, Any]]:
    """hare against each baseline at the same settings: throughput and p50 speed-ups (above 1: hare wins)."""
    return [
        {
            "baseline": r.baseline,
            "seq len": r.key.get("seq_len"),
            "batch": r.key.get("batch"),
            "concurrency": r.key.get("concurrency"),
            "hare req/s": _num(r.hare_req_s, 1),
            "baseline req/s": _num(r.baseline_req_s, 1),
            "throughput ×": _num(r.req_s_ratio),
            "p50 speed-up ×": _num(r.p50_ratio),
        }
        for r in ratios
    ]


def run_rows(runs: Iterable[Run]) -> list[dict[str, Any]]:
    """The run history table, newest first as the store returns it."""
    return [
        {
            "id": r.id,
            "created": r.created_at,
            "status": r.status,
            "kind": r.kind,
            "name": r.name,
            "task": r.task,
            "target": r.target,
            "cpu": str(r.machine.get("cpu", "")),
            "message": r.message,
        }
        for r in runs
    ]


def run_label(run: Run) -> str:
    """How a run is named in pickers: `#7 done · text-classification · 2025-01-01T10:00`."""
    parts = [f"#{run.id}", run.status, run.task or run.kind, run.created_at[:16]]
    if run.name:
        parts.insert(1, run.name)
    return " · ".join(p for p in parts if p)


def comparison_rows(comparisons: Iterable[Comparison]) -> list[dict[str, Any]]:
    """Two runs side by side at matching settings; ratios are b over a (throughput up, p50 down is better)."""
    rows = []
    for c in comparisons:
        a, b = c.a, c.b
        rows.append(
            {
                "target": c.target,
                "seq len": c.key.get("seq_len"),
                "batch": c.key.get("batch"),
                "concurrency": c.key.get("concurrency"),
                "A req/s": _num(a.req_s, 1) if a else None,
                "B req/s": _num(b.req_s, 1) if b else None,
                "B/A req/s": _num(c.req_s_ratio),
                "A p50 ms": _num(a.lat_p50) if a else None,
                "B p50 ms": _num(b.lat_p50) if b else None,
                "A p99 ms": _num(a.lat_p99) if a else None,
                "B p99 ms": _num(b.lat_p99) if b else None,
                "B/A p50": _num(c.p50_ratio),
            }
        )
    return rows


@dataclass
class Progress:
    """Everything a running (or finished) `hare bench run --progress jsonl` has said so far."""

    run_id: int | None = None
    planned: int = 0
    done_points: int = 0
    current: dict[str, Any] = field(default_factory=dict)  # the point being measured: target and settings
    tick: dict[str, Any] = field(default_factory=dict)  # its latest tick
    points: list[dict[str, Any]] = field(default_factory=list)  # finished points, as stored
    servers: dict[str, str] = field(default_factory=dict)  # target -> starting/ready/stopped
    log: list[str] = field(default_factory=list)
    status: str | None = None  # done/failed/cancelled once the final line came
    message: str = ""

    @property
    def fraction(self) -> float:
        """Share of the planned points measured, counting the current one's elapsed time."""
        if self.planned <= 0:
            return 0.0
        partial = 0.0
        if self.tick and self.status is None:
            duration = float(self.tick.get("duration_s") or 0)
            if duration > 0:
                partial = min(float(self.tick.get("elapsed_s") or 0) / duration, 1.0)
        return min((self.done_points + partial) / self.planned, 1.0)

    def describe(self) -> str:
        """One line for the progress bar."""
        if self.status is not None:
            return f"run #{self.run_id} {self.status}" + (f": {self.message}" if self.message else "")
        if not self.current:
            starting = [t for t, s in self.servers.items() if s == "starting"]
            return f"starting {', '.join(starting)}…" if starting else "starting…"
        s = self.current.get("settings", {})
        where = f"point {self.current.get('k', '?')}/{self.planned}: {self.current.get('target', '')}"
        what = ", ".join(f"{k}={s[k]}" for k in ("seq_len", "batch", "concurrency") if k in s)
        line = f"{where} ({what})" if what else where
        if self.tick:
            t = self.tick
            line += (
                f" · {t.get('req_s', 0):.1f} req/s · p50 {t.get('p50_ms', 0):.1f} ms · p99 {t.get('p99_ms', 0):.1f} ms"
            )
        return line


def apply_event(progress: Progress, event: Mapping[str, Any]) -> Progress:
    """Fold one progress line into the state (unknown events are kept in the log)."""
    kind = event.get("event")
    if kind == "start":
        progress.run_id = event.get("run_id")
        progress.planned = int(event.get("n") or 0)
    elif kind == "server":
        progress.servers[str(event.get("target"))] = str(event.get("state"))
    elif kind == "point_start":
        progress.current = {k: event.get(k) for k in ("k", "target", "settings")}
        progress.planned = int(event.get("n") or progress.planned)
        progress.tick = {}
    elif kind == "tick":
        progress.tick = dict(event)
    elif kind == "point":
        point = event.get("point")
        if isinstance(point, Mapping):
            progress.points.append(dict(point))
        progress.done_points = int(event.get("k") or progress.done_points + 1)
        progress.tick = {}
    elif kind == "done":
        progress.run_id = event.get("run_id", progress.run_id)
        progress.status = str(event.get("status") or "done")
        progress.message = str(event.get("message") or "")
        progress.current, progress.tick = {}, {}
    elif kind == "log":
        progress.log.append(str(event.get("message", "")))
    else:
        progress.log.append(json.dumps(event))
    return progress


def progress_from_lines(lines: Iterable[str]) -> Progress:
    """Fold JSON lines into a Progress; a line that is not JSON is kept as a log message."""
    progress = Progress()
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            progress.log.append(line)
            continue
        if isinstance(event, Mapping):
            apply_event(progress, event)
        else:
            progress.log.append(line)
    return progress


def live_point_rows(progress: Progress) -> list[Point]:
    """The finished points of a running bench as store Points (fields the store does not know are dropped)."""
    known = set(Point.__dataclass_fields__)
    out = []
    for p in progress.points:
        try:
            out.append(Point(**{k: v for k, v in p.items() if k in known}))
        except TypeError:
            continue  # a point from a newer bench with fields missing here: shown after the run from the store
    return out
