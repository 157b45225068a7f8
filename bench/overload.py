"""`hare bench overload BUNDLE`: how the server behaves at and past its capacity, one `hare serve` started
for the whole scenario, every phase stored as a point of one run (kind "overload"):

    one-user     1 closed-loop user, against the bundle's session with one thread in process (model-only)
    tail-Nt-Uu   U closed-loop users (users = cores, and 16) at N tokens (8 and 128): p99/p50 as they see it,
                 at their sockets (and, beside it, as the load generator read the answers: bench/client.py)
    capacity     2 users per core, closed loop: the capacity the later phases are measured against
    open-kx      Poisson arrivals at k x capacity, as the clients see it: accepted answers' latency from the
                 intended send time (p50, p99), goodput (answers read in the window a second, over
                 capacity), refusals and whether each said Retry-After, connections never answered
                 (connect failures, timeouts); also the server's own time (x-compute-time p99)
    flood        N greedy connections (closed loop, 10 ms back-off after a refusal): goodput / capacity
    recovery     2 users per core for the seconds right after the flood: req/s / capacity
    soak         (with --soak S) 2 users per core for S seconds, every server process's RSS sampled

With --rounds N the capacity, open loop, flood and recovery phases run N times on the same server (the later
rounds' phases named `capacity#2` and so on), each round's ratios taken against its own capacity, and each goal
judged on their median: on a shared 2-vCPU host one round's goodput moved from 0.70 to 0.98 between runs of
the same code.

Every phase also records the server's CPU (cores, from its processes' clocks); with the capacity phase's CPU
per answer it gives the cost of one refusal. The figures are printed against the goals of issues 12 and 19,
met or not; `hare bench report --kind overload` judges the stored runs again (stored_goals).
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import modelonly
from bench.inputs import Bodies, TextMaker, load_tokenizer, make_bodies
from bench.loadgen import CONNECT, TIMEOUT, LoadSpec, Samples, latency_summary, run_load
from bench.points import Planned, make_point
from bench.servers import ServerProcess, group_pss_mb, group_rss_mb, hare_server, split_url
from bench.store import Point, Run, Store
from bench.subjects import VERSIONED, manifest_hash
from bench.tables import wide_console
from container.bundle import TOKENIZER_FILE, model_bytes, read_manifest
from container.machine import describe, physical_cores, versions
from tasks.errors import InputError

TAIL_USERS = 16  # the tail's second phase: many users per core
PSS_NOTE = "the whole server, every process's PSS (MB, shared pages counted once)"


@dataclass(frozen=True)
class OverloadOptions:
    bundle: Path
    seq_len: int = 128
    factor: float = 3.0
    flood: int = 1000
    duration_s: float = 10.0
    soak_s: float = 0.0
    serve_args: tuple[str, ...] = ()
    tail_seqs: tuple[int, ...] = (8, 128)  # token counts of the tail phases (empty: none)
    rounds: int = 1  # passes of capacity, open loop, flood and recovery
    api_key: str | None = field(
        default=None, repr=False
    )  # the server's HARE_API_KEY, which it inherits (bench_api_key)


class _Scenario:
    def __init__(self, options: OverloadOptions, store: Store, stop: threading.Event) -> None:
        self.options, self.store, self.stop = options, store, stop
        self.maker = TextMaker(load_tokenizer(options.bundle / TOKENIZER_FILE))
        manifest = read_manifest(options.bundle)
        if options.seq_len > manifest.max_length:  # else measured at the server's cut, and named at --seq
            raise InputError(f"--seq {options.seq_len} exceeds the bundle's max_length {manifest.max_length}")
        self.task = manifest.task
        self.bodies = make_bodies(self.task, 1, options.seq_len, self.maker)
        self.cores = physical_cores()
        self.points: dict[str, Point] = {}
        self.k = 0
        self.run_id = 0
        self.watch: Callable[[str], None] = lambda name: None  # told each phase's name as it is stored

    def point(
        self,
        name: str,
        samples: Samples,
        load: str,
        users: int,
        rate: float,
        seq: int | None = None,
        bodies: Bodies | None = None,
        **extra: Any,
    ) -> Point:
        """Store a phase as a point (at the scenario's own length and bodies unless `seq` and `bodies`)."""
        bodies = bodies or self.bodies
        self.k += 1
        if samples.read_latencies:  # as the load generator read the answers, its own waits for a core included
            read = latency_summary(samples, read=True)
            extra["read_p50"], extra["read_p99"] = read.p50, read.p99
        if load == "open":  # how far behind the window its last answer came: the server's queue
            extra["drain_s"] = samples.drain_s
        cores = samples.server_cores()
        planned = Planned("hare", None, None, seq or self.options.seq_len, 1, users, rate)
        point = make_point(
            self.run_id,
            self.k,
            "hare",
            load,
            0,
            0,
            planned,
            bodies.tokens_per_sequence,
            samples.window_s,
            samples.requests,
            samples.ok,
            samples.errors(),
            latency_summary(samples),
            server=samples.server_figures(),
            client_cpu=samples.cpu_s / max(samples.window_s, 1e-9),
            server_cpu=sum(cores.values()) if cores is not None else None,
            answered=samples.answered,
            extra={"scenario": name, "retry_after": samples.retry_after, **extra},
        )
        self.store.add_point(point)
        self.watch(name)
        self.points[name] = point
        return point

    def load(
        self,
        server: ServerProcess,
        load: str,
        users: int = 1,
        rate: float = 0.0,
        warmup: float = 2.0,
        bodies: Bodies | None = None,
        **kw: Any,
    ) -> Samples:
        host, port = split_url(server.url)
        spec = LoadSpec(
            host=host,
            port=port,
            path="/predict",
            bodies=(bodies or self.bodies).bodies,
            load="open" if load == "open" else "closed",
            concurrency=users,
            rate=rate,
            warmup_s=warmup,
            duration_s=kw.get("duration", self.options.duration_s),
            max_requests=kw.get("max_requests", LoadSpec.max_requests),
            timeout_s=60.0,
            token=self.options.api_key,
        )
        return run_load(spec, stop=self.stop, probe=server.cpu_seconds if "duration" not in kw else None)


def run_overload(
    options: OverloadOptions, store: Store, stop: threading.Event, watch: Callable[[int, str], None] | None = None
) -> int:
    """Run every phase against one fresh `hare serve`; returns the run id. `watch`: called with the server's
    process group and "warm", then each phase's name as it ends (scripts/overload-memory.py reads its memory)."""
    sc = _Scenario(options, store, stop)
    console = wide_console()
    sc.run_id = store.create_run(
        "overload",
        task=sc.task,
        target=str(options.bundle),
        manifest_hash=manifest_hash(options.bundle),
        machine=describe(),
        versions=versions(VERSIONED),
        settings={k: str(v) for k, v in options.__dict__.items()},
    )
    try:
        return _phases(options, sc, store, stop, console, watch)
    except BaseException as exc:  # a server that did not start, a stop while it started: never left "running"
        message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
        store.finish_run(sc.run_id, "cancelled" if stop.is_set() else "failed", message)
        raise


def _phases(
    options: OverloadOptions,
    sc: _Scenario,
    store: Store,
    stop: threading.Event,
    console: Any,
    watch: Callable[[int, str], None] | None,
) -> int:
    rss: dict[str, float] = {}
    pss: dict[str, float] = {}  # the whole server's memory, shared pages counted once (group_pss_mb)
    server = hare_server(options.bundle, extra=list(options.serve_args))
    with server.start():
        server.wait_ready(stop=stop)
        assert server.proc is not None
        pgid = server.proc.pid
        time.sleep(1.0)
        rss["warm"] = max(group_rss_mb(pgid).values())
        pss["warm"] = sum(group_pss_mb(pgid).values())
        if watch is not None:
            sc.watch = functools.partial(watch, pgid)
        sc.watch("warm")
        users = 2 * sc.cores
        one = sc.point("one-user", sc.load(server, "closed", 1), "closed", 1, 0.0)
        # The reference right after the phase it divides, the server idle meanwhile: this VM's speed drifts
        # by several percent over the minutes the later phases take.
        model_p50 = _model_p50(options, sc, stop)
        for seq in options.tail_seqs:
            bodies = make_bodies(sc.task, 1, seq, sc.maker)
            for n in (sc.cores, TAIL_USERS):
                samples = sc.load(server, "closed", n, bodies=bodies)
                sc.point(f"tail-{seq}t-{n}u", samples, "closed", n, 0.0, seq, bodies)
        for r in range(1, options.rounds + 1):
            cap = sc.point(_named("capacity", r), sc.load(server, "closed", users), "closed", users, 0.0)
            if stop.is_set():  # a capacity cut short gives no rate to ask for
                break
            rate = options.factor * cap.req_s
            opened = sc.load(server, "open", rate=rate, warmup=1.0)
            sc.point(_named(f"open-{options.factor:g}x", r), opened, "open", 0, rate)
            flood = sc.load(server, "closed", options.flood, warmup=options.flood * 0.006 + 2)
            rss["flood"] = max(rss.get("flood", 0.0), *group_rss_mb(pgid).values())
            pss["flood"] = max(pss.get("flood", 0.0), sum(group_pss_mb(pgid).values()))
            sc.point(_named("flood", r), flood, "closed", options.flood, 0.0, rss_mb=rss["flood"])
            sc.point(_named("recovery", r), sc.load(server, "closed", users, warmup=0.0), "closed", users, 0.0)
            if stop.is_set():
                break
        if options.soak_s > 0:
            _soak(sc, server, pgid, users, rss)
    model_p50_end = _model_p50(options, sc, stop)
    file_mb = model_bytes(options.bundle) / 2**20
    # What the goals need beyond the points, so that a stored run's goals can be judged again (stored_goals).
    summary = {
        "model_p50_ms": model_p50,
        "model_p50_end_ms": model_p50_end,
        "rss_mb": rss,
        "pss_mb": pss,
        "file_mb": file_mb,
    }
    store.update_run(sc.run_id, summary=summary)
    store.finish_run(sc.run_id, "cancelled" if stop.is_set() else "done", "")
    here = describe()
    console.print(
        f"run {sc.run_id}: {options.bundle} at {options.seq_len} tokens, {sc.cores} cores of {here['cpu']} "
        f"(int8 path {here['int8_path']}; flags {' '.join(here['flags'])})"
    )
    console.print(
        f"  model-only, one thread, in process: p50 {model_p50:.1f} ms right after the one-user phase "
        f"({model_p50_end:.1f} ms at the end)"
    )
    for name, p in sc.points.items():
        capacity = sc.points.get(_named("capacity", _phase(name)[1]))
        per_answer = server_cores(capacity) / max(capacity.req_s, 1e-9) if capacity else math.nan
        console.print(phase_line(name, p, capacity.req_s if capacity else math.nan, per_answer))
    for note in memory_notes(summary):
        console.print(f"  {note}")
    if stop.is_set():  # phases cut short judge nothing ("N s after the flood / capacity: 0")
        console.print("  cancelled: the goals are not judged on phases cut short")
        return sc.run_id
    for goal in evaluate(sc.points, one.lat_p50, model_p50, rss, file_mb, sc.cores):
        console.print(goal)
    return sc.run_id


def _named(phase: str, round_: int) -> str:
    """A phase's name in its round: the first round's plain, later ones `capacity#2` and so on."""
    return phase if round_ == 1 else f"{phase}#{round_}"


def _phase(name: str) -> tuple[str, int]:
    """A stored phase's name and round (`flood#2` -> flood, 2)."""
    phase, _, round_ = name.partition("#")
    return phase, int(round_) if round_.isdigit() else 1


def _rounds(points: Mapping[str, Point]) -> list[dict[str, Point]]:
    """The phases of each round that measured its capacity, by their names without the round."""
    rounds: dict[int, dict[str, Point]] = {}
    for name, p in points.items():
        phase, r = _phase(name)
        rounds.setdefault(r, {})[phase] = p
    return [phases for _, phases in sorted(rounds.items()) if "capacity" in phases]


def _model_p50(options: OverloadOptions, sc: _Scenario, stop: threading.Event) -> float:
    """The bundle's one-thread session in this process at the scenario's length: p50 in ms."""
    model = modelonly.measure(options.bundle, sc.maker, options.seq_len, 1, 1, 1.0, 3.0, stop=stop)
    return modelonly.summary(model).p50


def _soak(sc: _Scenario, server: ServerProcess, pgid: int, users: int, rss: dict[str, float]) -> None:
    series: list[dict[int, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            series.append(group_rss_mb(pgid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # Time-bound only: at the load generator's default cap (100,000 answers) a fast bundle's 30-minute soak
    # ended after 20 minutes.
    soak = sc.load(server, "closed", users, warmup=0.0, duration=sc.options.soak_s, max_requests=2**62)
    done.set()
    sampler.join()
    if len(series) >= 2:
        rss["soak_start"], rss["soak_end"] = max(series[0].values()), max(series[-1].values())
    sc.point("soak", soak, "closed", users, 0.0, rss_series=[{str(k): v for k, v in s.items()} for s in series])


def unanswered(p: Point) -> int:
    """Requests that got no HTTP answer at all: the connection failed or the client timed out."""
    return p.errors.get(CONNECT, 0) + p.errors.get(TIMEOUT, 0)


def server_cores(p: Point) -> float:
    """The server's CPU over the phase, in cores (NaN when not measured). Runs stored before 2026-11-30 kept it
    in `extra["server_cores"]`, where the tables and the results page did not show it."""
    if p.server_cpu is not None:
        return p.server_cpu
    return float(p.extra.get("server_cores", math.nan))


def refusal_cost_us(p: Point, per_answer: float) -> float:
    """Server CPU per refusal in µs: the phase's CPU less its answers' (at the capacity phase's cost each)."""
    refused = p.errors.get("429", 0) / max(p.duration_s, 1e-9)
    if refused <= 0 or math.isnan(server_cores(p)):
        return math.nan
    return max(0.0, server_cores(p) - p.req_s * per_answer) / refused * 1e6


def phase_line(name: str, p: Point, capacity: float, per_answer: float) -> str:
    refused = p.errors.get("429", 0)
    other = sum(v for k, v in p.errors.items() if k[0] in "45" and k != "429")
    server_p99 = p.server.get("compute_p99", math.nan)
    cost = refusal_cost_us(p, per_answer)
    each = f", {cost:.0f} µs CPU each" if not math.isnan(cost) else ""  # none refused: no cost to give
    return (
        f"  {name:<10} {p.req_s:7.1f} req/s ({p.req_s / max(capacity, 1e-9):4.0%} of capacity)  "
        f"p50 {p.lat_p50:8.1f} ms  p99 {p.lat_p99:8.1f} ms  server p99 {server_p99:7.1f} ms  "
        f"refused {refused} ({refused / max(p.duration_s, 1e-9):.0f}/s{each})  unanswered {unanswered(p)}  "
        f"other errors {other}  "
        f"server CPU {server_cores(p):.2f} cores"
    )


def evaluate(
    points: Mapping[str, Point],
    one_p50: float,
    model_p50: float | None,
    rss: dict[str, float],
    file_mb: float | None,
    cores: int | None = None,
) -> list[str]:
    """One line per goal of issues 12 and 19: the figure, the target, met or not. A goal past capacity is judged
    on the median of its rounds (each against its own round's capacity), a count on their sum. A goal whose
    figure is unknown (model_p50 or file_mb None: a run stored before they were kept) is left out; `cores`
    defaults to this machine's."""

    def line(goal: str, value: float | Sequence[float], target: float, higher: bool, unit: str = "") -> str:
        values = [value] if isinstance(value, float | int) else list(value)
        figure = statistics.median(values)
        met = figure >= target if higher else figure <= target
        spread = f" (median of {len(values)} rounds, {_figure(min(values))}-{_figure(max(values))})"
        return (
            f"{'met ' if met else 'MISS'}  {goal}: {_figure(figure)}{unit}{spread if len(values) > 1 else ''} "
            f"(goal {'≥' if higher else '≤'} {_figure(target)}{unit})"
        )

    out = []
    if model_p50 is not None:
        out.append(line("one user p50 / one-thread model-only p50", one_p50 / model_p50, 0.7, False))
    cores = cores or physical_cores()
    rounds = _rounds(points)
    for name, p in points.items():
        if name.startswith("tail-"):
            target = 1.5 if p.concurrency <= cores else 2.0
            read = p.extra.get("read_p99", math.nan) / p.extra.get("read_p50", math.nan)
            out.append(
                line(
                    f"{name} ({p.seq_len} tokens, {p.concurrency} users): p99 / p50",
                    p.lat_p99 / p.lat_p50,
                    target,
                    False,
                )
                + f"; as the load generator read them {_figure(read)}"
            )
    for name in sorted({phase for phases in rounds for phase in phases if phase.startswith("open-")}):
        opened = [phases[name] for phases in rounds if name in phases]
        goodput = [phases[name].req_s / phases["capacity"].req_s for phases in rounds if name in phases]
        refused = sum(p.errors.get("429", 0) - int(p.extra["retry_after"]) for p in opened)
        bad = sum(v for p in opened for k, v in p.errors.items() if k.startswith("5"))
        p99 = [p.lat_p99 for p in opened]
        out.append(line(f"{name}: accepted answers' p99 from the intended send time", p99, 2000, False, " ms"))
        out.append(line(f"{name}: goodput / capacity", goodput, 0.8, True))
        never = sum(unanswered(p) for p in opened)
        out.append(line(f"{name}: requests never answered (connect failures, timeouts)", never, 0, False))
        out.append(line(f"{name}: refusals without Retry-After", refused, 0, False))
        out.append(line(f"{name}: 5xx answers", bad, 0, False))
    for phase, goal, target in (("flood", "flood goodput", 0.8), ("recovery", _after_flood(rounds), 0.9)):
        if ratios := [phases[phase].req_s / phases["capacity"].req_s for phases in rounds if phase in phases]:
            out.append(line(f"{goal} / capacity", ratios, target, True))
    for when, key in (("warm", "warm"), ("flood", "flood"), ("the soak", "soak_end")):
        if key in rss and file_mb is not None:
            out.append(line(f"largest process RSS after {when} - model file", rss[key] - file_mb, 200, False, " MB"))
    if "soak_start" in rss:
        out.append(line("RSS growth over the soak", rss["soak_end"] / rss["soak_start"] - 1, 0.05, False))
    return out


def _after_flood(rounds: Sequence[Mapping[str, Point]]) -> str:
    """The recovery goal's name, with the seconds its phase recorded (--duration): a fixed "10 s" misnamed a
    run at any other duration."""
    seconds = [phases["recovery"].duration_s for phases in rounds if "recovery" in phases]
    return f"{_figure(statistics.median(seconds)) if seconds else '-'} s after the flood"


def memory_notes(summary: Mapping[str, Any]) -> list[str]:
    """The server's memory at each moment measured: the largest process's RSS, and the whole server's PSS (a run
    stored before it was measured has none)."""
    out = []
    for what, key in (("largest process RSS (MB)", "rss_mb"), (PSS_NOTE, "pss_mb")):
        if figures := summary.get(key):
            out.append(f"{what}: {', '.join(f'{k} {v:.0f}' for k, v in figures.items())}")
    return out


def stored_goals(run: Run, points: Sequence[Point]) -> list[str]:
    """The goal lines of a stored overload run, judged from its points and summary on the cores it ran on."""
    phases = {str(p.extra.get("scenario", "")): p for p in points}
    if "capacity" not in phases:  # cut short before the capacity every later goal is measured against
        return []
    one = phases.get("one-user")
    return evaluate(
        phases,
        one.lat_p50 if one else math.nan,
        run.summary.get("model_p50_ms"),
        run.summary.get("rss_mb", {}),
        run.summary.get("file_mb"),
        run.machine.get("physical_cores"),
    )


def _figure(value: float) -> str:
    """Three significant digits, never an exponent: 1121 ms reads as 1121, not 1.12e+03."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
