"""`hare bench bulk`: `hare run` over a corpus, against the bundle's own model-only rate on the same texts and
the peers' own calls over the same corpus (bench/bulk_peers.py), in one run, on this machine; stored in the
result store as a run of kind "bulk" (its summary: bench/bulk_tables.py).

    corpus       prose (Python's own documentation) cut at random token counts from `shortest` to `longest`
    model-only   the same texts tokenized beforehand, cut into the job's chunks and length-sorted calls at the
                 job's batch budget, run on one one-thread session per stream: the model alone, no reading,
                 tokenizing, post-processing or writing (its wall time over all calls)
    hare run     the command itself in a child process (bundle load included), its peak RSS from the kernel;
                 once more on a quarter of the corpus, to show that memory does not grow with the corpus
    its job      the same run's job alone, from its --summary (wall and CPU time without process start, bundle
                 load and probe): timed as the peers are, whose clocks start after their load and warm-up
    peers        sentence-transformers torch (the reference), onnx and openvino `encode`, batch 32, and
                 fastembed `embed`, batch 32, each with the cosine p1 of its vectors to torch's; one missing
                 here is skipped with the reason

Each candidate makes one pass over the texts, one after the other: on a machine other work shares, the CPU
time a row costs is the steadier comparison, and the run keeps it beside the wall clock and the load average.
With `rounds` above one, every candidate that ran makes that many passes, a round at a time (every other round
in the reverse order), so that a slow spell of the machine falls on all of them rather than on one: the figures
stored are each candidate's median, and the goals the median of the ratios taken round by round
(bench/bulk_tables.py). The bench reaches `hare run` as a user does, through the command line (bench never
imports the server).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tokenizers import Tokenizer

from bench.bulk_peers import LABELS, PEERS, encode_corpus, workspace
from bench.bulk_tables import HARE_JOB, HARE_RUN, MODEL_ONLY, OURS
from bench.inputs import load_tokenizer
from bench.peers.candidates.base import Skip, reason
from bench.peers.candidates.workspace import Workspace
from bench.peers.texts import prose
from bench.servers import dies_with_parent
from bench.store import Store
from bench.subjects import manifest_hash
from bench.tables import wide_console
from container.bundle import MAX_BATCH_SIZE, MODEL_FILE, TOKENIZER_FILE, read_manifest, resolve_max_batch_tokens
from container.machine import describe, physical_cores, versions
from container.models import open_model
from tasks.ops import cosine, length_batches, pad_batch

CHUNK_ROWS = 4096  # the job's default chunk (api/bulk/job.py): model-only sorts by length within the same rows
PACKAGES = ("hare", "onnxruntime", "tokenizers", "numpy", "pyarrow", "torch", "transformers", "sentence-transformers",
            "optimum", "optimum-onnx", "optimum-intel", "openvino", "fastembed")  # fmt: skip


class Cancelled(Exception):
    """The run was stopped by a signal between or during its candidates."""


@dataclass(frozen=True)
class Rate:
    """rows a second (wall clock), and CPU seconds per 1,000 rows: on a machine other work shares, the CPU
    time a row costs is the figure that compares (the wall clock also counts the other work's share)."""

    rows_per_s: float
    cpu_per_1000: float


@dataclass(frozen=True)
class BulkOptions:
    bundle: Path  # an embedding bundle
    rows: int  # texts in the corpus
    model_dir: Path | None  # the peers' sentence-transformers folder; None leaves every peer out
    peers: tuple[str, ...] = PEERS
    streams: int = 0  # cores for every candidate (0: the physical cores)
    shortest: int = 10
    longest: int = 300
    work: Path | None = None  # where the peers' exports are kept (default: the bench cache)
    name: str = ""
    temp: Path | None = None  # where the corpus and hare run's outputs are written (default: the system's)
    rounds: int = 1  # passes of every candidate, interleaved (the module docstring)


@dataclass
class Outcome:
    """What a run measured, as stored in its summary (bench/bulk_tables.py)."""

    rows: int
    tokens: int = 0
    streams: int = 0
    rounds: int = 1
    candidates: list[dict[str, Any]] = field(default_factory=list)
    hare_job_rows_s: float | None = None
    rss_mb: float = 0.0
    rss_quarter_mb: float = 0.0
    exports: dict[str, str] = field(default_factory=dict)  # how the peers' exports were made and compute

    def add(self, key: str, label: str, rate: Rate | None, cosine_p1: float | None = None, skipped: str = "") -> None:
        self.candidates.append(
            {
                "key": key,
                "label": label,
                "rows_s": rate.rows_per_s if rate else None,
                "cpu_per_1000": rate.cpu_per_1000 if rate else None,
                "cosine_p1": cosine_p1,
                "skipped": skipped,
                "rounds": [[rate.rows_per_s, rate.cpu_per_1000]] if rate else [],
            }
        )

    def again(self, key: str, rate: Rate) -> float:
        """Another round's pass of candidate `key`: its figures become the median of its rounds (its rows/s
        returned)."""
        candidate = next(c for c in self.candidates if c["key"] == key)
        candidate["rounds"].append([rate.rows_per_s, rate.cpu_per_1000])
        candidate["rows_s"], candidate["cpu_per_1000"] = (float(v) for v in np.median(candidate["rounds"], axis=0))
        return float(candidate["rows_s"])


def corpus(tok: Tokenizer, n: int, shortest: int = 10, longest: int = 300, seed: int = 0) -> list[str]:
    """`n` texts of prose whose encodings run from `shortest` to `longest` tokens (uniformly), special tokens
    included: runs of one long prose stream, cut at token boundaries."""
    stream = " ".join(prose())
    encoding = tok.encode(stream, add_special_tokens=False)
    offsets = encoding.offsets
    special = len(tok.encode("").ids)
    rng = np.random.default_rng(seed)
    texts = []
    for length in rng.integers(shortest, longest + 1, n):
        body = max(int(length) - special, 1)
        start = int(rng.integers(0, len(offsets) - body))
        texts.append(stream[offsets[start][0] : offsets[start + body - 1][1]])
    return texts


def model_only(bundle: Path, texts: list[str], streams: int) -> tuple[Rate, int]:
    """The rate of the bundle's graph alone over `texts` in the job's calls, and the texts' tokens."""
    manifest = read_manifest(bundle)
    tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))  # truncating at max_length, as served
    tok.no_padding()
    model = open_model(bundle / MODEL_FILE, manifest.variant, manifest.target, 1, manifest.output, callers=streams)
    budget = resolve_max_batch_tokens(manifest, throughput=True).max_batch_tokens  # as `hare run` resolves it
    multiple = model.length_multiple  # as the job pads
    feeds, tokens = [], 0
    for at in range(0, len(texts), CHUNK_ROWS):
        encodings = tok.encode_batch(texts[at : at + CHUNK_ROWS])
        tokens += sum(len(e.ids) for e in encodings)
        for call in length_batches([len(e.ids) for e in encodings], MAX_BATCH_SIZE, budget):
            batch = [encodings[i] for i in call]
            feeds.append(pad_batch(batch, model.input_names, manifest.pad_id, multiple, manifest.max_length))
    model.run(feeds[0])  # first-run allocations
    taken = iter(range(len(feeds)))
    lock = threading.Lock()

    def stream() -> None:
        while True:
            with lock:
                k = next(taken, None)
            if k is None:
                return
            model.run(feeds[k])

    start, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=stream) for _ in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _rate(len(texts), time.perf_counter() - start, time.process_time() - cpu), tokens


