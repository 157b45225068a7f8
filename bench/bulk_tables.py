"""A bulk run's figures from its stored summary (`hare bench bulk`, bench/bulk.py): the candidates' rows, the
issue's goals judged on them (when read, so that every stored run is judged alike), and the tables `hare bench
bulk`, `hare bench show`, the results page and the console show. Light on purpose: no runtime is imported, so
the console and the page load without one.

The summary a bulk run stores (Run.summary):

    rows, tokens        the corpus: texts, and their tokens as the bundle's tokenizer counts them
    streams             the cores every candidate ran on (model streams, torch threads, sessions' threads)
    rounds              the passes every candidate made (bench/bulk.py; absent in runs stored before: one)
    candidates          one dict per candidate, in the order run: key, label, rows_s (wall clock), cpu_per_1000
                        (CPU seconds per 1,000 rows), cosine_p1 (to sentence-transformers torch fp32, or None),
                        skipped (why it did not run, or ""), rounds (each round's [rows_s, cpu_per_1000]; rows_s
                        and cpu_per_1000 are their medians)
    hare_job_rows_s     `hare run`'s own job time (its --summary: without process start and bundle load; also
                        the candidate "hare-job", with its CPU time, timed as the peers are after their load)
    rss_mb, rss_quarter_mb   `hare run`'s peak RSS on the corpus and on its first quarter
    load_start, load_end     the machine's load average (1, 5, 15 min)
    exports             what the peers' loaders noted (how an export was made, what OpenVINO computes in)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median
from typing import Any

from rich.markup import escape
from rich.table import Table

from bench.tables import fmt

MODEL_ONLY, HARE_RUN, HARE_JOB = "model-only", "hare-run", "hare-job"
OURS = (MODEL_ONLY, HARE_RUN, HARE_JOB)
GOAL_OF_MODEL = 0.9  # hare run at least 90% of the bundle's own model-only rate
GOAL_OVER_PEER = 1.5  # and 1.5x the fastest peer
GOAL_P1 = 0.99  # among the peers whose cosine p1 to torch fp32 is at least this
GOAL_RSS_MB = 1024  # peak RSS of the whole process, model included, under 1 GB
OVER_ROUNDS = "min-max"  # a goal's lowest and highest ratio over the rounds, in a run of several rounds
Candidate = dict[str, Any]  # one of a summary's candidates (the module docstring)
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
                "% of model-only": 100 * (rate / model) if rate is not None and model else None,  # 100 for itself
                "CPU s per 1,000 rows": c.get("cpu_per_1000"),
                "cosine p1 to torch": c.get("cosine_p1"),
                "skipped because": c.get("skipped") or "",
            }
        )
    return out


def _rate(summary: dict[str, Any], key: str) -> float | None:
    return next((c.get("rows_s") for c in summary.get("candidates", []) if c["key"] == key), None)


def goals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's goals, judged from the stored candidates: hare run's rate over the model-only rate, and over
    the fastest peer whose cosine p1 is at least GOAL_P1, each by the wall clock and by CPU time (rows per CPU
    second: on a machine other work shares, the wall clock also counts what the others took, and the
    candidates run one after the other); the same over the fastest peer for hare run's job alone (the peers'
    clocks start after their load and warm-up, the job's after the bundle's load); and hare run's peak RSS.
    A ratio is taken round by round and its median judged (a run of several rounds: bench/bulk.py), its range
    over the rounds beside it (OVER_ROUNDS, a key only in runs of several rounds). Met "yes", "NO", or "-"
    where a figure is missing (a peer skipped, or a run stored before the job's row)."""
    ran = {c["key"]: c for c in summary.get("candidates", []) if c.get("rows_s") and c.get("cpu_per_1000")}
    hare, job, model = ran.get(HARE_RUN), ran.get(HARE_JOB), ran.get(MODEL_ONLY)
    peers = [c for k, c in ran.items() if k not in OURS and (c.get("cosine_p1") or 0) >= GOAL_P1]
    out = []
    for how, speed in (("wall clock", _rows_s), ("CPU time", _rows_per_cpu_s)):
        best = max(peers, key=speed, default=None)  # by its median over the rounds
        peer = f" ({best['key']})" if best else ""
        out.append(_goal(f"hare run over model-only, by {how}", _ratios(hare, model, speed), GOAL_OF_MODEL))
        out.append(_goal(f"hare run over the fastest peer{peer}, by {how}", _ratios(hare, best, speed), GOAL_OVER_PEER))
        out.append(_goal(f"hare run's job alone over that peer, by {how}", _ratios(job, best, speed), GOAL_OVER_PEER))
    rss = summary.get("rss_mb")
    met = None if not rss else _met(rss < GOAL_RSS_MB)
    out.append({"goal": "hare run peak RSS, MB", "figure": round(rss) if rss else None, "target": f"< {GOAL_RSS_MB:,}",
                "met": met, OVER_ROUNDS: None})  # fmt: skip
    if not any(g[OVER_ROUNDS] for g in out):  # a run of one round: no range to show
        for g in out:
            del g[OVER_ROUNDS]
    return out


