"""Stage 5, autotune: time each variant that passed validation on this machine and pick the fastest.

Which variant wins depends on the CPU and the sequence length (plain and fused int8 trade places on
Zen 4), so we measure rather than assume: the median latency at each (length, batch) point, scored by
their geometric mean so that no single point dominates.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from container.optimize.textset import SENTENCES
from container.runtime import OnnxModel
from tasks.ops import pad_batch


def _feeds(tokenizer: Tokenizer, length: int, batch: int, names: Sequence[str]) -> dict[str, np.ndarray]:
    text = " ".join(SENTENCES * 20)
    enc = tokenizer.encode(text)  # truncated at the model's maximum by the bundle tokenizer
    enc.truncate(min(length, len(enc.ids)))
    return pad_batch([enc] * batch, names)


def time_variant(
    variant: Path,
    tokenizer: Tokenizer,
    lengths: Sequence[int],
    batches: Sequence[int],
    threads: int,
    target: str = "cpu",
    min_seconds: float = 0.2,
) -> dict[str, float]:
    """Median milliseconds per call at each point, keyed "s{length}xb{batch}"."""
    model = OnnxModel(variant, target=target, threads=threads)
    timings: dict[str, float] = {}
    for length in lengths:
        for batch in batches:
            feeds = _feeds(tokenizer, length, batch, model.input_names)
            model.run(feeds)  # first run allocates buffers and picks kernels
            samples: list[float] = []
            deadline = time.perf_counter() + min_seconds
            while len(samples) < 5 or time.perf_counter() < deadline:
                start = time.perf_counter()
                model.run(feeds)
                samples.append((time.perf_counter() - start) * 1e3)
            timings[f"s{length}xb{batch}"] = round(float(np.median(samples)), 3)
    return timings


def score(timings: dict[str, float]) -> float:
    """Geometric mean of the point latencies: lower is faster."""
    return float(np.exp(np.mean(np.log(list(timings.values())))))