def _rate(rows: int, wall: float, cpu: float) -> Rate:
    return Rate(rows / wall, cpu / rows * 1000)


def hare_run(
    bundle: Path, source: Path, out: Path, rows: int, streams: int, stop: threading.Event | None = None
) -> tuple[Rate, Rate, float]:
    """`hare run` in a child process: its rate (its CPU time from the kernel), the rate of the job alone (its
    summary's wall and CPU time, without process start and bundle load), and its peak RSS in MB (VmHWM,
    polled: the kernel's ru_maxrss of a child counts the parent's memory it was forked from). A set `stop`
    ends it (Cancelled)."""
    summary = out.with_suffix(".summary.json")
    command = [sys.executable, "-m", "hare.cli", "run", str(bundle), "-i", str(source), "-o", str(out)]
    command += ["--streams", str(streams), "-q", "--overwrite", "--summary", str(summary)]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, preexec_fn=dies_with_parent())
    peak = 0
    while True:
        peak = max(peak, _hwm_kb(child.pid))
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if stop is not None and stop.is_set():
            child.kill()
            child.wait()
            raise Cancelled("stopped by a signal during hare run")
        time.sleep(0.1)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"hare run failed with exit code {child.returncode}")
    job = orjson.loads(summary.read_bytes())
    job_rate = _rate(rows, float(job["seconds"]), float(job["cpu_seconds"]))
    return _rate(rows, wall, usage.ru_utime + usage.ru_stime), job_rate, peak / 1024


def _hwm_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def _say(message: str) -> None:
    wide_console().print(message, style="dim")


def run_bulk(
    options: BulkOptions, store: Store, stop: threading.Event | None = None, say: Callable[[str], None] = _say
) -> int:
    """Measure every candidate of the module docstring on one corpus, store the run (kind "bulk"), return its
    id. A signal between or during candidates ends it as "cancelled", with what was measured so far."""
    streams = options.streams or physical_cores()
    manifest = read_manifest(options.bundle)
    texts = corpus(load_tokenizer(options.bundle / TOKENIZER_FILE), options.rows, options.shortest, options.longest)
    peers = options.peers if options.model_dir is not None else ()
    settings = {
        "bundle": str(options.bundle),
        "variant": manifest.variant,
        "model_dir": str(options.model_dir or ""),
        "rows": options.rows,
        "shortest": options.shortest,
        "longest": options.longest,
        "streams": streams,
        "batch": 32,
        "peers": list(peers),
        "rounds": options.rounds,
    }
    run_id = store.create_run(
        "bulk",
        name=options.name,
        task=manifest.task,
        target=str(options.bundle),
        manifest_hash=manifest_hash(options.bundle),
        machine=describe(),
        versions=versions(PACKAGES),
        settings=settings,
    )
    outcome, load_start = Outcome(options.rows, streams=streams, rounds=options.rounds), os.getloadavg()
    status, message = "done", ""
    try:
        _measure(options, texts, peers, outcome, stop, say)
    except Cancelled as exc:
        status, message = "cancelled", str(exc)
    except BaseException as exc:
        store.update_run(run_id, summary=_summary(outcome, load_start))
        store.finish_run(run_id, "failed", reason(exc))
        raise
    store.update_run(run_id, summary=_summary(outcome, load_start))
    store.finish_run(run_id, status, message)
    return run_id


