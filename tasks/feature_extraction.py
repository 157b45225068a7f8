"""Embeddings: token states pooled (and usually normalized) into one vector per text."""

from __future__ import annotations

import numpy as np

from tasks.base import Gate, ParityInput, TaskSpec
from tasks.ops import cosine, pool


def _pooled(states: np.ndarray, mode: str) -> np.ndarray:
    return pool(states[None], np.ones((1, states.shape[0]), dtype=np.int64), mode)[0]


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.stack([_pooled(r, p.pooling) for r in p.reference])
    cand = np.stack([_pooled(c, p.pooling) for c in p.candidate])
    cos = cosine(ref, cand)
    return {"cosine_p1": float(np.percentile(cos, 1)), "cosine_min": float(cos.min())}


SPEC = TaskSpec(
    name="feature-extraction",
    head="AutoModel",
    architectures=(),
    output="last_hidden_state",
    pairs=False,
    parity=parity,
    default_pooling="mean",  # what transformers' feature-extraction models without a pooling config get
    gates=(Gate("cosine_p1", 0.99, True, "1st percentile of cosine(PyTorch, candidate) embeddings"),),
)
