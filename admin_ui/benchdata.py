"""The Benchmarks page's logic: bench store rows and `--progress jsonl` events turned into tables and chart data.

Reads `bench.store` types only; nothing here starts a process or touches Streamlit.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admin_ui.tables import cell, figure, numeric_columns
from bench.report import rows_to_csv
from bench.store import Comparison, Point, Ratio, Run

PERCENTILES = ("p50", "p90", "p95", "p99")
LATENCY_COLUMNS = ("min", "avg", "p50", "p90", "p95", "p99", "max")
SETTING_COLUMNS = ("batch", "workers", "threads")  # shown once above the table when every point shares them
APPROXIMATE = "~"  # marks a percentile from fewer answers than it needs
MODEL_ONLY = (
    "model-only: the bundle's model called inside the bench's own process, without HTTP or the server's "
    "batching; its concurrency is model streams side by side: 1, and at most one per core of this machine"
)


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


def point_table(points: Sequence[Point]) -> Table:
    """The measured points as the Results tab shows them: one column per figure a reader compares, settings
    every point shares said once, columns with nothing in them left out, and percentiles of too few answers
    marked "~" with a sentence saying which."""
    raw: list[dict[str, Any]] = []
    for p in points:
        row: dict[str, Any] = {"target": p.target, "seq len": p.seq_len}
        row |= {k: getattr(p, k) for k in SETTING_COLUMNS}
        row["concurrency"] = p.concurrency
        if p.load == "open":
            row["rate/s"] = p.rate
        row |= {"answers": p.ok, "errors": sum(p.errors.values())}
        for name in LATENCY_COLUMNS:
            row[name] = _num(getattr(p, f"lat_{name}"))
        row |= {
            "req/s": _num(p.req_s, 1),
            "seq/s": _num(p.seq_s, 1),
            "tokens/s": _num(p.tokens_s, 0),
            "server p50": _num(p.server.get("compute_p50")),
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
    notes = []
    if marked:
        notes.append(approximate_note(marked))
    if any(p.target == "model-only" for p in points):
        notes.append(MODEL_ONLY + ".")
    return Table(rows, numeric, shared, notes)


def approximate_note(points: Sequence[Point]) -> str:
    """Which points have percentiles marked "~", and why."""
    few = ", ".join(
        f"{p.target} at {p.seq_len} tokens and {p.concurrency} user{'s' if p.concurrency != 1 else ''} ({p.ok:,})"
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
            "ms": _num(getattr(p, f"lat_{q}")),
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


# Pixels per History column: the message is read whole, and the table fits a wide page (1400 px).
RUN_WIDTHS = {"id": 50, "created": 140, "status": 90, "message": 330, "name": 120, "target": 200}


def run_outcome(run: Run) -> str:
    """Why a failed or cancelled run ended, as the Results tab says it."""
    message = run.message or "no reason recorded"
    if message.startswith(run.status):
        return f"Run #{run.id} {message}."
    return f"Run #{run.id} {run.status}: {message}."


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

    def describe(self, plan: Plan | None = None) -> str:
        """One line for the progress bar: which point of how many, what it measures, its running figures."""
        if self.status is not None:
            return self.outcome()
        if not self.current:
            starting = [t for t, s in self.servers.items() if s == "starting"]
            return f"Starting {', '.join(starting)}…" if starting else "Starting the bench…"
        target = str(self.current.get("target", ""))
        what = point_setting(target, self.current.get("settings") or {}, plan)
        line = f"Point {self.current.get('k', '?')} of {self.planned}: {what}"
        if target == "model-only":
            return line + " · measuring"
        t = self.tick
        if not t:
            return line + " · warming up"
        answers = int(t.get("requests") or 0) - int(t.get("errors") or 0)
        if answers <= 0:
            return line + " · measuring, no answer yet"
        p50 = latency_text(float(t.get("p50_ms") or 0), "p50", answers)
        p99 = latency_text(float(t.get("p99_ms") or 0), "p99", answers)
        return line + f" · {answers:,} answers · {float(t.get('req_s') or 0):,.1f} req/s · p50 {p50} ms · p99 {p99} ms"

    def outcome(self) -> str:
        """How the run ended, in a sentence: "Run #7 done: 8 of 8 points measured"."""
        head = f"Run #{self.run_id}" if self.run_id is not None else "The run"
        measured = f"{self.done_points} of {self.planned} points measured" if self.planned else ""
        if self.status == "cancelled":
            why = f" ({self.message})" if self.message else ""
            if not self.done_points:
                return f"{head} cancelled{why} before any point was measured"
            return f"{head} cancelled{why}: {measured}, kept under Results"
        parts = [p for p in (measured, self.message) if p]
        return f"{head} {self.status}" + (": " + "; ".join(parts) if parts else "")

    def plan_note(self, plan: Plan | None) -> str:
        """What the planned points are, when the bench adds points of its own (the model alone, in process)."""
        if plan is None or self.planned <= plan.http_points or plan.http_points <= 0:
            return ""
        extra = self.planned - plan.http_points
        return (
            f"{self.planned} points: the {plan.http_points} asked for, over HTTP, then {extra} of the model alone "
            "(in process, no HTTP): 1 stream, and as many side by side as the concurrency asks, at most one "
            "per core of this machine."
        )


@dataclass(frozen=True)
class Plan:
    """What the page asked the bench for: how many points go over HTTP, and the most concurrent clients."""

    http_points: int
    max_concurrency: int


def point_setting(target: str, settings: Mapping[str, Any], plan: Plan | None = None) -> str:
    """A point's target and settings in words: "hare over HTTP, 16 tokens, batch 1, 4 concurrent clients"."""
    seq = settings.get("seq_len")
    words = [f"{seq} tokens" if isinstance(seq, int) else f"{seq} sentences" if seq else ""]
    if settings.get("batch") is not None:
        words.append(f"batch {settings['batch']}")
    n = int(settings.get("concurrency") or 0)
    if target == "model-only":
        streams = f"{n} stream{'s' if n != 1 else ''}" if n else ""
        if n and plan is not None and n < plan.max_concurrency:
            streams += f" (at most one per core; {plan.max_concurrency} clients asked)"
        return ", ".join(w for w in ["the model alone, in process (no HTTP)", *words, streams] if w)
    if settings.get("load") == "open":
        load = f"{float(settings.get('rate') or 0):g} requests/s arriving"
    else:
        load = f"{n} concurrent client{'s' if n != 1 else ''}" if n else ""
    return ", ".join(w for w in [f"{target} over HTTP", *words, load] if w)


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
