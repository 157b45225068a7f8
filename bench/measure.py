"""The `hare bench` subcommands that measure (bench/cli.py parses them): run, headline, overload, peers,
bulk, model, ceiling. Each records what it measured in the result store and prints it; SIGINT or SIGTERM
cancels it cleanly (exit status CANCELLED)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from bench.geometries import GEOMETRIES
from bench.readout import open_store, print_run
from bench.store import Store
from bench.tables import wide_console
from tasks.errors import HareError, InputError

CANCELLED = 130  # 128 + SIGINT, as a shell reports a process it interrupted


@contextlib.contextmanager
def cancellable() -> Iterator[threading.Event]:
    """SIGINT, SIGTERM and SIGHUP set the event instead of killing the process, so servers are stopped cleanly."""
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # SIGHUP too: a closed terminal or a dropped SSH session left the server running and the run "running".
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def run(args: argparse.Namespace) -> int:
    from bench.progress import reporter

    try:
        return _run_checked(args)
    except HareError as exc:
        if args.progress == "jsonl":  # the console waits for a final line even when the run never started
            reporter("jsonl").done(None, "failed", exc.message)
        raise


def _run_checked(args: argparse.Namespace) -> int:
    from bench.progress import reporter
    from bench.runner import Grid, Runner, RunOptions
    from bench.servers import bench_api_key, bench_token
    from bench.subjects import resolve

    subject = resolve(args.target, args.task, args.model, args.bundle, args.tokenizer)
    if args.quick:
        grid = Grid(seq_lens=[8, 16], batches=[1], concurrencies=[1], warmup_s=0.3, duration_s=1.0, bodies=32)
    else:
        grid = Grid(
            seq_lens=args.seq,
            batches=args.batch,
            concurrencies=args.concurrency,
            rates=args.rate,
            load=args.load,
            workers=list(args.workers) if args.workers else [None],
            threads=list(args.threads) if args.threads else [None],
            warmup_s=args.warmup,
            duration_s=args.duration,
            max_requests=args.max_requests,
            timeout_s=args.timeout,
        )
    options = RunOptions(
        subject=subject,
        grid=grid,
        baselines=args.baseline,
        model_only=not args.no_model_only,
        comet_workers=args.comet_workers,
        kind="quick" if args.quick else "run",
        name=args.name,
        serve_args=args.serve_arg,
        rounds=args.rounds,
        token=bench_token(),
        api_key=bench_api_key(),
    )
    store = open_store(args)
    rep = reporter(args.progress)
    with cancellable() as stop:
        run_id = Runner(options, store, rep, stop).run()
    return _ended(store, run_id, show=args.progress != "jsonl")  # jsonl keeps stdout machine-readable


def headline(args: argparse.Namespace) -> int:
    from bench.headline import HeadlineOptions, run_headline

    store = open_store(args)
    with cancellable() as stop:
        status = run_headline(
            HeadlineOptions(
                duration_s=args.duration,
                warmup_s=args.warmup,
                seq_lens=args.seq,
                embeddings=not args.no_embeddings,
                progress=args.progress,
            ),
            store,
            stop,
        )
    return CANCELLED if status == "cancelled" else (0 if status == "done" else 1)


def overload(args: argparse.Namespace) -> int:
    from bench.overload import OverloadOptions, run_overload
    from bench.servers import bench_api_key

    _check_rounds(args.rounds)
    tail = () if args.no_tail else tuple(args.tail)
    serve_args = tuple(args.serve_arg)
    options = OverloadOptions(
        args.bundle,
        args.seq,
        args.factor,
        args.flood,
        args.duration,
        args.soak,
        serve_args,
        tail,
        args.rounds,
        api_key=bench_api_key(),
    )
    with cancellable() as stop:
        run_overload(options, open_store(args), stop)
    return CANCELLED if stop.is_set() else 0


def peers(args: argparse.Namespace) -> int:
    from bench.peers.options import CANDIDATES, PeersOptions
    from bench.peers.runner import run_peers
    from bench.subjects import bundle_for_model
    from container.defaults import DEFAULT_TASK, default_model_dir

    model_dir = args.model_dir or default_model_dir()
    if not (model_dir / "config.json").is_file():
        raise InputError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    bundle = args.bundle or bundle_for_model(model_dir, DEFAULT_TASK)
    chosen = tuple(args.only) if args.only else CANDIDATES
    if args.only and "torch" not in chosen:
        chosen = ("torch", *chosen)
    options = PeersOptions(
        model_dir=model_dir,
        bundle=bundle,
        seq_len=args.seq,
        batch=args.batch,
        threads=tuple(args.threads),
        rounds=args.rounds,
        seconds=args.seconds,
        fidelity=args.fidelity,
        fidelity_max=args.fidelity_max,
        candidates=tuple(c for c in chosen if c not in args.skip),
        int8_config=args.int8_config,
        work=args.work,
        name=args.name,
    )
    store = open_store(args)
    with cancellable() as stop:
        run_id, _ = run_peers(options, store, stop)
    return _ended(store, run_id)


def bulk(args: argparse.Namespace) -> int:
    from bench.bulk import BulkOptions, run_bulk
    from bench.bulk_peers import PEERS
    from container.bundle import read_manifest
    from container.defaults import default_model_dir

    unknown = sorted(set(args.skip) - set(PEERS))
    if unknown:
        raise InputError(f"unknown peers {', '.join(unknown)}; choose among {', '.join(PEERS)}")
    if args.rows < 8:
        raise InputError("--rows: at least 8 texts (hare run also runs on a quarter of them)")
    _check_rounds(args.rounds)
    read_manifest(args.bundle)  # a folder that is no bundle is refused before the corpus is made
    peers = tuple(p for p in PEERS if p not in args.skip)
    model_dir = args.model_dir or default_model_dir()
    options = BulkOptions(
        bundle=args.bundle,
        rows=args.rows,
        model_dir=model_dir if peers else None,
        peers=peers,
        streams=args.streams,
        work=args.work,
        name=args.name,
        rounds=args.rounds,
    )
    store = open_store(args)
    with cancellable() as stop:
        run_id = run_bulk(options, store, stop)
    return _ended(store, run_id)


def model(args: argparse.Namespace) -> int:
    from bench.geometries import build

    folder = build(args.name, args.folder)
    task = GEOMETRIES[args.name].task
    print(f"{folder}: {args.name} geometry, random weights; measure it with")
    print(f"  hare bench run {folder} --task {task} --baseline vanilla --seq 8,128")
    return 0


def ceiling(args: argparse.Namespace) -> int:
    from bench.loadgen import LoadSpec, latency_summary, run_load
    from bench.servers import trivial_server

    console = wide_console()
    with trivial_server().start() as server, cancellable() as stop:
        server.wait_ready(timeout=20, stop=stop)
        console.print(f"load generator ceiling against a trivial endpoint ({server.url}, 1 process):")
        for c in args.concurrency:
            spec = LoadSpec("127.0.0.1", server.port, "/predict", [b'{"inputs":"I like you. I love you"}'])
            spec = LoadSpec(**{**spec.__dict__, "concurrency": c, "warmup_s": 0.5, "duration_s": args.duration})
            s = run_load(spec, stop=stop)
            p50 = latency_summary(s).p50
            console.print(
                f"  {c:>3} users: {s.answered / s.window_s:9.0f} req/s  p50 {p50:.3f} ms  "
                f"client cpu {s.cpu_s / s.window_s:.2f} cores = {s.cpu_s / max(s.ok, 1) * 1e6:.0f} µs per request"
            )
    return 0


def _ended(store: Store, run_id: int, show: bool = True) -> int:
    """Print a finished run (show), say why it failed on stderr as every hare command says its error (it was
    only in the run's printout on stdout), and return the exit status."""
    run = store.run(run_id)
    if show:
        print_run(store, run_id)
    if run.status == "failed":
        print(f"hare bench: error: run {run_id} failed" + (f": {run.message}" if run.message else ""), file=sys.stderr)
    return CANCELLED if run.status == "cancelled" else (0 if run.status == "done" else 1)


def _check_rounds(rounds: int) -> None:
    """`--rounds` of overload and bulk: at least one pass, refused before anything starts."""
    if rounds < 1:
        raise InputError(f"--rounds: at least 1 (got {rounds})")
