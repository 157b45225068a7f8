"""The dated results page: every run in the result store as Markdown, grouped by kind, newest first, each with
its date, machine, versions and settings and the tables `hare bench show` prints (`hare bench report`).

The figures of the docs come from here: the pages say what is measured and how, and point at this page for
the numbers, so history stays in the store (queryable) instead of growing prose. The page depends on the
store only (no clock, no paths of this machine), so the same store renders the same page.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from rich.table import Table

from bench.store import Run, Store
from bench.tables import markdown, points_table, ratios_table
from container.machine import machine_line

# kind -> the command that makes such runs, and what they measure; the page's sections go in this order.
KINDS: dict[str, tuple[str, str]] = {
    "headline": (
        "hare bench headline",
        "The scenario hare is judged by: DistilBERT-base classification against the vanilla baseline, then "
        "all-MiniLM-L6-v2 embeddings, over HTTP, each goal met or not.",
    ),
    "run": (
        "hare bench run",
        "A grid of points over HTTP, with the baselines and the in-process model-only figure in the same run.",
    ),
    "overload": (
        "hare bench overload",
        "One `hare serve` at and past its capacity, each phase a point, each goal of issues 12 and 19 met or "
        "MISS (docs/overload.md).",
    ),
    "peers": (
        "hare bench peers",
        "In process: hare's bundle against sentence-transformers (torch, ONNX, OpenVINO, int8) and fastembed "
        "on the same texts, with each one's cosine to torch.",
    ),
    "bulk": (
        "hare bench bulk",
        "`hare run` over a corpus of 10-300-token texts against the bundle's own model-only rate and the peers' "
        "encode/embed at batch 32 on the same texts, each with its cosine to torch, and issue 49's goals.",
    ),
    "quick": ("hare bench run --quick", "Two short points: a smoke test, not a measurement."),
}
OLD_OVERLOAD = (
    "This run was stored before overload runs kept the one-thread model figure and the RSS: the goals on them "
    "are left out."
)
SHOWN = ("done",)  # the statuses the page shows unless asked for every run


def render(store: Store, kind: str | None = None, since: datetime | None = None, every: bool = False) -> str:
    """The page for the store's runs: done ones (`every`: failed, cancelled and running too), of `kind` only if
    given, created at or after `since` (UTC when it names no zone) if given."""
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    runs = [
        r
        for r in store.runs()
        if (every or r.status in SHOWN) and (kind is None or r.kind == kind) and (since is None or utc(r) >= since)
    ]
    runs.sort(key=lambda r: (utc(r), r.id), reverse=True)
    kinds = [k for k in KINDS if any(r.kind == k for r in runs)]
    kinds += sorted({r.kind for r in runs} - set(kinds))
    parts = ["# hare benchmark results", "", _preamble(runs, kind, since, every), ""]
    if not runs:
        return "\n".join([*parts, "No runs match.", ""])
    parts += ["Kinds: " + ", ".join(f"{k} ({sum(r.kind == k for r in runs)})" for k in kinds), ""]
    for k in kinds:
        command, what = KINDS.get(k, (f"hare bench ({k})", ""))
        parts += [f"## {k}: `{command}`", ""] + ([what, ""] if what else [])
        for run in (r for r in runs if r.kind == k):
            parts += [*run_section(store, run), ""]
    return "\n".join(parts)


def utc(run: Run) -> datetime:
    """When the run started, in UTC (the store keeps local time with its offset)."""
    return datetime.strptime(run.created_at, "%Y-%m-%dT%H:%M:%S%z").astimezone(UTC)


def _when(stamp: str | None, fmt: str = "%Y-%m-%d %H:%M UTC") -> str:
    if not stamp:
        return "-"
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S%z").astimezone(UTC).strftime(fmt)


def _preamble(runs: Sequence[Run], kind: str | None, since: datetime | None, every: bool) -> str:
    chosen = f"{len(runs)} {'runs' if every else 'done runs'}" + (f" of kind {kind}" if kind else "")
    chosen += f" since {since:%Y-%m-%d %H:%M} UTC" if since else ""
    if runs:
        first, last = f"{utc(runs[-1]):%Y-%m-%d}", f"{utc(runs[0]):%Y-%m-%d}"
        chosen += f", {first}" + (f" to {last}" if last != first else "")
    return (
        f"Rendered by `hare bench report` from the bench result store ({chosen}); re-render it rather than edit "
        'it (docs/benchmarks.md, "The result store"). Dates in UTC; latencies in ms, client side unless a table '
        "says otherwise; CPU in cores."
    )


def run_section(store: Store, run: Run) -> list[str]:
    """One run: a heading with its date, what, where and how it measured, then its tables."""
    heading = f"### Run {run.id}, {utc(run):%Y-%m-%d %H:%M} UTC" + (f": {run.name}" if run.name else "")
    lines = [heading, "", *(f"- **{k}**: {v}" for k, v in _facts(run)), ""]
    for table in tables(store, run):
        lines += [markdown(table), ""]
    goals = overload_goals(store, run)
    if goals:
        lines += ["Goals, judged again from the stored run:", "", *(f"- {g}" for g in goals), ""]
        if "model_p50_ms" not in run.summary:
            lines += [OLD_OVERLOAD, ""]
    lines += [f"- {note}" for note in notes(run)]
    while lines and lines[-1] == "":
        lines.pop()
    return lines


def _facts(run: Run) -> list[tuple[str, str]]:
    m = run.machine
    machine = machine_line(m) + (f", {m['platform']}" if m.get("platform") else "")
    same_day = (run.finished_at or "")[:10] == run.created_at[:10]
    end = _when(run.finished_at, "%H:%M:%S UTC" if same_day else "%Y-%m-%d %H:%M:%S UTC")
    status = f"{run.status}, {_when(run.created_at, '%H:%M:%S UTC')} to {end}"
    facts = [
        ("command", f"`{KINDS.get(run.kind, (f'hare bench ({run.kind})', ''))[0]}`"),
        ("status", status + (f" ({run.message})" if run.message else "")),
        ("measured", f"{run.task or '-'}, {run.target or '-'}"),
        ("bundle manifest sha256", f"`{run.manifest_hash}`" if run.manifest_hash else "-"),
        ("machine", machine),
        ("versions", ", ".join(f"{k} {v}" for k, v in run.versions.items()) or "-"),
        ("settings", ", ".join(f"`{s}`" for s in _settings(run.settings)) or "-"),
    ]
    if "headline_run" in run.summary:
        facts.append(("part of", f"headline run {run.summary['headline_run']} (its goals are listed there)"))
    return facts


def _settings(settings: dict[str, Any], prefix: str = "") -> Iterable[str]:
    """`key=value` for every setting, nested ones by dotted key, values as JSON unless plain strings."""
    for key, value in settings.items():
        if isinstance(value, dict) and value:
            yield from _settings(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}={value if isinstance(value, str) else json.dumps(value)}"


def tables(store: Store, run: Run) -> list[Table]:
    """The tables `hare bench show` prints for the run, built by the same functions."""
    if run.kind == "peers":
        from bench.peers.tables import peers_tables

        return peers_tables(run.summary, run.settings)
    if run.kind == "bulk":
        from bench.bulk_tables import bulk_tables

        return bulk_tables(run.summary, run.settings)
    points = store.points(run.id)
    out = [points_table(points)] if points else []
    ratios = store.ratios(run.id)
    if ratios:
        out.append(ratios_table(ratios))
    if run.summary.get("goals"):
        from bench.headline import goals_table

        out.append(goals_table(run.summary["goals"]))
    return out


def overload_goals(store: Store, run: Run) -> list[str]:
    """An overload run's goal lines, met or MISS (none for other kinds)."""
    if run.kind != "overload":
        return []
    from bench.overload import stored_goals

    return stored_goals(run, store.points(run.id))


def notes(run: Run) -> list[str]:
    """The lines `hare bench show` prints under a peers, bulk or overload run's tables (load average, how exports
    were made, a bulk run's corpus and memory, an overload run's memory)."""
    if run.kind == "bulk":
        from bench.bulk_tables import notes as bulk_notes

        return bulk_notes(run.summary, run.settings)
    if run.kind == "overload":
        from bench.overload import memory_notes

        return memory_notes(run.summary)
    if run.kind != "peers":
        return []
    from bench.peers.tables import peers_notes

    return peers_notes(run.summary)
