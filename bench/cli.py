"""`hare bench`: run | headline | overload | peers | bulk | model | ceiling | list | show | compare | export | report.

hare bench run BUNDLE --seq 8,128 --batch 1 --concurrency 2 --baseline vanilla,comet
hare bench run http://127.0.0.1:8000 --bundle BUNDLE        (a server already running)
hare bench run BUNDLE --load open --rate 50,100 --duration 20
hare bench headline                                         (the issue's scenario, with its goals)
hare bench peers [MODEL_DIR] [--bundle BUNDLE]              (in process: hare's bundle vs sentence-transformers,
                                                             its ONNX/OpenVINO backends and int8, fastembed)
hare bench bulk [BUNDLE] --rows 2000                        (hare run over a corpus vs the model alone and the
                                                             peers' encode/embed, batch 32)
hare bench model mpnet-base DIR                             (a random-weights folder of a real geometry)
hare bench ceiling                                          (the load generator against a trivial server)
hare bench list | show RUN | compare RUN RUN | export RUN --format csv | report RUN --format html
hare bench report [--kind overload] [--since 2026-11-01] [--out docs/results.md]   (the dated results page)

This module is the parser; the subcommands that measure are bench/measure.py's, those that read the result
store bench/readout.py's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench import measure, readout
from bench.geometries import GEOMETRIES
from bench.inputs import MIXES
from bench.loadgen import MAX_RATE
from bench.store import default_db_path
from container.arguments import comma_floats, comma_ints, count, positive_float, positive_int, seconds
from container.machine import physical_cores
from tasks.registry import TASKS


def _rates(text: str) -> list[float]:
    """`--rate 50,100.5`: requests a second, each above 0 and at most MAX_RATE (the open loop's client would
    fall behind and queue arrivals without end)."""
    rates = comma_floats(text)
    if max(rates) > MAX_RATE:
        raise argparse.ArgumentTypeError(f"expected rates of at most {MAX_RATE:,.0f} requests a second, got {text!r}")
    return rates


def _seqs(text: str) -> list[int | str]:
    """`8,128,comet,mix`: token counts, or a mix of lengths by name (bench.inputs.MIXES)."""
    out: list[int | str] = []
    for item in text.split(","):
        if item in MIXES:
            out.append(item)
        elif item.isdigit() and int(item) > 0:
            out.append(int(item))
        elif item:
            names = " or ".join(f"`{name}`" for name in MIXES)
            raise argparse.ArgumentTypeError(f"sequence lengths are positive integers, {names}; got {item!r}")
    return out


def _since(text: str) -> datetime:
    """`2026-11-01` or `2026-11-01T12:00` (UTC unless it names its zone)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date such as 2026-11-01, got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, default=None, help=f"result store (default {default_db_path()})")


