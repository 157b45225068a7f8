"""What the benchmark result store (bench/store.py) holds, as Python values: a Run, its Points, two runs'
points matched (Comparison), and hare against a baseline within a run (Ratio). Standard library only, as the
store: the console reads them too."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Points are matched across runs and targets on these settings. A mix of lengths is stored at its mean length,
# so its name ("inputs") keeps it apart from an exact length of that many tokens.
MATCH_KEYS = ("load", "workers", "threads", "seq_len", "inputs", "batch", "concurrency", "rate")
# A point measured in several rounds (`hare bench run --rounds`) keeps each round's value of these in
# extra["rounds"] beside its own figures, which are its median round's.
ROUND_FIGURES = ("req_s", "lat_p50", "lat_p99")
BASELINES = ("vanilla", "comet")


@dataclass
class Run:
    """One benchmark invocation. JSON columns come back as dicts."""

    id: int
    created_at: str
    finished_at: str | None
    status: str  # running | done | failed | cancelled
    kind: str  # run | headline | quick
    name: str
    task: str
    target: str  # the URL, bundle or model folder measured
    manifest_hash: str  # sha256 of the bundle's hare.json ("" for a bare URL whose bundle is unknown)
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # e.g. the headline's goals, met or not
    message: str = ""  # why it failed or was cancelled


@dataclass
class Point:
    """One measured configuration of one target. Latencies in ms; CPU in cores; rate 0 for closed loop.
    A figure with nothing to summarise (no answer in the window) is NaN."""

    run_id: int
    idx: int
    target: str  # hare | vanilla | comet | model-only
    load: str  # closed | open | in-process
    workers: int
    threads: int
    seq_len: int
    batch: int
    concurrency: int
    rate: float
    duration_s: float
    requests: int  # answers received in the measured window (ok + errors)
    ok: int
    errors: dict[str, int]  # by HTTP status, or "connect" / "timeout"
    req_s: float
    seq_s: float
    tokens_s: float
    lat_min: float
    lat_avg: float
    lat_p50: float
    lat_p90: float
    lat_p95: float
    lat_p99: float
    lat_max: float
    server: dict[str, float]  # compute_p50/avg (x-compute-time) and tokenize/queue/inference/postprocess avg
    client_cpu: float
    server_cpu: float | None = None
    # inputs ("exact", or a mix's name: bench.points.MIX_NAMES), url, server_cpu_by_process (cores per server
    # process, busiest first)
    extra: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @property
    def inputs(self) -> str:
        """What the point's texts were: "exact" token counts, or the name of the mix of lengths it sent."""
        return str(self.extra.get("inputs", "exact"))

    def key(self) -> tuple[Any, ...]:
        """The settings two points must share to be compared."""
        return tuple(getattr(self, k) for k in MATCH_KEYS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def seq_label(seq_len: int, inputs: str = "exact") -> int | str:
    """A point's length as tables show it: its token count, or the mix it sent and the mix's mean ("mix ~33")."""
    return seq_len if inputs == "exact" else f"{inputs} ~{seq_len}"


@dataclass
class Comparison:
    """Two points with the same settings; `ratio` is b/a for throughput and latency p50 (None if one is missing)."""

    target: str
    key: dict[str, Any]
    a: Point | None
    b: Point | None
    req_s_ratio: float | None
    p50_ratio: float | None


@dataclass
class Ratio:
    """hare against one baseline at the same settings in the same run."""

    baseline: str
    key: dict[str, Any]
    hare_req_s: float
    baseline_req_s: float
    req_s_ratio: float
    p50_ratio: float  # baseline p50 / hare p50: above 1 means hare answers faster
    rounds: int = 1
    low: float | None = None  # with several rounds: the lowest and highest of the rounds' throughput ratios
    high: float | None = None


def ratios(points: Sequence[Point]) -> list[Ratio]:
    """hare against each baseline at the same settings; baselines may run other worker counts, so the
    worker and thread settings are not part of the match. Points measured in the same rounds are compared
    round by round: each ratio is then the median of the rounds' ratios (not the ratio of the medians)."""

    def loose(p: Point) -> tuple[Any, ...]:
        return (p.load, p.seq_len, p.inputs, p.batch, p.concurrency, p.rate)

    baselines = {(p.target, loose(p)): p for p in points if p.target in BASELINES}
    out = []
    for h in points:
        if h.target != "hare":
            continue
        for name in BASELINES:
            b = baselines.get((name, loose(h)))
            if b is None or b.req_s <= 0 or h.lat_p50 <= 0:
                continue
            ratio = Ratio(
                baseline=name,
                key=dict(zip(MATCH_KEYS, h.key(), strict=True)),
                hare_req_s=h.req_s,
                baseline_req_s=b.req_s,
                req_s_ratio=h.req_s / b.req_s,
                p50_ratio=b.lat_p50 / h.lat_p50,
            )
            out.append(_by_round(ratio, h, b))
    return out


def _by_round(ratio: Ratio, h: Point, b: Point) -> Ratio:
    """`ratio` from the rounds both points ran (the same count, each with answers), where they ran several."""
    hr, br = h.extra.get("rounds"), b.extra.get("rounds")
    if not hr or not br or len(hr["req_s"]) != len(br["req_s"]) or len(hr["req_s"]) < 2:
        return ratio
    pairs = list(zip(hr["req_s"], br["req_s"], hr["lat_p50"], br["lat_p50"], strict=True))
    if not all(hq > 0 and bq > 0 and hp > 0 and bp > 0 for hq, bq, hp, bp in pairs):
        return ratio
    speed = [hq / bq for hq, bq, _, _ in pairs]
    return dataclasses.replace(
        ratio,
        req_s_ratio=statistics.median(speed),
        p50_ratio=statistics.median(bp / hp for _, _, hp, bp in pairs),
        rounds=len(pairs),
        low=min(speed),
        high=max(speed),
    )
