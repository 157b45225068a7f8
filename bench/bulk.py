"""`hare bench bulk`: `hare run` over a corpus, against the bundle's own model-only rate on the same texts and
sentence-transformers' torch `encode` (batch 32), in one run, on this machine.

    corpus       prose (Python's own documentation) cut at random token counts from `shortest` to `longest`
    model-only   the same texts tokenized beforehand, cut into the job's chunks and length-sorted calls at the
                 bundle's batch budget, run on one one-thread session per stream: the model alone, no reading,
                 tokenizing, post-processing or writing (its wall time over all calls)
    hare run     the command itself in a child process (bundle load included), its peak RSS from the kernel;
                 once more on a quarter of the corpus, to show that memory does not grow with the corpus
    torch        SentenceTransformer.encode(batch_size=32) on the model folder; hare's vectors' cosine to it

The bench reaches `hare run` as a user does, through the command line (bench never imports the server).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
from tokenizers import Tokenizer

from bench.inputs import load_tokenizer
from bench.peers.texts import prose
from container.bundle import MAX_BATCH_SIZE, MODEL_FILE, TOKENIZER_FILE, read_manifest, resolve_max_batch_tokens
from container.machine import physical_cores
from container.runtime import OnnxModel
from tasks.ops import cosine, length_batches, pad_batch

CHUNK_ROWS = 4096  # the job's default chunk (api/bulk/job.py): model-only sorts by length within the same rows


@dataclass(frozen=True)
class Rate:
    """rows a second (wall clock), and CPU seconds per 1,000 rows: on a machine other work shares, the CPU
    time a row costs is the figure that compares (the wall clock also counts the other work's share)."""

    rows_per_s: float
    cpu_per_1000: float


@dataclass(frozen=True)
class BulkFigures:
    """One bulk run: each candidate's rate, hare run's job time alone (without loading the bundle), its peak
    RSS on the whole corpus and on a quarter of it (MB), and the 1st percentile of cosine(torch, hare) (None
    where torch was not run)."""

    rows: int
    tokens: int
    model_only: Rate
    hare: Rate
    hare_job_rows_per_s: float
    torch: Rate | None
    rss_mb: float
    rss_quarter_mb: float
    cosine_p1: float | None


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
    model = OnnxModel(bundle / MODEL_FILE, manifest.target, 1, manifest.output)
    budget = resolve_max_batch_tokens(manifest).max_batch_tokens  # as `hare serve` and `hare run` resolve it
    feeds, tokens = [], 0
    for at in range(0, len(texts), CHUNK_ROWS):
        encodings = tok.encode_batch(texts[at : at + CHUNK_ROWS])
        tokens += sum(len(e.ids) for e in encodings)
        for call in length_batches([len(e.ids) for e in encodings], MAX_BATCH_SIZE, budget):
            feeds.append(pad_batch([encodings[i] for i in call], model.input_names, manifest.pad_id))
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


def hare_run(bundle: Path, source: Path, out: Path, rows: int) -> tuple[Rate, float, float]:
    """`hare run` in a child process: its rate (its CPU time from the kernel), rows a second of the job alone
    (its summary's time, without loading the bundle), and its peak RSS in MB (VmHWM, polled: the kernel's
    ru_maxrss of a child counts the parent's memory it was forked from)."""
    summary = out.with_suffix(".summary.json")
    command = [sys.executable, "-m", "hare.cli", "run", str(bundle), "-i", str(source), "-o", str(out)]
    start = time.perf_counter()
    child = subprocess.Popen([*command, "-q", "--overwrite", "--summary", str(summary)], stdout=subprocess.DEVNULL)
    peak = 0
    while True:
        peak = max(peak, _hwm_kb(child.pid))
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.1)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"hare run failed with exit code {child.returncode}")
    job = float(orjson.loads(summary.read_bytes())["seconds"])
    return _rate(rows, wall, usage.ru_utime + usage.ru_stime), rows / job, peak / 1024


def _hwm_kb(pid: int) -> int:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def torch_encode(model_dir: Path, texts: list[str], threads: int) -> tuple[Rate, np.ndarray]:
    """sentence-transformers' own encode with batch 32 on `threads` torch threads: its rate, its vectors."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    model.encode(texts[:64], batch_size=32)
    start, cpu = time.perf_counter(), time.process_time()
    vectors = model.encode(texts, batch_size=32, convert_to_numpy=True, show_progress_bar=False)
    return _rate(len(texts), time.perf_counter() - start, time.process_time() - cpu), np.asarray(vectors, np.float32)


def measure(bundle: Path, n: int, model_dir: Path | None, streams: int = 0, work: Path | None = None) -> BulkFigures:
    """Every figure of the module docstring, in that order, on `n` texts."""
    streams = streams or physical_cores()
    texts = corpus(load_tokenizer(bundle / TOKENIZER_FILE), n)
    with tempfile.TemporaryDirectory(dir=work) as folder:
        whole, quarter = Path(folder) / "corpus.jsonl", Path(folder) / "quarter.jsonl"
        whole.write_bytes(b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in enumerate(texts)))
        quarter.write_bytes(b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in enumerate(texts[: n // 4])))
        model_rate, tokens = model_only(bundle, texts, streams)
        hare, job, rss = hare_run(bundle, whole, Path(folder) / "out.parquet", n)
        _, _, rss_quarter = hare_run(bundle, quarter, Path(folder) / "quarter.parquet", n // 4)
        hare_vectors = _vectors(Path(folder) / "out.parquet")
        torch_rate: Rate | None = None
        p1: float | None = None
        if model_dir is not None:
            torch_rate, reference = torch_encode(model_dir, texts, streams)
            p1 = float(np.percentile(cosine(reference, hare_vectors), 1))
    return BulkFigures(n, tokens, model_rate, hare, job, torch_rate, rss, rss_quarter, p1)


def _vectors(path: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    column = pq.read_table(path, columns=["embeddings"]).column("embeddings").combine_chunks()
    return np.asarray(column.flatten(), np.float32).reshape(len(column), -1)


def rows(figures: BulkFigures) -> list[tuple[str, str]]:
    """The figures as (what, value) lines for a table."""
    f = figures

    def rate(r: Rate) -> str:
        return f"{r.rows_per_s:,.1f} rows/s, {r.cpu_per_1000:,.1f} CPU s per 1,000 rows"

    out = [
        ("texts", f"{f.rows:,} ({f.tokens:,} tokens)"),
        ("model-only", rate(f.model_only)),
        ("hare run", f"{rate(f.hare)} (the job alone {f.hare_job_rows_per_s:,.1f} rows/s)"),
        ("hare run / model-only", _ratios(f.hare, f.model_only)),
    ]
    if f.torch is not None:
        out.append(("torch encode, batch 32", rate(f.torch)))
        out.append(("hare run / torch", _ratios(f.hare, f.torch)))
        out.append(("cosine p1 hare vs torch", f"{f.cosine_p1:.4f}"))
    out.append(("peak RSS", f"{f.rss_mb:,.0f} MB (a quarter of the corpus: {f.rss_quarter_mb:,.0f} MB)"))
    return out


def _ratios(a: Rate, b: Rate) -> str:
    return f"{a.rows_per_s / b.rows_per_s:.2f}x by the wall clock, {b.cpu_per_1000 / a.cpu_per_1000:.2f}x by CPU time"
