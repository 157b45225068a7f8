"""`hare optimize MODEL_DIR --task TASK --target cpu|gpu --out BUNDLE_DIR`."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from container.arguments import comma_ints, count, finite_float, positive_float, positive_int
from container.bundle import Manifest
from container.defaults import DEFAULT_BUNDLE, DEFAULT_TASK, default_model_dir
from container.machine import FULL_LEVELS, NARROW_LEVELS
from container.optimize.autotune import BUDGETS_HELP, HOPELESS, check_cores, checked_budgets
from container.optimize.textset import file_samples
from container.optimize.validate import FP32_GATE
from tasks.base import Gate
from tasks.errors import InputError
from tasks.registry import TASKS, get_task

# The gates' flags from before they were generated (metric -> flag); any other gate's flag is --min- or --max-
# followed by its metric.
FLAGS = {
    "max_abs_diff": "--max-fp32-diff",
    "top1_agreement": "--min-top1",
    "cosine_p1": "--min-cosine",
    "spearman_min": "--min-spearman",
    "top20_overlap_p1": "--min-top20-overlap",
}


def declared_gates() -> list[tuple[str, Gate]]:
    """Every gate a candidate may face, with where it applies: a task's name, or "every task" (fp32 variants)."""
    return [("every task", FP32_GATE), *((name, gate) for name, spec in TASKS.items() for gate in spec.gates)]


def gates_by_metric() -> dict[str, list[tuple[str, Gate]]]:
    """declared_gates by metric: tasks may share one (and its flag)."""
    found: dict[str, list[tuple[str, Gate]]] = {}
    for name, gate in declared_gates():
        found.setdefault(gate.metric, []).append((name, gate))
    return found


def gate_flag(gate: Gate) -> str:
    """The flag that overrides the gate's threshold: --min-X for a floor, --max-X for a ceiling."""
    bound = "min" if gate.higher_is_better else "max"
    return FLAGS.get(gate.metric) or f"--{bound}-{gate.metric.removeprefix(bound + '_').replace('_', '-')}"


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
    p.add_argument(
        "--adapter",
        metavar="NAME",
        help="for a folder with task adapters (LoRA; config lora_adaptations, e.g. jina-embeddings-v3): the one "
        "baked into this bundle's weights (its sentence-transformers prompt of the same name becomes the default)",
    )
    p.add_argument("--validation-file", type=Path, help="one text per line, or JSONL {text} / {query, documents}")
    p.add_argument("--variants", help="comma-separated variant names to try (default: all for the target)")
    p.add_argument(
        "--int8-weights",
        choices=["auto", "full", "narrow"],
        default="auto",
        help="int8 weight levels: full (127 a side), narrow (64: its integer sums are exact on every x86 CPU, "
        "for a bundle that will run on CPUs other than this one), auto (narrow where this CPU's int8 kernel "
        "adds products in saturating 16-bit pairs: x86 without VNNI; full elsewhere)",
    )
    p.add_argument("--tune-lengths", type=comma_ints, default=[16, 128, 384], help="sequence lengths timed")
    p.add_argument("--tune-batches", type=comma_ints, default=[1, 8], help="batch sizes timed")
    p.add_argument(
        "--tune-threads", type=positive_int, default=1, help="ORT threads while timing (serving: 1 per worker)"
    )
    p.add_argument(
        "--tune-seconds",
        type=positive_float,
        default=0.2,
        help="least time spent timing each point, over autotune's rounds (by the calls' CPU time at one thread), "
        "and each batch budget",
    )
    p.add_argument(
        "--tune-streams",
        type=count,
        default=0,
        help="model calls at once while measuring the batch budget (0: one per physical core, as under load)",
    )
    p.add_argument(
        "--tune-budgets",
        type=comma_ints,
        default=None,
        help=f"padded tokens per call tried for the batch budget, smallest first, {BUDGETS_HELP}; the climb "
        "stops past the peak, and fewer make a large model's build quicker",
    )
    gates = p.add_argument_group("parity gates (a variant must meet every one to ship; default: the task's gate)")
    for metric, declared in gates_by_metric().items():
        first = declared[0][1]
        helps = {g.help for _, g in declared}
        what = first.help if len(helps) == 1 else "; ".join(f"{name}: {g.help}" for name, g in declared)
        defaults = {f"{g.threshold:g}" for _, g in declared}
        default = defaults.pop() if len(defaults) == 1 else ", ".join(f"{n} {g.threshold:g}" for n, g in declared)
        gates.add_argument(
            gate_flag(first),
            dest=f"gate_{metric}",
            type=finite_float,
            metavar="X",
            help=f"{what} (default: {default})".replace("%", "%%"),
        )


