"""Reranking with a cross-encoder: one relevance score per (query, document) pair."""

from __future__ import annotations

import numpy as np

from tasks.base import Gate, ParityInput, TaskSpec
from tasks.ops import spearman


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.stack(p.reference)[:, 0]
    cand = np.stack(p.candidate)[:, 0]
    groups = np.asarray(p.groups)
    rhos = [spearman(ref[groups == g], cand[groups == g]) for g in np.unique(groups)]
    return {"spearman_min": float(min(rhos)), "spearman_mean": float(np.mean(rhos))}


SPEC = TaskSpec(
    name="text-ranking",
    head="AutoModelForSequenceClassification",
    architectures=("ForSequenceClassification",),
    output="logits",
    pairs=True,
    parity=parity,
    # Gated on the worst query, so no single query's ranking may drift.
    gates=(Gate("spearman_min", 0.98, True, "lowest per-query Spearman correlation with PyTorch scores"),),
)
