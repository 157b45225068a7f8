"""Cohere's embed API (v2 and v1) on embedding bundles, with every embedding type Cohere returns.

    POST /v2/embed  {"texts": [str], "input_type"?, "embedding_types"?: ["float" | "base64" | "int8" | "uint8" |
                     "binary" | "ubinary"], "output_dimension"?, "truncate"?: "NONE" | "END", "model"?,
                     "max_tokens"?, "priority"?} -> {"id", "embeddings": {<type>: [...] per type asked},
                     "texts", "meta", "response_type": "embeddings_by_type"}
    POST /v1/embed  the same body; without embedding_types the v1 answer is {"id", "embeddings": [[float]],
                     "texts", "meta", "response_type": "embeddings_floats"}, as Cohere's v1

input_type picks the bundle's prompt (config_sentence_transformers.json) by name, the first of INPUT_PROMPTS'
names the bundle declares; a bundle with none of them gets its default prompt, as when input_type is left out.
output_dimension keeps the first N dimensions, re-normalized (hare's `dimensions`). The quantized types are
tasks/quantize.py's (sentence-transformers' definitions, with the fixed range [-1, 1] for int8 and uint8).
Texts longer than the model's maximum are cut at the end (END) or at the start (START: the last tokens are
read), or refused with 413 (NONE); max_tokens cuts (or refuses) each text at that many of its own tokens
where that is fewer than the model reads. priority is ignored.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from api.engine.pipeline import PredictRequest
from api.web import schemas
from api.web.openapi_parts import INFER_ERRORS, Shapes, closed, nullable, ok, post
from api.web.protocols.base import embeddings as needs_embeddings
from api.web.protocols.base import infer, reply
from api.web.state import Resources
from tasks import params, quantize
from tasks.base import NUMBER, Inputs
from tasks.errors import InvalidRequest

EXAMPLE = '{"texts": ["some text"], "input_type": "search_query"}'
FIELDS = (
    "texts",
    "input_type",
    "embedding_types",
    "output_dimension",
    "truncate",
    "model",
    "max_tokens",
    "priority",
)
# Cohere's input types -> prompt names looked for in the bundle, first found wins: Cohere's own name (Nomic's
# models declare these), then the ones sentence-transformers' encode_query and encode_document look for.
INPUT_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
# Cohere's truncate as hare's parameters: END cuts a long text's end, START its start, NONE refuses it.
TRUNCATE: dict[str, dict[str, object]] = {
    "END": {"truncate": True},
    "START": {"truncate": True, "truncation_direction": "Left"},
    "NONE": {"truncate": False},
}


@dataclass(frozen=True, slots=True)
class Asked:
    """What shapes the answer: the texts as sent, the types asked (None: v1's floats-only answer)."""

    texts: list[str]
    types: tuple[str, ...] | None


def prompt_name(input_type: object, prompts: Mapping[str, str]) -> str | None:
    """The bundle's prompt for a Cohere input_type (None: the bundle's default prompt)."""
    if input_type is None:
        return None
    if not isinstance(input_type, str) or input_type not in INPUT_PROMPTS:
        shown = repr(input_type) if isinstance(input_type, str) and len(input_type) <= 40 else params.kind(input_type)
        raise InvalidRequest(f"input_type must be one of {', '.join(INPUT_PROMPTS)}; got {shown}")
    return next((name for name in INPUT_PROMPTS[input_type] if name in prompts), None)


def embedding_types(value: object, default: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is None:
        return default
    if not isinstance(value, list) or not value:
        raise InvalidRequest(f"embedding_types must be a non-empty list of {', '.join(quantize.ENCODINGS)}")
    for i, kind in enumerate(value):
        if not isinstance(kind, str) or kind not in quantize.ENCODINGS:
            shown = repr(kind) if isinstance(kind, str) and len(kind) <= 40 else params.kind(kind)
            raise InvalidRequest(f"embedding_types[{i}] is {shown}; accepted: {', '.join(quantize.ENCODINGS)}")
    return tuple(dict.fromkeys(value))  # each type once, in the order asked


def width(res: Resources) -> int | None:
    """The served vectors' size: the last Dense module's output, else the graph's."""
    dense = res.model.dense
    return int(dense[-1].weight.shape[0]) if dense else res.backend.output_width


def _parse(body: bytes, res: Resources, v2: bool) -> tuple[PredictRequest, Asked]:
    data = params.at_root(schemas.parse_json(body, EXAMPLE))
    schemas.only_fields(data, FIELDS)
    schemas.require(data, ("texts",), EXAMPLE)
    texts = params.text_list(data["texts"], "texts")
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise InvalidRequest(f"model must be a string, got {params.kind(data['model'])}")
    params.integer(data, "priority", None, minimum=-params.INT64, nullable=True)
    types = embedding_types(data.get("embedding_types"), ("float",) if v2 else None)
    raw: dict[str, object] = {"encoding_format": "float"}
    name = prompt_name(data.get("input_type"), res.model.prompts)
    if name is not None:
        raw["prompt_name"] = name
    dimension = params.integer(data, "output_dimension", None, minimum=1, nullable=True)
    top = width(res)
    if dimension is not None:
        if top is not None and dimension > top:
            raise InvalidRequest(
                f"output_dimension is {dimension}; this model's vectors have {top}: ask for 1 to {top}"
            )
        raw["dimensions"] = dimension
    truncate = data.get("truncate")
    if truncate is not None:
        if not isinstance(truncate, str) or truncate not in TRUNCATE:
            shown = repr(truncate) if isinstance(truncate, str) and len(truncate) <= 40 else params.kind(truncate)
            raise InvalidRequest(
                f"truncate must be END (cut the end of a long text), START (cut its start) or NONE (refuse "
                f"it); got {shown}"
            )
        raw.update(TRUNCATE[truncate])
    most = params.integer(data, "max_tokens", None, minimum=1, nullable=True)
    # Each text cut to max_tokens of its own tokens (or refused, with NONE), as Cohere does.
    inputs = Inputs(texts, single=False, name="texts")
    request = schemas.checked(inputs, raw, res.task, res.model, res.limits, text_tokens=most)
    return request, Asked(texts, types)


def _parse_v1(body: bytes, res: Resources) -> tuple[PredictRequest, Asked]:
    return _parse(body, res, v2=False)


def _parse_v2(body: bytes, res: Resources) -> tuple[PredictRequest, Asked]:
    return _parse(body, res, v2=True)


def _by_type(vectors: list[np.ndarray], types: tuple[str, ...]) -> dict[str, list[Any]]:
    return {kind: [quantize.encode(v, kind) for v in vectors] for kind in types}


async def embed(request: Request) -> Response:
    v2 = request.url.path.startswith("/v2")
    call = await infer(request, _parse_v2 if v2 else _parse_v1, needs_embeddings, "an embeddings bundle")
    asked: Asked = call.extra
    vectors: list[np.ndarray] = call.served.answer.body
    tokens = call.served.tokens
    answer: dict[str, Any] = {
        "id": str(uuid.uuid4()),
        "texts": asked.texts,
        "meta": {
            "api_version": {"version": "2" if v2 else "1"},
            "billed_units": {"input_tokens": tokens},
            "tokens": {"input_tokens": tokens},
        },
    }
    if asked.types is None:
        answer.update(response_type="embeddings_floats", embeddings=vectors)
    else:
        answer.update(response_type="embeddings_by_type", embeddings=_by_type(vectors, asked.types))
    return reply(call, answer)


def v1_operation(s: Shapes) -> dict[str, Any] | None:
    return _operation(s, "Cohere v1 embed")


def v2_operation(s: Shapes) -> dict[str, Any] | None:
    return _operation(s, "Cohere v2 embed")


def _operation(s: Shapes, summary: str) -> dict[str, Any] | None:
    if not needs_embeddings(s.task):
        return None
    encodings = {"type": "string", "enum": list(quantize.ENCODINGS)}
    body = closed(
        {
            "texts": s.texts,
            "input_type": nullable({"type": "string", "enum": list(INPUT_PROMPTS)}),
            "embedding_types": nullable({"type": "array", "items": encodings, "minItems": 1}),
            "output_dimension": nullable(
                {"type": "integer", "minimum": 1, "maximum": s.bounds.get("width", params.INT64)}
            ),
            "truncate": nullable({"type": "string", "enum": list(TRUNCATE)}),
            "model": {"type": ["string", "null"]},
            "max_tokens": nullable({"type": "integer", "minimum": 1, "maximum": params.INT64}),
            "priority": {"type": ["integer", "null"], "minimum": -params.INT64, "maximum": params.INT64},
        },
        ["texts"],
    )
    assert set(body["properties"]) == set(FIELDS)
    floats = {"type": "array", "items": {"type": "array", "items": NUMBER}}
    codes = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
    by_type = closed(
        {
            "float": floats,
            **{kind: codes for kind in ("int8", "uint8", "binary", "ubinary")},
            "base64": {"type": "array", "items": {"type": "string"}},
        }
    )
    answer = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "embeddings": {"anyOf": [by_type, floats]},
            "texts": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object"},
            "response_type": {"type": "string", "enum": ["embeddings_by_type", "embeddings_floats"]},
        },
        "required": ["id", "embeddings", "texts", "meta", "response_type"],
    }
    done = ok(answer, "per embedding type asked, one entry per text (v1 without embedding_types: floats)")
    return post(summary, body, done, INFER_ERRORS)
