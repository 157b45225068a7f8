"""Reranking as Cohere (v1 and v2) and Jina define it, on ranking bundles.

    POST /v2/rerank  {"model"?, "query", "documents": [str | {"text"}], "top_n"?, "max_tokens_per_doc"?,
                      "priority"?} -> {"id", "results": [{"index", "relevance_score"}], "meta"}
    POST /v1/rerank  Cohere v1 adds "return_documents" (default false; then each result has "document":
                     {"text"}, or the object sent), "rank_fields", "max_chunks_per_doc"; Jina's body is the
                     same. The answer carries both shapes: Cohere's id and meta, Jina's model and usage.

Results are best first; relevance_score is the task's score (sigmoid of the logit). Documents are cut with
the query at the model's maximum; max_tokens_per_doc cuts each document to that many of its own tokens first
(as Cohere does; at or above the room beside the query it changes nothing), max_chunks_per_doc (checked, at
least 1) never lengthens one; priority is accepted and ignored (one queue per worker).
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from api.engine.pipeline import PredictRequest
from api.web import schemas
from api.web.openapi_parts import INFER_ERRORS, Shapes, closed, ok, post
from api.web.protocols.base import infer, pairs, reply
from api.web.state import Resources
from tasks import params
from tasks.base import NUMBER, TRUNCATED, Inputs
from tasks.errors import InputError, InvalidRequest

EXAMPLE = '{"query": "some text", "documents": ["a document"]}'
FIELDS = (
    "model",
    "query",
    "documents",
    "top_n",
    "return_documents",
    "rank_fields",
    "max_chunks_per_doc",
    "max_tokens_per_doc",
    "priority",
)


def document_text(doc: object, i: int, fields: tuple[str, ...]) -> str:
    """A document's text: a string, or an object's "text"; with rank_fields, the object's listed fields as
    "field: value" lines (its text when it has none of them)."""
    name = f"documents[{i}]"
    if isinstance(doc, str):
        return params.text(doc, name)
    if not isinstance(doc, dict):
        raise InvalidRequest(f"{name} must be a string or an object with text, got {params.kind(doc)}")
    for field, value in doc.items():
        if isinstance(value, dict | list):
            raise InvalidRequest(f"{name}.{field} must be a string, number, boolean or null, got {params.kind(value)}")
    # A structured document needs no "text" when it has a listed field (Cohere's own example has none).
    lines = [f"{f}: {_value(doc[f])}" for f in fields if doc.get(f) is not None]
    if lines:
        return "\n".join(lines)
    if doc.get("text") is None and fields:
        raise InvalidRequest(f"{name} has none of rank_fields ({', '.join(fields)}) and no text")
    return params.text(doc.get("text"), f"{name}.text")


def _value(value: object) -> str:
    """A field's value as written in its line: a string as it is, a number or boolean as JSON writes it."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def _parse(body: bytes, res: Resources) -> tuple[PredictRequest, tuple[list[Any], bool]]:
    data = params.at_root(schemas.parse_json(body, EXAMPLE))
    schemas.only_fields(data, FIELDS)
    schemas.require(data, ("query", "documents"), EXAMPLE)
    query = params.text(data["query"], "query")
    documents = data["documents"]
    if not isinstance(documents, list):
        raise InvalidRequest(f"documents must be a list of strings or objects, got {params.kind(documents)}")
    if not documents:
        raise InputError("documents is an empty list; send at least one document")
    fields = params.string_list(data, "rank_fields", ())
    texts = [document_text(d, i, fields) for i, d in enumerate(documents)]
    params.integer(data, "max_chunks_per_doc", None, minimum=1, nullable=True)
    most = params.integer(data, "max_tokens_per_doc", None, minimum=1, nullable=True)
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise InvalidRequest(f"model must be a string, got {params.kind(data['model'])}")
    params.integer(data, "priority", None, minimum=-params.INT64, nullable=True)
    given = params.at_root({k: v for k, v in data.items() if v is not None})
    returned = params.boolean(given, "return_documents", False)
    raw = params.only(given, ("top_n",))
    inputs = Inputs(texts, single=False, query=query, name="documents")
    # Each document cut to max_tokens_per_doc of its own tokens first, as Cohere cuts it.
    request = schemas.checked(inputs, raw, res.task, res.model, res.limits, text_tokens=most)
    return request, (documents, returned)


async def rerank(request: Request) -> Response:
    call = await infer(request, _parse, pairs, "a text-ranking bundle")
    documents, returned = call.extra
    results = []
    for entry in call.served.answer.body:
        result: dict[str, Any] = {"index": entry["index"], "relevance_score": entry["score"]}
        if returned:
            doc = documents[entry["index"]]
            result["document"] = {"text": doc} if isinstance(doc, str) else doc
        if entry.get("truncated"):
            result["truncated"] = True
        results.append(result)
    version = "2" if request.url.path.startswith("/v2") else "1"
    tokens = call.served.tokens
    return reply(
        call,
        {
            "id": str(uuid.uuid4()),
            "results": results,
            "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1}},
            "model": call.res.model_name,
            "usage": {"total_tokens": tokens, "prompt_tokens": tokens},
        },
    )


def v1_operation(s: Shapes) -> dict[str, Any] | None:
    return _operation(s, "Cohere v1 rerank (and Jina's)")


def v2_operation(s: Shapes) -> dict[str, Any] | None:
    return _operation(s, "Cohere v2 rerank")


def _operation(s: Shapes, summary: str) -> dict[str, Any] | None:
    if not pairs(s.task):
        return None
    fields = {"type": ["string", "number", "boolean", "null"]}
    document = {
        "oneOf": [
            s.text,
            {"type": "object", "properties": {"text": s.text}, "required": ["text"], "additionalProperties": fields},
        ]
    }
    positive = {"type": ["integer", "null"], "minimum": 1, "maximum": params.INT64}
    body = closed(
        {
            "query": s.text,
            "documents": {"type": "array", "items": document, "minItems": 1, "maxItems": s.texts["maxItems"]},
            "model": {"type": ["string", "null"]},
            "top_n": s.parameters(["top_n"], nullable=True)["top_n"],
            "return_documents": {"type": ["boolean", "null"]},
            "rank_fields": {"type": ["array", "null"], "items": {"type": "string"}},
            "max_chunks_per_doc": positive,
            "max_tokens_per_doc": positive,
            "priority": {"type": ["integer", "null"], "minimum": -params.INT64, "maximum": params.INT64},
        },
        ["query", "documents"],
    )
    assert set(body["properties"]) == set(FIELDS)
    result = closed(
        {
            "index": {"type": "integer"},
            "relevance_score": NUMBER,
            "document": {"type": "object"},
            "truncated": TRUNCATED,
        },
        ["index", "relevance_score"],
    )
    answer = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "results": {"type": "array", "items": result},
            "meta": {"type": "object"},
            "model": {"type": "string"},
            "usage": {"type": "object"},
        },
        "required": ["id", "results", "meta", "model", "usage"],
    }
    return post(
        summary, body, ok(answer, "results best first: Cohere's id and meta, Jina's model and usage"), INFER_ERRORS
    )
