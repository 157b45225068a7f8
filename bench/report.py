"""Exports (CSV, JSON) and reports (Markdown with PNG plots beside it, or one self-contained HTML file).

Plots: client latency percentiles against sequence length, throughput against batch size and against
concurrency, and hare against each baseline. matplotlib (the `bench` extra) is imported only here.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.store import Point, Ratio, Run, Store
from bench.tables import POINT_COLUMNS, RATIO_COLUMNS, fmt, md_table, point_row, ratio_row
from container.machine import machine_line
from tasks.errors import InputError

COLORS = {"hare": "#d9480f", "vanilla": "#495057", "comet": "#1c7ed6", "model-only": "#2b8a3e"}


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    return value


def flat_point(p: Point) -> dict[str, Any]:
    """One CSV row: settings, figures, errors and the server's figures flattened."""
    row = {k: v for k, v in p.to_dict().items() if k not in ("errors", "server", "extra")}
    row["errors"] = sum(p.errors.values())
    row |= {f"errors_{k}": v for k, v in p.errors.items()}
    row |= {f"server_{k}": v for k, v in p.server.items()}
    return row


def export_csv(store: Store, run_id: int) -> str:
    return rows_to_csv([flat_point(p) for p in store.points(run_id)])


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Rows -> CSV text with a header of every column seen, in first-seen order (None as empty)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if r.get(k) is None else r.get(k) for k in columns})
    return buf.getvalue()


def export_json(store: Store, run_id: int) -> str:
    run = store.run(run_id)
    data = {
        "run": _clean(run.__dict__),
        "points": [_clean(p.to_dict()) for p in store.points(run_id)],
        "ratios": [r.__dict__ for r in store.ratios(run_id)],
    }
    return json.dumps(data, indent=2, default=str) + "\n"


# -- plots ---------------------------------------------------------------------------------------------------

Plot = tuple[str, bytes]  # (title, PNG)


def plots(points: Sequence[Point], ratios: Sequence[Ratio]) -> list[Plot]:
    """Every plot the run's points support (a plot needs two or more x values, or a baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    out: list[Plot] = []
    # A point none of whose requests was answered has no latency (NaN) and no rate (0) to draw, on log axes
    # that refuse them (a run whose every request failed died in matplotlib): its row in the table says so.
    points = [p for p in points if p.ok > 0]
    http = [p for p in points if p.load != "in-process"]
    for make in (_latency_vs_seq, _throughput_vs_batch, _throughput_vs_concurrency, _hare_vs_baseline):
        plot = make(http if make is not _hare_vs_baseline else list(points), ratios)
        if plot is not None:
            out.append(plot)
    return out


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _series(points: Sequence[Point], x: Callable[[Point], float], fixed: Callable[[Point], Any]) -> dict[Any, Any]:
    """{(target, fixed settings): [(x, point)]} sorted by x."""
    groups: dict[Any, list[tuple[float, Point]]] = defaultdict(list)
    for p in points:
        groups[(p.target, fixed(p))].append((x(p), p))
    return {k: sorted(v, key=lambda t: t[0]) for k, v in groups.items()}


def _plain_ticks(ax: Any, xs: list[float]) -> None:
    """Log axes, labelled with the measured values rather than powers of two and ten."""
    from matplotlib.ticker import ScalarFormatter

    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.xaxis.set_minor_formatter("")
    ax.yaxis.set_major_formatter(ScalarFormatter())


def _latency_vs_seq(points: Sequence[Point], _: Sequence[Ratio]) -> Plot | None:
    import matplotlib.pyplot as plt

    series = _series(points, lambda p: p.seq_len, lambda p: (p.batch, p.concurrency, p.rate, p.workers))
    series = {k: v for k, v in series.items() if len(v) > 1}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    styles = {"p50": "-", "p90": "--", "p99": ":"}
    for (target, (batch, conc, rate, workers)), items in series.items():
        xs = [x for x, _ in items]
        for q, style in styles.items():
            label = f"{target} {q} (batch {batch}, {f'{rate:g}/s' if rate else f'{conc} users'}, {workers} w)"
            ax.plot(xs, [getattr(p, f"lat_{q}") for _, p in items], style, marker="o", ms=3, label=label,
                    color=COLORS.get(target))  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    _plain_ticks(ax, sorted({x for items in series.values() for x, _ in items}))
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("client latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return "Latency percentiles against sequence length", _png(fig)


def _throughput_vs(points: Sequence[Point], attr: str, fixed: Callable[[Point], Any], title: str) -> Plot | None:
    import matplotlib.pyplot as plt

    series = {k: v for k, v in _series(points, lambda p: getattr(p, attr), fixed).items() if len(v) > 1}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for (target, key), items in series.items():
        ax.plot([x for x, _ in items], [p.seq_s for _, p in items], marker="o", label=f"{target} {key}",
                color=COLORS.get(target))  # fmt: skip
    ax.set_xscale("log", base=2)
    _plain_ticks(ax, sorted({x for items in series.values() for x, _ in items}))
    ax.set_xlabel(attr)
    ax.set_ylabel("sequences per second")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return title, _png(fig)


def _throughput_vs_batch(points: Sequence[Point], _: Sequence[Ratio]) -> Plot | None:
    return _throughput_vs(
        points,
        "batch",
        lambda p: f"seq {p.seq_len}, {p.concurrency} users, {p.workers} w",
        "Throughput against batch size",
    )


def _throughput_vs_concurrency(points: Sequence[Point], _: Sequence[Ratio]) -> Plot | None:
    closed = [p for p in points if p.load == "closed"]
    return _throughput_vs(
        closed,
        "concurrency",
        lambda p: f"seq {p.seq_len}, batch {p.batch}, {p.workers} w",
        "Throughput against concurrency",
    )


def _hare_vs_baseline(points: Sequence[Point], ratios: Sequence[Ratio]) -> Plot | None:
    import matplotlib.pyplot as plt

    targets = [t for t in COLORS if any(p.target == t for p in points)]
    if len(targets) < 2:
        return None
    lengths = sorted({p.seq_len for p in points})
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    width = 0.8 / len(targets)
    for i, target in enumerate(targets):
        best = {s: max((p.req_s for p in points if p.target == target and p.seq_len == s), default=0.0)
                for s in lengths}  # fmt: skip
        xs = [j + i * width for j in range(len(lengths))]
        ax.bar(xs, [best[s] for s in lengths], width, label=target, color=COLORS[target])
    ax.set_xticks([j + width * (len(targets) - 1) / 2 for j in range(len(lengths))], [str(s) for s in lengths])
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("requests per second (best point)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return "hare against the baselines (model-only: one in-process stream)", _png(fig)


# -- documents -----------------------------------------------------------------------------------------------


def _point_rows(points: Sequence[Point]) -> tuple[list[str], list[list[str]]]:
    return list(POINT_COLUMNS), [point_row(p) for p in points]


def _ratio_rows(ratios: Sequence[Ratio]) -> tuple[list[str], list[list[str]]]:
    return list(RATIO_COLUMNS), [ratio_row(r) for r in ratios]


def _goal_rows(goals: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    head = ["goal", "figure", "target", "met", "gap"]
    rows = [
        [g["goal"], fmt(g.get("value"), 2), g["target"], "yes" if g.get("met") else "NO", g.get("gap", "")]
        for g in goals
    ]
    return head, rows


def _rich_rows(table: Any) -> tuple[list[str], list[list[str]]]:
    """A rich Table's header and cells as plain text (its markup dropped)."""
    from rich.text import Text

    def plain(x: Any) -> str:
        return x.plain if isinstance(x, Text) else Text.from_markup(str(x)).plain

    head = [plain(c.header) for c in table.columns]
    return head, [list(r) for r in zip(*([plain(x) for x in c.cells] for c in table.columns), strict=True)]


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def _header(run: Run) -> list[tuple[str, str]]:
    m = run.machine
    return [
        ("run", f"{run.id} ({run.kind}, {run.status}) {run.name}".strip()),
        ("when", f"{run.created_at} to {run.finished_at or '-'}"),
        ("task", run.task),
        ("measured", run.target),
        ("machine", machine_line(m)),
        ("versions", ", ".join(f"{k} {v}" for k, v in run.versions.items())),
        ("bundle manifest sha256", run.manifest_hash or "-"),
        ("message", run.message or "-"),
    ]  # fmt: skip