def _summary(outcome: Outcome, load_start: tuple[float, float, float]) -> dict[str, Any]:
    return {
        **outcome.__dict__,
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
    }


def _measure(
    options: BulkOptions,
    texts: list[str],
    peers: tuple[str, ...],
    outcome: Outcome,
    stop: threading.Event | None,
    say: Callable[[str], None],
) -> None:
    def check() -> None:
        if stop is not None and stop.is_set():
            raise Cancelled("stopped by a signal")

    n, streams = len(texts), outcome.streams
    with tempfile.TemporaryDirectory(dir=options.temp) as folder:
        whole, quarter = Path(folder) / "corpus.jsonl", Path(folder) / "quarter.jsonl"
        _jsonl(whole, texts)
        _jsonl(quarter, texts[: n // 4])
        say(f"model-only: {n:,} texts on {streams} streams")
        model_rate, outcome.tokens = model_only(options.bundle, texts, streams)
        outcome.add(MODEL_ONLY, "the bundle's model alone", model_rate)
        check()
        say("hare run: the corpus, then its first quarter (memory)")
        out = Path(folder) / "out.parquet"
        hare, job, outcome.rss_mb = hare_run(options.bundle, whole, out, n, streams, stop)
        outcome.hare_job_rows_s = job.rows_per_s
        _, _, outcome.rss_quarter_mb = hare_run(
            options.bundle, quarter, Path(folder) / "quarter.parquet", n // 4, streams, stop
        )
        outcome.add(HARE_RUN, "hare run (start and load included)", hare)
        outcome.add(HARE_JOB, "hare run's job alone (timed as the peers)", job)
        space = workspace(options.model_dir, options.bundle, options.work) if options.model_dir else None
        if space is not None:
            _peers(space, peers, texts, _vectors(out), outcome, check, say)

        def model_pass() -> None:
            outcome.again(MODEL_ONLY, model_only(options.bundle, texts, streams)[0])

        def hare_pass() -> None:
            hare, job, _ = hare_run(options.bundle, whole, out, n, streams, stop)
            outcome.again(HARE_RUN, hare)
            outcome.hare_job_rows_s = outcome.again(HARE_JOB, job)

        def peer_pass(key: str) -> Callable[[], None]:
            def run() -> None:
                assert space is not None  # a peer ran in the first round
                wall, cpu, _ = encode_corpus(space, key, texts, streams)
                outcome.again(key, _rate(n, wall, cpu))

            return run

        ran = [c["key"] for c in outcome.candidates if c["key"] not in OURS and not c["skipped"]]
        passes = [("model-only", model_pass), ("hare run", hare_pass), *((k, peer_pass(k)) for k in ran)]
        for number in range(2, options.rounds + 1):
            for name, one_pass in passes[::-1] if number % 2 == 0 else passes:
                check()
                say(f"round {number} of {options.rounds}: {name}")
                one_pass()


def _peers(
    space: Workspace,
    peers: tuple[str, ...],
    texts: list[str],
    hare_vectors: np.ndarray,
    outcome: Outcome,
    check: Callable[[], None],
    say: Callable[[str], None],
) -> None:
    """The first round of the peers, torch first: its vectors are the reference every cosine p1 is taken to,
    hare run's (and its job's) included."""
    reference: np.ndarray | None = None
    for key in sorted(peers, key=lambda k: k != "torch"):
        check()
        say(f"{key}: loading, then {len(texts):,} texts")
        try:
            wall, cpu, vectors = encode_corpus(space, key, texts, outcome.streams)
        except Skip as exc:
            say(f"{key} skipped: {exc}")
            outcome.add(key, LABELS[key], None, skipped=str(exc))
            continue
        if key == "torch":
            reference = vectors
            for ours in outcome.candidates:
                if ours["key"] in (HARE_RUN, HARE_JOB):  # the run and its job: the same vectors
                    ours["cosine_p1"] = _p1(reference, hare_vectors)
        p1 = _p1(reference, vectors) if reference is not None else None
        outcome.add(key, LABELS[key], _rate(len(texts), wall, cpu), p1)
        outcome.exports = dict(space.notes)


def _p1(reference: np.ndarray, vectors: np.ndarray) -> float:
    return float(np.percentile(cosine(reference, vectors), 1))


def _jsonl(path: Path, texts: list[str]) -> None:
    path.write_bytes(b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in enumerate(texts)))


def _vectors(path: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=["embeddings"]).column("embeddings").combine_chunks()
    return np.asarray(column.flatten(), np.float32).reshape(len(column), -1)
