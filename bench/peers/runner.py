"""run_peers: load every candidate at every thread count, take its fidelity to torch, time them all in
alternating rounds, and store the run (kind "peers": a point per candidate, thread count and batch; the
table and the goal in its summary)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from bench.inputs import TextMaker, comet_texts, load_tokenizer
from bench.peers.candidates import load
from bench.peers.candidates.base import Encoder, Skip, Vectors, reason
from bench.peers.candidates.workspace import Workspace
from bench.peers.options import CANDIDATES, LABELS, PeersOptions
from bench.peers.results import Row, goal
from bench.peers.texts import fidelity_texts, lengths, speed_texts
from bench.peers.timing import Slot, encode_all, time_slot
from bench.points import Planned, make_point
from bench.stats import summarize
from bench.store import Point, Store
from bench.subjects import manifest_hash
from bench.tables import wide_console
from container.bundle import TOKENIZER_FILE, read_manifest
from container.machine import describe, versions
from tasks.errors import InputError

PACKAGES = ("hare", "onnxruntime", "tokenizers", "numpy", "torch", "transformers", "sentence-transformers", "optimum",
            "optimum-onnx", "optimum-intel", "openvino", "nncf", "fastembed", "huggingface-hub")  # fmt: skip

Encoders = dict[tuple[str, int], Encoder]


def _say(message: str) -> None:
    wide_console().print(message, style="dim")


def check(options: PeersOptions) -> None:
    """The options a run cannot start with, as InputError."""
    unknown = sorted(set(options.candidates) - set(CANDIDATES))
    if unknown:
        raise InputError(f"unknown candidates {', '.join(unknown)}; choose among {', '.join(CANDIDATES)}")
    if "torch" not in options.candidates:
        raise InputError("the torch candidate is the reference every cosine is taken against: keep it")
    if options.batch < 2:
        raise InputError("--batch is the throughput batch: at least 2 (batch 1 is always measured)")


def run_peers(
    options: PeersOptions,
    store: Store,
    stop: threading.Event | None = None,
    say: Callable[[str], None] = _say,
) -> tuple[int, list[Row]]:
    """Load every candidate, check its fidelity, time it in rounds; store and return the run id and rows."""
    check(options)
    manifest = read_manifest(options.bundle)
    tok = load_tokenizer(options.bundle / TOKENIZER_FILE)
    calls = speed_texts(TextMaker(tok), options.seq_len, options.batch)
    fidelity = fidelity_texts(tok, options.fidelity, options.fidelity_max)
    space = Workspace(options, comet_texts(options.ov_calibration or 300, seed=1))
    load_start = os.getloadavg()
    run_id = store.create_run(
        "peers",
        name=options.name,
        task=manifest.task,
        target=str(options.bundle),
        manifest_hash=manifest_hash(options.bundle),
        machine=describe(),
        versions=versions(PACKAGES),
        settings=_settings(options, manifest.variant, space),
    )
    rows = {key: Row(key, LABELS[key]) for key in options.candidates}
    encoders: Encoders = {}
    status, message = "done", ""
    try:
        _load_all(options, space, fidelity, rows, encoders, say)
        running = [k for k in options.candidates if not rows[k].skipped]
        results, cancelled = _rounds(options, running, encoders, calls, stop, say)
        if cancelled:
            status, message = "cancelled", "stopped by a signal"
        _store_points(options, store, run_id, running, rows, results)
    except BaseException as exc:
        store.finish_run(run_id, "failed", reason(exc))
        raise
    finally:
        for encoder in encoders.values():
            encoder.close()
        encoders.clear()
    table = [rows[k] for k in options.candidates]
    load_end = os.getloadavg()
    store.update_run(
        run_id,
        summary={
            "peers": [r.to_dict() for r in table],
            "goal": goal(table, options.threads),
            "load_start": list(load_start),
            "load_end": list(load_end),
            "exports": space.notes,
            "fidelity_tokens": lengths(tok, fidelity),
        },
    )
    store.finish_run(run_id, status, message)
    return run_id, table


def _settings(options: PeersOptions, variant: str, space: Workspace) -> dict[str, Any]:
    return {
        "model_dir": str(options.model_dir),
        "bundle": str(options.bundle),
        "variant": variant,
        "seq_len": options.seq_len,
        "batch": options.batch,
        "threads": list(options.threads),
        "rounds": options.rounds,
        "seconds": options.seconds,
        "warmup_calls": options.warmup_calls,
        "fidelity": options.fidelity,
        "fidelity_max": options.fidelity_max,
        "candidates": list(options.candidates),
        "int8_config": space.int8,
        "work": str(space.work),
    }


def _load_all(
    options: PeersOptions,
    space: Workspace,
    fidelity: list[str],
    rows: dict[str, Row],
    encoders: Encoders,
    say: Callable[[str], None],
) -> None:
    """Load each candidate at each thread count (exports happen here, once) and take its fidelity; torch first,
    the reference. A candidate that cannot run is skipped with its reason, unless it is torch."""
    reference: Vectors | None = None
    for key in ["torch", *[k for k in options.candidates if k != "torch"]]:
        row = rows[key]
        try:
            say(f"loading {key}")
            for threads in options.threads:
                encoders[key, threads] = load(space, key, threads)
            vectors = encode_all(encoders[key, max(options.threads)], fidelity, options.batch)
        except Skip as exc:
            row.skipped = str(exc)
            for threads in options.threads:
                encoders.pop((key, threads), None)
            say(f"  skipped: {row.skipped}")
            if key == "torch":
                raise InputError(f"the reference (sentence-transformers torch) cannot run: {exc}") from exc
            continue
        if reference is None:
            reference = vectors
        row.take_fidelity(reference, vectors)


def _slots(options: PeersOptions) -> list[tuple[int, int]]:
    """(threads, batch) of every slot, in the order each round runs them."""
    return [(threads, batch) for batch in (1, options.batch) for threads in options.threads]


def _rounds(
    options: PeersOptions,
    running: list[str],
    encoders: Encoders,
    calls: dict[int, list[list[str]]],
    stop: threading.Event | None,
    say: Callable[[str], None],
) -> tuple[dict[tuple[str, int, int], Slot], bool]:
    """Every slot, all candidates, then the next slot; the first candidate rotates each round, so that a drift
    in the machine's load hits them all alike. Returns the slots and whether a signal cut the rounds short."""
    slots = _slots(options)
    results = {(k, t, b): Slot() for k in running for t, b in slots}
    for r in range(options.rounds):
        if stop is not None and stop.is_set():
            return results, True
        order = running[r % len(running) :] + running[: r % len(running)]
        say(f"round {r + 1}/{options.rounds}: {' '.join(order)}")
        for threads, batch in slots:
            for key in order:
                time_slot(encoders[key, threads], calls[batch], options, stop, results[key, threads, batch])
    return results, False


