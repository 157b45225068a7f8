"""Token classification (NER): one label distribution per token, aggregated into entities."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tasks import params
from tasks.base import (
    NUMBER,
    TEXT_TENSOR,
    TRUNCATED,
    Answer,
    Baseline,
    Gate,
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
from tasks.entities import STRATEGIES, aggregate, without_overlaps
from tasks.ops import softmax
from tasks.windows import content_tokens


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.concatenate(list(p.reference))
    cand = np.concatenate(list(p.candidate))
    return {
        "token_agreement": float((ref.argmax(-1) == cand.argmax(-1)).mean()),
        "max_abs_prob_diff": float(np.abs(softmax(ref) - softmax(cand)).max()),
    }


@dataclass(frozen=True, slots=True)
class Params:
    strategy: str
    ignore: tuple[str, ...]


PARAMETERS = {
    "aggregation_strategy": params.Choice(
        "none, simple, first, average or max (default simple): how tokens become entities, as in transformers' "
        "token-classification pipeline",
        options=STRATEGIES,
    ),
    "ignore_labels": params.Strings('labels left out of the answer (default ["O"])'),
}


def parse_params(raw: Mapping[str, object], model: ModelInfo) -> Params:
    return Params(
        PARAMETERS["aggregation_strategy"].read(raw, "aggregation_strategy", "simple"),
        PARAMETERS["ignore_labels"].read(raw, "ignore_labels", ("O",)),
    )


def postprocess(out: Outputs, p: Params, model: ModelInfo) -> Answer:
    """Per input, its entities with character offsets into the original text; windows are merged token by
    token before aggregation, so an entity split by a window edge comes out whole. Of a text read in several
    windows, overlapping entities are then dropped as the pipeline drops them (the per-token answer of
    strategy none, which the pipeline refuses with a stride, keeps every token)."""
    answers: list[list[dict[str, Any]]] = []
    predicted: list[str] = []
    zipped = zip(out.inputs.texts, out.windows, out.arrays, out.truncated, strict=True)
    for i, (text, windows, rows, truncated) in enumerate(zipped):
        tokens = content_tokens(windows, rows, out.stride, out.begins.get(i, 0))
        entities = aggregate(text, tokens, softmax(tokens.rows), p.strategy, model.labels, model.vocab, p.ignore)
        if len(windows) > 1 and p.strategy != "none":  # as the pipeline does to a text of several windows
            entities = without_overlaps(entities)
        for e in entities:
            predicted.append(e.get("entity_group") or e["entity"])
            if truncated:
                e["truncated"] = True
        answers.append(entities)
    return Answer(answers[0] if out.inputs.single else answers, predicted)


ENTITY = json_object(
    {
        "entity_group": {"type": "string"},
        "entity": {"type": "string"},
        "score": NUMBER,
        "index": {"type": "integer"},
        "word": {"type": "string"},
        "start": {"type": ["integer", "null"]},
        "end": {"type": ["integer", "null"]},
        "truncated": TRUNCATED,
    },
    ["score", "word", "start", "end"],
)
ANSWER = {"anyOf": [{"type": "array", "items": ENTITY}, {"type": "array", "items": {"type": "array", "items": ENTITY}}]}


def tensors(body: list[list[dict[str, Any]]]) -> list[Tensor]:
    """Each input's entity list as one JSON string (the /predict objects)."""
    return [Tensor("entities", "BYTES", [len(body)], [orjson.dumps(row).decode() for row in body])]


def baseline(pipe: Callable[..., Any], inputs: Any) -> Any:
    # The pipeline truncates at the tokenizer's model_max_length on its own, and takes no `truncation`
    # (transformers 5 raises TypeError on it: the baseline failed every request).
    return pipe(inputs)


SPEC = TaskSpec(
    name="token-classification",
    head="AutoModelForTokenClassification",
    architectures=("ForTokenClassification",),
    output="logits",
    output_axes=3,
    pairs=False,
    offsets=True,
    parity=parity,
    gates=(Gate("token_agreement", 0.98, True, "share of tokens whose label matches PyTorch"),),
    parameters=PARAMETERS,
    parse_inputs=params.texts,
    parse_params=parse_params,
    postprocess=postprocess,
    answer=ANSWER,
    tensors=Tensors((TEXT_TENSOR,), (tensor_io("entities", "BYTES", [-1]),), tensors),
    playground=Playground("text", "entities", "Ada Lovelace worked with Charles Babbage in London."),
    baseline=Baseline("token-classification", baseline),
)
