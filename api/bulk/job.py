"""`run_job`: a corpus file through a bundle into one output file, at the machine's full rate, resumable.

    reader thread        model threads (one per core)          writer thread
    read a chunk ──> tokenize ──> batches ──> queue ──> backend.run + post-process ──> part file (atomic)
    (api/bulk/reader.py)  (api/bulk/model.py)                    (api/bulk/writer.py)

Reading, tokenizing and writing overlap the model calls; at most IN_FLIGHT chunks are between the reader and
the writer, so memory stays flat however long the corpus is. The model threads take the calls of every chunk in
flight from one queue, so no core waits at a chunk's end. Any thread's error stops the others, and the first
error is raised here (an InputError names what to fix).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import queue
import re
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa

from api.bulk import checkpoint
from api.bulk.model import BulkModel, Work
from api.bulk.reader import Chunk, Columns, Corpus
from api.bulk.writer import Parts, output_format
from api.config import Settings
from tasks.errors import InputError

# Chunks between reading and writing: one tokenized ahead, one on the model (two at its turn), one being written.
# A chunk's encodings are most of its memory (25 KB a text of 156 tokens): on 20,000 texts of 10-300 tokens
# (MiniLM, 2 cores) four chunks peaked at 849 MB of RSS and three at 766, at the same rate (two: 704).
IN_FLIGHT = 3
CHUNK_ROWS = 4096  # rows per chunk: the unit of resuming, and of length-sorting (more rows, less padding)
POLL = 0.1  # seconds a blocked thread waits before it looks whether the job was stopped


@dataclass(frozen=True)
class BulkOptions:
    """One job. parameters: the task's /predict parameters; max_chars: characters per text at most (None: the
    server's HARE_MAX_INPUT_CHARS); streams: model threads (0: one per core, one on a GPU)."""

    input: Path
    output: Path
    input_format: str | None = None
    output_format: str | None = None
    columns: Columns = field(default_factory=Columns)
    parameters: dict[str, Any] = field(default_factory=dict)
    long_input: str | None = None
    truncation_direction: str = "right"
    max_chars: int | None = None
    chunk_rows: int = CHUNK_ROWS
    rejects: Path | None = None
    overwrite: bool = False
    streams: int = 0
    summary: Path | None = None  # where the CLI writes the summary: checked with the job's other files

    @property
    def rejects_path(self) -> Path:
        """Where rejected rows go: as asked, else beside the output (out.parquet -> out.rejects.jsonl)."""
        return self.rejects or self.output.with_name(self.output.stem + ".rejects.jsonl")


@dataclass
class Summary:
    """What a job did. rows: rows read and run in this run; skipped: rows of chunks an earlier run finished;
    rejected and reasons: the rejects file's, the whole job's (a resumed run's own and its earlier runs')."""

    output: Path
    rejects: Path
    rows: int = 0
    written: int = 0
    rejected: int = 0
    skipped: int = 0
    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # the process's CPU time (all its threads) over the same span as `seconds`
    resumed: bool = False
    reasons: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def rate(self) -> float:
        """Rows a second in this run."""
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The summary as JSON values (`hare run --summary`)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return fields | {"output": str(self.output), "rejects": str(self.rejects), "rows_per_second": self.rate}


class Progress:
    """What a job tells its watcher (the CLI's progress bar); this one tells no one."""

    def start(self, total: int, unit: str, streams: int, batching: tuple[int, int]) -> None:
        """The input's size in `unit` (bytes or rows), before the first chunk."""

    def advance(self, position: int, rows: int, skipped: bool) -> None:
        """A chunk is done: the input stands at `position`; it held `rows` rows (skipped: an earlier run's)."""


