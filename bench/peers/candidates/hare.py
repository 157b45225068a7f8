"""The `hare` candidate: hare's bundle with hare's own code, as the server runs it."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tokenizers import Encoding, Tokenizer

from bench.peers.candidates.base import Encoder, Skip, Vectors
from bench.peers.candidates.workspace import Workspace
from container.bundle import (
    MAX_BATCH_SIZE,
    MODEL_FILE,
    TOKENIZER_FILE,
    read_dense,
    read_manifest,
    resolve_max_batch_tokens,
)
from container.models import Model, open_models
from tasks.ops import length_batches, normalize_vector, pad_batch, pool_tokens


class HareEncoder:
    """hare's bundle with hare's own code: the bundle's tokenizer as the server loads it, the runtime with hare's
    session options, pad_batch, pooling, Dense modules and normalizing as the manifest says.

    Scheduled as a server worker on `threads` cores schedules it (api/engine/batching.py): one text is a lone
    request, run with every core; several are split into model calls of at most the bundle's max_batch_tokens
    (padded tokens) and the server's default of sequences per call, nearest lengths
    together, and those calls run on one-thread sessions, `threads` at once (the worker's model streams)."""

    def __init__(self, bundle: Path, threads: int) -> None:
        manifest = read_manifest(bundle)
        if manifest.task != "feature-extraction":
            raise Skip(f"{bundle} serves {manifest.task}; the peers compare embedding models")
        graph, variant, target, output = bundle / MODEL_FILE, manifest.variant, manifest.target, manifest.output
        models = open_models(graph, variant, target, {threads: 1} if threads == 1 else {threads: 1, 1: threads}, output)
        self.wide, self.narrow = models[threads], models[1]
        self.streams = ThreadPoolExecutor(threads)
        self.max_batch_tokens = resolve_max_batch_tokens(manifest).max_batch_tokens  # as `hare serve` would
        self.tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))  # truncating at max_length, as served
        self.tok.no_padding()
        self.pooling = manifest.pooling or "mean"
        self.normalize = manifest.normalize
        self.dense = read_dense(bundle, manifest)
        self.prompt = manifest.prompts.get(manifest.default_prompt_name or "", "")
        self.pad_id = manifest.pad_id

    def __call__(self, texts: list[str]) -> Vectors:
        encodings = self.tok.encode_batch([self.prompt + t for t in texts] if self.prompt else texts)
        if len(encodings) == 1:
            return self._embed(self.wide, encodings)
        calls = length_batches([len(e.ids) for e in encodings], MAX_BATCH_SIZE, self.max_batch_tokens)
        done = list(self.streams.map(lambda call: self._embed(self.narrow, [encodings[i] for i in call]), calls))
        vectors = np.empty((len(encodings), done[0].shape[1]), np.float32)
        for call, rows in zip(calls, done, strict=True):
            vectors[call] = rows  # back in the order of the texts
        return vectors

    def _embed(self, model: Model, encodings: Sequence[Encoding]) -> Vectors:
        states = model.run(pad_batch(list(encodings), model.input_names, self.pad_id))
        vectors = []
        for row, encoding in zip(states, encodings, strict=True):  # as the server: padding trimmed, then pooled
            vector = pool_tokens(row[: len(encoding.ids)], self.pooling)
            for layer in self.dense:
                vector = layer(vector)
            vectors.append(normalize_vector(vector) if self.normalize else vector)
        return np.stack(vectors)


def load_hare(space: Workspace, threads: int) -> Encoder:
    encoder = HareEncoder(space.options.bundle, threads)
    return Encoder(encoder, close=encoder.streams.shutdown)