def _ratios(a: Candidate | None, b: Candidate | None, speed: Callable[[Candidate], float]) -> list[float]:
    """`a`'s speed over `b`'s, round by round (none when either is missing)."""
    if a is None or b is None:
        return []
    return [speed(x) / speed(y) for x, y in zip(_rounds(a), _rounds(b), strict=False)]


def _rounds(candidate: Candidate) -> list[Candidate]:
    """A candidate's figures in each round (one round, its own, for a run stored before rounds were kept)."""
    rounds = candidate.get("rounds") or [[candidate["rows_s"], candidate["cpu_per_1000"]]]
    return [{"rows_s": rows_s, "cpu_per_1000": cpu} for rows_s, cpu in rounds]


def _rows_s(candidate: Candidate) -> float:
    return float(candidate["rows_s"])


def _rows_per_cpu_s(candidate: Candidate) -> float:
    return 1000 / float(candidate["cpu_per_1000"])


def _goal(what: str, ratios: list[float], at_least: float) -> dict[str, Any]:
    value = float(median(ratios)) if ratios else None
    met = None if value is None else _met(value >= at_least)
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}" if len(ratios) > 1 else None
    return {"goal": what, "figure": value, "target": f">= {at_least:.2f}", "met": met, OVER_ROUNDS: spread}


def _met(met: bool) -> str:
    return "yes" if met else "NO"


def notes(summary: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The lines under the tables: the corpus, hare run's own job rate and memory, the machine's load."""
    out = [
        f"{summary.get('rows', 0):,} texts of {settings.get('shortest', '?')}-{settings.get('longest', '?')} tokens "
        f"({summary.get('tokens', 0):,} tokens), every candidate on {summary.get('streams', '?')} cores; peers "
        f"at batch {settings.get('batch', 32)}"
    ]
    if settings.get("peers"):
        out.append(f"the fastest peer: the fastest of those whose cosine p1 to torch is at least {GOAL_P1}")
    if summary.get("rounds", 1) > 1:
        out.append(
            f"{summary['rounds']} rounds, every candidate once a round (every other round in the reverse order): "
            f"each figure is the candidate's median, each goal the median of its ratios round by round ({OVER_ROUNDS}: "
            "their range)"
        )
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
    return out + [f"{key}: {note}" for key, note in summary.get("exports", {}).items()]


def _loads(values: Sequence[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def bulk_tables(summary: dict[str, Any], settings: dict[str, Any]) -> list[Table]:
    """The candidates and the goals as rich tables (the results page renders them as Markdown)."""
    table = Table(title="hare bench bulk: the same texts through each, in one run")
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
    if rows:
        goal_table = Table(title="goals (issue 49)")
        judged = goals(summary)
        for column in judged[0]:
            goal_table.add_column(column, justify="left" if column in ("goal", "met") else "right")
        for g in judged:
            met = {"yes": "[green]yes[/]", "NO": "[red]NO[/]"}.get(g["met"], "-")
            spread = (g[OVER_ROUNDS] or "-",) if OVER_ROUNDS in g else ()
            goal_table.add_row(g["goal"], fmt(g["figure"], 3), g["target"], met, *spread)
        out.append(goal_table)
    return out
