"""The bundle as a bulk job runs it: the server's own pieces (api/engine's Encoder and Backend, the task's
parse_params, prepare and postprocess), without HTTP and without the server's queue.

A chunk's way through it: `encode` tokenizes its good rows as /predict's requests would be (all the texts as
one request; for ranking, one request per query with its documents); `batches` packs the rows into
length-sorted model calls within the bundle's batch budget; `run` makes one call and post-processes its rows
as one request at once (every task answers each input on its own, so the answers are /predict's), keeping
answers rather than token states; `answer` gives the chunk's rows back in input order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from tokenizers import Encoding

from api.bulk.columns import Answers, item_name, per_input
from api.bulk.reader import Chunk, Columns, Reject
from api.config import Settings
from api.engine.backend import Backend
from api.engine.encoder import NO_TOKENS
from api.engine.opened import open_bundle
from container.bundle import MODEL_FILE
from tasks import params
from tasks.base import SIDES, Inputs, LongInput, Outputs
from tasks.errors import InputError, InvalidRequest
from tasks.ops import length_batches

LONG_INPUTS = ("truncate", "window", "refuse")  # the values of /predict's long_input (tasks.base.LongInput)


@dataclass(slots=True)
class Work:
    """A chunk on its way through the model, per good row: its text as the task prepared it (what was
    tokenized), its sequences (one, or several windows; none for a row rejected, and none once its call has
    answered it), whether it was cut, and, once its call has run, its answer item. kept: the rows to answer (not
    rejected); sent: the texts as sent where prepare rewrote them; begins: for a row read by its end alone,
    where that end begins (Outputs.begins)."""

    chunk: Chunk
    texts: list[str]
    sent: list[str] | None
    windows: list[list[Encoding]]
    truncated: list[bool]
    items: list[Any]
    tokens: int
    begins: dict[int, int]
    kept: list[int]
    pending: int = 0  # model calls not yet answered (the job's count)


class BulkModel:
    """A bundle loaded for a bulk job. `raw` holds the task's request parameters (as /predict's
    "parameters"); `long_input`: truncate (at the model's maximum), window (read whole in overlapping
    windows, tasks that allow it) or refuse (a too-long row goes to the rejects, where /predict answers 413);
    None: the server's default (HARE_TRUNCATE). `side`: the end a cut text loses, right or left (its start, as
    /predict's truncation_direction Left).
    `settings` gives the target as `hare serve` resolves it for this bundle, and the batch budget as a bulk job
    does (the bundle's budget of the best token rate)."""

    def __init__(
        self, settings: Settings, raw: Mapping[str, object], long_input: str | None = None, side: str = "right"
    ) -> None:
        opened = open_bundle(settings, throughput=True)
        self.settings = settings = opened.settings
        self.manifest = manifest = opened.manifest
        self.task = task = opened.task
        long_input = long_input or ("truncate" if settings.truncate else "refuse")
        if long_input not in LONG_INPUTS:
            raise InputError(f"--long-input must be one of {', '.join(LONG_INPUTS)}, got {long_input!r}")
        if side not in SIDES:
            raise InputError(f"--truncation-direction must be right or left, got {side!r}")
        if long_input == "window" and not task.windows:
            raise InputError(f"{task.name} reads every input whole: --long-input window does not apply")
        self.model = opened.model
        unknown = sorted(set(raw) - set(task.parameters))
        if unknown:
            accepted = ", ".join(params.taken(task.parameters, self.model))
            raise InvalidRequest(f"unknown parameter(s) {', '.join(unknown)} for {task.name}; accepted: {accepted}")
        if chosen := [name for name in task.choosers if name in raw]:
            raise InvalidRequest(
                f"{', '.join(chosen)} chooses among a request's inputs; a bulk job answers every row, so it does "
                "not apply: drop it (each row's score is written, to sort or cut afterwards)"
            )
        self.params = task.parse_params(raw, self.model)
        self.encoder = opened.encoder
        self.long_input, self.side = long_input, SIDES[side]
        if long_input == "window":
            self.reading = LongInput.window(None, self.encoder.window_tokens)
        else:
            self.reading = LongInput("truncate", side=self.side)
        # One-thread sessions, called from one model thread per core: how the bundle's batch budget was measured.
        target = settings.target or manifest.target
        self.backend = Backend(
            settings.bundle / MODEL_FILE,
            target,
            (1,),
            manifest.output,
            arena=settings.cpu_arena,
            pad_id=manifest.pad_id,
            variant=manifest.variant,
            callers=settings.cores,
            max_length=manifest.max_length,
        )
        self.streams = 1 if target == "gpu" else settings.cores
        self.name = item_name(task)

    @property
    def batching(self) -> tuple[int, int]:
        """Sequences and padded tokens per model call at most."""
        return self.settings.max_batch_size, self.settings.max_batch_tokens

    def check(self, columns: Columns) -> None:
        """Refuse columns the task cannot read: a second text beside each text is a classifier's pair; the two
        texts of a pair are two columns (the rows' values are keyed by column: one named twice was read once, a
        classifier's pairs as single texts, ranking's documents as missing)."""
        if columns.text_pair is not None and not self.task.text_pairs:
            raise InputError(f"{self.task.name} reads single texts: --text-pair-column is text-classification's")
        # A column named for the other kind of task was read never, silently (the defaults name none).
        default = Columns()
        if self.task.pairs and columns.text != default.text:
            raise InputError(f"{self.task.name} reads --query-column and --document-column, not --text-column")
        if not self.task.pairs and (columns.query, columns.document) != (default.query, default.document):
            raise InputError(
                f"{self.task.name} reads --text-column: --query-column and --document-column are ranking's"
            )
        first, *others = columns.values(self.task.pairs)
        if first in others:
            options = columns.options(self.task.pairs)
            raise InputError(f"{options} both name the column {first!r}: name two different columns")

    def probe(self, id_type: pa.DataType) -> pa.Schema:
        """One text through the whole path before the job starts, so that parameters the model cannot answer
        (dimensions above its width) stop it at once rather than at its first chunk; returns the output's
        schema (ids of `id_type`), so that every output has every column (api/bulk/writer.py, Parts.merge)."""
        chunk = Chunk(0, 0, 1, 0, ids=[None], positions=[0], values=[["hello"]] * (2 if self.task.pairs else 1))
        work = self.encode(chunk)
        self.run(work, [0])
        return self.answer(work, id_type).table().schema

    def encode(self, chunk: Chunk) -> Work:
        """Tokenize the chunk's good rows as /predict's requests would be (all texts as one request; for
        ranking, one per query); rows with no tokens (/predict's 400) become rejects, and with long_input
        refuse, rows the model would have to cut."""
        n = len(chunk.ids)
        texts = [""] * n
        windows: list[list[Encoding]] = [[] for _ in range(n)]
        sent: list[str] | None = None
        truncated = [False] * n
        begins: dict[int, int] = {}
        blank: list[int] = []
        for rows, inputs in self._requests(chunk):
            prepared = self.task.prepare(inputs, self.params) if self.task.prepare is not None else inputs
            encoded = self.encoder.encode(prepared, self.reading, keep_blank=True)
            blank += [rows[k] for k in encoded.blank()]
            if prepared.sent is not None:
                sent = sent or [""] * n
            for k, row in enumerate(rows):
                texts[row], windows[row], truncated[row] = prepared.texts[k], encoded.windows[k], encoded.truncated[k]
                if k in encoded.begins:
                    begins[row] = encoded.begins[k]
                if sent is not None and prepared.sent is not None:
                    sent[row] = prepared.sent[k]
        for row in sorted(blank):
            chunk.rejects.append(Reject(chunk.positions[row], chunk.ids[row], f"it {NO_TOKENS}"))
            windows[row] = []
        if self.long_input == "refuse":
            limit = self.encoder.max_length
            for row in (r for r in range(n) if truncated[r]):
                reason = f"it is longer than the model's {limit} tokens (--long-input refuse)"
                chunk.rejects.append(Reject(chunk.positions[row], chunk.ids[row], reason))
                windows[row] = []
        tokens = sum(len(s) for w in windows for s in w)
        kept = [r for r, w in enumerate(windows) if w]
        return Work(chunk, texts, sent, windows, truncated, [None] * n, tokens, begins, kept)

    def batches(self, work: Work) -> list[list[int]]:
        """The chunk's rows in model calls: nearest lengths together, within the batch budget. A row read as
        windows counts as its longest window times their number, so that it costs what it pads to."""
        rows = work.kept
        lengths = [max(len(s) for s in work.windows[r]) * len(work.windows[r]) for r in rows]
        max_items, max_tokens = self.batching
        return [[rows[i] for i in call] for call in length_batches(lengths, max_items, max_tokens)]

    def run(self, work: Work, rows: list[int]) -> None:
        """One model call over `rows` of the chunk, post-processed at once as one /predict request of those
        rows (every task answers each input on its own), so only answers, not token states, are kept."""
        windows = [work.windows[r] for r in rows]
        outputs = self.backend.run([s for w in windows for s in w])
        grouped, at = [], 0
        for w in windows:
            grouped.append(outputs[at : at + len(w)])
            at += len(w)
        sent = None if work.sent is None else [work.sent[r] for r in rows]
        inputs = Inputs([work.texts[r] for r in rows], single=False, sent=sent)
        begins = {k: work.begins[r] for k, r in enumerate(rows) if r in work.begins}
        out = Outputs(inputs, windows, grouped, [work.truncated[r] for r in rows], self.reading.stride, begins)
        body = self.task.postprocess(out, self.params, self.model).body
        for row, item in zip(rows, per_input(body, self.task, len(rows)), strict=True):
            work.items[row] = item
            # Answered: its encodings go now, not with its chunk, whose memory they are most of (25 KB a text
            # of 156 tokens): a chunk answered but not yet written held all of them (api/bulk/job.py IN_FLIGHT).
            work.windows[row] = []

    def answer(self, work: Work, id_type: pa.DataType) -> Answers:
        """The chunk's answered rows in input order (not those rejected as too long)."""
        kept = work.kept
        ids = [work.chunk.ids[r] for r in kept]
        return Answers(ids, id_type, [work.items[r] for r in kept], [work.truncated[r] for r in kept], self.name)

    def _requests(self, chunk: Chunk) -> list[tuple[list[int], Inputs]]:
        """The chunk's good rows as requests: one of all texts, or (ranking) one per query, in first-seen order."""
        if not chunk.ids:
            return []
        if not self.task.pairs:
            pairs = chunk.values[1] if len(chunk.values) == 2 else None  # a classifier's (text, text_pair) rows
            return [(list(range(len(chunk.ids))), Inputs(chunk.values[0], single=False, pairs=pairs))]
        by_query: dict[str, list[int]] = {}
        for i, query in enumerate(chunk.values[0]):
            by_query.setdefault(query, []).append(i)
        documents = chunk.values[1]
        return [(rows, Inputs([documents[i] for i in rows], single=False, query=q)) for q, rows in by_query.items()]
