"""Reranking: one relevance score per (query, document) pair, from a cross-encoder's head or from a causal LM
read as Qwen3-Reranker reads it (each pair written into its chat template, "yes" scored against "no")."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tasks import params
from tasks.base import (
    CORRELATION,
    DIFFERENCE,
    NUMBER,
    TRUNCATED,
    Answer,
    Array,
    Baseline,
    Gate,
    Inputs,
    ModelInfo,
    Outputs,
    ParityInput,
    Playground,
    TaskSpec,
    Tensor,
    Tensors,
    json_object,
    tensor_io,
)
from tasks.errors import InvalidRequest
from tasks.ops import ACTIVATIONS, sigmoid, softmax, spearman


def relevance_logit(logits: Array) -> Array:
    """The relevance logit of each pair from the head's [pairs, labels] output: the only logit of a one-logit
    head, else the last label's log-odds against the others (what its softmax probability ranks by)."""
    if logits.shape[1] == 1:
        return logits[:, 0]
    others = logits[:, :-1]
    top = others.max(axis=1, keepdims=True)
    return logits[:, -1] - (top[:, 0] + np.log(np.exp(others - top).sum(axis=1)))


def parity(p: ParityInput) -> dict[str, float]:
    ref = relevance_logit(np.stack(p.reference))
    cand = relevance_logit(np.stack(p.candidate))
    groups = np.asarray(p.groups)
    rhos = [spearman(ref[groups == g], cand[groups == g]) for g in np.unique(groups)]
    # The score: sigmoid of the relevance logit. It is the served score of a one-logit head with the default
    # activation (of one with another, a proxy of it) and of an LM reranker (P(yes)), and exactly the last
    # label's softmax probability, the served score, of a head with several labels.
    score_diff = np.abs(sigmoid(ref) - sigmoid(cand)).max()
    return {
        "spearman_min": float(min(rhos)),
        "spearman_mean": float(np.mean(rhos)),
        "max_score_diff": float(score_diff),
    }


@dataclass(frozen=True, slots=True)
class Params:
    top_n: int | None
    return_documents: bool
    raw_scores: bool
    activation: str = "sigmoid"
    template: str | None = None  # an LM reranker's pair format (None for cross-encoders)
    instruction: str = ""


PARAMETERS = {
    "top_n": params.Integer("how many documents to return, best first (default: all)", minimum=1, nullable=True),
    "return_documents": params.Boolean("include each document's text in its entry (default false)"),
    "raw_scores": params.Boolean(
        "true returns the relevance logit instead of the score (the model's activation of it)"
    ),
    "instruction": params.Text(
        "LM rerankers (Qwen3-Reranker) only: the task instruction written before the query (default: the "
        "model card's, 'Given a web search query, retrieve relevant passages that answer the query')",
        only_if="pair_template",
    ),
}


def write_pair(template: str, instruction: str, query: str, document: str) -> str:
    """One (query, document) pair as an LM reranker reads it (one pass: braces in the texts stay as sent)."""
    values = {"instruction": instruction, "query": query, "document": document}
    return re.sub(r"\{(instruction|query|document)\}", lambda m: values[m.group(1)], template)


def _instruction(raw: Mapping[str, object], model: ModelInfo) -> str:
    if not model.pair_template:
        if "instruction" in raw:
            raise InvalidRequest(
                f"{params.named(raw, 'instruction')} applies to LM rerankers (Qwen3-Reranker) only; this model is a "
                "cross-encoder, which reads the query and document as they are"
            )
        return ""
    instruction: str = PARAMETERS["instruction"].read(raw, "instruction", model.pair_template["instruction"])
    return instruction


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
    return Inputs(params.text_list(value[name], f"inputs.{name}"), False, query, name=f"inputs.{name}")


def parse_params(raw: Mapping[str, object], model: ModelInfo) -> Params:
    return Params(
        PARAMETERS["top_n"].read(raw, "top_n", None),
        PARAMETERS["return_documents"].read(raw, "return_documents", False),
        PARAMETERS["raw_scores"].read(raw, "raw_scores", False),
        model.activation,
        model.pair_template.get("format"),
        _instruction(raw, model),
    )


