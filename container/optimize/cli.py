"""`hare optimize MODEL_DIR --task TASK --target cpu|gpu --out BUNDLE_DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from container.bundle import Manifest
from container.defaults import DEFAULT_BUNDLE, DEFAULT_TASK, default_model_dir
from tasks.errors import InputError
from tasks.registry import TASKS, get_task


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model_dir",
        nargs="?",
        type=Path,
        help="Hugging Face model folder (default: the embedded all-MiniLM-L6-v2)",
    )
    p.add_argument("--task", choices=list(TASKS), help=f"what to serve (default with no MODEL_DIR: {DEFAULT_TASK})")
    p.add_argument("--target", choices=["cpu", "gpu"], default="cpu", help="cpu: int8 candidates; gpu: fp16")
    p.add_argument("--out", type=Path, default=None, help=f"bundle folder (default {DEFAULT_BUNDLE})")
    p.add_argument("--force", action="store_true", help="replace an existing output folder")
    p.add_argument("--allow-pickle", action="store_true", help="accept pytorch_model.bin weights (unsafe)")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model's own Python code (config auto_map) while building; the bundle stays plain ONNX",
    )
    p.add_argument("--validation-file", type=Path, help="one text per line, or JSONL {text} / {query, documents}")
    p.add_argument("--variants", help="comma-separated variant names to try (default: all for the target)")
    p.add_argument("--tune-lengths", type=_ints, default=[16, 128, 384], help="sequence lengths timed")
    p.add_argument("--tune-batches", type=_ints, default=[1, 8], help="batch sizes timed")
    p.add_argument("--tune-threads", type=int, default=1, help="ORT threads while timing (serving: 1 per worker)")
    p.add_argument(
        "--tune-seconds", type=float, default=0.2, help="least time spent timing each point (variants, batch budgets)"
    )
    p.add_argument(
        "--tune-streams",
        type=int,
        default=0,
        help="model calls at once while measuring the batch budget (0: one per physical core, as under load)",
    )
    gates = p.add_argument_group("parity gates (a variant must meet every one to ship)")
    gates.add_argument("--max-fp32-diff", type=float, default=1e-4, help="fp32 max |Δ output| vs PyTorch")
    gates.add_argument("--min-top1", type=float, default=0.99, help="classification top-1 agreement")
    gates.add_argument("--min-token-agreement", type=float, default=0.98, help="per-token label agreement")
    gates.add_argument("--min-cosine", type=float, default=0.99, help="embeddings: 1st percentile of cosine")
    gates.add_argument("--min-spearman", type=float, default=0.98, help="ranking: lowest per-query Spearman")
    gates.add_argument(
        "--min-top20-overlap", type=float, default=0.9, help="sparse: 1st percentile of the top-20 terms' overlap"
    )


def main(args: argparse.Namespace) -> int:
    from container.optimize.pipeline import OptimizeOptions, optimize

    if args.model_dir is None:
        model_dir, task = default_model_dir(), args.task or DEFAULT_TASK
    elif args.task is None:
        raise InputError(f"--task is required with a model folder; one of {', '.join(TASKS)}")
    else:
        model_dir, task = args.model_dir, args.task
    thresholds = {
        "max_abs_diff": args.max_fp32_diff,
        "top1_agreement": args.min_top1,
        "token_agreement": args.min_token_agreement,
        "cosine_p1": args.min_cosine,
        "spearman_min": args.min_spearman,
        "top20_overlap_p1": args.min_top20_overlap,
    }
    # Piped output (CI logs) gets a wide console so the variant table is not squeezed to 80 columns.
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 180)
    out = args.out or DEFAULT_BUNDLE
    manifest = optimize(
        OptimizeOptions(
            model_dir=model_dir,
            task=get_task(task),
            out=out,
            target=args.target,
            force=args.force,
            allow_pickle=args.allow_pickle,
            trust_remote_code=args.trust_remote_code,
            validation_file=args.validation_file,
            thresholds=thresholds,
            only=args.variants.split(",") if args.variants else None,
            tune_lengths=args.tune_lengths,
            tune_batches=args.tune_batches,
            tune_threads=args.tune_threads,
            tune_seconds=args.tune_seconds,
            tune_streams=args.tune_streams,
        ),
        console,
    )
    console.print(variant_table(manifest))
    if manifest.max_batch_tokens:
        rates = ", ".join(f"{budget}: {rate:,.0f}" for budget, rate in manifest.token_rates.items())
        console.print(f"batch budget [bold]{manifest.max_batch_tokens}[/] padded tokens (tokens/s by budget: {rates})")
    console.print(f"bundle written to [bold]{out}[/] (variant [bold]{manifest.variant}[/])")
    return 0


def variant_table(manifest: Manifest) -> Table:
    """Every candidate with its gate figures and timings; the chosen one marked."""
    points = sorted({k for v in manifest.variants for k in v["timings_ms"]}, key=lambda k: (len(k), k))
    table = Table(title=f"{manifest.task} · {manifest.architecture} · {manifest.machine.get('cpu', '')}")
    for col in ["variant", "MB", "max|Δ|", "gates", "ok", *[f"{p} ms" for p in points]]:
        table.add_column(col, justify="left" if col in ("variant", "gates") else "right")
    for v in manifest.variants:
        gates = ", ".join(f"{m}={g['value']:.4g}" for m, g in v["gates"].items() if m != "max_abs_diff")
        diff = v["metrics"].get("max_abs_diff")
        table.add_row(
            ("* " if v["chosen"] else "  ") + v["name"],
            f"{v['size_mb']:.1f}",
            "-" if diff is None else f"{diff:.2g}",
            gates or (f"build failed: {v['error']}"[:80] if v.get("error") else ""),
            "yes" if v["passed"] else "NO",
            *[f"{v['timings_ms'][p]:.2f}" if p in v["timings_ms"] else "-" for p in points],
        )
    return table
