"""Sequence classification: one label distribution per text."""

from __future__ import annotations

import numpy as np

from tasks.base import Gate, ParityInput, TaskSpec
from tasks.ops import softmax


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.stack(p.reference)
    cand = np.stack(p.candidate)
    ref_p, cand_p = softmax(ref), softmax(cand)
    return {
        "top1_agreement": float((ref.argmax(-1) == cand.argmax(-1)).mean()),
        "max_abs_prob_diff": float(np.abs(ref_p - cand_p).max()),
    }


SPEC = TaskSpec(
    name="text-classification",
    head="AutoModelForSequenceClassification",
    architectures=("ForSequenceClassification",),
    output="logits",
    pairs=False,
    parity=parity,
    gates=(Gate("top1_agreement", 0.99, True, "share of texts whose top label matches PyTorch"),),
)
