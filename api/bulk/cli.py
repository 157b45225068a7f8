"""`hare run [BUNDLE] --input PATH --output PATH`: a corpus through a bundle (docs/bulk.md).

The batch budget, target, cores and the default size limit and truncation are the server's settings for the
bundle (api/config.py: HARE_MAX_BATCH_TOKENS, HARE_MAX_BATCH_SIZE, HARE_TARGET, HARE_CORES,
HARE_MAX_INPUT_CHARS, HARE_TRUNCATE), except that where HARE_MAX_BATCH_TOKENS is unset a job batches up to the
bundle's budget of the best measured token rate (container/bundle.py resolve_max_batch_tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.table import Table
from rich.text import Text

from api.bulk.job import CHUNK_ROWS, IN_FLIGHT, BulkOptions, Summary, run_job
from api.bulk.job import Progress as JobProgress
from api.bulk.model import LONG_INPUTS, BulkModel
from api.bulk.reader import FORMATS, Columns, Corpus
from api.bulk.writer import OUTPUT_FORMATS
from api.config import Settings
from container.arguments import positive_int, whole_number_to
from tasks.base import SIDES
from tasks.errors import InputError, InvalidRequest

# Rows a chunk at most: a job holds IN_FLIGHT chunks, their texts, tokens and answers, at once. 72,000 texts of
# 10-40 tokens peaked at 540 MB of RSS in chunks of 4,096 rows and at 830 MB in chunks of 16,384 (MiniLM,
# 2026-12-04; docs/bulk.md); --chunk-rows 10000000 read a whole corpus into memory before its first answer.
MAX_CHUNK_ROWS = 16_384


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", nargs="?", type=Path, help="bundle folder (default: the server's, HARE_BUNDLE)")
    parser.add_argument(
        "--input", "-i", type=Path, required=True, help="JSONL, CSV or Parquet file, or a folder of them"
    )
    parser.add_argument("--output", "-o", required=True, help="Parquet file (or .jsonl)")
    parser.add_argument("--input-format", choices=FORMATS, help="the input's format (default: from its suffix)")
    parser.add_argument("--output-format", choices=OUTPUT_FORMATS, help="default: jsonl for .jsonl, else parquet")
    parser.add_argument("--text-column", default="text", help="the texts' column (default: text)")
    parser.add_argument("--query-column", default="query", help="text-ranking: the queries' column")
    parser.add_argument("--document-column", default="document", help="text-ranking: the documents' column")
    parser.add_argument(
        "--text-pair-column",
        help="text-classification: each text's second text, to classify pairs (inference, paraphrase); "
        "default: single texts",
    )
    parser.add_argument("--id-column", help="the rows' ids (default: id if there is one, else row numbers)")
    parser.add_argument(
        "--param",
        "-p",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a /predict parameter of the task (VALUE read as JSON, else as text), e.g. encoding_format=int8",
    )
    parser.add_argument(
        "--long-input",
        choices=LONG_INPUTS,
        help="texts over the model's maximum: cut them, read them in windows, or refuse them (to the rejects) "
        "(default: truncate unless HARE_TRUNCATE=0)",
    )
    parser.add_argument(
        "--truncation-direction",
        choices=tuple(SIDES),
        default="right",
        help="the end a text cut at the model's maximum loses: right (its end) or left (its start; its last tokens "
        "are read), as /predict's truncation_direction",
    )
    parser.add_argument("--max-chars", type=positive_int, help="characters per text; longer rows are rejected")
    parser.add_argument(
        "--chunk-rows",
        type=whole_number_to(MAX_CHUNK_ROWS, f"a job holds {IN_FLIGHT} chunks in memory at once"),
        default=CHUNK_ROWS,
        help=f"rows per chunk, the unit of resuming (at most {MAX_CHUNK_ROWS:,})",
    )
    parser.add_argument("--streams", type=positive_int, help="model threads (default: one per core)")
    parser.add_argument("--rejects", type=Path, help="rejected rows, JSONL (default: OUTPUT's stem + .rejects.jsonl)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress bar; the summary only")
    parser.add_argument("--summary", type=Path, help="also write the summary to this file, as JSON")
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="run on the Ray cluster at ADDRESS (auto: the local one) with Ray Data; OUTPUT is then a folder of "
        "Parquet files, rejected rows kept with their reason in `error` (docs/bulk.md)",
    )


def main(args: argparse.Namespace) -> int:
    if not args.ray and args.output.endswith(("/", os.sep)):  # Path drops the slash: a file of that name was written
        raise InputError(
            f"the output {args.output} names a folder; name a file to write, such as {args.output}out.parquet"
        )
    if args.output == "-":  # a file named "-" was written, where a user meant standard output
        raise InputError("the output - (standard output) is not one hare run writes to; name a file, such as out.jsonl")
    args.output = Path(args.output)
    settings = Settings.from_env()
    if args.bundle is not None:
        settings = dataclasses.replace(settings, bundle=args.bundle)
    options = BulkOptions(
        input=args.input,
        output=args.output,
        input_format=args.input_format,
        output_format=args.output_format,
        columns=Columns(
            args.text_column, args.query_column, args.document_column, args.id_column, args.text_pair_column
        ),
        parameters=parameters(args.param),
        long_input=args.long_input,
        truncation_direction=args.truncation_direction,
        max_chars=args.max_chars,
        chunk_rows=args.chunk_rows,
        rejects=args.rejects,
        overwrite=args.overwrite,
        streams=args.streams or 0,
        summary=args.summary,
    )
    if args.ray:
        return _on_ray(args, settings, options)
    console = Console(stderr=True)
    bar = Bar(console, quiet=args.quiet or not console.is_terminal)
    try:
        summary = run_job(settings, options, bar)
    except KeyboardInterrupt:
        bar.close()
        # The committed parts are on disk and the work folder's lock goes with the process: leave now. The
        # interpreter's teardown destroyed OpenVINO's compiled models out of order now and then (SIGABRT,
        # "terminate called without an active exception"; once in a loaded CI run, never in 15 runs here).
        print("hare run: stopped; its committed chunks are kept: the same command resumes the job", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    finally:
        bar.close()
    Console().print(report(summary))
    if args.summary is not None:
        args.summary.write_bytes(orjson.dumps(summary.to_dict(), option=orjson.OPT_INDENT_2))
    if summary.rejected and not summary.written and not summary.skipped:
        # A file of another encoding, a wrong column's numbers: the job "succeeded" with nothing in its output.
        reason, count = summary.reasons.most_common(1)[0]
        raise InputError(
            f"every row of {options.input} was rejected ({count:,} of {summary.rejected:,}: {reason}); the reasons "
            f"are in {summary.rejects}"
        )
    return 0


# Options the Ray path has no use for: given with --ray, they are refused rather than silently ignored.
NOT_ON_RAY = {
    "output_format": "--output-format",
    "rejects": "--rejects",
    "summary": "--summary",
    "streams": "--streams",
}


def _on_ray(args: argparse.Namespace, settings: Settings, options: BulkOptions) -> int:
    from api.bulk.ray import check_output, run_on_ray

    ignored = [flag for name, flag in NOT_ON_RAY.items() if getattr(args, name) is not None]
    if ignored:
        raise InputError(
            f"{', '.join(ignored)}: not with --ray, which writes a folder of Parquet files (rejected rows in it, their "
            "reason in `error`) with one model thread an actor; leave it out"
        )
    columns = dataclasses.replace(options.columns, id=options.columns.id or "id")
    # What the actors would refuse, refused here first, in one sentence: a missing column, a parameter the model
    # cannot answer (each came back as Ray's tracebacks, after the cluster had started on it).
    model = BulkModel(settings, options.parameters, options.long_input, options.truncation_direction)
    model.check(columns)
    corpus = Corpus(options.input, columns, model.task.pairs, options.input_format)
    model.probe(corpus.id_type)
    pairs = model.task.pairs
    del model
    check_output(options.input, options.output, options.overwrite)
    stage = {
        "format": corpus.format,
        "pairs": pairs,
        "parameters": options.parameters,
        "columns": columns,
        "long_input": options.long_input,
        "truncation_direction": options.truncation_direction,
        "max_chars": options.max_chars,
    }
    start = time.perf_counter()
    try:
        rows = run_on_ray(
            args.ray, settings.bundle, corpus.files, options.output, stage, options.chunk_rows, args.quiet
        )
    except KeyboardInterrupt:
        print(
            f"hare run: stopped; {options.output} is as it was: the same command runs the job again from the start",
            file=sys.stderr,
        )
        return 130
    seconds = time.perf_counter() - start
    rejected = pq.read_table(options.output, columns=["error"]).column("error").drop_null()
    Console().print(
        f"hare run on Ray ({args.ray}): {rows:,} rows in {seconds:,.1f} s, {len(rejected):,} rejected (their reason "
        f"in `error`) -> {options.output}/"
    )
    if rows and len(rejected) == rows:  # as a job on one machine ends
        raise InputError(
            f"every row of {options.input} was rejected (the first: {rejected[0]}); the reasons are in `error` of "
            f"{options.output}/"
        )
    return 0


def parameters(pairs: list[str]) -> dict[str, Any]:
    """NAME=VALUE pairs as /predict's parameters: each VALUE read as JSON (3, true, null, "x"), else as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest(f"--param takes NAME=VALUE, got {pair!r}")
        if name in out:  # the last one won, silently
            raise InvalidRequest(f"--param {name} is given twice; give it once")
        try:
            out[name] = orjson.loads(value)
        except orjson.JSONDecodeError:
            out[name] = value
    return out