def run_job(settings: Settings, options: BulkOptions, progress: Progress | None = None) -> Summary:
    """Run `options.input` through the bundle of `settings` into `options.output`; see the module docstring."""
    progress = progress or Progress()
    _check_files(options)
    model = BulkModel(settings, options.parameters, options.long_input, options.truncation_direction)
    model.check(options.columns)
    corpus = Corpus(options.input, options.columns, model.task.pairs, options.input_format)
    fmt = output_format(options.output, options.output_format)
    max_chars = options.max_chars or settings.max_input_chars
    job = {
        "input": checkpoint.describe_input(options.input, corpus.files),
        "bundle": str(settings.bundle.resolve()),
        # What the bundle is, not only where: a bundle rebuilt in place from other weights resumed into one
        # output of two models' answers.
        "model": {"weights_sha256": model.manifest.source.get("weights_sha256"), "files": model.manifest.files},
        "variant": model.manifest.variant,
        "task": model.task.name,
        "columns": [*corpus.names, corpus.id_column],
        "parameters": options.parameters,
        "long_input": model.long_input,
        "max_chars": max_chars,
        "chunk_rows": options.chunk_rows,
        "format": fmt,
    }
    if model.side != "right":  # only where asked: a job begun before the option existed resumes as it was
        job["truncation_direction"] = model.side
    schema = model.probe(corpus.id_type)  # before the work folder: a job refused here leaves nothing behind
    with checkpoint.open_folder(options.output, job, options.overwrite, options.rejects_path) as work:
        parts = Parts(work.path, fmt)
        done = parts.done()
        streams = options.streams or model.streams
        summary = Summary(options.output, options.rejects_path, resumed=work.resumed)
        progress.start(corpus.size, "rows" if corpus.format == "parquet" else "bytes", streams, model.batching)
        start, cpu = time.perf_counter(), time.process_time()
        pipeline = _Pipeline(model, parts, corpus.id_type, streams, progress, summary)
        chunks = pipeline.run(corpus.chunks(options.chunk_rows, max_chars, done))
        summary.seconds, summary.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
        summary.rejected = parts.merge(chunks, options.output, summary.rejects, schema)
        if work.resumed and summary.rejected:  # this run saw only its own chunks' reasons
            with summary.rejects.open("rb") as lines:
                summary.reasons = collections.Counter(_reason_kind(orjson.loads(line)["reason"]) for line in lines)
        work.close()
    return summary


def check_apart(source: Path, output: Path) -> None:
    """Refuse an output that would replace the input, be read as part of it, or hold it (a folder replaced)."""
    source, target = source.resolve(), output.resolve()
    if target == source or source in target.parents or target in source.parents:
        raise InputError(f"the output {output} is the input or inside it, or holds it; give an output outside {source}")


def _check_files(options: BulkOptions) -> None:
    """Refuse an output `check_apart` refuses or that names a folder, and a rejects file or summary that is
    another of the job's files or inside one, or in no folder that can be written: the rejects were merged
    over the output or the input, the summary written over the output, and an unwritable one found only once
    the output was done."""
    check_apart(options.input, options.output)
    if options.output.is_dir():
        raise InputError(
            f"the output {options.output} is a folder; name a file to write, such as {options.output / 'out.parquet'}"
        )
    named = {"--rejects" if options.rejects else "the rejects file": options.rejects_path, "--summary": options.summary}
    for name, path in {"the output": options.output, **named}.items():
        # A device or a pipe: the finished file replaced it (as root, -o /dev/null --overwrite replaced /dev/null).
        if path is not None and path.exists() and not path.is_file() and not path.is_dir():
            raise InputError(
                f"{name} {path} is not a regular file (a device, a pipe or a socket); name a file to write"
            )
    taken = {"the input": options.input, "the output": options.output}
    taken["the job's work folder"] = checkpoint.work_folder(options.output)
    for name, path in named.items():
        if path is None:
            continue
        target = path.resolve()
        for what, other in taken.items():
            held = other.resolve()
            if target == held or held in target.parents or target in held.parents:
                raise InputError(f"{name} {path} is {what}, inside it or holds it; give a file of its own")
        folder = target.parent
        # The default rejects file is beside the output, whose folder the job makes: the output's check covers it.
        given = name.startswith("--")
        if given and (not folder.is_dir() or not os.access(folder, os.W_OK) or target.is_dir()):
            raise InputError(f"{name} {path} cannot be written (is {folder} a folder this user can write?)")
        taken[name] = path


