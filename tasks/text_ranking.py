"""Reranking with a cross-encoder: one relevance score per (query, document) pair."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks import params
from tasks.base import Answer, Gate, Inputs, ModelInfo, Outputs, ParityInput, TaskSpec
from tasks.errors import InvalidRequest
from tasks.ops import sigmoid, softmax, spearman


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.stack(p.reference)[:, 0]
    cand = np.stack(p.candidate)[:, 0]
    groups = np.asarray(p.groups)
    rhos = [spearman(ref[groups == g], cand[groups == g]) for g in np.unique(groups)]
    return {"spearman_min": float(min(rhos)), "spearman_mean": float(np.mean(rhos))}


@dataclass(frozen=True, slots=True)
class Params:
    top_n: int | None
    return_documents: bool
    raw_scores: bool


PARAMETERS = {
    "top_n": params.Integer("how many documents to return, best first (default: all)", minimum=1, nullable=True),
    "return_documents": params.Boolean("include each document's text in its entry (default false)"),
    "raw_scores": params.Boolean("true returns the logit instead of its sigmoid"),
}


def parse_inputs(value: object) -> Inputs:
    """{"query": str, "documents": [str]}; `texts` is accepted for `documents` (TEI's name)."""
    if not isinstance(value, dict):
        raise InvalidRequest(
            f'inputs must be an object {{"query": str, "documents": [str]}} for text-ranking, got {params.kind(value)}'
        )
    unknown = sorted(set(value) - {"query", "documents", "texts"})
    if unknown:
        raise InvalidRequest(f"inputs has unknown field(s) {', '.join(unknown)}; expected query and documents")
    if "documents" in value and "texts" in value:
        raise InvalidRequest("inputs has both documents and texts; send one (texts is an alias of documents)")
    if "query" not in value:
        raise InvalidRequest("inputs.query is missing; send the query to rank the documents against")
    name = "texts" if "texts" in value else "documents"
    if name not in value:
        raise InvalidRequest("inputs.documents is missing; send the documents to rank")
    query = params.text(value["query"], "inputs.query")
    return Inputs(params.text_list(value[name], f"inputs.{name}"), single=False, query=query)


def parse_params(raw: Mapping[str, object], model: ModelInfo) -> Params:
    return Params(
        PARAMETERS["top_n"].read(raw, "top_n", None),
        PARAMETERS["return_documents"].read(raw, "return_documents", False),
        PARAMETERS["raw_scores"].read(raw, "raw_scores", False),
    )


def postprocess(out: Outputs, p: Params, model: ModelInfo) -> Answer:
    """Documents sorted by relevance. One-logit heads score sigmoid(logit); two-or-more-label heads score the
    last label's probability (the "relevant" class of binary cross-encoders)."""
    logits = np.stack([rows[0] for rows in out.arrays])
    if logits.shape[1] == 1:
        raw = logits[:, 0]
        scores = raw if p.raw_scores else sigmoid(raw)
    else:
        raw = logits[:, -1]
        scores = raw if p.raw_scores else softmax(logits)[:, -1]
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[: p.top_n]
    ranked: list[dict[str, Any]] = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "score": float(scores[i])}
        if p.return_documents:
            entry["document"] = out.inputs.texts[i]
        if out.truncated[i]:
            entry["truncated"] = True
        ranked.append(entry)
    return Answer(ranked)


SPEC = TaskSpec(
    name="text-ranking",
    head="AutoModelForSequenceClassification",
    architectures=("ForSequenceClassification",),
    output="logits",
    pairs=True,
    parity=parity,
    # Gated on the worst query, so no single query's ranking may drift.
    gates=(Gate("spearman_min", 0.98, True, "lowest per-query Spearman correlation with PyTorch scores"),),
    parameters=PARAMETERS,
    parse_inputs=parse_inputs,
    parse_params=parse_params,
    postprocess=postprocess,
    windows=False,
)