def _progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        choices=["rich", "jsonl", "none"],
        default="rich",
        help="rich: a progress bar on stderr; jsonl: one JSON event per line on stdout (see bench/store.py)",
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="bench_command", required=True, metavar="SUBCOMMAND")

    run = sub.add_parser("run", help="measure a server, bundle or model folder (and baselines) over a grid")
    run.add_argument("target", help="http://127.0.0.1:PORT, a bundle folder, or a model folder (with --task)")
    run.add_argument(
        "--task", choices=list(TASKS), help="the task (needed for a model folder, or a URL without --bundle)"
    )
    run.add_argument("--bundle", type=Path, help="with a URL: the bundle it serves (tokenizer, model-only figure)")
    run.add_argument("--model", type=Path, help="Hugging Face folder for the baselines (default: the bundle's source)")
    run.add_argument("--tokenizer", type=Path, help="tokenizer.json for exact token counts (default: the bundle's)")
    grid = run.add_argument_group("grid")
    grid.add_argument(
        "--seq",
        type=_seqs,
        default=[8, 128],
        help="token counts, `comet` (45-55 words) or `mix` (3-140 words, most short) (default 8,128)",
    )
    grid.add_argument("--batch", type=comma_ints, default=[1], help="texts (or ranked documents) per request")
    grid.add_argument("--concurrency", type=comma_ints, default=[physical_cores()], help="closed-loop users")
    grid.add_argument("--load", choices=["closed", "open"], default="closed", help="closed loop or Poisson arrivals")
    grid.add_argument("--rate", type=_rates, default=[], help="open loop: requests per second (comma-separated)")
    grid.add_argument(
        "--workers",
        type=comma_ints,
        default=None,
        help="hare server workers to try, each with the server's streams for its share (default: its own)",
    )
    grid.add_argument(
        "--threads", type=comma_ints, default=None, help="ORT threads per worker to try (default: its own)"
    )
    grid.add_argument("--warmup", type=seconds, default=2.0, help="seconds of unrecorded load before each point")
    grid.add_argument("--duration", type=positive_float, default=10.0, help="seconds recorded per point")
    grid.add_argument("--max-requests", type=positive_int, default=100_000, help="stop a point after this many answers")
    grid.add_argument(
        "--timeout", type=positive_float, default=60.0, help="seconds before a request counts as timed out"
    )
    run.add_argument("--baseline", type=_names, default=[], help="vanilla,comet: baselines in the same run")
    run.add_argument("--comet-workers", type=positive_int, default=physical_cores(), help="comet baseline workers")
    run.add_argument("--no-model-only", action="store_true", help="skip the in-process model-only figure")
    run.add_argument("--serve-arg", action="append", default=[], help="extra argument for `hare serve` (repeat)")
    run.add_argument("--quick", action="store_true", help="two short points (seq 8 and 16, 1 user): a smoke test")
    run.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes over every target's points, interleaved; each point keeps its median pass and each ratio is "
        "the median of the passes' ratios (default 1)",
    )
    run.add_argument("--name", default="", help="a label for the run")
    _progress(run)
    _common(run)

    head = sub.add_parser("headline", help="the headline scenario: DistilBERT classification vs vanilla, MiniLM")
    head.add_argument("--duration", type=positive_float, default=8.0, help="seconds recorded per point")
    head.add_argument("--warmup", type=seconds, default=2.0, help="seconds of unrecorded load before each point")
    head.add_argument("--seq", type=comma_ints, default=None, help="override the classification lengths")
    head.add_argument("--no-embeddings", action="store_true", help="skip the MiniLM embeddings part")
    _progress(head)
    _common(head)

    over = sub.add_parser("overload", help="one user vs model-only, open loop at k x capacity, flood, recovery, soak")
    over.add_argument("bundle", type=Path, help="the bundle to serve (one `hare serve` for every phase)")
    over.add_argument("--seq", type=positive_int, default=128, help="tokens per request (default 128)")
    over.add_argument(
        "--factor", type=positive_float, default=3.0, help="open-loop arrival rate in capacities (default 3)"
    )
    over.add_argument("--flood", type=positive_int, default=1000, help="connections of the greedy flood (default 1000)")
    over.add_argument("--duration", type=positive_float, default=10.0, help="seconds recorded per phase (default 10)")
    over.add_argument("--soak", type=seconds, default=0.0, help="seconds of soak with RSS sampling (default: none)")
    over.add_argument("--serve-arg", action="append", default=[], help="extra argument for `hare serve` (repeat)")
    over.add_argument(
        "--tail",
        type=comma_ints,
        default=[8, 128],
        help="token counts of the p99/p50 phases at users = cores and 16 users",
    )
    over.add_argument("--no-tail", action="store_true", help="skip the p99/p50 phases")
    over.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="passes of capacity, open loop, flood and recovery on the same server; each goal judged on the "
        "median of its rounds (default 1)",
    )
    _common(over)

    peers = sub.add_parser(
        "peers",
        help="hare's bundle against sentence-transformers (torch, onnx, openvino, int8) and fastembed, in process",
        description="See bench/peers/__init__.py for each candidate and how its threads are set.",
    )
    peers.add_argument(
        "model_dir",
        nargs="?",
        type=Path,
        default=None,
        help="sentence-transformers folder (default: the default model)",
    )
    peers.add_argument("--bundle", type=Path, help="hare's bundle of it (default: `hare optimize` it, cached)")
    peers.add_argument(
        "--seq", type=positive_int, default=128, help="tokens per text for the speed figures (default 128)"
    )
    peers.add_argument(
        "--batch", type=positive_int, default=32, help="the throughput batch (default 32; batch 1 always)"
    )
    peers.add_argument("--threads", type=comma_ints, default=[1, 2], help="thread counts (default 1,2)")
    peers.add_argument("--rounds", type=positive_int, default=5, help="rounds of every candidate in turn (default 5)")
    peers.add_argument("--seconds", type=seconds, default=1.0, help="seconds recorded per slot and round (default 1)")
    peers.add_argument("--fidelity", type=positive_int, default=200, help="texts in the fidelity set (default 200)")
    peers.add_argument(
        "--fidelity-max", type=positive_int, default=200, help="the fidelity set's longest text in tokens"
    )
    peers.add_argument("--only", type=_names, default=None, help="candidates to run (torch always runs)")
    peers.add_argument("--skip", type=_names, default=[], help="candidates to leave out")
    peers.add_argument(
        "--int8-config",
        choices=["avx512_vnni", "avx512", "avx2", "arm64"],
        default=None,
        help="sentence-transformers' dynamic int8 configuration (default: from the CPU's flags)",
    )
    peers.add_argument("--work", type=Path, default=None, help="where the peers' exports are kept (default: cache)")
    peers.add_argument("--name", default="", help="a label for the run")
    _common(peers)

    bulk = sub.add_parser(
        "bulk",
        help="`hare run` over a corpus vs the model alone and the peers' encode/embed (bench/bulk.py)",
        description="See bench/bulk.py for each candidate; a peer whose packages are missing is skipped, saying why.",
    )
    bulk.add_argument(
        "bundle", nargs="?", type=Path, default=Path("bundles/all-MiniLM-L6-v2"), help="an embedding bundle"
    )
    bulk.add_argument(
        "--rows", type=int, default=2_000, help="texts of 10-300 tokens (default 2,000: minutes a candidate on 2 cores)"
    )
    bulk.add_argument("--model-dir", type=Path, help="the peers' model folder (default: the default model's)")
    bulk.add_argument("--skip", type=_names, default=[], help="peers to leave out: torch,onnx,openvino,fastembed")
    bulk.add_argument("--streams", type=count, default=0, help="cores for every candidate (default: physical cores)")
    bulk.add_argument("--work", type=Path, default=None, help="where the peers' exports are kept (default: cache)")
    bulk.add_argument(
        "--rounds", type=int, default=1, help="passes of every candidate, interleaved; figures are medians (default 1)"
    )
    bulk.add_argument("--name", default="", help="a label for the run")
    _common(bulk)

    model = sub.add_parser("model", help="write a random-weights model folder of a real checkpoint's geometry")
    model.add_argument("name", choices=sorted(GEOMETRIES), help="the geometry (see bench/geometries.py)")
    model.add_argument("folder", type=Path, help="a new or empty folder (one this command wrote is kept as it is)")

    ceiling = sub.add_parser("ceiling", help="the load generator's own ceiling against a trivial endpoint")
    ceiling.add_argument("--concurrency", type=comma_ints, default=[1, 2, 16], help="users to try")
    ceiling.add_argument("--duration", type=positive_float, default=3.0)

    lst = sub.add_parser("list", help="runs in the store, newest first")
    lst.add_argument("--limit", type=positive_int, default=30)
    _common(lst)

    show = sub.add_parser("show", help="a run's settings, points and hare/baseline ratios")
    show.add_argument("run", type=int)
    _common(show)

    cmp = sub.add_parser("compare", help="two runs side by side at matching settings (B over A)")
    cmp.add_argument("a", type=int)
    cmp.add_argument("b", type=int)
    _common(cmp)

    exp = sub.add_parser("export", help="a run's points as CSV or JSON")
    exp.add_argument("run", type=int)
    exp.add_argument("--format", choices=["csv", "json"], default="csv")
    exp.add_argument("--out", type=Path, help="file to write (default: stdout)")
    _common(exp)

    rep = sub.add_parser(
        "report",
        help="a run's Markdown or HTML report with plots; without RUN, the dated results page of every run",
        description="With RUN: that run's report with plots (--format md|html). Without: the results page "
        "(Markdown, bench/page.py), every done run grouped by kind, newest first, with its machine, versions, "
        "settings and tables; the same store renders the same page.",
    )
    rep.add_argument("run", type=int, nargs="?", help="one run's report (default: the results page of every run)")
    rep.add_argument("--format", choices=["md", "html"], default=None, help="with RUN: md or html (default html)")
    rep.add_argument(
        "--out", type=Path, help="output file (default: bench-report-RUN.html|md; the results page: stdout)"
    )
    rep.add_argument("--kind", help="the results page: runs of this kind only (run, headline, overload, peers...)")
    rep.add_argument("--since", type=_since, help="the results page: runs from this date on (YYYY-MM-DD, UTC)")
    rep.add_argument("--all", action="store_true", help="the results page: failed and cancelled runs too")
    _common(rep)


def main(args: argparse.Namespace) -> int:
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "run": measure.run,
        "headline": measure.headline,
        "overload": measure.overload,
        "peers": measure.peers,
        "bulk": measure.bulk,
        "model": measure.model,
        "ceiling": measure.ceiling,
        "list": readout.list_runs,
        "show": readout.show,
        "compare": readout.compare,
        "export": readout.export,
        "report": readout.report,
    }
    return handlers[args.bench_command](args)