def write_report(store: Store, run_id: int, out: Path, fmt: str) -> Path:
    """Write `out` (.md with a folder of PNGs beside it, or a self-contained .html)."""
    if fmt not in ("md", "html"):
        raise InputError(f"report format {fmt!r}: choose md or html")
    run, points, ratios = store.run(run_id), store.points(run_id), store.ratios(run_id)
    figures = plots(points, ratios)
    goals = run.summary.get("goals") or []
    sections: list[tuple[str, tuple[list[str], list[list[str]]]]] = []
    if goals:
        sections.append(("Goals", _goal_rows(goals)))
    sections.append(("Points", _point_rows(points)))
    if ratios:
        sections.append(("hare against the baselines", _ratio_rows(ratios)))
    title = f"hare bench: run {run.id}"
    notes = (
        "Latencies are client side, in milliseconds, over HTTP on loopback; the load generator shares the machine "
        "with the server (its CPU use is the client cpu column, in cores). model-only is the bundle's ONNX session "
        "called in process on pre-tokenized inputs, one stream."
    )
    if run.kind == "bulk":  # no points: its figures are in its summary (bench/bulk_tables.py)
        from bench.bulk_tables import bulk_tables
        from bench.bulk_tables import notes as bulk_notes

        sections = [(str(t.title), _rich_rows(t)) for t in bulk_tables(run.summary, run.settings)]
        notes = "; ".join(bulk_notes(run.summary, run.settings)) + "."
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "md":
        assets = out.with_name(out.stem + "-files")
        assets.mkdir(exist_ok=True)
        parts = [f"# {title}", "", *(f"- **{k}**: {v}" for k, v in _header(run)), "", notes, ""]
        for name, (head, rows) in sections:
            parts += [f"## {name}", "", md_table(head, rows), ""]
        if figures:
            parts += ["## Plots", ""]
        for i, (caption, png) in enumerate(figures, 1):
            (assets / f"plot-{i}.png").write_bytes(png)
            parts += [f"![{caption}]({assets.name}/plot-{i}.png)", "", f"*{caption}*", ""]
        out.write_text("\n".join(parts))
        return out
    body = [f"<h1>{html.escape(title)}</h1><dl>"]
    body += [f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in _header(run)]
    body += ["</dl>", f"<p>{html.escape(notes)}</p>"]
    for name, (head, rows) in sections:
        body += [f"<h2>{html.escape(name)}</h2>", _html_table(head, rows)]
    if figures:
        body.append("<h2>Plots</h2>")
    for caption, png in figures:
        data = base64.b64encode(png).decode()
        body.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(caption)}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>")  # fmt: skip
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;"
        "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}td:first-child,"
        "th:first-child{text-align:left}dt{font-weight:bold}figure{margin:1em 0}"
    )
    out.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )
    return out