def prepare(inputs: Inputs, p: Params) -> Inputs:
    """An LM reranker reads each pair as one text in its template (the tokenizer adds the fixed prefix and
    suffix, and truncation cuts the document's end, as the model card's code does)."""
    if p.template is None or inputs.query is None:
        return inputs
    texts = [write_pair(p.template, p.instruction, inputs.query, d) for d in inputs.texts]
    return replace(inputs, texts=texts, query=None, sent=inputs.texts)


def postprocess(out: Outputs, p: Params, model: ModelInfo) -> Answer:
    """Documents sorted by relevance, scored as sentence-transformers' CrossEncoder scores them.

    One-logit heads: the model's activation of the logit (CrossEncoder's activation_fn; sigmoid unless the
    config names another). Heads with two or more labels: the last label's softmax probability. Binary
    cross-encoders are trained with label 1 = relevant (CrossEncoder's own training, ms-marco's 2-class
    heads), and the last label of a graded head is its most relevant grade; CrossEncoder.predict would answer
    every logit, which cannot be ranked. `raw_scores`: the relevance logit (relevance_logit), whose order is
    the score's.
    """
    logits = np.stack([rows[0] for rows in out.arrays])
    # `raw_scores` answers the relevance logit, which ranks as the score does: the last label's own logit did
    # not, so asking for raw scores reordered a two-label head's documents and changed what top_n kept.
    raw = relevance_logit(logits)
    if p.raw_scores:
        scores = raw
    elif logits.shape[1] == 1:
        scores = ACTIVATIONS[p.activation](raw)
    else:
        scores = softmax(logits)[:, -1]
    order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[: p.top_n]
    ranked: list[dict[str, Any]] = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "score": float(scores[i])}
        if p.return_documents:
            entry["document"] = (out.inputs.sent or out.inputs.texts)[i]
        if out.truncated[i]:
            entry["truncated"] = True
        ranked.append(entry)
    return Answer(ranked)


RANKED = json_object(
    {"index": {"type": "integer"}, "score": NUMBER, "document": {"type": "string"}, "truncated": TRUNCATED},
    ["index", "score"],
)
ANSWER = {"type": "array", "items": RANKED}


def tensors(body: list[dict[str, Any]]) -> list[Tensor]:
    """Document indices best first (order) with their scores: k = top_n (default all documents)."""
    scores = np.array([e["score"] for e in body], dtype=np.float32)
    order = np.array([e["index"] for e in body], dtype=np.int64)
    return [Tensor("scores", "FP32", [len(body)], scores), Tensor("order", "INT64", [len(body)], order)]


def baseline(pipe: Callable[..., Any], inputs: Any) -> Any:
    """The text-classification pipeline over (query, document) pairs, one raw score each."""
    pairs = [{"text": inputs["query"], "text_pair": d} for d in inputs["documents"]]
    return [float(r["score"]) for r in pipe(pairs, truncation=True)]


PLAYGROUND_DOCUMENTS = (
    "Quantizing the model to int8 makes inference faster on CPUs.\n"
    "The museum opens at nine on Sundays.\n"
    "Batching requests raises throughput on a busy server."
)

SPEC = TaskSpec(
    name="text-ranking",
    head="AutoModelForSequenceClassification",
    architectures=("ForSequenceClassification", "ForCausalLM"),
    output="logits",
    output_axes=2,
    pairs=True,
    parity=parity,
    # Gated on the worst query, so no single query's ranking may drift; and on the scores themselves, so that a
    # threshold on them (score > 0.5) answers as with transformers.
    gates=(
        Gate("spearman_min", 0.98, True, "lowest per-query Spearman correlation with PyTorch scores", CORRELATION),
        Gate(
            "max_score_diff",
            0.02,
            False,
            "largest |score difference| from PyTorch (sigmoid of the relevance logit)",
            DIFFERENCE,
        ),
    ),
    parameters=PARAMETERS,
    parse_inputs=parse_inputs,
    parse_params=parse_params,
    postprocess=postprocess,
    prepare=prepare,
    windows=False,
    choosers=("top_n",),
    answer=ANSWER,
    tensors=Tensors(
        (tensor_io("query", "BYTES", [1]), tensor_io("documents", "BYTES", [-1])),
        (tensor_io("scores", "FP32", [-1]), tensor_io("order", "INT64", [-1])),
        tensors,
    ),
    playground=Playground("pairs", "ranking", "How do I speed up inference?", documents=PLAYGROUND_DOCUMENTS),
    baseline=Baseline("text-classification", baseline, options={"function_to_apply": "none"}),
)
