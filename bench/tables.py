"""Rich tables for the terminal: runs, a run's points, hare/baseline ratios, and two runs compared. The rows
of points and ratios are made here once (point_row, ratio_row) and read by the reports too (bench/report.py);
`markdown` turns any of these tables into Markdown for the results page (bench/page.py)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from bench.records import seq_label
from bench.store import Comparison, Point, Ratio, Run


def wide_console() -> Console:
    """stdout; when it is a pipe or a file (no terminal width), wide enough for the points table."""
    return Console(width=None if sys.stdout.isatty() else 180)


def fmt(value: Any, digits: int = 1) -> str:
    """A figure for a table: floats to `digits` places, none (or NaN) as "-", anything else as it prints."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


LATENCIES = ("min", "avg", "p50", "p90", "p95", "p99", "max")
POINT_COLUMNS = (
    *("target", "load", "w", "thr", "seq", "batch", "conc/rate", "req/s", "seq/s", "tokens/s"),
    *LATENCIES,
    *("errors", "server p50", "client cpu", "server cpu", "server ms/req"),
)
RATIO_COLUMNS = ("baseline", "seq", "batch", "conc/rate", "hare req/s", "baseline req/s", "throughput x", "p50 x")
POINTS_CAPTION = (
    "latency in ms (client side; server p50 from x-compute-time); cpu in cores; server ms/req: the server's CPU "
    "time per answer, in brackets its own (its event loops' work, the model calls left out): 1000 / that is the "
    "ceiling per core"
)
RATIOS_CAPTION = (
    "p50 x: baseline p50 / hare p50 (above 1: hare answers faster); run in rounds (--rounds): the median of the "
    "rounds' ratios, their range in brackets, beside the median rounds' req/s"
)


def _load(load: str, rate: float, concurrency: int) -> str:
    return f"{rate:g}/s" if load == "open" else str(concurrency)


def point_row(p: Point) -> list[str]:
    """One measured point, in POINT_COLUMNS' order."""
    return [
        *(p.target, p.load, str(p.workers), str(p.threads), str(seq_label(p.seq_len, p.inputs)), str(p.batch)),
        _load(p.load, p.rate, p.concurrency),
        *(fmt(p.req_s), fmt(p.seq_s), fmt(p.tokens_s, 0)),
        *(fmt(getattr(p, f"lat_{k}"), 2) for k in LATENCIES),
        ", ".join(f"{k}: {v}" for k, v in p.errors.items()) or "0",
        *(fmt(p.server.get("compute_p50"), 2), fmt(p.client_cpu, 2), fmt(p.server_cpu, 2)),
        _server_ms(p),
    ]


def server_ms_per_request(p: Point) -> float | None:
    """The server's CPU milliseconds per answer (all its processes; None where it was not measured)."""
    if p.server_cpu is None or not p.req_s:
        return None
    return p.server_cpu / p.req_s * 1000.0


def server_own_ms_per_request(p: Point) -> float | None:
    """The server's own CPU milliseconds per answer, whatever the model's size: its event loops' work less the
    model calls they ran (hare's /metrics; None where it was not measured)."""
    own = p.extra.get("own_cores")
    if own is None or not p.req_s:
        return None
    return own / p.req_s * 1000.0


def _server_ms(p: Point) -> str:
    """The server's CPU per answer, and its own in brackets where the model's share was measured."""
    own = server_own_ms_per_request(p)
    whole = fmt(server_ms_per_request(p), 3)
    return whole if own is None else f"{whole} ({own:.3f})"


def ratio_row(r: Ratio) -> list[str]:
    """hare against one baseline at one point, in RATIO_COLUMNS' order."""
    return [
        *(r.baseline, str(seq_label(r.key["seq_len"], r.key["inputs"])), str(r.key["batch"])),
        _load(r.key["load"], r.key["rate"], r.key["concurrency"]),
        *(fmt(r.hare_req_s), fmt(r.baseline_req_s), _throughput_x(r), fmt(r.p50_ratio, 2)),
    ]


