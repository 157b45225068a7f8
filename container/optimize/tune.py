"""`hare tune BUNDLE`: measure a CPU bundle's batch budget on this machine and write it into its hare.json.

`hare optimize` measures the budget where it runs; an image's bundle is optimized where the image is built,
and another CPU (other caches, more cores) may want another budget (docs/overload.md). This runs the
optimizer's budget stage again on the bundle as it ships, with the same rule. `--dry-run` only prints it, as
the HARE_MAX_BATCH_TOKENS to set where the bundle is read-only (an image's /bundle)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from container.bundle import MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE, read_manifest
from container.defaults import DEFAULT_BUNDLE
from container.machine import physical_cores
from tasks.errors import InputError


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "bundle", nargs="?", type=Path, default=DEFAULT_BUNDLE, help=f"bundle folder (default {DEFAULT_BUNDLE})"
    )
    p.add_argument(
        "--streams", type=int, default=0, help="model calls at once (0: one per physical core, as the server runs)"
    )
    p.add_argument("--seconds", type=float, default=0.2, help="least time spent timing each budget")
    p.add_argument("--dry-run", action="store_true", help="measure and print; leave hare.json as it is")


def main(args: argparse.Namespace) -> int:
    from tokenizers import Tokenizer

    from container.optimize import autotune

    bundle: Path = args.bundle
    manifest = read_manifest(bundle)
    if manifest.target != "cpu":
        raise InputError(
            f"{bundle} is a {manifest.target} bundle: the batch budget is measured for CPU bundles "
            "(a GPU batches up to HARE_MAX_BATCH_TOKENS, 8192 by default)"
        )
    if args.streams < 0 or args.seconds <= 0:
        raise InputError("--streams must be 0 or more and --seconds more than 0")
    streams = args.streams or physical_cores()
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    rates = autotune.token_rates(bundle / MODEL_FILE, tokenizer, streams, min_seconds=args.seconds)
    fields = autotune.budget_fields(rates, streams)
    budget = fields["max_batch_tokens"]
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
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
        temporary.unlink(missing_ok=True)
        raise InputError(
            f"cannot write {bundle / MANIFEST_FILE} ({exc.strerror}): set HARE_MAX_BATCH_TOKENS={budget} "
            "where the bundle is served instead"
        ) from exc
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