class _Pipeline:
    """The threads of one job (see the module docstring)."""

    def __init__(
        self, model: BulkModel, parts: Parts, id_type: pa.DataType, streams: int, progress: Progress, summary: Summary
    ) -> None:
        self.model = model
        self.parts = parts
        self.id_type = id_type
        self.streams = streams
        self.progress = progress
        self.summary = summary
        self.calls: queue.Queue[tuple[Work, list[int]] | None] = queue.Queue()
        self.answered: queue.Queue[Work | None] = queue.Queue()
        self.slots = threading.Semaphore(IN_FLIGHT)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.chunks = 0

    def run(self, chunks: Iterator[Chunk]) -> int:
        """Run every chunk; returns how many the input has."""
        reader = self._thread("hare-bulk-reader", lambda: self._read(chunks))
        model = [self._thread(f"hare-bulk-model-{k}", self._model) for k in range(self.streams)]
        writer = self._thread("hare-bulk-writer", self._write)
        try:
            for thread in (reader, *model):
                _join(thread)
            self.answered.put(None)
            _join(writer)
        except BaseException:  # Ctrl-C: stop the threads, leave the committed parts for the next run
            self.stop.set()
            # Each ends within a model call: one still inside it when the interpreter exits aborts the process
            # ("terminate called without an active exception").
            for thread in (reader, *model, writer):
                _join(thread)
            raise
        if self.error is not None:
            raise self.error
        return self.chunks

    def _thread(self, name: str, body: Callable[[], None]) -> threading.Thread:
        def guarded() -> None:
            try:
                body()
            except BaseException as exc:
                with self.lock:
                    self.error = self.error or exc
                self.stop.set()

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        return thread

    def _read(self, chunks: Iterator[Chunk]) -> None:
        try:
            for chunk in chunks:
                self.chunks = chunk.index + 1
                if chunk.skipped:
                    self.summary.skipped += chunk.rows
                    self.progress.advance(chunk.end, chunk.rows, True)
                    continue
                while not self.slots.acquire(timeout=POLL):
                    if self.stop.is_set():
                        return
                work = self.model.encode(chunk)
                calls = self.model.batches(work)
                work.pending = len(calls)
                if not calls:  # every row rejected: straight to the writer
                    self.answered.put(work)
                for call in calls:
                    self.calls.put((work, call))
                if self.stop.is_set():
                    return
        finally:
            for _ in range(self.streams):
                self.calls.put(None)
            if isinstance(chunks, Generator):
                chunks.close()  # the input file, when the job stopped before its end

    def _model(self) -> None:
        while not self.stop.is_set():
            taken = self.calls.get()
            if taken is None:
                return
            work, rows = taken
            self.model.run(work, rows)
            with self.lock:
                work.pending -= 1
                finished = work.pending == 0
            if finished:
                self.answered.put(work)

    def _write(self) -> None:
        while not self.stop.is_set():
            try:
                work = self.answered.get(timeout=POLL)
            except queue.Empty:
                continue
            if work is None:
                return
            chunk = work.chunk
            answers = self.model.answer(work, self.id_type)
            rejects = sorted(chunk.rejects, key=lambda r: r.row)
            self.parts.write(chunk.index, answers, rejects)
            self.slots.release()
            s = self.summary
            s.rows += chunk.rows
            s.written += len(answers.ids)
            s.tokens += work.tokens
            s.reasons.update(_reason_kind(r.reason) for r in rejects)
            self.progress.advance(chunk.end, chunk.rows, False)


def _join(thread: threading.Thread) -> None:
    while thread.is_alive():  # in slices, so that Ctrl-C reaches the main thread
        thread.join(POLL)


def _reason_kind(reason: str) -> str:
    """A reason without its particulars (a parser's message; lengths and line numbers as N), for the summary's
    counts: "row N of a.csv (the header is row N) has N fields, the header N"."""
    # A number standing alone, not one inside a name ("UTF-8", "part-0001.csv" stay as they are).
    return re.sub(r"(?<![\w.-])\d[\d,.]*", "N", reason.split(":")[0])
