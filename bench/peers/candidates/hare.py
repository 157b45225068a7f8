"""The `hare` candidate: hare's bundle with hare's own code, as the server runs it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from bench.peers.candidates.base import Encoder, Skip, Vectors
from bench.peers.candidates.workspace import Workspace
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_dense, read_manifest
from container.runtime import OnnxModel
from tasks.ops import normalize_vector, pad_batch, pool_tokens


class HareEncoder:
    """hare's bundle with hare's own code: the bundle's tokenizer as the server loads it, OnnxModel with hare's
    session options, pad_batch, pooling, Dense modules and normalizing as the manifest says."""

    def __init__(self, bundle: Path, threads: int) -> None:
        manifest = read_manifest(bundle)
        if manifest.task != "feature-extraction":
            raise Skip(f"{bundle} serves {manifest.task}; the peers compare embedding models")
        self.model = OnnxModel(bundle / MODEL_FILE, manifest.target, threads, manifest.output)
        self.tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))  # truncating at max_length, as served
        self.tok.no_padding()
        self.pooling = manifest.pooling or "mean"
        self.normalize = manifest.normalize
        self.dense = read_dense(bundle, manifest)
        self.prompt = manifest.prompts.get(manifest.default_prompt_name or "", "")
        self.pad_id = manifest.pad_id

    def __call__(self, texts: list[str]) -> Vectors:
        encodings = self.tok.encode_batch([self.prompt + t for t in texts] if self.prompt else texts)
        states = self.model.run(pad_batch(encodings, self.model.input_names, self.pad_id))
        vectors = []
        for row, encoding in zip(states, encodings, strict=True):  # as the server: padding trimmed, then pooled
            vector = pool_tokens(row[: len(encoding.ids)], self.pooling)
            for layer in self.dense:
                vector = layer(vector)
            vectors.append(normalize_vector(vector) if self.normalize else vector)
        return np.stack(vectors)


def load_hare(space: Workspace, threads: int) -> Encoder:
    return Encoder(HareEncoder(space.options.bundle, threads))
