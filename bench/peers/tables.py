"""The tables of a peers run, from its stored summary: `hare bench peers` and `hare bench show` print them,
and the results page (bench/page.py) renders them as Markdown. Light on purpose: no runtime is imported."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from bench.peers.results import GOAL_P1, Row
from bench.tables import fmt, wide_console


def peers_table(rows: Sequence[Row], threads: Sequence[int], batch: int, seq_len: int) -> Table:
    table = Table(title=f"hare against its peers: {seq_len}-token texts, in process (hare-http: over loopback)")
    table.add_column("candidate")
    for t in threads:
        table.add_column(f"{t} thread{'s' if t > 1 else ''} p50 ms", justify="right")
    for t in threads:
        table.add_column(f"sentences/s, batch {batch}, {t} thread{'s' if t > 1 else ''}", justify="right")
    table.add_column("cosine p1 to torch", justify="right")
    table.add_column("cosine mean", justify="right")
    table.add_column("skipped because", overflow="fold", max_width=48)
    for r in rows:
        if r.skipped:
            table.add_row(r.label, *(["-"] * (2 * len(threads) + 2)), escape(r.skipped))
            continue
        table.add_row(
            r.label,
            *(fmt(r.p50_ms.get(t), 1) for t in threads),
            *(fmt(r.sentences_s.get(t), 1) for t in threads),
            fmt(r.cosine_p1, 4),
            fmt(r.cosine_mean, 4),
            "",
        )
    table.caption = "p50: one text per call; cosine: the fidelity set's vectors against sentence-transformers torch"
    return table


def cpu_table(rows: Sequence[Row], threads: Sequence[int], batch: int) -> Table:
    """CPU time per call (the process's, every thread's): what each call cost, whatever share of the cores the
    machine's other load left it; on a busy machine a steadier comparison than wall time, at 1 thread above all."""
    table = Table(title="CPU time per call, p50 ms (the process's, all threads), and cores used")
    table.add_column("candidate")
    slots = [(b, t) for b in (1, batch) for t in threads]
    for b, t in slots:
        table.add_column(f"batch {b}, {t} thread{'s' if t > 1 else ''}", justify="right")
    for r in rows:
        if r.skipped:
            continue
        cells = []
        for b, t in slots:
            key = f"b{b}t{t}"
            cells.append(f"{fmt(r.cpu_ms.get(key), 1)} ({fmt(r.cores.get(key), 2)})")
        table.add_row(r.key, *cells)
    table.caption = (
        "in brackets: the process's CPU time over the slots' wall time, in cores (hare-http: the client's alone)"
    )
    return table


def goal_table(goals: Sequence[dict[str, Any]]) -> Table:
    table = Table(title=f"goal: hare at least as fast as the fastest peer with cosine p1 >= {GOAL_P1}")
    for col in ("figure", "threads", "hare", "fastest such peer", "peer", "met"):
        table.add_column(col, justify="left" if col in ("figure", "fastest such peer") else "right")
    for g in goals:
        met = "-" if g["met"] is None else ("[green]yes[/]" if g["met"] else "[red]no[/]")
        table.add_row(g["figure"], str(g["threads"]), fmt(g["hare"]), g["best_peer"] or "-", fmt(g["peer"]), met)
    return table


def peers_tables(summary: dict[str, Any], settings: dict[str, Any]) -> list[Table]:
    """The run's tables, from its stored summary and settings: the candidates, their CPU time, the goal."""
    rows = [Row.from_dict(r) for r in summary.get("peers", [])]
    threads = [int(t) for t in settings.get("threads", [1, 2])]
    batch = int(settings.get("batch", 32))
    tables = [peers_table(rows, threads, batch, int(settings.get("seq_len", 128)))]
    if any(r.cpu_ms for r in rows):
        tables.append(cpu_table(rows, threads, batch))
    if summary.get("goal"):
        tables.append(goal_table(summary["goal"]))
    return tables


def peers_notes(summary: dict[str, Any]) -> list[str]:
    """The lines under the tables: the machine's load average at the start and end, how each export was made."""
    notes = []
    start, end = summary.get("load_start"), summary.get("load_end")
    if start and end:
        notes.append(f"load average (1, 5, 15 min): {_loads(start)} at the start, {_loads(end)} at the end")
    notes += [f"{key}: {note}" for key, note in summary.get("exports", {}).items()]
    return notes


def print_peers(summary: dict[str, Any], settings: dict[str, Any]) -> None:
    """The run's table, goal and load, from its stored summary (`hare bench peers` and `hare bench show`)."""
    console = wide_console()
    for table in peers_tables(summary, settings):
        console.print(table)
    for note in peers_notes(summary):
        console.print(escape(note))


def _loads(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)