class Bar(JobProgress):
    """A rich progress bar: rows, rows a second in this run, and the time left at that rate."""

    def __init__(self, console: Console, quiet: bool) -> None:
        self.quiet = quiet
        self.rich = Progress(
            TextColumn("[bold]hare run"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            _Rate(),
            console=console,
            transient=False,
        )
        self.task = self.rich.add_task("rows", total=None, visible=not quiet)
        self.rows = self.rows_run = 0
        self.position = self.first = 0
        self.start_time = 0.0

    def start(self, total: int, unit: str, streams: int, batching: tuple[int, int]) -> None:
        self.rich.update(self.task, total=max(total, 1))
        self.start_time = time.perf_counter()
        if not self.quiet:
            self.rich.start()
            self.rich.console.print(
                f"{streams} model thread(s), calls of at most {batching[0]} sequences and {batching[1]} padded tokens",
                style="dim",
            )

    def advance(self, position: int, rows: int, skipped: bool) -> None:
        self.rows += rows
        if skipped:  # an earlier run's chunk: no part of this run's rate
            self.first = position
        else:
            self.rows_run += rows
        self.position = max(self.position, position)
        elapsed = time.perf_counter() - self.start_time
        speed = (self.position - self.first) / elapsed if elapsed > 0 else 0.0
        total = self.rich.tasks[0].total or 0
        left = (total - self.position) / speed if speed > 0 else None
        self.rich.update(
            self.task, completed=self.position, rows=self.rows, rate=self.rows_run / max(elapsed, 1e-9), left=left
        )

    def close(self) -> None:
        self.rich.stop()


class _Rate(ProgressColumn):
    """rows, rows/s and the time left."""

    def render(self, task: Task) -> Text:
        rows, rate, left = task.fields.get("rows", 0), task.fields.get("rate", 0.0), task.fields.get("left")
        eta = "-:--:--" if left is None else time.strftime("%H:%M:%S", time.gmtime(left))
        return Text(f"{rows:,} rows  {rate:,.0f} rows/s  {eta} left")


def report(summary: Summary) -> Table:
    """The summary at the end of a job."""
    table = Table(title="hare run", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("output", f"{summary.output} ({_size(summary.output)})")
    table.add_row("rows", f"{summary.rows:,} run, {summary.written:,} written")
    if summary.resumed:
        table.add_row("resumed", f"{summary.skipped:,} rows were done by an earlier run")
    table.add_row("rejected", f"{summary.rejected:,}" + (f" -> {summary.rejects}" if summary.rejected else ""))
    kinds = summary.reasons.most_common()
    for reason, count in kinds[:5]:
        table.add_row("", f"{count:,} {reason}")
    if len(kinds) > 5:
        table.add_row("", f"{sum(c for _, c in kinds[5:]):,} for {len(kinds) - 5} other reasons (in the rejects file)")
    table.add_row("time", f"{summary.seconds:,.1f} s, {summary.rate:,.1f} rows/s, {summary.tokens:,} tokens")
    return table


def _size(path: Path) -> str:
    size = float(path.stat().st_size) if path.is_file() else 0.0
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:,.1f} {unit}"
        size /= 1024
    return ""