def checked_gates(thresholds: Mapping[str, float], task: str) -> None:
    """Refuse a gate's flag that does not apply to `task` (it was ignored: a build judged on the default), and a
    threshold outside the values its metric takes (Gate.bounds): `--min-top1 2` failed every variant, and only
    after the whole build."""
    applies = {FP32_GATE.metric, *(gate.metric for gate in TASKS[task].gates)}
    for metric in sorted(set(thresholds) - applies):
        tasks = [name for name, gate in gates_by_metric()[metric]]
        raise InputError(
            f"{gate_flag(gates_by_metric()[metric][0][1])} is a gate of {', '.join(tasks)}, not of {task}; "
            f"{task}'s gates: {', '.join(gate_flag(g) for g in (FP32_GATE, *TASKS[task].gates))}"
        )
    for metric, value in sorted(thresholds.items()):
        gate = next(gate for _, gate in gates_by_metric()[metric])  # tasks sharing a metric share its bounds
        low, high = gate.bounds
        if not low <= value <= high:
            values = f"from {low:g} to {high:g}" if math.isfinite(high) else f"of {low:g} or more"
            raise InputError(
                f"{gate_flag(gate)} {value:g} is outside the values {metric} takes ({gate.help}), so it fails or "
                f"passes every variant alike; give a threshold {values}"
            )


def variant_names(text: str | None) -> list[str] | None:
    """`--variants a,b`: the names, spaces around them dropped; None (every variant) only when not given."""
    if text is None:
        return None
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise InputError(f"--variants {text!r} names no variant; leave it out to try them all")
    return names


def exit_on_signal(signum: int, frame: object) -> None:
    """A signal handler that leaves as Ctrl-C does, through every `finally` (a build's folder is removed)."""
    raise SystemExit(128 + signum)


def main(args: argparse.Namespace) -> int:
    from container.optimize.pipeline import OptimizeOptions, optimize

    if args.model_dir is None:
        model_dir, task = default_model_dir(), args.task or DEFAULT_TASK
    elif not Path(args.model_dir).is_dir():  # said before the task: no task makes a missing folder a model
        what = "is a file; give the model's folder" if Path(args.model_dir).is_file() else "does not exist"
        raise InputError(f"model folder {args.model_dir} {what}")
    elif args.task is None:
        raise InputError(f"--task is required with a model folder; one of {', '.join(TASKS)}")
    else:
        model_dir, task = args.model_dir, args.task
    given = {metric: getattr(args, f"gate_{metric}", None) for metric in gates_by_metric()}
    thresholds = {metric: value for metric, value in given.items() if value is not None}
    checked_gates(thresholds, task)
    check_cores("--tune-streams", args.tune_streams, "streams")
    check_cores("--tune-threads", args.tune_threads, "threads")
    if args.validation_file is not None:  # read whole here: what is wrong with it was said after the export
        file_samples(args.validation_file, get_task(task).pairs)
    signal.signal(signal.SIGTERM, exit_on_signal)  # docker stop, Kubernetes, timeout: the build's folder is removed
    # Piped output (CI logs) gets a wide console so the variant table is not squeezed to 80 columns.
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 180)
    out = args.out or DEFAULT_BUNDLE
    options = OptimizeOptions(
        model_dir=model_dir,
        task=get_task(task),
        out=out,
        target=args.target,
        force=args.force,
        allow_pickle=args.allow_pickle,
        trust_remote_code=args.trust_remote_code,
        adapter=args.adapter,
        validation_file=args.validation_file,
        thresholds=thresholds,
        only=variant_names(args.variants),
        tune_lengths=args.tune_lengths,
        tune_batches=args.tune_batches,
        tune_threads=args.tune_threads,
        tune_seconds=args.tune_seconds,
        tune_streams=args.tune_streams,
        tune_budgets=None if args.tune_budgets is None else checked_budgets(args.tune_budgets),
        int8_levels={"full": FULL_LEVELS, "narrow": NARROW_LEVELS}.get(args.int8_weights),
    )
    try:
        manifest = optimize(options, console)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM (exit_on_signal): it left without a word
        console.print(f"hare optimize: stopped; {out} is as it was, and the build's working folder is removed")
        raise
    console.print(variant_table(manifest))
    for line in build_lines(manifest):
        console.print(line)
    if manifest.pick:
        console.print(pick_line(manifest.pick))
    if manifest.max_batch_tokens:
        rates = ", ".join(f"{budget}: {rate:,.0f}" for budget, rate in manifest.token_rates.items())
        console.print(f"batch budget [bold]{manifest.max_batch_tokens}[/] padded tokens (tokens/s by budget: {rates})")
    console.print(f"bundle written to [bold]{out}[/] (variant [bold]{manifest.variant}[/])")
    return 0


