"""hare against sentence-transformers in process on one GPU, texts in and vectors out (run by scripts/gpu-check
on the device machine, after the MiniLM build): the bundle's tokenizer, the served backend (CUDA graphs
included) and the task's pooling and normalizing, against SentenceTransformer.encode in fp16 on the same
GPU, at batch 32 and 1, texts of 128 and 16 tokens; texts/s from the median of 50 calls after 10 warm-ups,
and the cosine of the two vectors (the same weights: the bundle was built from the folder given).

    python scripts/gpu-peers.py BUNDLE MODEL_DIR [--device cpu] [--calls N]   (cpu: a smoke test of the script)
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from api.engine.backend import Backend
from bench.inputs import TextMaker, load_tokenizer
from bench.stats import median_call_seconds
from container.bundle import MODEL_FILE, read_manifest
from container.cudagraphs import graph_shapes
from tasks.ops import normalize_vector, pool_tokens

Vectors = NDArray[np.float32]


def hare_encoder(bundle: Path, target: str) -> Callable[[list[str]], Vectors]:
    manifest = read_manifest(bundle)
    tokenizer = load_tokenizer(bundle)
    shapes = graph_shapes(64, 16384, manifest.max_length)
    backend = Backend(
        bundle / MODEL_FILE,
        target,
        (1,),
        manifest.output,
        pad_id=manifest.pad_id,
        graph_shapes=shapes,
        max_length=manifest.max_length,
    )
    pooling = manifest.pooling or "mean"

    def encode(texts: list[str]) -> Vectors:
        rows = backend.run(tokenizer.encode_batch(texts))
        vectors = [pool_tokens(r, pooling) for r in rows]
        return np.stack([normalize_vector(v) if manifest.normalize else v for v in vectors])

    return encode


def st_encoder(model_dir: Path, device: str) -> Callable[[list[str]], Vectors]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
    if device == "cuda":
        model.half()

    def encode(texts: list[str]) -> Vectors:
        out = model.encode(texts, batch_size=len(texts), convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)

    return encode


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--calls", type=int, default=50, help="timed calls a median is taken over (default 50)")
    args = parser.parse_args()
    maker = TextMaker(load_tokenizer(args.bundle))
    hare = hare_encoder(args.bundle, "gpu" if args.device == "cuda" else "cpu")
    st = st_encoder(args.model_dir, args.device)
    print(
        f"\n## {args.bundle.name} against sentence-transformers {'fp16 ' if args.device == 'cuda' else ''}"
        f"on {args.device}, in process"
    )
    for batch, tokens in ((32, 128), (32, 16), (1, 128), (1, 16)):
        texts = maker.texts(tokens, batch)
        a, b = hare(texts), st(texts)
        cosine = float(np.min(np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)))
        h, s = (median_call_seconds(functools.partial(f, texts), args.calls, 10) for f in (hare, st))
        print(
            f"  batch {batch} x {tokens} tokens: hare {batch / h:,.0f} texts/s ({h * 1000:.2f} ms), "
            f"sentence-transformers {batch / s:,.0f} ({s * 1000:.2f} ms), {s / h:.2f}x; min cosine {cosine:.4f}"
        )


if __name__ == "__main__":
    main()
