"""One benchmark run: plan the grid's points for hare, the baselines and the model-only figure, start and stop
the servers, measure each point, and store it as it finishes.

Order: for each hare worker count, start `hare serve` (unless a URL was given) and measure every point;
then each baseline the same way on the same inputs; then the model-only figures, with no server running.
With `rounds` above one, that order is run that many times, every other round backwards (a slow spell of a
shared machine then falls on every target rather than on one), and each point is stored once: its median
round by req/s, with every round's figures beside it (`extra["rounds"]`), from which `ratios` takes the median
of the rounds' ratios.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any, Literal

from bench import modelonly
from bench.inputs import Bodies, TextMaker, load_tokenizer, make_bodies
from bench.loadgen import CONNECT, TIMEOUT, LoadSpec, latency_summary, run_load
from bench.points import Planned, make_point
from bench.progress import Reporter, model_only_streams_cap
from bench.records import ROUND_FIGURES, Point
from bench.servers import ServerProcess, baseline_server, get_json, hare_server, loop_cpu_seconds, split_url
from bench.store import BASELINES, Store
from bench.subjects import VERSIONED, Subject, check_model_dir, info_json, manifest_hash
from container.bundle import read_manifest
from container.machine import describe, physical_cores, versions
from tasks.errors import HareError, InputError

Load = Literal["closed", "open"]


@dataclass(frozen=True)
class Grid:
    """The points of a run. seq_lens: exact token counts, or mixes of lengths by name (bench.inputs.MIXES).
    workers, threads: hare worker counts and ORT threads per worker to start the server with (None: its
    default); every combination is a server start. Ignored for a URL."""

    seq_lens: list[int | str] = field(default_factory=lambda: [8, 128])
    batches: list[int] = field(default_factory=lambda: [1])
    concurrencies: list[int] = field(default_factory=lambda: [physical_cores()])
    rates: list[float] = field(default_factory=list)
    load: Load = "closed"
    workers: list[int | None] = field(default_factory=lambda: [None])
    threads: list[int | None] = field(default_factory=lambda: [None])
    warmup_s: float = 2.0
    duration_s: float = 10.0
    max_requests: int = 100_000
    timeout_s: float = 60.0
    bodies: int = 512

    def loads(self) -> list[tuple[int, float]]:
        """(concurrency, rate) pairs: users for closed loop, arrival rates for open loop."""
        if self.load == "open":
            if not self.rates:
                raise InputError("open loop needs at least one --rate")
            return [(0, r) for r in self.rates]
        return [(c, 0.0) for c in self.concurrencies]


@dataclass(frozen=True)
class RunOptions:
    subject: Subject
    grid: Grid
    baselines: list[str] = field(default_factory=list)
    model_only: bool = True
    comet_workers: int = field(default_factory=physical_cores)
    kind: str = "run"
    name: str = ""
    serve_args: list[str] = field(default_factory=list)
    rounds: int = 1  # passes over every target's points (see the module's docstring)
    token: str | None = field(default=None, repr=False)  # hare's admin token for /info and /metrics (bench_token)
    api_key: str | None = field(default=None, repr=False)  # hare's API key for /predict (bench_api_key)


def plan(options: RunOptions) -> list[Planned]:
    grid = options.grid
    points: list[Planned] = []
    shape = [(s, b, c, r) for s in grid.seq_lens for b in grid.batches for c, r in grid.loads()]
    servers = [(w, t) for w in grid.workers for t in grid.threads] if options.subject.url is None else [(None, None)]
    for w, t in servers:
        points += [Planned("hare", w, t, s, b, c, r) for s, b, c, r in shape]
    for name in options.baselines:
        w = 1 if name == "vanilla" else options.comet_workers
        points += [Planned(name, w, None, s, b, c, r) for s, b, c, r in shape]
    if options.model_only and options.subject.bundle is not None:
        # One stream alone, and as many side by side as the load keeps busy (at most one per core).
        streams = sorted({1} | {min(c, model_only_streams_cap()) for c, _ in grid.loads() if c > 0})
        points += [
            Planned("model-only", 1, None, s, b, n, 0.0) for s in grid.seq_lens for b in grid.batches for n in streams
        ]
    return points


class Runner:
    def __init__(self, options: RunOptions, store: Store, reporter: Reporter, stop: threading.Event) -> None:
        self.options = options
        self.store = store
        self.reporter = reporter
        self.stop = stop
        self.subject = options.subject
        self.maker = TextMaker(load_tokenizer(self.subject.tokenizer)) if self.subject.tokenizer else None
        self._bodies: dict[tuple[int | str, int], Bodies] = {}
        self.k = 0
        self.failures: list[str] = []
        self.hare_threads = 1
        self.max_length: int | None = None  # the bundle's; longer inputs are truncated to it
        self._rounds: dict[Planned, list[Point]] = {}  # with several rounds: each point's passes, held
        self._answers: dict[str, Counter[str]] = {}  # each HTTP target's answers over its points, by status
        self.stopped: list[str] = []  # HTTP targets that stopped answering mid-run (their later points not measured)

    def run(self) -> int:
        """Measure every planned point; returns the run id (its status says how it ended)."""
        options, subject = self.options, self.subject
        if any(b not in BASELINES for b in options.baselines):
            raise InputError(f"unknown baseline in {options.baselines}; choose from {', '.join(BASELINES)}")
        if options.baselines and subject.model_dir is None:
            raise InputError("the baselines need the model folder the bundle was built from; pass --model MODEL_DIR")
        if options.baselines and subject.model_dir is not None:
            check_model_dir(subject.model_dir, subject.bundle)
        exact = [n for n in options.grid.seq_lens if isinstance(n, int)]
        if exact and self.maker is None:  # else a run was stored, then failed at its first point
            raise InputError(
                f"exact token lengths (--seq {','.join(map(str, exact))}) need the served model's tokenizer: pass "
                "--bundle BUNDLE or --tokenizer TOKENIZER_JSON, or measure a mix of texts (--seq mix or comet)"
            )
        if options.rounds < 1:
            raise InputError(f"--rounds must be 1 or more, got {options.rounds}")
        if subject.bundle is not None:
            limit = self.max_length = read_manifest(subject.bundle).max_length
            too_long = [n for n in options.grid.seq_lens if isinstance(n, int) and n > limit]
            if too_long:
                raise InputError(f"sequence lengths {too_long} exceed the bundle's max_length {limit}")
        planned = plan(options)
        run_id = self.store.create_run(
            options.kind,
            name=options.name,
            task=subject.task,
            target=subject.label,
            manifest_hash=manifest_hash(subject.bundle),
            machine=describe(),
            versions=versions(VERSIONED),
            settings={
                "grid": asdict(options.grid),
                "baselines": options.baselines,
                "model_only": options.model_only,
                "comet_workers": options.comet_workers,
                "bundle": str(subject.bundle) if subject.bundle else None,
                "model_dir": str(subject.model_dir) if subject.model_dir else None,
                "url": subject.url,
                "serve_args": options.serve_args,
                "rounds": options.rounds,
            },
        )
        n = len(planned) * options.rounds
        self.reporter.start(run_id, n, str(self.store.path))
        status, message = "done", ""
        groups = _groups(planned)
        order = [group for r in range(options.rounds) for group in (groups if r % 2 == 0 else groups[::-1])]
        try:
            for group in order:
                if self.stop.is_set():
                    break
                self._measure_group(run_id, group, n)
        except HareError as exc:
            status, message = "failed", exc.message
        except Exception as exc:
            status, message = "failed", f"{type(exc).__name__}: {exc}"
            self._store_rounds(planned)
            self.store.finish_run(run_id, status, message)
            self.reporter.done(run_id, status, message)
            raise
        self._store_rounds(planned)
        if self.stop.is_set():
            status, message = "cancelled", "stopped by a signal"
        elif status == "done":
            # A target no request of which was answered is no measurement: a server that answers GET /info as
            # hare does and fails every /predict (another task's, a broken model) was a run done, exit 0.
            unanswered = [t for t, answers in self._answers.items() if not answers["200"]]
            self.failures += [_unanswered(t, self._answers[t], subject.task, self.options.api_key) for t in unanswered]
            if self.failures:
                message = "; ".join(self.failures)
                status = "failed" if self.k == 0 or "hare" in unanswered or "hare" in self.stopped else "done"
        self.store.finish_run(run_id, status, message)
        self.reporter.done(run_id, status, message)
        return run_id

    # -- one server's points ---------------------------------------------------------------------------------

    def _measure_group(self, run_id: int, group: list[Planned], n: int) -> None:
        target = group[0].target
        k0 = self.k
        if target == "model-only":
            for p in group:
                if self.stop.is_set():
                    return
                self._model_only(run_id, p, n)
            return
        try:
            with self._server(group[0]) as (url, server):
                try:
                    token = self.options.token if target == "hare" else None
                    status, body = get_json(url, "/info", token=token)
                except OSError as exc:
                    reason = os.strerror(exc.errno) if exc.errno else str(exc)  # asyncio's strerror repeats the address
                    raise InputError(f"{url} does not answer ({reason}): start the server, or check the URL") from exc
                info = info_json(body) if status == 200 else {}
                # Else 1,123 501s were stored as a run done: a web server that is not hare (a 404, or a page
                # that happens to be at /info) was measured.
                if target == "hare" and status == 401:
                    raise InputError(_needs_token(url, token))
                if target == "hare" and (status != 200 or "task" not in info):
                    got = f"status {status}" if status != 200 else f"status 200 and {_excerpt(body)}, not its JSON"
                    raise InputError(f"{url} does not answer GET /info as a hare server does ({got}): check the URL")
                if target == "hare":
                    self._check_served(url, info)
                    self.hare_threads = int(info.get("threads") or 1)
                for p in group:
                    if self.stop.is_set():
                        return
                    self._http_point(run_id, p, url, server, info, n)
        except HareError as exc:
            if target == "hare" and self.subject.url is not None:
                raise
            self.failures.append(f"{target}: {exc.message}")
            self.reporter.log(f"{target} skipped: {exc.message}")
            self.k = k0 + len(group)  # keep k of n honest: the points not measured will not come

    def _check_served(self, url: str, info: dict[str, Any]) -> None:
        """InputError where a running server serves another task, or another variant than --bundle's: the run
        was stored under the bundle's task and manifest, beside its model-only figures, as that server's."""
        subject = self.subject
        said = f"--bundle {subject.bundle}" if subject.bundle is not None else "--task"
        if info.get("task") != subject.task:
            raise InputError(f"{url} serves {info.get('task')}, not {subject.task} as {said} says: check the URL")
        variant = read_manifest(subject.bundle).variant if subject.bundle is not None else None
        if variant is not None and "variant" in info and info["variant"] != variant:
            raise InputError(
                f"{url} serves the {info.get('variant')} variant, not {said}'s {variant}: give the bundle it serves"
            )

    @contextlib.contextmanager
    def _server(self, p: Planned) -> Iterator[tuple[str, ServerProcess | None]]:
        target = p.target
        if target == "hare" and self.subject.url is not None:
            yield self.subject.url, None
            return
        if target == "hare":
            assert self.subject.bundle is not None
            server = hare_server(self.subject.bundle, p.workers, p.threads, self.options.serve_args)
        else:
            assert self.subject.model_dir is not None
            server = baseline_server(self.subject.model_dir, self.subject.task, target, p.workers or 1)
        self.reporter.server(target, "starting", server.url)
        with server.start():
            server.wait_ready(stop=self.stop)
            self.reporter.server(target, "ready", server.url)
            try:
                yield server.url, server
            finally:
                server.stop()
                self.reporter.server(target, "stopped", server.url)

    def bodies(self, seq_len: int | str, batch: int) -> Bodies:
        key = (seq_len, batch)
        if key not in self._bodies:
            made = make_bodies(self.subject.task, batch, seq_len, self.maker, self.options.grid.bodies)
            if self.max_length is not None and made.tokens_per_sequence > self.max_length:
                made = Bodies(made.bodies, made.batch, float(self.max_length))  # what the server keeps
            self._bodies[key] = made
        return self._bodies[key]

    def _settings(self, p: Planned, workers: int, threads: int) -> dict[str, Any]:
        g = self.options.grid
        return {
            "target": p.target,
            "load": "in-process" if p.target == "model-only" else g.load,
            "workers": workers,
            "threads": threads,
            "seq_len": p.seq_len,
            "batch": p.batch,
            "concurrency": p.concurrency,
            "rate": p.rate,
            "warmup_s": g.warmup_s,
            "duration_s": g.duration_s,
        }

    def _http_point(
        self, run_id: int, p: Planned, url: str, server: ServerProcess | None, info: dict[str, Any], n: int
    ) -> None:
        g = self.options.grid
        workers = int(info.get("workers") or p.workers or 0)
        threads = int(info.get("threads") or p.threads or 0)
        self.k += 1
        k = self.k
        self.reporter.point_start(k, n, p.target, self._settings(p, workers, threads))
        bodies = self.bodies(p.seq_len, p.batch)
        host, port = split_url(url)
        spec = LoadSpec(
            host=host,
            port=port,
            path="/predict",
            bodies=bodies.bodies,
            load=g.load,
            concurrency=p.concurrency,
            rate=p.rate,
            warmup_s=g.warmup_s,
            duration_s=g.duration_s,
            max_requests=g.max_requests,
            timeout_s=g.timeout_s,
            token=self.options.api_key if p.target == "hare" else None,
        )
        samples = run_load(
            spec,
            stop=self.stop,
            on_tick=lambda figures: self.reporter.tick(k, n, figures),
            probe=server.cpu_seconds if server is not None else None,
            own_probe=partial(loop_cpu_seconds, url, self.options.token) if p.target == "hare" else None,
        )
        window = max(samples.window_s, 1e-9)
        tokens = bodies.tokens_per_sequence
        lat = latency_summary(samples)
        # Cores per server process, busiest first: a worker near 0 while another is near 1 means the
        # connections (keep-alive) all landed on one worker.
        cores = samples.server_cores()
        by_process = sorted((round(c, 3) for c in cores.values()), reverse=True) if cores is not None else None
        point = make_point(
            run_id,
            k,
            p.target,
            g.load,
            workers,
            threads,
            p,
            tokens,
            samples.window_s,
            samples.requests,
            samples.ok,
            samples.errors(),
            lat,
            server=samples.server_figures(),
            client_cpu=samples.cpu_s / window,
            server_cpu=sum(by_process) if by_process is not None else None,
            answered=samples.answered,
            extra={
                "inputs": inputs(p.seq_len),
                "url": url,
                "streams": info.get("streams"),  # model streams per worker (hare servers only)
                "server_cpu_by_process": by_process,
                # Cores the event loops spent on their own work (the model calls left out): the server's own cost.
                "own_cores": samples.own_s / (samples.probe_s or window) if samples.own_s is not None else None,
            },
        )
        self._answers.setdefault(p.target, Counter()).update({"200": point.ok, **point.errors})
        self._keep(p, point, k, n)
        if point.ok == 0 and point.errors.get(CONNECT):
            # It answered GET /info and earlier points, and now takes no connection: it died. Its later points
            # would each be 0 answers and thousands of connect errors, stored and charted as 0 req/s.
            self.stopped.append(p.target)
            raise InputError(
                f"{p.target} stopped answering at point {k}: 0 answers, {_statuses(Counter(point.errors))}; "
                "its later points were not measured"
            )
        if point.ok == 0 and set(point.errors) == {"401"}:
            # A key it lacks or got wrong is refused at every later point too: said now, not after the grid.
            self.stopped.append(p.target)
            raise InputError(_unanswered(p.target, Counter(point.errors), self.subject.task, self.options.api_key))
        if by_process and workers > 1 and sum(by_process) > 0.2 and by_process[0] > 0.85 * sum(by_process):
            self.reporter.log(
                f"{p.target}: one server process used {by_process[0] / sum(by_process):.0%} of the server's CPU "
                "in this point: the keep-alive connections probably all landed on one worker"
            )

    def _model_only(self, run_id: int, p: Planned, n: int) -> None:
        assert self.subject.bundle is not None and self.maker is not None
        g = self.options.grid
        threads = self.hare_threads
        self.k += 1
        k = self.k
        self.reporter.point_start(k, n, p.target, self._settings(p, 1, threads))
        result = modelonly.measure(
            self.subject.bundle,
            self.maker,
            p.seq_len,
            p.batch,
            threads,
            warmup_s=min(g.warmup_s, 1.0),
            duration_s=min(g.duration_s, 3.0),
            stop=self.stop,
            streams=p.concurrency,
        )
        window = max(result.window_s, 1e-9)
        tokens = self.bodies(p.seq_len, p.batch).tokens_per_sequence
        lat = modelonly.summary(result)
        point = make_point(
            run_id,
            k,
            "model-only",
            "in-process",
            1,
            threads,
            dataclasses.replace(p, rate=0.0),
            tokens,
            result.window_s,
            len(result.latencies_ms),
            len(result.latencies_ms),
            {},
            lat,
            server={"tokenize_avg": result.tokenize_ms},
            client_cpu=result.cpu_s / window,
            extra={"inputs": inputs(p.seq_len)},
        )
        self._keep(p, point, k, n)

    def _keep(self, p: Planned, point: Point, k: int, n: int) -> None:
        """Store a measured point as it finishes; with several rounds, hold it until the rounds end."""
        if self.options.rounds == 1:
            self.store.add_point(point)
        else:
            self._rounds.setdefault(p, []).append(point)
        self.reporter.point(k, n, point)

    def _store_rounds(self, planned: list[Planned]) -> None:
        """Each held point's median round by req/s (the lower of two middle ones), numbered in plan order, with
        every round's req/s and latencies beside it; a cancelled run keeps the rounds it finished."""
        for idx, p in enumerate(dict.fromkeys(planned), 1):
            passes = self._rounds.pop(p, [])
            if not passes:
                continue
            median = sorted(passes, key=lambda q: q.req_s)[(len(passes) - 1) // 2]
            rounds = {k: [getattr(q, k) for q in passes] for k in ROUND_FIGURES}
            self.store.add_point(dataclasses.replace(median, idx=idx, extra={**median.extra, "rounds": rounds}))


def _groups(planned: list[Planned]) -> list[list[Planned]]:
    """Consecutive points that share a server (target, workers and threads)."""
    out: list[list[Planned]] = []
    for p in planned:
        last = out[-1][0] if out else None
        if last is not None and (last.target, last.workers, last.threads) == (p.target, p.workers, p.threads):
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _unanswered(target: str, answers: Counter[str], task: str, api_key: str | None) -> str:
    """Why none of a target's requests was answered, and what to check."""
    if {status for status, n in answers.items() if n} == {"401"}:
        check = "set HARE_API_KEY to its API key: the bench sends it as the bearer token on POST /predict"
        check = f"it refuses the HARE_API_KEY the bench sent; {check}" if api_key else f"it has an API key; {check}"
    else:
        check = f"check that it serves {task} at POST /predict, and its log"
    return f"{target}: every request failed ({_statuses(answers)}): {check}"


def _statuses(answers: Counter[str]) -> str:
    """What a target's requests got, such as "1,123 answered 501, 2 timed out" (the load generator's statuses)."""
    said = {CONNECT: "could not connect", TIMEOUT: "timed out"}
    got = [f"{n:,} {said.get(status, f'answered {status}')}" for status, n in sorted(answers.items()) if n]
    return ", ".join(got) or "none was sent"


def _excerpt(body: bytes) -> str:
    """The start of an answer that is not hare's /info, as a user would recognize it (an HTML page, an error)."""
    lines = body[:200].decode("utf-8", "replace").strip().splitlines()
    if not lines:
        return "an empty body"
    return repr(lines[0][:40]) + ("..." if len(lines) > 1 or len(lines[0]) > 40 else "")


def inputs(seq_len: int | str) -> str:
    """What a point's texts were, as stored with it: "exact" token counts, or the mix's name."""
    return "exact" if isinstance(seq_len, int) else seq_len


def _needs_token(url: str, token: str | None) -> str:
    """Why a hare server refused GET /info with a 401: it has an admin token (HARE_ADMIN_TOKEN) the bench lacks."""
    if token:
        return (
            f"{url} refuses the admin token the bench sent to GET /info (status 401): set HARE_BENCH_TOKEN to its "
            "HARE_ADMIN_TOKEN"
        )
    return (
        f"{url} needs its admin token for GET /info (status 401): set HARE_BENCH_TOKEN (or HARE_ADMIN_TOKEN) to the "
        "server's HARE_ADMIN_TOKEN before `hare bench run`"
    )
