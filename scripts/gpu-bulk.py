"""`hare run` on one GPU, against the bundle's model alone and sentence-transformers fp16 on the same GPU (run by
scripts/gpu-check after the MiniLM build, BULK=0 skips it; issue 49 asks the job to keep "the GPU busy"):
N texts of 10-300 tokens (bench.bulk.corpus, as `hare bench bulk`), then

    model alone   the job's own calls, tokenized beforehand (bench.bulk.model_only), on 1 and 2 threads
    hare run      the command in a child process on 1 and 2 model threads (`--streams`): rows/s of its job
                  (its --summary: no process start or bundle load) and by the wall clock, its peak RSS
    ST fp16       SentenceTransformer.encode in fp16 on the GPU at batch 32 and 128, after a warm-up

and the 1st percentile of the cosine of hare run's vectors to sentence-transformers' (the same weights: the
bundle was built from MODEL_DIR). One pass each, in that order.

    python scripts/gpu-bulk.py BUNDLE MODEL_DIR [--rows N] [--device cpu]   (cpu: a smoke test of the script)
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bulk import _jsonl, _p1, _vectors, corpus, hare_run, model_only
from bench.inputs import load_tokenizer

STREAMS = (1, 2)
ST_BATCHES = (32, 128)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle", type=Path)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--rows", type=int, default=20_000, help="texts in the corpus (default 20,000)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.bundle)
    texts = corpus(tokenizer, args.rows, 10, 300)
    print(f"\n## hare run on {args.device}: {args.rows:,} texts of 10-300 tokens, {args.bundle.name}")
    for streams in STREAMS:
        rate, tokens = model_only(args.bundle, texts, streams)
        each = tokens / len(texts)
        print(f"  model alone, {streams} thread(s): {rate.rows_per_s:,.0f} rows/s, {each:.0f} tokens a text")
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "corpus.jsonl"
        _jsonl(source, texts)
        for streams in STREAMS:
            out = Path(folder) / f"out-{streams}.parquet"
            whole, job, peak = hare_run(args.bundle, source, out, len(texts), streams)
            print(
                f"  hare run, {streams} model thread(s): its job {job.rows_per_s:,.0f} rows/s, with start and load "
                f"{whole.rows_per_s:,.0f}; peak RSS {peak:,.0f} MB"
            )
        vectors = _vectors(out)  # the last run's: each writes the same rows
    for batch, (st_rate, theirs) in zip(ST_BATCHES, st_encode(args.model_dir, args.device, texts), strict=True):
        p1 = _p1(theirs, vectors)
        print(f"  sentence-transformers, batch {batch}: {st_rate:,.0f} rows/s; hare run's cosine p1 to it {p1:.4f}")


def st_encode(model_dir: Path, device: str, texts: list[str]) -> list[tuple[float, np.ndarray]]:
    """Rows/s and vectors of SentenceTransformer.encode at each of ST_BATCHES (fp16 on a GPU)."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
    if device == "cuda":
        model.half()
    done = []
    for batch in ST_BATCHES:
        model.encode(texts[: batch * 4], batch_size=batch, show_progress_bar=False)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.encode(texts, batch_size=batch, convert_to_numpy=True, show_progress_bar=False)
        done.append((len(texts) / (time.perf_counter() - start), np.asarray(out, dtype=np.float32)))
    return done


if __name__ == "__main__":
    main()