def _throughput_x(r: Ratio) -> str:
    """The throughput ratio, and over several rounds the range of the rounds' ratios."""
    spread = f" ({r.low:.2f}-{r.high:.2f})" if r.low is not None and r.high is not None else ""
    return fmt(r.req_s_ratio, 2) + spread


def runs_table(runs: Sequence[Run]) -> Table:
    table = Table(title="benchmark runs")
    for col in ("id", "created", "status", "kind", "task", "target", "cpu", "message"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(
            str(r.id),
            r.created_at,
            r.status,
            r.kind,
            r.task,
            r.target,
            f"{r.machine.get('cpu', '')} ({r.machine.get('physical_cores', '?')} cores)"
            + "".join(f", {g.split(' (driver')[0]}" for g in r.machine.get("gpus", [])),
            r.message[:60],
        )
    return table


def points_table(points: Sequence[Point], title: str = "") -> Table:
    """The points in POINT_COLUMNS, after a phase column when they are a scenario's phases (`hare bench overload`)."""
    table = Table(title=title, caption=POINTS_CAPTION)
    phases = any("scenario" in p.extra for p in points)
    if phases:  # whole, however narrow the terminal: `flood` and `flood#2` must not both read `flo…`
        table.add_column("phase", no_wrap=True, min_width=max(len(str(p.extra.get("scenario", ""))) for p in points))
    for col in POINT_COLUMNS:
        table.add_column(col, justify="left" if col in ("target", "load") else "right")
    for p in points:
        table.add_row(*([str(p.extra.get("scenario", ""))] if phases else []), *point_row(p))
    return table


def ratios_table(ratios: Sequence[Ratio]) -> Table:
    table = Table(title="hare / baseline at the same settings", caption=RATIOS_CAPTION)
    for col in RATIO_COLUMNS:
        table.add_column(col, justify="left" if col == "baseline" else "right")
    for r in ratios:
        table.add_row(*ratio_row(r))
    return table


def compare_table(rows: Sequence[Comparison], a: int, b: int) -> Table:
    table = Table(title=f"run {b} against run {a}")
    for col in ("target", "seq", "batch", "conc", "workers", f"{a} req/s", f"{b} req/s", "req/s x"):
        table.add_column(col, justify="left" if col == "target" else "right")
    for col in (f"{a} p50", f"{b} p50", "p50 x", f"{a} p99", f"{b} p99"):
        table.add_column(col, justify="right")
    for c in rows:
        table.add_row(
            c.target,
            str(seq_label(c.key["seq_len"], c.key["inputs"])),
            str(c.key["batch"]),
            f"{c.key['rate']:g}/s" if c.key["load"] == "open" else str(c.key["concurrency"]),
            str(c.key["workers"]),
            fmt(c.a.req_s if c.a else None),
            fmt(c.b.req_s if c.b else None),
            fmt(c.req_s_ratio, 2),
            fmt(c.a.lat_p50 if c.a else None, 2),
            fmt(c.b.lat_p50 if c.b else None, 2),
            fmt(c.p50_ratio, 2),
            fmt(c.a.lat_p99 if c.a else None, 2),
            fmt(c.b.lat_p99 if c.b else None, 2),
        )
    return table


def md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table; a `|` in a cell is escaped, a line break folded."""

    def cell(text: str) -> str:
        return " ".join(text.split("\n")).replace("|", "\\|")

    lines = ["| " + " | ".join(map(cell, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in rows]
    return "\n".join(lines)


def markdown(table: Table) -> str:
    """One of these tables as Markdown, the rows as the terminal shows them (rich markup dropped): its title
    in bold above, its caption in italics below."""
    head = [_plain(c.header) for c in table.columns]
    rows = [list(r) for r in zip(*([_plain(x) for x in c.cells] for c in table.columns), strict=True)]
    parts = [f"**{_plain(table.title)}**", ""] if table.title else []
    parts.append(md_table(head, rows))
    if table.caption:
        parts += ["", f"*{_plain(table.caption)}*"]
    return "\n".join(parts)


def _plain(value: Any) -> str:
    if isinstance(value, Text):
        return value.plain
    if isinstance(value, str):
        return Text.from_markup(value).plain
    return str(value)
