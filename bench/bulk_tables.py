"""A bulk run's figures from its stored summary (`hare bench bulk`, bench/bulk.py): the candidates' rows, the
issue's goals judged on them, and the tables `hare bench bulk`, `hare bench show`, the results page and the
console show. Light on purpose: no runtime is imported, so the console and the page load without one.

The summary a bulk run stores (Run.summary):

    rows, tokens        the corpus: texts, and their tokens as the bundle's tokenizer counts them
    streams             the cores every candidate ran on (model streams, torch threads, sessions' threads)
    candidates          one dict per candidate, in the order run: key, label, rows_s (wall clock), cpu_per_1000
                        (CPU seconds per 1,000 rows), cosine_p1 (to sentence-transformers torch fp32, or None),
                        skipped (why it did not run, or "")
    hare_job_rows_s     `hare run`'s own job time (its --summary: without process start and bundle load)
    rss_mb, rss_quarter_mb   `hare run`'s peak RSS on the corpus and on its first quarter
    goals               [{goal, value, target, met}] as judged when the run ended
    load_start, load_end     the machine's load average (1, 5, 15 min)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table

from bench.tables import fmt

MODEL_ONLY, HARE_RUN = "model-only", "hare-run"
OURS = (MODEL_ONLY, HARE_RUN)
GOAL_OF_MODEL = 0.9  # hare run at least 90% of the bundle's own model-only rate
GOAL_OVER_PEER = 1.5  # and 1.5x the fastest peer
GOAL_P1 = 0.99  # among the peers whose cosine p1 to torch fp32 is at least this
GOAL_RSS_MB = 1024  # peak RSS of the whole process, model included, under 1 GB
# The places each figure is shown with (a cosine to four: 0.9979 and 0.9981 must not both read 0.998).
DIGITS = {"rows/s": 1, "tokens/s": 0, "% of model-only": 1, "CPU s per 1,000 rows": 2, "cosine p1 to torch": 4}


def candidate_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per candidate: rows/s and tokens/s by the wall clock, its share of the model-only rate, CPU
    seconds per 1,000 rows, cosine p1 to torch, and why it was skipped (figures None where there are none)."""
    rows, tokens = int(summary.get("rows", 0)), int(summary.get("tokens", 0))
    model = _rate(summary, MODEL_ONLY)
    out = []
    for c in summary.get("candidates", []):
        rate = c.get("rows_s")
        out.append(
            {
                "candidate": c["label"],
                "rows/s": rate,
                "tokens/s": rate * tokens / rows if rate is not None and rows else None,
                "% of model-only": 100 * rate / model if rate is not None and model else None,
                "CPU s per 1,000 rows": c.get("cpu_per_1000"),
                "cosine p1 to torch": c.get("cosine_p1"),
                "skipped because": c.get("skipped") or "",
            }
        )
    return out


def _rate(summary: dict[str, Any], key: str) -> float | None:
    return next((c.get("rows_s") for c in summary.get("candidates", []) if c["key"] == key), None)


def goals(candidates: Sequence[dict[str, Any]], rss_mb: float) -> list[dict[str, Any]]:
    """The issue's goals on these figures: hare run's share of the model-only rate, its lead over the fastest
    peer whose cosine p1 is at least GOAL_P1 (wall clock, same texts, same run), and its peak RSS."""
    rate = {c["key"]: c["rows_s"] for c in candidates if c.get("rows_s") is not None}
    hare, model = rate.get(HARE_RUN), rate.get(MODEL_ONLY)
    peers = [c for c in candidates if c["key"] not in OURS and c.get("rows_s") and (c.get("cosine_p1") or 0) >= GOAL_P1]
    best = max(peers, key=lambda c: c["rows_s"], default=None)
    of_model = hare / model if hare and model else None
    over_peer = hare / best["rows_s"] if hare and best else None
    return [
        _goal("hare run rows/s over model-only", of_model, f">= {GOAL_OF_MODEL:.2f}", GOAL_OF_MODEL),
        _goal(
            f"hare run over the fastest peer at cosine p1 >= {GOAL_P1}" + (f" ({best['key']})" if best else ""),
            over_peer,
            f">= {GOAL_OVER_PEER:.2f}",
            GOAL_OVER_PEER,
        ),
        {
            "goal": "hare run peak RSS, MB",
            "value": round(rss_mb),
            "target": f"< {GOAL_RSS_MB:,}",
            "met": rss_mb < GOAL_RSS_MB,
        },
    ]


def _goal(what: str, value: float | None, target: str, at_least: float) -> dict[str, Any]:
    return {"goal": what, "value": value, "target": target, "met": None if value is None else value >= at_least}


def goal_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored goals as table rows: met "yes", "NO", or "-" where a figure is missing (a peer skipped)."""
    return [
        {"goal": g["goal"], "figure": g.get("value"), "target": g["target"], "met": _met(g.get("met"))}
        for g in summary.get("goals", [])
    ]


def _met(met: bool | None) -> str:
    return "-" if met is None else ("yes" if met else "NO")


def notes(summary: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The lines under the tables: the corpus, hare run's own job rate and memory, the machine's load."""
    out = [
        f"{summary.get('rows', 0):,} texts of {settings.get('shortest', '?')}-{settings.get('longest', '?')} tokens "
        f"({summary.get('tokens', 0):,} tokens), every candidate on {summary.get('streams', '?')} cores; peers "
        f"at batch {settings.get('batch', 32)}"
    ]
    if summary.get("hare_job_rows_s"):
        out.append(f"hare run's job alone (no process start or bundle load): {summary['hare_job_rows_s']:,.1f} rows/s")
    if summary.get("rss_mb"):
        out.append(
            f"hare run's peak RSS: {summary['rss_mb']:,.0f} MB on the corpus, "
            f"{summary.get('rss_quarter_mb', 0):,.0f} MB on its first quarter"
        )
    start, end = summary.get("load_start"), summary.get("load_end")
    if start and end:
        out.append(f"load average (1, 5, 15 min): {_loads(start)} at the start, {_loads(end)} at the end")
    return out


def _loads(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def bulk_tables(summary: dict[str, Any], settings: dict[str, Any]) -> list[Table]:
    """The candidates and the goals as rich tables (the results page renders them as Markdown)."""
    table = Table(title="hare bench bulk: one pass over the same texts each, in one run")
    rows = candidate_rows(summary)
    for column in rows[0] if rows else ():
        wide = 48 if column == "skipped because" else None
        table.add_column(
            column,
            justify="right" if column in DIGITS else "left",
            overflow="fold",
            max_width=wide,
            no_wrap=column == "candidate",
        )
    for row in rows:
        table.add_row(*(fmt(v, DIGITS[k]) if k in DIGITS else escape(str(v)) for k, v in row.items()))
    out = [table]
    if summary.get("goals"):
        goal_table = Table(title="goals (issue 49)")
        for column in ("goal", "figure", "target", "met"):
            goal_table.add_column(column, justify="right" if column in ("figure", "target") else "left")
        for g in goal_rows(summary):
            met = {"yes": "[green]yes[/]", "NO": "[red]NO[/]"}.get(g["met"], "-")
            goal_table.add_row(g["goal"], fmt(g["figure"], 3), g["target"], met)
        out.append(goal_table)
    return out
