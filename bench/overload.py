"""`hare bench overload BUNDLE`: how the server behaves at and past its capacity, one `hare serve` started
for the whole scenario, every phase stored as a point of one run (kind "overload"):

    one-user     1 closed-loop user, against the bundle's session with one thread in process (model-only)
    capacity     2 users per core, closed loop: the capacity the later phases are measured against
    open-kx      Poisson arrivals at k x capacity: accepted answers' server time (x-compute-time p99, from
                 the intended send time on the client), refusals, and whether each said Retry-After
    flood        N greedy connections (closed loop, 10 ms back-off after a refusal): goodput / capacity
    recovery     2 users per core for the seconds right after the flood: req/s / capacity
    soak         (with --soak S) 2 users per core for S seconds, every server process's RSS sampled

The figures are printed against the goals of issue 12, met or not and by how much.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import modelonly
from bench.inputs import TextMaker, load_tokenizer, make_bodies
from bench.loadgen import LoadSpec, Samples, latency_summary, run_load
from bench.runner import Planned, make_point
from bench.servers import group_rss_mb, hare_server, split_url
from bench.store import Point, Store
from bench.subjects import manifest_hash, versions
from bench.tables import wide_console
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_manifest
from container.machine import describe, physical_cores


@dataclass(frozen=True)
class OverloadOptions:
    bundle: Path
    seq_len: int = 128
    factor: float = 3.0
    flood: int = 1000
    duration_s: float = 10.0
    soak_s: float = 0.0
    serve_args: tuple[str, ...] = ()


class _Scenario:
    def __init__(self, options: OverloadOptions, store: Store, stop: threading.Event) -> None:
        self.options, self.store, self.stop = options, store, stop
        self.maker = TextMaker(load_tokenizer(options.bundle / TOKENIZER_FILE))
        self.task = read_manifest(options.bundle).task
        self.bodies = make_bodies(self.task, 1, options.seq_len, self.maker)
        self.cores = physical_cores()
        self.points: dict[str, Point] = {}
        self.k = 0
        self.run_id = 0

    def point(self, name: str, samples: Samples, load: str, users: int, rate: float, **extra: Any) -> Point:
        self.k += 1
        planned = Planned("hare", None, None, self.options.seq_len, 1, users, rate)
        point = make_point(
            self.run_id,
            self.k,
            "hare",
            load,
            0,
            0,
            planned,
            self.bodies.tokens_per_sequence,
            samples.window_s,
            samples.requests,
            samples.ok,
            samples.errors(),
            latency_summary(samples),
            server=samples.server_figures(),
            client_cpu=samples.cpu_s / max(samples.window_s, 1e-9),
            extra={"scenario": name, "retry_after": samples.retry_after, **extra},
        )
        self.store.add_point(point)
        self.points[name] = point
        return point

    def load(self, url: str, load: str, users: int = 1, rate: float = 0.0, warmup: float = 2.0, **kw: Any) -> Samples:
        host, port = split_url(url)
        spec = LoadSpec(
            host=host,
            port=port,
            path="/predict",
            bodies=self.bodies.bodies,
            load="open" if load == "open" else "closed",
            concurrency=users,
            rate=rate,
            warmup_s=warmup,
            duration_s=kw.get("duration", self.options.duration_s),
            timeout_s=60.0,
        )
        return run_load(spec, stop=self.stop)


def run_overload(options: OverloadOptions, store: Store, stop: threading.Event) -> int:
    """Run every phase against one fresh `hare serve`; returns the run id."""
    sc = _Scenario(options, store, stop)
    console = wide_console()
    sc.run_id = store.create_run(
        "overload",
        task=sc.task,
        target=str(options.bundle),
        manifest_hash=manifest_hash(options.bundle),
        machine=describe(),
        versions=versions(),
        settings={k: str(v) for k, v in options.__dict__.items()},
    )
    rss: dict[str, float] = {}
    server = hare_server(options.bundle, extra=list(options.serve_args))
    with server.start():
        server.wait_ready(stop=stop)
        assert server.proc is not None
        pgid = server.proc.pid
        time.sleep(1.0)
        rss["warm"] = max(group_rss_mb(pgid).values())
        users = 2 * sc.cores
        one = sc.point("one-user", sc.load(server.url, "closed", 1), "closed", 1, 0.0)
        cap = sc.point("capacity", sc.load(server.url, "closed", users), "closed", users, 0.0)
        rate = options.factor * cap.req_s
        sc.point(f"open-{options.factor:g}x", sc.load(server.url, "open", rate=rate, warmup=1.0), "open", 0, rate)
        flood = sc.load(server.url, "closed", options.flood, warmup=options.flood * 0.006 + 2)
        rss["flood"] = max(group_rss_mb(pgid).values())
        sc.point("flood", flood, "closed", options.flood, 0.0, rss_mb=rss["flood"])
        sc.point("recovery", sc.load(server.url, "closed", users, warmup=0.0), "closed", users, 0.0)
        if options.soak_s > 0:
            _soak(sc, server.url, pgid, users, rss)
    model = modelonly.measure(options.bundle, sc.maker, options.seq_len, 1, 1, 1.0, 3.0, stop=stop)
    model_p50 = modelonly.summary(model).p50
    store.finish_run(sc.run_id, "cancelled" if stop.is_set() else "done", "")
    file_mb = (options.bundle / MODEL_FILE).stat().st_size / 2**20
    console.print(f"run {sc.run_id}: {options.bundle} at {options.seq_len} tokens, {sc.cores} cores")
    console.print(f"  model-only, one thread, in process: p50 {model_p50:.1f} ms")
    for name, p in sc.points.items():
        refused = p.errors.get("429", 0)
        console.print(
            f"  {name:<10} {p.req_s:8.1f} req/s  p50 {p.lat_p50:8.1f} ms  p99 {p.lat_p99:8.1f} ms  "
            f"server p99 {p.server.get('compute_p99', math.nan):8.1f} ms  refused {refused}  "
            f"other errors {sum(v for k, v in p.errors.items() if k != '429')}"
        )
    console.print(f"  largest process RSS (MB): {', '.join(f'{k} {v:.0f}' for k, v in rss.items())}")
    for goal in evaluate(sc.points, one.lat_p50, model_p50, cap.req_s, rss, file_mb):
        console.print(goal)
    return sc.run_id


def _soak(sc: _Scenario, url: str, pgid: int, users: int, rss: dict[str, float]) -> None:
    series: list[dict[int, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            series.append(group_rss_mb(pgid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    soak = sc.load(url, "closed", users, warmup=0.0, duration=sc.options.soak_s)
    done.set()
    sampler.join()
    if len(series) >= 2:
        rss["soak_start"], rss["soak_end"] = max(series[0].values()), max(series[-1].values())
    sc.point("soak", soak, "closed", users, 0.0, rss_series=[{str(k): v for k, v in s.items()} for s in series])


def evaluate(
    points: dict[str, Point], one_p50: float, model_p50: float, capacity: float, rss: dict[str, float], file_mb: float
) -> list[str]:
    """One line per goal of issue 12: the figure, the target, met or not."""

    def line(goal: str, value: float, target: float, higher: bool, unit: str = "") -> str:
        met = value >= target if higher else value <= target
        return (
            f"{'met ' if met else 'MISS'}  {goal}: {value:.3g}{unit} (goal {'≥' if higher else '≤'} {target:g}{unit})"
        )

    out = [line("one user p50 / one-thread model-only p50", one_p50 / model_p50, 0.7, False)]
    for name, p in points.items():
        if name.startswith("open-"):
            refused = p.errors.get("429", 0)
            bad = sum(v for k, v in p.errors.items() if k.startswith("5"))
            out.append(
                line(f"{name}: accepted server time p99", p.server.get("compute_p99", math.nan), 2000, False, " ms")
            )
            out.append(line(f"{name}: refusals without Retry-After", refused - int(p.extra["retry_after"]), 0, False))
            out.append(line(f"{name}: 5xx answers", bad, 0, False))
    if "flood" in points:
        out.append(line("flood goodput / capacity", points["flood"].req_s / capacity, 0.8, True))
    if "recovery" in points:
        out.append(line("10 s after the flood / capacity", points["recovery"].req_s / capacity, 0.9, True))
    for when in ("warm", "flood"):
        if when in rss:
            out.append(line(f"largest process RSS after {when} - model file", rss[when] - file_mb, 200, False, " MB"))
    if "soak_start" in rss:
        out.append(line("RSS growth over the soak", rss["soak_end"] / rss["soak_start"] - 1, 0.05, False))
    return out
