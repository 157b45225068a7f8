"""`hare tune BUNDLE`: measure a CPU bundle's batch budget on this machine and write it into its hare.json;
`hare tune BUNDLE --check`: run the bundle's parity gate again on this machine.

`hare optimize` measures the budget where it runs; an image's bundle is optimized where the image is built,
and another CPU (other caches, more cores) may want another budget (docs/optimizer.md). This runs the
optimizer's budget stage again on the bundle as it ships, with the same rule. `--dry-run` only prints it, as
the HARE_MAX_BATCH_TOKENS to set where the bundle is read-only (an image's /bundle).

An int8 graph's error depends on the CPU's int8 kernels (container/machine.py INT8_PATHS): a bundle checked
on an AMX machine and served on an AVX2 one was judged on other arithmetic. `--check` runs the shipped graph
on the validation set the bundle carries (parity.npz: the inputs and PyTorch's answers) and applies the gates
it shipped with; no torch is needed, so it runs in the serving image. A bundle holds one graph, so a failing
check cannot re-pick: it says to rebuild on this CPU (or build with --variants fp32)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from tokenizers import Tokenizer

from container.arguments import comma_ints, count, positive_float
from container.bundle import MANIFEST_FILE, MODEL_FILE, PARITY_FILE, Manifest, checked_bundle
from container.defaults import DEFAULT_BUNDLE
from container.machine import physical_cores
from container.onnx_wire import hidden_width
from tasks.errors import InputError


def configure(p: argparse.ArgumentParser) -> None:
    from container.optimize.autotune import BUDGETS_HELP

    p.add_argument(
        "bundle", nargs="?", type=Path, default=DEFAULT_BUNDLE, help=f"bundle folder (default {DEFAULT_BUNDLE})"
    )
    p.add_argument(
        "--streams", type=count, default=0, help="model calls at once (0: one per physical core, as the server runs)"
    )
    p.add_argument("--seconds", type=positive_float, default=0.2, help="least time spent timing each budget")
    p.add_argument(
        "--budgets",
        type=comma_ints,
        default=None,
        help=f"padded tokens per call tried, {BUDGETS_HELP}",
    )
    p.add_argument("--dry-run", action="store_true", help="measure and print; leave hare.json as it is")
    p.add_argument(
        "--check",
        action="store_true",
        help="instead: run the bundle's parity gates on this CPU (exit 1 if the graph fails them here)",
    )


def main(args: argparse.Namespace) -> int:
    bundle: Path = args.bundle
    # As `hare serve` and `hare run` open it: a bundle they refuse (its task unknown, its tokenizer unreadable) is
    # refused here in the same sentence, not measured, checked or rewritten.
    manifest, tokenizer = checked_bundle(bundle)
    if args.check:
        return check(bundle, manifest)
    from container.optimize.cli import exit_on_signal  # here, as serve.py takes it: cli imports the optimizer's stages

    signal.signal(signal.SIGTERM, exit_on_signal)  # docker stop, timeout: said as Ctrl-C is, through the finally
    try:
        return _measure(args, bundle, manifest, tokenizer)
    except (KeyboardInterrupt, SystemExit):  # it left without a word (exit 130 or 143)
        _console().print(f"hare tune: stopped; {bundle / MANIFEST_FILE} is as it was")
        raise


def _console() -> Console:
    """stderr, its lines wrapped at 120 columns where it is no terminal (a log): rich's 80 split a bundle's path."""
    return Console(stderr=True, width=None if sys.stderr.isatty() else 120)


def _measure(args: argparse.Namespace, bundle: Path, manifest: Manifest, tokenizer: Tokenizer) -> int:
    """The budget measured and written (or printed, --dry-run)."""
    from container.optimize import autotune

    if manifest.target != "cpu":
        raise InputError(
            f"{bundle} is a {manifest.target} bundle: the batch budget is measured for CPU bundles "
            "(a GPU batches up to HARE_MAX_BATCH_TOKENS, 8192 by default)"
        )
    if not args.dry_run and not os.access(bundle, os.W_OK):  # found after the measurement, its minutes lost
        raise InputError(
            f"cannot write {bundle / MANIFEST_FILE} (the bundle's folder is read-only to this user): pass --dry-run "
            "to measure and print the budget, then set HARE_MAX_BATCH_TOKENS to it where the bundle is served"
        )
    autotune.check_cores("--streams", args.streams, "streams")
    streams = args.streams or physical_cores()
    fitting = autotune.fitting_tokens(hidden_width(bundle / MODEL_FILE) or 0, streams)
    budgets = autotune.BUDGETS if args.budgets is None else autotune.checked_budgets(args.budgets, fitting)
    console = _console()
    # A line a budget climbed to and a round: the climb's largest calls take seconds each, and a measurement
    # that seems to hang says where it is.
    rates = autotune.token_rates(
        bundle / MODEL_FILE,
        tokenizer,
        streams,
        budgets=budgets,
        min_seconds=args.seconds,
        step=lambda detail: console.print(f"batch budget: {detail}"),
        variant=manifest.variant,
    )
    fields = autotune.budget_fields(rates, streams)
    budget = fields["max_batch_tokens"]
    console.print(f"batch budget on {fields['budget_machine']['cpu']}, {streams} model calls at once")
    console.print(_table(rates, budget, manifest.max_batch_tokens))
    if args.dry_run:
        print(f"HARE_MAX_BATCH_TOKENS={budget}")
        return 0
    data = json.loads((bundle / MANIFEST_FILE).read_text()) | fields  # keys this hare does not know stay
    temporary = bundle / f".{MANIFEST_FILE}.{os.getpid()}"
    try:
        temporary.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(temporary, bundle / MANIFEST_FILE)  # a server starting meanwhile reads the old or the new
    except OSError as exc:
        raise InputError(
            f"cannot write {bundle / MANIFEST_FILE} ({exc.strerror}): set HARE_MAX_BATCH_TOKENS={budget} "
            "where the bundle is served instead"
        ) from exc
    finally:  # written and not renamed: a full disk, or stopped in between
        with contextlib.suppress(OSError):  # a read-only file system refuses even removing what is not there
            temporary.unlink(missing_ok=True)
    print(f"{bundle / MANIFEST_FILE}: max_batch_tokens {manifest.max_batch_tokens} -> {budget}")
    return 0


def _table(rates: dict[int, float], budget: int, before: int | None) -> Table:
    table = Table()
    for col in ("padded tokens per call", "tokens/s", ""):
        table.add_column(col, justify="right")
    best = max(rates.values())
    for tokens, rate in rates.items():
        marks = [m for m, on in (("chosen", tokens == budget), ("was", tokens == before)) if on]
        table.add_row(str(tokens), f"{rate:,.0f} ({rate / best:.0%})", ", ".join(marks))
    return table


def check(bundle: Path, manifest: Manifest) -> int:
    """The shipped graph against the bundle's stored reference, on this CPU, with the gates it shipped with
    (`manifest`: the bundle's, checked_bundle's)."""
    from container.machine import int8_check
    from container.models import open_model
    from container.optimize.validate import judge, load_parity, served_outputs
    from tasks.registry import get_task

    if not (bundle / PARITY_FILE).is_file():
        raise InputError(f"{bundle} has no {PARITY_FILE} (built before hare kept its validation set): rebuild it")
    shipped = next((v for v in manifest.variants if v["name"] == manifest.variant), None)
    if shipped is None:
        raise InputError(
            f"{bundle}/{MANIFEST_FILE} ships variant {manifest.variant!r} but records no gates for it (its "
            "variants list lacks it): rebuild the bundle"
        )
    thresholds = {metric: float(g["threshold"]) for metric, g in shipped["gates"].items()}
    feeds, refs, groups = load_parity(bundle / PARITY_FILE)
    model = open_model(bundle / MODEL_FILE, manifest.variant, manifest.target, 1, manifest.output)
    names = set(model.input_names)
    feeds = [{k: v for k, v in f.items() if k in names} for f in feeds]
    served = served_outputs(model.run, feeds, manifest.pad_id, refs, groups)
    task = get_task(manifest.task)
    _, verdicts = judge(
        task,
        manifest.precision,
        *served,
        manifest.pooling or "mean",
        manifest.multi_label,
        thresholds,
        manifest.regression,
    )
    path = int8_check(manifest.machine, manifest.int8_levels)
    console = _console()
    console.print(
        f"{manifest.variant} on {path['serving_on']} int8 kernels; "
        f"checked at build on {path['checked_on']}; int8 weights of {path['levels']} levels a side"
        f"{' (exact on both)' if path['exact'] else ''}; {len(feeds)} samples"
    )
    table = Table()
    for col in ("gate", "at build", "here", "threshold", "passes here"):
        table.add_column(col, justify="left" if col == "gate" else "right")
    for metric, verdict in verdicts.items():
        built = shipped["gates"].get(metric, {}).get("value")
        table.add_row(
            metric,
            "-" if built is None else f"{float(built):.4g}",
            f"{float(verdict['value']):.4g}",
            f"{float(verdict['threshold']):g}",
            "yes" if verdict["passed"] else "NO",
        )
    console.print(table)
    failed = [m for m, v in verdicts.items() if not v["passed"]]
    if failed:
        console.print(
            f"{bundle}: {manifest.variant} fails {', '.join(failed)} on this CPU; rebuild it here "
            "(hare optimize picks among the variants that pass on this CPU's kernels), or build with --variants fp32"
        )
        return 1
    print(f"{bundle}: {manifest.variant} passes its gates on this CPU")
    return 0
