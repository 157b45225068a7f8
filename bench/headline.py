"""`hare bench headline`: the scenario hare is judged by, with its goals met or not.

1. Text classification with DistilBERT-base geometry (6 layers, hidden 768, 2 labels, random weights, the
   BERT uncased vocabulary of the default model's tokenizer), batch 1, concurrency = physical cores, at 8 to
   512 tokens, against the vanilla baseline in the same run, plus the model-only figure.
2. Embeddings with the default all-MiniLM-L6-v2 bundle, 16 users, at 8 and 128 tokens.

Each part is a run in the store; the goals are written into the first run's summary. The model folder and
the bundles are built once and kept in the bench cache (beside the result store).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import geometries
from bench.progress import Reporter, reporter
from bench.runner import Grid, Runner, RunOptions, plan
from bench.servers import bench_api_key, bench_token
from bench.store import Point, Store
from bench.subjects import Subject, bundle_for_model, cache_dir, is_bundle
from bench.tables import wide_console
from container.bundle import TOKENIZER_FILE
from container.defaults import DEFAULT_BUNDLE, default_model_dir
from container.machine import physical_cores

SEQ_LENS = [8, 16, 32, 64, 128, 256, 512]
EMBEDDING_SEQ_LENS = [8, 128]
EMBEDDING_USERS = 16
# The candidates worth timing for DistilBERT on CPU: ONNX Runtime's dynamic int8, and OpenVINO's where this
# machine's default build tries them (classifier_variants). fp32 variants never win there and cost minutes, as
# do the calibrated int8-mixed's and the blockwise ones, which lose to these at DistilBERT's size.
ONNX_RUNTIME_VARIANTS = ("int8", "fused-int8", "fused-int8-per-channel")
OPENVINO_VARIANTS = ("bf16", "int8-grouped")


@dataclass(frozen=True)
class HeadlineOptions:
    duration_s: float = 8.0
    warmup_s: float = 2.0
    seq_lens: list[int] | None = None
    embeddings: bool = True
    progress: str = "rich"


def classifier_variants() -> list[str]:
    """The variants the headline's DistilBERT bundle races: ONNX Runtime's dynamic int8, and OpenVINO's bf16 and
    int8-grouped where a default `hare optimize` here tries them, so the headline serves what a user's build
    would (on the VNNI EPYC int8-grouped served 512 tokens 1.2x as fast as fused-int8, 2026-12-02)."""
    from container.optimize.pipeline import candidates  # the optimizer's imports, only when building

    tried = {v.name for v in candidates("cpu") if not v.optional}
    return [name for name in (*ONNX_RUNTIME_VARIANTS, *OPENVINO_VARIANTS) if name in tried]


def minilm_bundle() -> Path:
    """The default embeddings bundle if `hare optimize` already built it here, else one in the bench cache."""
    if is_bundle(DEFAULT_BUNDLE):
        return DEFAULT_BUNDLE
    return bundle_for_model(default_model_dir(), "feature-extraction", cache_dir() / "all-MiniLM-L6-v2")


class _Offset:
    """Forwards a run's progress as part of the whole headline: one start, k counted across both runs, and
    one final `done`."""

    def __init__(self, inner: Reporter, n: int) -> None:
        self.inner, self.n, self.offset, self.started, self.first_run = inner, n, 0, False, 0

    def start(self, run_id: int, n: int, db: str) -> None:
        if not self.started:
            self.started, self.first_run = True, run_id
            self.inner.start(run_id, self.n, db)
        else:
            self.inner.log(f"embeddings part: run {run_id}")

    def server(self, target: str, state: str, url: str) -> None:
        self.inner.server(target, state, url)

    def point_start(self, k: int, n: int, target: str, settings: dict[str, Any]) -> None:
        self.inner.point_start(k + self.offset, self.n, target, settings)

    def tick(self, k: int, n: int, figures: dict[str, float]) -> None:
        self.inner.tick(k + self.offset, self.n, figures)

    def point(self, k: int, n: int, point: Point) -> None:
        self.inner.point(k + self.offset, self.n, point)

    def log(self, message: str) -> None:
        self.inner.log(message)

    def done(self, run_id: int | None, status: str, message: str = "") -> None:
        self.inner.log(f"run {run_id}: {status}" + (f" ({message})" if message else ""))

    def finish(self, status: str, message: str = "") -> None:
        self.inner.done(self.first_run, status, message)


def run_headline(options: HeadlineOptions, store: Store, stop: threading.Event) -> str:
    """Build what is missing, run both parts, evaluate and print the goals; returns the final status."""
    console = Console(stderr=True)
    cores = physical_cores()
    console.print("preparing the headline models (cached after the first run)...")
    model = geometries.build("distilbert-base", cache_dir() / "distilbert-base-random", cache=True)
    cls_bundle = bundle_for_model(
        model, "text-classification", cache_dir() / "distilbert-base-random-bundle", classifier_variants()
    )
    grid = Grid(
        seq_lens=list(options.seq_lens or SEQ_LENS),
        batches=[1],
        concurrencies=[cores],
        warmup_s=options.warmup_s,
        duration_s=options.duration_s,
        bodies=256,
    )
    cls_options = RunOptions(
        subject=Subject(
            "text-classification", bundle=cls_bundle, model_dir=model, tokenizer=cls_bundle / TOKENIZER_FILE
        ),
        grid=grid,
        baselines=["vanilla"],
        kind="headline",
        name="headline: DistilBERT-base text-classification",
        token=bench_token(),  # the servers it starts inherit HARE_ADMIN_TOKEN and HARE_API_KEY
        api_key=bench_api_key(),
    )
    runs = [cls_options]
    if options.embeddings:
        emb = minilm_bundle()
        runs.append(
            RunOptions(
                subject=Subject("feature-extraction", bundle=emb, tokenizer=emb / TOKENIZER_FILE),
                grid=Grid(
                    seq_lens=list(EMBEDDING_SEQ_LENS),
                    batches=[1],
                    concurrencies=[EMBEDDING_USERS],
                    warmup_s=options.warmup_s,
                    duration_s=options.duration_s,
                    bodies=256,
                ),
                kind="headline",
                name="headline: all-MiniLM-L6-v2 embeddings",
                token=bench_token(),
                api_key=bench_api_key(),
            )
        )
    progress = _Offset(reporter(options.progress), sum(len(plan(r)) for r in runs))
    ids: list[int] = []
    status = "done"
    for run_options in runs:
        if stop.is_set():
            break
        ids.append(Runner(run_options, store, progress, stop).run())
        progress.offset += len(plan(run_options))
        if store.run(ids[-1]).status != "done":
            status = store.run(ids[-1]).status
    goals = evaluate(store.points(ids[0]), store.points(ids[1]) if len(ids) > 1 else [], cores)
    store.update_run(ids[0], summary={"goals": goals, "runs": ids})
    if len(ids) > 1:
        store.update_run(ids[1], summary={"headline_run": ids[0]})
    progress.finish(status, "runs " + ", ".join(map(str, ids)))
    # With --progress jsonl stdout carries only the events; the tables go to stderr.
    out = wide_console() if options.progress != "jsonl" else Console(stderr=True, width=180)
    out.print(headline_table(store.points(ids[0]), store.points(ids[1]) if len(ids) > 1 else []))
    out.print(goals_table(goals))
    run = store.run(ids[0])
    out.print(f"machine: {run.machine.get('cpu')} ({cores} physical cores); runs {', '.join(map(str, ids))}")
    return "cancelled" if stop.is_set() else status


# -- goals -----------------------------------------------------------------------------------------------------


def _find(points: list[Point], target: str, seq: int) -> Point | None:
    """The batch-1 point of `target` at `seq` tokens; for model-only, its one-stream figure."""
    return next(
        (
            p
            for p in points
            if p.target == target
            and p.seq_len == seq
            and p.batch == 1
            and (target != "model-only" or p.concurrency == 1)
        ),
        None,
    )


def _side_by_side(points: list[Point], seq: int) -> Point | None:
    """The model-only point with the most streams (more than one) at `seq`: as many as the hare point kept busy."""
    found = [p for p in points if p.target == "model-only" and p.seq_len == seq and p.batch == 1 and p.concurrency > 1]
    return max(found, key=lambda p: p.concurrency, default=None)


def _goal(goal: str, value: float | None, target: float, unit: str, higher: bool) -> dict[str, Any]:
    want = f"{'≥' if higher else '≤'}{target:g}{unit}"
    if value is None or math.isnan(value):
        return {"goal": goal, "value": None, "target": want, "met": False, "gap": "not measured"}
    met = value >= target if higher else value <= target
    if met:
        gap = ""
    elif higher:
        gap = f"short by {(target - value) / target:.0%} ({value:.3g}{unit} of {target:g}{unit})"
    else:
        gap = f"over by {(value - target) / target:.0%} ({value:.3g}{unit} vs {target:g}{unit})"
    return {"goal": goal, "value": round(value, 4), "target": want, "met": met, "gap": gap}


def evaluate(cls: list[Point], emb: list[Point], cores: int) -> list[dict[str, Any]]:
    """The issue's goals, each with its figure, met or not, and by how much it falls short."""
    goals = []

    def ratio(seq: int) -> float | None:
        h, v = _find(cls, "hare", seq), _find(cls, "vanilla", seq)
        return h.req_s / v.req_s if h and v and v.req_s > 0 else None

    def req_s(points: list[Point], seq: int) -> float | None:
        p = _find(points, "hare", seq)
        return p.req_s if p else None

    for seq, want in ((8, 6.0), (16, 6.0), (128, 4.0), (512, 4.0)):
        goals.append(_goal(f"throughput vs vanilla at seq {seq}", ratio(seq), want, "x", True))
    goals.append(_goal("throughput at seq 8", req_s(cls, 8), 250, " req/s", True))
    goals.append(_goal("throughput at seq 128", req_s(cls, 128), 35, " req/s", True))
    h8, m8 = _find(cls, "hare", 8), _find(cls, "model-only", 8)
    goals.append(_goal("e2e p50 - model-only p50 at seq 8", h8.lat_p50 - m8.lat_p50 if h8 and m8 else None,
                       0.5, " ms", False))  # fmt: skip
    h128, m128 = _find(cls, "hare", 128), _find(cls, "model-only", 128)
    overhead = (h128.lat_p50 - m128.lat_p50) / m128.lat_p50 * 100 if h128 and m128 else None
    goals.append(_goal("(e2e p50 - model-only p50) / model-only p50 at seq 128", overhead, 10, "%", False))
    hare = [p for p in cls if p.target == "hare" and p.lat_p50 > 0]
    if hare:
        worst = max(hare, key=lambda p: p.lat_p99 / p.lat_p50)
        goals.append(_goal(f"p99 / p50 (worst: seq {worst.seq_len})", worst.lat_p99 / worst.lat_p50, 1.5, "x", False))
    else:
        goals.append(_goal("p99 / p50", None, 1.5, "x", False))
    if emb:
        goals.append(_goal(f"embeddings, {EMBEDDING_USERS} users, 8 tokens", req_s(emb, 8), 450, " req/s", True))
        goals.append(_goal(f"embeddings, {EMBEDDING_USERS} users, 128 tokens", req_s(emb, 128), 80, " req/s", True))
    del cores
    return goals