def variant_table(manifest: Manifest) -> Table:
    """Every candidate with its gate figures and timings (autotune's low percentile, ms per call); the chosen
    one marked "*", and "=" the ones it tied with."""
    points = sorted({k for v in manifest.variants for k in v["timings_ms"]}, key=lambda k: (len(k), k))
    tied = manifest.pick.get("tied", [])
    table = Table(title=f"{manifest.task} · {manifest.architecture} · {manifest.machine.get('cpu', '')}")
    for col in ["variant", "MB", "max|Δ|", "gates", "ok", *[f"{p} ms" for p in points]]:
        table.add_column(col, justify="left" if col in ("variant", "gates") else "right")
    for v in manifest.variants:
        gates = ", ".join(  # a failed gate with its threshold: the table says why a variant was refused
            f"{m}={g['value']:.4g}" + ("" if g["passed"] else f" (gate {g['threshold']:g})")
            for m, g in v["gates"].items()
            if m != "max_abs_diff"
        )
        diff = v["metrics"].get("max_abs_diff")
        table.add_row(
            ("* " if v["chosen"] else "= " if v["name"] in tied else "  ") + v["name"],
            f"{v['size_mb']:.1f}",
            "-" if diff is None else f"{diff:.2g}",
            gates or (f"build failed: {v['error']}"[:80] if v.get("error") else ""),
            "yes" if v["passed"] else "NO",
            *[f"{v['timings_ms'][p]:.2f}" if p in v["timings_ms"] else "-" for p in points],
        )
    return table


def build_lines(manifest: Manifest) -> list[str]:
    """What each calibrated variant's build chose (int8-mixed: the smoothing, the activation scales and the
    MatMuls kept fp32 or split, the lookup tables stored as int8 rows; int8-grouped: its activation group)."""
    lines = []
    for v in manifest.variants:
        chose = v.get("build") or {}
        if "group" in chose:  # int8-grouped (container/optimize/grouped_int8.py)
            stored = chose.get("tables", [])  # bundles of the variant's first builds: none
            rows = f"; lookup tables in int8 rows ({', '.join(stored)})" if stored else ""
            lines.append(
                f"{v['name']}: {chose['weights']} MatMul weights in int8, activations quantized per token in groups "
                f"of {chose['group']} channels at run time{rows}; chosen on {chose['calibration']} samples, "
                f"{chose['passes']} tried, {chose['seconds']:.1f} s"
            )
        if "fp32" not in chose:
            continue
        kept, alpha = chose["fp32"], chose["alpha"]
        smoothing = f"smoothing alpha {alpha:g} on {chose['smoothed']} activations" if alpha else "no smoothing"
        smoothing += f", one activation scale per {chose.get('scales', 'tensor')}"  # older bundles: per tensor
        smoothing += f", int8 weights of {chose.get('levels', FULL_LEVELS)} levels a side"  # older bundles: full
        how = f"chosen on {chose['calibration']} samples, {chose['passes']} simulated passes, {chose['seconds']:.1f} s"
        named = f" ({', '.join(kept)})" if kept else ""
        split = chose.get("split", [])  # older bundles: none
        split_named = f"; {len(split)} split, their outlier channels fp32 ({', '.join(split)})" if split else ""
        table_names = chose.get("tables", [])  # older bundles: none
        stored = f"; lookup tables in int8 rows ({', '.join(table_names)})" if table_names else ""
        lines.append(
            f"{v['name']}: {smoothing}; {len(kept)} of {chose['matmuls']} MatMuls kept fp32{named}{split_named}"
            f"{stored}; {how}"
        )
    return lines


def pick_line(pick: Mapping[str, Any]) -> str:
    """How autotune chose (the manifest's `pick`), in words; "" for a bundle from before it was recorded."""
    if not pick:
        return ""
    how = f"{pick['statistic']}, {pick['rounds']} rounds"
    if dropped := pick.get("dropped"):
        how += f"; {', '.join(dropped)} timed no more after the first points, over {1 + HOPELESS:g}x the fastest"
    if pick["runner_up"] is None:
        alone = "the only variant left" if dropped else "the only variant timed"
        return f"picked {pick['winner']}: {alone} ({how})"
    if not pick["tie"]:
        return f"picked {pick['winner']}: {pick['margin']:.1%} faster than {pick['runner_up']} ({how})"
    return (
        f"tie within {pick['clear_margin']:.0%} ({', '.join(pick['tied'])}; {pick['fastest']} ahead by "
        f"{pick['margin']:.1%}): took {pick['winner']} (more accurate) ({how})"
    )
