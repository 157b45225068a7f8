"""The model-only figure: the bundle's ONNX session called in this process on pre-tokenized inputs, no HTTP,
no tokenizer, no queue. End-to-end latency minus this is what serving costs.

With `streams` > 1, that many threads call the one session at once, as the server's model streams do: two
runs side by side on two cores are each slower than one alone (they share the memory bus and the L3 cache),
and that part of the end-to-end latency is the hardware's, not serving's."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from bench.inputs import MIXES, TextMaker, mix_pairs
from bench.stats import Summary, mean, summarize
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_manifest
from container.models import open_model
from tasks.ops import pad_batch
from tasks.registry import TASKS

MAX_ITERATIONS = 20_000


@dataclass(frozen=True)
class ModelOnly:
    latencies_ms: list[float]
    tokenize_ms: float  # mean time to tokenize one request's texts, for reference
    window_s: float
    cpu_s: float


def measure(
    bundle: Path,
    maker: TextMaker,
    seq_len: int | str,
    batch: int,
    threads: int,
    warmup_s: float,
    duration_s: float,
    stop: threading.Event | None = None,
    streams: int = 1,
) -> ModelOnly:
    """Time `session.run` on batches of `batch` inputs of `seq_len` tokens (or a mix's texts, bench.inputs.MIXES:
    the first of those the served bodies hold), padded as the server pads them, from `streams` threads at once."""
    manifest = read_manifest(bundle)
    model = open_model(
        bundle / MODEL_FILE, manifest.variant, manifest.target, threads, manifest.output, callers=streams
    )
    n = 16 if isinstance(seq_len, int) else 128  # a mix's lengths need more batches to be a fair sample
    # The served tokenizer as the server loads it: truncating at max_length, as the server does by default.
    tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    tok.no_padding()
    if TASKS[manifest.task].pairs:
        pairs = maker.pairs(seq_len, n * batch) if isinstance(seq_len, int) else mix_pairs(seq_len, n, batch)
        groups: list[list[str] | list[tuple[str, str]]] = [pairs[i * batch : (i + 1) * batch] for i in range(n)]
    else:
        texts = maker.texts(seq_len, n * batch) if isinstance(seq_len, int) else MIXES[seq_len](n * batch, 0)
        groups = [texts[i * batch : (i + 1) * batch] for i in range(n)]
    tokenize: list[float] = []
    feeds = []
    for group in groups:
        t0 = time.perf_counter()
        encodings = tok.encode_batch(group)
        # Padded as the server's backend pads (api/engine/backend.py): to the runtime's multiple, never past the
        # bundle's maximum.
        feeds.append(
            pad_batch(encodings, model.input_names, manifest.pad_id, model.length_multiple, manifest.max_length)
        )
        tokenize.append((time.perf_counter() - t0) * 1000.0)
    start = time.perf_counter() + warmup_s
    deadline = start + duration_s
    per_stream: list[list[float]] = [[] for _ in range(streams)]
    cpu0 = [0.0]

    def stream(k: int) -> None:
        mine, i = per_stream[k], k
        while time.perf_counter() < start:  # warm-up, unrecorded
            model.run(feeds[i % n])
            i += 1
        if k == 0:
            cpu0[0] = time.process_time()  # the process's CPU clock: every stream's work from here on
        while len(mine) < MAX_ITERATIONS // streams and not (stop is not None and stop.is_set()):
            t0 = time.perf_counter()
            model.run(feeds[i % n])
            t1 = time.perf_counter()
            mine.append((t1 - t0) * 1000.0)
            i += 1
            if t1 >= deadline:
                break

    others = [threading.Thread(target=stream, args=(k,), name=f"model-only-{k}") for k in range(1, streams)]
    for other in others:
        other.start()
    stream(0)
    for other in others:
        other.join()
    window = time.perf_counter() - start
    latencies = [x for mine in per_stream for x in mine]
    return ModelOnly(latencies, mean(tokenize), window, time.process_time() - cpu0[0])


def summary(result: ModelOnly) -> Summary:
    return summarize(result.latencies_ms)