def goals_table(goals: list[dict[str, Any]]) -> Table:
    table = Table(title="headline goals (2-core machine, HTTP end to end, batch 1)")
    for col in ("goal", "figure", "target", "met", "gap"):
        table.add_column(col, justify="right" if col in ("figure", "target") else "left")
    for g in goals:
        value = g.get("value")
        table.add_row(
            g["goal"],
            "-" if value is None else f"{value:.3g}",
            g["target"],
            "[green]yes[/]" if g["met"] else "[red]NO[/]",
            g.get("gap", ""),
        )
    return table


def headline_table(cls: list[Point], emb: list[Point]) -> Table:
    table = Table(title="headline: DistilBERT-base text-classification (batch 1, users = cores) and MiniLM")
    cols = ["part", "seq", "hare req/s", "vanilla req/s", "x", "hare p50", "hare p99", "vanilla p50"]
    for col in [*cols, "model p50", "model p50 xN", "overhead p50", "overhead xN", "server cpu", "client cpu"]:
        table.add_column(col, justify="left" if col == "part" else "right")

    def ms(p: Point | None) -> str:
        return f"{p.lat_p50:.2f}" if p else "-"

    def over(h: Point | None, m: Point | None) -> str:
        return f"{h.lat_p50 - m.lat_p50:+.2f}" if h and m else "-"

    def by_worker(p: Point | None) -> str:
        """Cores used by each worker, busiest first: "0.99+0.98" when the clients' connections spread over
        the workers, "1.65+0.00" when the kernel handed them all to one."""
        if p is None or not p.extra.get("server_cpu_by_process"):
            return "-"
        return "+".join(f"{c:.2f}" for c in p.extra["server_cpu_by_process"][: max(p.workers, 1)])

    for seq in sorted({p.seq_len for p in cls}):
        h, v = _find(cls, "hare", seq), _find(cls, "vanilla", seq)
        m, mn = _find(cls, "model-only", seq), _side_by_side(cls, seq)
        table.add_row(
            "classify",
            str(seq),
            f"{h.req_s:.1f}" if h else "-",
            f"{v.req_s:.1f}" if v else "-",
            f"{h.req_s / v.req_s:.2f}" if h and v and v.req_s else "-",
            ms(h),
            f"{h.lat_p99:.2f}" if h else "-",
            ms(v),
            ms(m),
            f"{ms(mn)} (x{mn.concurrency})" if mn else "-",
            over(h, m),
            over(h, mn),
            by_worker(h),
            f"{h.client_cpu:.2f}" if h else "-",
        )
    for p in (p for p in emb if p.target == "hare"):
        m, mn = _find(emb, "model-only", p.seq_len), _side_by_side(emb, p.seq_len)
        table.add_row(
            f"embed x{p.concurrency}",
            str(p.seq_len),
            f"{p.req_s:.1f}",
            "-",
            "-",
            ms(p),
            f"{p.lat_p99:.2f}",
            "-",
            ms(m),
            f"{ms(mn)} (x{mn.concurrency})" if mn else "-",
            "-",
            "-",
            by_worker(p),
            f"{p.client_cpu:.2f}",
        )
    table.caption = (
        "latency in ms; model p50: the ONNX session alone in process, one stream, and xN: N streams side by side "
        "(as the server runs them); overhead = hare e2e p50 - model p50; server cpu: cores used by each worker, "
        "busiest first (one near 0: the connections all landed on one worker); client cpu in cores"
    )
    return table
