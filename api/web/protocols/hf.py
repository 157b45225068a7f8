"""The Hugging Face Inference API, as huggingface_hub's InferenceClient calls it (POST /predict), and
sentence similarity (also TEI's POST /similarity).

    POST /predict      {"inputs": ..., "parameters": {...}}: the task's answer (api/web/schemas.py, tasks/*.py)
                       embedding bundles: {"inputs": {"source_sentence", "sentences"}} -> [cosine per sentence]
    POST /similarity   the same sentence-similarity body, with TEI's optional "parameters"
"""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from api.engine.pipeline import PredictRequest
from api.web import schemas
from api.web.openapi_parts import INFER_ERRORS, Shapes, closed, nullable, ok, post
from api.web.protocols.base import Call, embeddings, infer, reply
from api.web.protocols.vectors import as_vector
from api.web.state import Resources
from tasks import params
from tasks.base import NUMBER
from tasks.errors import InvalidRequest

SIMILARITY_EXAMPLE = '{"inputs": {"source_sentence": "some text", "sentences": ["other text"]}}'
COSINES = {"type": "array", "items": NUMBER}


def _predict(body: bytes, res: Resources) -> tuple[PredictRequest, bool]:
    return schemas.parse_hf(body, res.task, res.model, res.limits)


async def predict(request: Request) -> Response:
    call = await infer(request, _predict)
    return reply(call, cosines(call) if call.extra else call.served.answer.body)


def _similarity(body: bytes, res: Resources) -> tuple[PredictRequest, bool]:
    data = schemas.parse_json(body, SIMILARITY_EXAMPLE)
    unknown = sorted(set(data) - {"inputs", "parameters"})
    if unknown:
        raise InvalidRequest(f'unknown field(s) {", ".join(unknown)}; the body is {{"inputs": {{...}}, "parameters"?}}')
    schemas.require(data, ("inputs",), SIMILARITY_EXAMPLE)
    value = data["inputs"]
    if not isinstance(value, dict):
        raise InvalidRequest(f"inputs must be an object {{source_sentence, sentences}}, got {params.kind(value)}")
    raw = {k: v for k, v in schemas.parameters(data.get("parameters")).items() if v is not None}
    inputs = schemas.similarity_inputs(value)
    return schemas.checked(
        inputs, schemas.for_cosines(raw, res.task), res.task, res.model, res.limits, uncounted=1
    ), True


async def similarity(request: Request) -> Response:
    call = await infer(request, _similarity, embeddings, "an embeddings bundle")
    return reply(call, cosines(call))


def cosines(call: Call[bool]) -> list[float]:
    """Cosine of the first vector (the source sentence) with each of the others."""
    vectors = np.stack([as_vector(v) for v in call.served.answer.body])
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    # Within [-1, 1]: float32 rounding gave a text and itself 1.0000001, whose arccos is NaN.
    return [float(c) for c in np.clip(unit[1:] @ unit[0], -1.0, 1.0)]


def _similarity_inputs(s: Shapes) -> dict[str, Any]:
    return closed({"source_sentence": s.text, "sentences": s.texts}, ["source_sentence", "sentences"])


def _inputs(s: Shapes) -> dict[str, Any]:
    if s.task.pairs:
        return {
            "oneOf": [
                closed({"query": s.text, "documents": s.texts}, ["query", "documents"]),
                closed({"query": s.text, "texts": s.texts}, ["query", "texts"]),
            ]
        }
    shapes = [s.text, s.texts]
    if s.task.embeddings:
        shapes.append(_similarity_inputs(s))
    if s.task.text_pairs:
        pair = closed({"text": s.text, "text_pair": s.text}, ["text", "text_pair"])
        listed = {"type": "array", "prefixItems": [s.text, s.text], "minItems": 2, "maxItems": 2}
        pairs = {**s.texts, "items": {"oneOf": [pair, listed]}}
        shapes += [pair, pairs]
    return {"oneOf": shapes}


def predict_operation(s: Shapes) -> dict[str, Any]:
    # Any parameter may also sit at the body's root, as huggingface_hub sends embedding options: stated in the
    # description rather than the schema, where each would need a rule that it is not in both places.
    body = closed(
        {
            "inputs": _inputs(s),
            "parameters": nullable(closed(s.parameters())),
            "options": {"type": ["object", "null"], "description": "ignored (the Inference API's wait_for_model)"},
        },
        ["inputs"],
        description="any parameter may also sit at the body's root (as the Hugging Face client sends embedding "
        "options); a root one wins over the same one in parameters",
    )
    answer = s.task.answer
    if s.task.embeddings:
        answer = {"anyOf": [answer, COSINES]}
    summary = f"{s.task.name}: the Hugging Face Inference API (huggingface_hub's InferenceClient)"
    return post(summary, body, ok(answer, "the task's answer"), INFER_ERRORS)


def similarity_operation(s: Shapes) -> dict[str, Any] | None:
    if not embeddings(s.task):
        return None
    body = closed(
        {"inputs": _similarity_inputs(s), "parameters": nullable(closed(s.parameters(nullable=True)))}, ["inputs"]
    )
    return post(
        "sentence similarity (TEI): cosine of the source sentence with each sentence",
        body,
        ok(COSINES, "one cosine per sentence"),
        INFER_ERRORS,
    )
