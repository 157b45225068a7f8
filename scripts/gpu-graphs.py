"""CUDA graphs on real GPU bundles (run by scripts/gpu-check on the device machine, after the builds): the
served backend with its graphs captured against the same backend without, on real texts.

For each bundle: every batch's rows from the graphed backend against the plain one (max |diff|; the graphs
pad to their shape, so fp16 kernels may round a little differently), then the median of 200 calls after 20
warm-ups of `Backend.run` (padding, copies and trimming included) at (texts, tokens) = (1, 16), (1, 128),
(8, 128), (32, 128), both ways, and the texts/s each way at the biggest. For an embedding bundle, the same
with the vectors pooled on the device from the graph's buffers (`pooled`, container/pooling.py) against the
plain run's token states pooled on the host (tasks/ops.py), and their largest difference.

    python scripts/gpu-graphs.py /tmp/bundle-minilm [/tmp/bundle-distilbert ...]
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

import numpy as np

from api.engine.backend import Backend
from bench.inputs import TextMaker, load_tokenizer
from bench.stats import median_call_seconds
from container.bundle import MODEL_FILE, read_manifest
from container.cudagraphs import graph_shapes
from tasks.ops import pool_tokens

SHAPES = [(1, 16), (1, 128), (8, 128), (32, 128)]


def check(bundle: Path) -> None:
    manifest = read_manifest(bundle)
    tokenizer = load_tokenizer(bundle)
    maker = TextMaker(tokenizer)
    shapes = graph_shapes(64, 16384, manifest.max_length)
    args = (bundle / MODEL_FILE, "gpu", (1,), manifest.output)
    start = time.perf_counter()
    graphed = Backend(*args, pad_id=manifest.pad_id, graph_shapes=shapes, max_length=manifest.max_length)
    made = time.perf_counter() - start
    plain = Backend(*args, pad_id=manifest.pad_id, max_length=manifest.max_length)
    print(
        f"\n## {bundle.name}: {manifest.variant}; {len(shapes)} shapes captured: {graphed.graphs is not None}"
        f" (backend made in {made:.1f} s)"
    )
    worst = 0.0
    rng = np.random.default_rng(0)
    for size in (1, 3, 8, 5, 32, 1, 17, 64, 2):
        lengths = rng.integers(4, manifest.max_length, size)
        batch = [tokenizer.encode(maker.texts(int(n), 1)[0]) for n in lengths]
        for got, want in zip(graphed.run(batch), plain.run(batch), strict=True):
            worst = max(worst, float(np.max(np.abs(got - want))))
    print(f"  graphed against plain, 9 batches of 1-64 texts at random lengths: max |diff| {worst:.2e}")
    for texts, tokens in SHAPES:
        batch = tokenizer.encode_batch(maker.texts(tokens, texts))
        g = median_call_seconds(functools.partial(graphed.run, batch)) * 1000
        p = median_call_seconds(functools.partial(plain.run, batch)) * 1000
        print(
            f"  ({texts}, {tokens}) Backend.run median ms: graphs {g:.3f}, plain {p:.3f}"
            f"  ({texts / g * 1000:,.0f} / {texts / p * 1000:,.0f} texts/s)"
        )
        if manifest.task != "feature-extraction" or graphed.graphs is None:
            continue

        def host_pooled(batch: list = batch) -> list:  # type: ignore[type-arg]
            return [pool_tokens(rows, "mean") for rows in plain.run(batch)]

        pooled = graphed.run(batch, pooling="mean")
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(pooled, host_pooled(), strict=True))
        g = median_call_seconds(functools.partial(graphed.run, batch, pooling="mean")) * 1000
        p = median_call_seconds(host_pooled) * 1000
        print(
            f"  ({texts}, {tokens}) mean-pooled vectors, median ms: on the device {g:.3f}, plain + host {p:.3f}"
            f"  ({texts / g * 1000:,.0f} / {texts / p * 1000:,.0f} texts/s; max |diff| {diff:.2e})"
        )


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        check(Path(arg))