def _store_points(
    options: PeersOptions,
    store: Store,
    run_id: int,
    running: list[str],
    rows: dict[str, Row],
    results: dict[tuple[str, int, int], Slot],
) -> None:
    """Each slot's figures into its candidate's row, and a point per slot into the store."""
    idx = 0
    for key in running:
        row = rows[key]
        for threads, batch in _slots(options):
            slot = results[key, threads, batch]
            if not slot.latencies_ms:
                continue
            total_s = sum(slot.latencies_ms) / 1000.0
            if batch == 1:
                row.p50_ms[threads] = summarize(slot.latencies_ms).p50
            else:
                row.sentences_s[threads] = batch * len(slot.latencies_ms) / total_s
            row.cores[f"b{batch}t{threads}"] = slot.cpu_s / max(slot.wall_s, 1e-9)
            row.cpu_ms[f"b{batch}t{threads}"] = summarize(slot.cpu_ms).p50
            idx += 1
            store.add_point(_point(run_id, idx, key, threads, batch, options.seq_len, slot))


def _point(run_id: int, idx: int, key: str, threads: int, batch: int, seq_len: int, slot: Slot) -> Point:
    planned = Planned(key, 1, threads, seq_len, batch, 1, 0.0)
    window = sum(slot.latencies_ms) / 1000.0
    return make_point(
        run_id,
        idx,
        key,
        "in-process",
        1,
        threads,
        planned,
        float(seq_len),
        window,
        len(slot.latencies_ms),
        len(slot.latencies_ms),
        {},
        summarize(slot.latencies_ms),
        server={},
        client_cpu=slot.cpu_s / max(slot.wall_s, 1e-9),
        extra={"candidate": LABELS[key], "cpu_ms_p50": summarize(slot.cpu_ms).p50},
    )
