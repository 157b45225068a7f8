"""Sequence classification: one label distribution per text."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks import params
from tasks.base import (
    DIFFERENCE,
    NUMBER,
    TEXT_TENSOR,
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
from tasks.ops import sigmoid, softmax

FUNCTIONS: dict[str, Callable[[Array], Array]] = {"softmax": softmax, "sigmoid": sigmoid, "none": lambda x: x}


def parity(p: ParityInput) -> dict[str, float]:
    """top1_agreement, and max_score_diff: the largest |score difference| over every text and label, the
    scores being what the server answers by default (default_function: sigmoid for multi-label and one-logit
    heads, else softmax), so a user who thresholds a score sees the same answers as with transformers. A
    regression head's scores are its raw values, on a scale of the model's own (0-1, 0-5, dollars): their
    difference counts as a share of the range PyTorch's values span over the validation texts. Its sigmoid,
    judged before, flattened a miss of 0.2 at a score of 4 to 0.003."""
    ref = np.stack(p.reference)
    cand = np.stack(p.candidate)
    if p.regression:
        spread = np.maximum(np.ptp(ref, axis=0), np.float32(1e-6))  # a label's range; 1e-6: a constant head
        score_diff = (np.abs(ref - cand) / spread).max()
    elif p.multi_label or ref.shape[-1] == 1:
        score_diff = np.abs(sigmoid(ref) - sigmoid(cand)).max()
    else:
        score_diff = np.abs(softmax(ref) - softmax(cand)).max()
    return {
        "top1_agreement": float((ref.argmax(-1) == cand.argmax(-1)).mean()),
        "max_score_diff": float(score_diff),
    }


@dataclass(frozen=True, slots=True)
class Params:
    top_k: int | None
    function: str


PARAMETERS = {
    "top_k": params.Integer(
        "how many labels to return, best first (default 1; null returns every label)", minimum=1, nullable=True
    ),
    "function_to_apply": params.Choice(
        "softmax, sigmoid or none (default: none for a regression model, sigmoid for multi-label or one-label "
        "models, else softmax), as in transformers",
        options=tuple(FUNCTIONS),
    ),
    "raw_scores": params.Boolean(
        'true returns the logits (TEI\'s name for function_to_apply "none"; with another function_to_apply, refused)'
    ),
}


def parse_inputs(value: object) -> Inputs:
    """A text or a list of texts, or text pairs (natural language inference, paraphrase) as transformers'
    pipeline takes them: {"text", "text_pair"} for one pair, a list of such objects, or of [text, text_pair]
    lists (TEI's pairs; `[[a, b]]` is one pair to the pipeline too)."""
    if isinstance(value, dict):
        text, pair = _pair(value, "inputs")
        return Inputs([text], single=True, pairs=[pair])
    if isinstance(value, list) and value and isinstance(value[0], dict | list):
        firsts, seconds = zip(*(_pair(item, f"inputs[{i}]") for i, item in enumerate(value)), strict=True)
        return Inputs(list(firsts), single=False, pairs=list(seconds))
    return params.texts(value)


def _pair(value: object, name: str) -> tuple[str, str]:
    if isinstance(value, list):
        if len(value) != 2:
            raise InvalidRequest(f"{name} must be a pair [text, text_pair], got a list of {len(value)}")
        return params.text(value[0], f"{name}[0]"), params.text(value[1], f"{name}[1]")
    if not isinstance(value, dict):
        raise InvalidRequest(
            f'{name} must be a pair {{"text", "text_pair"}} or [text, text_pair] as the list\'s first item is, '
            f"got {params.kind(value)}"
        )
    if set(value) != {"text", "text_pair"}:
        raise InvalidRequest(f'{name} must hold "text" and "text_pair", and only them, to classify a pair')
    return params.text(value["text"], f"{name}.text"), params.text(value["text_pair"], f"{name}.text_pair")


def default_function(model: ModelInfo) -> str:
    """transformers' rule: none for a regression head, sigmoid for multi-label and single-logit heads, softmax
    otherwise."""
    if model.regression:
        return "none"
    return "sigmoid" if model.multi_label or len(model.labels) == 1 else "softmax"


def parse_params(raw: Mapping[str, object], model: ModelInfo) -> Params:
    function = PARAMETERS["function_to_apply"].read(raw, "function_to_apply", default_function(model))
    if PARAMETERS["raw_scores"].read(raw, "raw_scores", False):
        if raw.get("function_to_apply") not in (None, "none"):
            raise InvalidRequest(
                f'raw_scores true returns the logits, and function_to_apply "{function}" their {function}: send one'
            )
        function = "none"
    top_k = PARAMETERS["top_k"].read(raw, "top_k", 1)
    return Params(top_k, function)


def postprocess(out: Outputs, p: Params, model: ModelInfo) -> Answer:
    """Per input, labels sorted by score; windows' scores are averaged. Always a list per input, one text
    included: the Hugging Face Inference API's shape (`[[{"label", "score"}]]`, which huggingface_hub's
    InferenceClient indexes with [0]); transformers' pipeline answers one text with the inner list."""
    apply = FUNCTIONS[p.function]
    answers: list[list[dict[str, Any]]] = []
    predicted: list[str] = []
    for rows, truncated in zip(out.arrays, out.truncated, strict=True):
        scores = apply(rows[0]) if len(rows) == 1 else apply(np.stack(rows)).mean(axis=0)
        # A stable sort, best first, ties in label order: the pipeline's order exactly.
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[: p.top_k]
        ranked = [{"label": model.labels[i], "score": float(scores[i])} for i in order]
        if truncated:
            for item in ranked:
                item["truncated"] = True
        answers.append(ranked)
        predicted.append(model.labels[order[0]])
    return Answer(answers, predicted)


LABEL = json_object({"label": {"type": "string"}, "score": NUMBER, "truncated": TRUNCATED}, ["label", "score"])
ANSWER = {"type": "array", "items": {"type": "array", "items": LABEL}}


def tensors(body: list[list[dict[str, Any]]]) -> list[Tensor]:
    """Each input's top labels and their scores, best first: k = top_k (default 1; null: every label)."""
    k = len(body[0])
    labels = [item["label"] for row in body for item in row]
    scores = np.array([[item["score"] for item in row] for row in body], dtype=np.float32)
    return [Tensor("labels", "BYTES", [len(body), k], labels), Tensor("scores", "FP32", [len(body), k], scores)]


def baseline(pipe: Callable[..., Any], inputs: Any) -> Any:
    return pipe(inputs, truncation=True)


SPEC = TaskSpec(
    name="text-classification",
    head="AutoModelForSequenceClassification",
    architectures=("ForSequenceClassification",),
    output="logits",
    output_axes=2,
    pairs=False,
    parity=parity,
    gates=(
        Gate("top1_agreement", 0.99, True, "share of texts whose top label matches PyTorch"),
        Gate(
            "max_score_diff",
            0.02,
            False,
            "largest |score difference| from PyTorch (softmax over the labels; sigmoid for multi-label and "
            "one-logit heads; a regression head's values as a share of their range over the validation texts)",
            DIFFERENCE,
        ),
    ),
    parameters=PARAMETERS,
    parse_inputs=parse_inputs,
    text_pairs=True,
    parse_params=parse_params,
    postprocess=postprocess,
    answer=ANSWER,
    tensors=Tensors(
        (TEXT_TENSOR,), (tensor_io("labels", "BYTES", [-1, -1]), tensor_io("scores", "FP32", [-1, -1])), tensors
    ),
    # Every label's score, not only the best one, so the bars compare them all (as the pipeline's top_k=None).
    playground=Playground(
        "text-pair", "labels", "The new release is fast and the setup took two minutes.", parameters='{"top_k": null}'
    ),
    baseline=Baseline("text-classification", baseline),
)
