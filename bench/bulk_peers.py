"""The peers of `hare bench bulk`: each library's own call over the whole corpus, as its user would index one.

    torch, onnx, openvino   SentenceTransformer.encode(texts, batch_size=32) with backend torch (fp32, the
                            reference every cosine is taken against), onnx (Optimum's export) or openvino
                            (Optimum Intel's): it sorts the texts by length itself, then encodes them 32 at a time
    fastembed               TextEmbedding.embed(texts, batch_size=32) on Optimum's ONNX export, in order

They load as `hare bench peers` loads them (bench/peers/candidates/: the same exports, kept under the bench
cache, the same threads settings), each at the run's core count. A peer whose packages are not installed, or
that fails to load, is skipped with the reason; bench/peers-requirements.txt says how to install them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.peers.candidates import load
from bench.peers.candidates.base import Vectors
from bench.peers.candidates.workspace import Workspace
from bench.peers.options import PeersOptions

PEERS = ("torch", "onnx", "openvino", "fastembed")
LABELS = {
    "torch": "sentence-transformers torch (reference)",
    "onnx": "sentence-transformers onnx",
    "openvino": "sentence-transformers openvino",
    "fastembed": "fastembed embed",
}
BATCH = 32
WARMUP = 64  # texts encoded once before the clock starts (first-call allocations, lazy compilation)


def workspace(model_dir: Path, bundle: Path, work: Path | None) -> Workspace:
    """Where the peers' exports are made or found: `hare bench peers`'s folder for these weights."""
    return Workspace(PeersOptions(model_dir=model_dir, bundle=bundle, work=work), calibration=[])


def encode_corpus(space: Workspace, key: str, texts: list[str], threads: int) -> tuple[float, float, Vectors]:
    """`key` over `texts` at `threads` threads: its wall and CPU seconds (this process's, every thread's), and
    its vectors. Raises bench.peers.candidates.base.Skip when the peer cannot run here."""
    encoder = load(space, key, threads)
    try:
        call = _corpus_call(key, encoder.model)
        encoder.enter()
        call(texts[:WARMUP])
        start, cpu = time.perf_counter(), time.process_time()
        vectors = call(texts)
        return time.perf_counter() - start, time.process_time() - cpu, vectors
    finally:
        encoder.close()


def _corpus_call(key: str, model: Any) -> Callable[[list[str]], Vectors]:
    if key == "fastembed":
        return lambda texts: np.stack(list(model.embed(texts, batch_size=BATCH))).astype(np.float32)

    def encode(texts: list[str]) -> Vectors:
        vectors = model.encode(texts, batch_size=BATCH, convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)

    return encode
