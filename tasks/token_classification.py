"""Token classification (NER): one label distribution per token."""

from __future__ import annotations

import numpy as np

from tasks.base import Gate, ParityInput, TaskSpec
from tasks.ops import softmax


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.concatenate(list(p.reference))
    cand = np.concatenate(list(p.candidate))
    return {
        "token_agreement": float((ref.argmax(-1) == cand.argmax(-1)).mean()),
        "max_abs_prob_diff": float(np.abs(softmax(ref) - softmax(cand)).max()),
    }


SPEC = TaskSpec(
    name="token-classification",
    head="AutoModelForTokenClassification",
    architectures=("ForTokenClassification",),
    output="logits",
    pairs=False,
    parity=parity,
    gates=(Gate("token_agreement", 0.98, True, "share of tokens whose label matches PyTorch"),),
)
