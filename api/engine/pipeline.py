"""One inference request's way through a worker: tokenize, queue for the model, post-process, each phase
timed for the Server-Timing header and the metrics.

Work is hoisted out of this path where possible: the tokenizer, task and limits are bound once per worker;
large requests are tokenized and post-processed on a thread so one big body cannot stall the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Encoding

from api.engine.batching import Batcher, Result, Ticket
from api.engine.encoder import Encoded, Encoder
from api.engine.errors import ClientGone
from container.bundle import Manifest, model_head
from tasks.base import TRUNCATE, Answer, Array, Inputs, LongInput, ModelInfo, Outputs, TaskSpec, Vocab
from tasks.errors import InputTooLong

# Above this many characters a request is tokenized and post-processed off the event loop (about 1 ms of
# tokenizer work; 60-80 ms of entity grouping, whose Python costs about 15 us a token: a 1 MB request of
# entities held its worker's loop, health probes included, for 8 s).
OFFLOAD_CHARS = 20_000
WARM_LENGTHS = (8, 64, 512)  # tokens; capped at the model's maximum
log = logging.getLogger("hare.pipeline")
# Returns once the client has gone away (the HTTP face watches its connection; api/web/protocols/base.py).
Gone = Callable[[], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class PredictRequest:
    """A checked request (every protocol's body becomes one, api/web/schemas.py)."""

    inputs: Inputs
    long_input: LongInput
    params: Any


@dataclass(frozen=True, slots=True)
class Served:
    """An answered request. truncated: per input, whether it was cut; phases: tokenize, queue, inference and
    postprocess seconds."""

    answer: Answer
    characters: int
    tokens: int
    truncated: list[bool]
    phases: tuple[float, float, float, float]


class Pipeline:
    def __init__(
        self,
        task: TaskSpec,
        model: ModelInfo,
        encoder: Encoder,
        batcher: Batcher[Encoding],
        max_answer_values: int | None = None,
    ) -> None:
        """`max_answer_values`: the most numbers an answer of token vectors may hold (None: no limit)."""
        self.task = task
        self.model = model
        self.encoder = encoder
        self.batcher = batcher
        self.max_answer_values = max_answer_values

    async def run(self, ticket: Ticket[Encoding], request: PredictRequest, gone: Gone | None = None) -> Served:
        """Answer `request` within its admission `ticket`. With `gone`, a request that has to wait behind a
        full batch watches for its client to leave, and is withdrawn if it does."""
        inputs = request.inputs
        characters = sum(map(len, inputs.texts)) + (len(inputs.query) if inputs.query else 0)
        if inputs.pairs is not None:
            characters += sum(map(len, inputs.pairs))
        large = characters > OFFLOAD_CHARS
        start = time.perf_counter()
        if large:
            encoded = await asyncio.to_thread(self.encoder.encode, inputs, request.long_input)
        else:
            encoded = self.encoder.encode(inputs, request.long_input)
        queued = time.perf_counter()
        pooling = self.task.pooling(request.params) if self.task.pooling is not None else None
        result = await self._wait(ticket, encoded, gone, pooling)
        if self.task.token_values is not None:
            self._check_answer(self.task.token_values(result.outputs, request.params))
        answered = time.perf_counter()

        def postprocess() -> Answer:
            grouped = _regroup(result.outputs, encoded)
            stride = request.long_input.stride
            outputs = Outputs(inputs, encoded.windows, grouped, encoded.truncated, stride, encoded.begins)
            return self.task.postprocess(outputs, request.params, self.model)

        answer = await asyncio.to_thread(postprocess) if large else postprocess()
        done = time.perf_counter()
        inference = result.inference_seconds
        phases = (queued - start, max(answered - queued - inference, 0.0), inference, done - answered)
        return Served(answer, characters, encoded.tokens, encoded.truncated, phases)

    async def warm_up(self, streams: int, max_batch: int) -> None:
        """Answer a few requests through the real path (tokenize, queue, model, post-process) at a few
        lengths, alone and `streams` at once (every model thread), so that the first real requests do not pay
        the runtime's first-run allocations (their batches also give admission its first token rate); then
        run each length once on the event loop's own thread on every core, as the fast lane does. A lone
        request asks for every core, but a worker that warms up while another worker holds a core gets one:
        its wide session would first run on a served request (OpenVINO: 30-40 ms more than the next)."""
        params = self.task.parse_params({}, self.model)
        pooling = self.task.pooling(params) if self.task.pooling is not None else None

        def inputs(words: int, batch: int = 1) -> Inputs:
            text = " ".join(["hello"] * words)
            return Inputs([text] * batch, single=False, query="hello" if self.task.pairs else None)

        # Each length in tokens, special tokens (and a pair's query) included: a runtime that compiles kernels
        # per shape (OpenVINO) then has the shortest requests' own (8 tokens) ready.
        one, two = (self.encoder.encode(inputs(words), TRUNCATE).tokens for words in (1, 2))
        per_word = max(1, two - one)

        def words(tokens: int) -> int:
            return max(1, (tokens - one) // per_word + 1)

        async def ask(n: int, batch: int) -> None:
            with self.batcher.admit(checked=False) as ticket:  # other workers' load must not fail this boot
                await self.run(ticket, PredictRequest(inputs(words(n), batch), TRUNCATE, params))

        for n in sorted({min(n, self.model.max_length) for n in WARM_LENGTHS}):
            await ask(n, 1)
            await asyncio.gather(*(ask(n, 1) for _ in range(streams)))
            if n == WARM_LENGTHS[0]:
                await ask(n, min(8, max_batch))
            sequences = self.encoder.encode(inputs(words(n)), TRUNCATE).sequences
            if not await self.batcher.warm_here(sequences, pooling):
                log.info("warm-up: the %d-token call on every core left to the first lone request (cores busy)", n)

    def _check_answer(self, values: int) -> None:
        """Refuse an answer of token vectors past `max_answer_values` before it is written: as JSON each number
        takes about 11 bytes, and a text of 40,000 words read in windows (an 80 KB body) made a 181 MB answer
        that took 490 MB of the worker's memory; under a memory limit, such a request killed the worker."""
        if self.max_answer_values is None or values <= self.max_answer_values:
            return
        raise InputTooLong(
            f"the answer's token vectors would hold {values} numbers; this server answers at most "
            f"{self.max_answer_values} (HARE_MAX_ANSWER_VALUES): send fewer or shorter texts, or ask for a vector a "
            "text instead of a vector a token",
            limit=self.max_answer_values,
        )

    async def _wait(self, ticket: Ticket[Encoding], encoded: Encoded, gone: Gone | None, pooling: str | None) -> Result:
        future = ticket.submit(encoded.sequences, pooling)
        if gone is None or self.batcher.backlog <= self.batcher.max_items:
            return await future
        watcher = asyncio.ensure_future(_watch(gone, future))
        try:
            return await future
        except asyncio.CancelledError:
            if watcher.done() and not watcher.cancelled():
                raise ClientGone("the client closed the connection before its answer was ready") from None
            raise
        finally:
            watcher.cancel()


async def _watch(gone: Gone, future: asyncio.Future[Result]) -> None:
    """Cancel `future` when the client goes away."""
    await gone()
    future.cancel()


def _regroup(rows: list[Array], encoded: Encoded) -> list[list[Array]]:
    if len(rows) == len(encoded.windows):
        return [[row] for row in rows]
    grouped, i = [], 0
    for windows in encoded.windows:
        grouped.append(rows[i : i + len(windows)])
        i += len(windows)
    return grouped


def model_info(bundle: Path, manifest: Manifest, task: TaskSpec, words: Vocab) -> ModelInfo:
    """The served model as post-processing sees it (labels, pooling, head, the vocabulary's facts), from the
    bundle: the server's and the bulk job's alike."""
    labels = manifest.labels
    return ModelInfo(
        labels=tuple(labels.get(i, f"LABEL_{i}") for i in range(max(labels) + 1)) if labels else (),
        multi_label=manifest.multi_label,
        regression=manifest.regression,
        pooling=manifest.pooling or task.default_pooling or "mean",
        normalize=manifest.normalize,
        max_length=manifest.max_length,
        vocab=words,
        **model_head(bundle, manifest),
    )
