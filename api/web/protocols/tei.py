"""text-embeddings-inference's routes, with TEI's request fields and answer shapes (router/src/http/types.rs).

    POST /embed     {"inputs": str | [str], "normalize"?: true, "truncate"?, "truncation_direction"?,
                     "dimensions"?, and any other embedding parameter} -> [[float]], one vector per input
    POST /embed_all {"inputs": str | [str], "truncate"?, "truncation_direction"?, "prompt_name"?} ->
                    [[[float]]], per input its tokens' last hidden states (special tokens included), not
                    pooled, Dense-transformed or normalized: TEI's raw embeddings
    POST /embed_sparse {"inputs": str | [str], "truncate"?, "truncation_direction"?, "top_k"?, "threshold"?}
                    -> [[{"index", "value"}]], one list of non-zero weights per input (sparse-embedding bundles;
                    a bge-m3 bundle answers its lexical weights)
    POST /rerank    {"query", "texts": [str], "raw_scores"?, "return_text"?, "truncate"?,
                     "truncation_direction"?} -> [{"index", "score", "text"?}] best first
    POST /tokenize  {"inputs": str | [str], "add_special_tokens"?: true} ->
                     [[{"id", "text", "special", "start", "stop"}]] (every bundle)
    POST /decode    {"ids": [int] | [[int]], "skip_special_tokens"?: true} -> [str] (every bundle)

(/similarity is api/web/protocols/hf.py's.) /tokenize's start and stop are character offsets (TEI's are bytes:
the same for ASCII); special tokens have null ones, as in TEI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from api.engine.pipeline import OFFLOAD_CHARS, PredictRequest
from api.web import schemas
from api.web.openapi_parts import INFER_ERRORS, READ_ERRORS, Shapes, closed, ok, post
from api.web.protocols.base import embeddings, guarded, infer, json_response, pairs, reply, sparse
from api.web.state import Resources
from tasks import params, sparse_embedding
from tasks.base import NUMBER, TRUNCATED, Inputs
from tasks.errors import InputTooLong, InvalidRequest
from tasks.feature_extraction import EMBEDDING, TOKENS

EMBED_ALL_FIELDS = ("inputs", "truncate", "truncation_direction", "prompt_name")
SPARSE_FIELDS = ("inputs", "truncate", "truncation_direction", "top_k", "threshold")
RERANK_FIELDS = ("query", "texts", "raw_scores", "return_text", "truncate", "truncation_direction")
RERANK_EXAMPLE = '{"query": "some text", "texts": ["a document"]}'
DECODE_EXAMPLE = '{"ids": [101, 7592, 102]}'


def _texts(
    body: bytes,
    res: Resources,
    fields: tuple[str, ...] | None,
    defaults: Mapping[str, object],
    forced: Mapping[str, object] | None = None,
) -> tuple[PredictRequest, None]:
    """A TEI body of texts: `inputs` (answered as a list, even for one text, as TEI nests it) and parameters
    (only `fields` when given), over the route's `defaults`; `forced` the route sets whatever was sent."""
    data = schemas.parse_json(body, schemas.HF_EXAMPLE)
    if fields is not None:
        schemas.only_fields(data, fields)
    schemas.require(data, ("inputs",), schemas.HF_EXAMPLE)
    inputs = Inputs(params.texts(data["inputs"]).texts, single=False)
    raw = params.at_root(
        {**defaults, **{k: v for k, v in data.items() if k != "inputs" and v is not None}, **(forced or {})}
    )
    return schemas.checked(inputs, raw, res.task, res.model, res.limits), None


def _embed(body: bytes, res: Resources) -> tuple[PredictRequest, None]:
    # TEI normalizes unless told not to; every other field is a task or common parameter.
    return _texts(body, res, None, {"normalize": True})


async def embed(request: Request) -> Response:
    call = await infer(request, _embed, embeddings, "an embeddings bundle")
    return reply(call, call.served.answer.body)


def _embed_all(body: bytes, res: Resources) -> tuple[PredictRequest, None]:
    return _texts(body, res, EMBED_ALL_FIELDS, {"output_value": "token_embeddings"})


async def embed_all(request: Request) -> Response:
    call = await infer(request, _embed_all, embeddings, "an embeddings bundle")
    return reply(call, call.served.answer.body)


def _embed_sparse(body: bytes, res: Resources) -> tuple[PredictRequest, None]:
    m3_lexical = {"return_dense": False, "return_sparse": True, "return_colbert_vecs": False}
    return _texts(body, res, SPARSE_FIELDS, {}, m3_lexical if res.model.heads else None)  # bge-m3: its weights


async def embed_sparse(request: Request) -> Response:
    call = await infer(request, _embed_sparse, sparse, "a sparse-embedding bundle")
    return reply(call, sparse_embedding.tei_rows(call.served.answer.body))


def _rerank(body: bytes, res: Resources) -> tuple[PredictRequest, list[str] | None]:
    data = schemas.parse_json(body, RERANK_EXAMPLE)
    schemas.only_fields(data, RERANK_FIELDS)
    schemas.require(data, ("query", "texts"), RERANK_EXAMPLE)
    query = params.text(data["query"], "query")
    inputs = Inputs(params.text_list(data["texts"], "texts"), single=False, query=query, name="texts")
    given = params.at_root({k: v for k, v in data.items() if v is not None})
    text = params.boolean(given, "return_text", False)
    raw = params.only(given, ("raw_scores", "truncate", "truncation_direction"))
    return schemas.checked(inputs, raw, res.task, res.model, res.limits), inputs.texts if text else None


async def rerank(request: Request) -> Response:
    call = await infer(request, _rerank, pairs, "a text-ranking bundle")
    texts = call.extra
    answer = []
    for entry in call.served.answer.body:
        item: dict[str, Any] = {"index": entry["index"], "score": entry["score"]}
        if texts is not None:
            item["text"] = texts[entry["index"]]
        if entry.get("truncated"):
            item["truncated"] = True
        answer.append(item)
    return reply(call, answer)


async def _body(request: Request, res: Resources, example: str) -> dict[str, Any]:
    if res.limiter is not None:
        res.limiter.check(request)
    return schemas.parse_json(await schemas.read_body(request, res.limits), example)


async def tokenize(request: Request) -> Response:
    res = guarded(request)
    data = await _body(request, res, schemas.HF_EXAMPLE)
    schemas.only_fields(data, ("inputs", "add_special_tokens"))
    schemas.require(data, ("inputs",), schemas.HF_EXAMPLE)
    inputs = params.texts(data["inputs"])
    schemas.check_limits(inputs, res.limits)
    special = params.boolean(
        params.at_root({k: v for k, v in data.items() if v is not None}), "add_special_tokens", True
    )
    tokenizer = res.encoder.whole
    if sum(map(len, inputs.texts)) > OFFLOAD_CHARS:
        encodings = await asyncio.to_thread(tokenizer.encode_batch, inputs.texts, add_special_tokens=special)
    else:
        encodings = tokenizer.encode_batch(inputs.texts, add_special_tokens=special)
    answer = []
    for text, enc in zip(inputs.texts, encodings, strict=True):
        tokens = []
        for token_id, token, (start, stop), is_special in zip(
            enc.ids, enc.tokens, enc.offsets, enc.special_tokens_mask, strict=True
        ):
            if is_special:
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append(
                    {"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                )
        answer.append(tokens)
    return json_response(answer)


async def decode(request: Request) -> Response:
    res = guarded(request)
    data = await _body(request, res, DECODE_EXAMPLE)
    schemas.only_fields(data, ("ids", "skip_special_tokens"))
    schemas.require(data, ("ids",), DECODE_EXAMPLE)
    ids = data["ids"]
    batch = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
    vocab_size = res.encoder.whole.get_vocab_size()
    for i, row in enumerate(batch):
        if not isinstance(row, list) or not row:
            raise InvalidRequest("ids must be a non-empty list of token ids, or a list of such lists")
        if len(batch) > res.limits.max_inputs:
            raise InputTooLong(
                f"ids has {len(batch):,} rows, over this server's {res.limits.max_inputs:,} (HARE_MAX_INPUTS)",
                limit=res.limits.max_inputs,
            )
        if len(row) > res.limits.max_input_chars:
            where = f"ids[{i}]" if isinstance(ids[0], list) else "ids"
            raise InputTooLong(
                f"{where} has {len(row):,} ids, over this server's {res.limits.max_input_chars:,} a text "
                "(HARE_MAX_INPUT_CHARS)",
                limit=res.limits.max_input_chars,
            )
        for j, value in enumerate(row):
            if isinstance(value, float) and value.is_integer():  # JSON's 3.0 is the integer 3
                row[j] = value = int(value)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
                where = f"ids[{i}][{j}]" if len(batch) > 1 or isinstance(ids[0], list) else f"ids[{j}]"
                raise InvalidRequest(f"{where} must be a token id from 0 to {vocab_size - 1}")
    skip = params.boolean(params.at_root({k: v for k, v in data.items() if v is not None}), "skip_special_tokens", True)
    return json_response(res.encoder.whole.decode_batch(batch, skip_special_tokens=skip))


def _texts_body(s: Shapes, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A TEI body of `inputs` and the parameters `names` (every one the server accepts by default)."""
    return closed({"inputs": {"oneOf": [s.text, s.texts]}, **s.parameters(names, nullable=True)}, ["inputs"])


def embed_operation(s: Shapes) -> dict[str, Any] | None:
    if not embeddings(s.task):
        return None
    answer = ok({"type": "array", "items": EMBEDDING}, "the vectors")
    summary = "TEI's embed: one vector per input (normalize defaults to true, as TEI)"
    return post(summary, _texts_body(s), answer, INFER_ERRORS)


def embed_all_operation(s: Shapes) -> dict[str, Any] | None:
    if not embeddings(s.task):
        return None
    answer = ok({"type": "array", "items": TOKENS}, "token vectors per input")
    summary = "TEI's embed_all: per input, its tokens' last hidden states (special tokens included, not pooled)"
    return post(summary, _texts_body(s, EMBED_ALL_FIELDS), answer, INFER_ERRORS)


def embed_sparse_operation(s: Shapes) -> dict[str, Any] | None:
    if not sparse(s.task):
        return None
    answer = ok({"type": "array", "items": sparse_embedding.SPARSE}, "one sparse vector per input")
    summary = "TEI's embed_sparse: the non-zero weights of each input"
    return post(summary, _texts_body(s, SPARSE_FIELDS[1:]), answer, INFER_ERRORS)


def rerank_operation(s: Shapes) -> dict[str, Any] | None:
    if not pairs(s.task):
        return None
    body = closed(
        {
            "query": s.text,
            "texts": s.texts,
            "return_text": {"type": ["boolean", "null"]},
            **s.parameters(["raw_scores", "truncate", "truncation_direction"], nullable=True),
        },
        ["query", "texts"],
    )
    assert set(body["properties"]) == set(RERANK_FIELDS)
    item = closed(
        {"index": {"type": "integer"}, "score": NUMBER, "text": {"type": "string"}, "truncated": TRUNCATED},
        ["index", "score"],
    )
    return post("TEI's rerank", body, ok({"type": "array", "items": item}, "best first"), INFER_ERRORS)


def tokenize_operation(s: Shapes) -> dict[str, Any]:
    token = closed(
        {
            "id": {"type": "integer"},
            "text": {"type": "string"},
            "special": {"type": "boolean"},
            "start": {"type": ["integer", "null"]},
            "stop": {"type": ["integer", "null"]},
        },
        ["id", "text", "special", "start", "stop"],
    )
    body = closed(
        {"inputs": {"oneOf": [s.text, s.texts]}, "add_special_tokens": {"type": ["boolean", "null"]}}, ["inputs"]
    )
    answer = ok({"type": "array", "items": {"type": "array", "items": token}}, "tokens per input", compute=False)
    return post("TEI's tokenize (character offsets; special tokens have null ones)", body, answer, READ_ERRORS)


def decode_operation(s: Shapes) -> dict[str, Any]:
    limits = s.res.limits
    top = s.res.encoder.whole.get_vocab_size() - 1
    row = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": top},
        "minItems": 1,
        "maxItems": limits.max_input_chars,
    }
    body = closed(
        {
            "ids": {"oneOf": [row, {"type": "array", "items": row, "minItems": 1, "maxItems": limits.max_inputs}]},
            "skip_special_tokens": {"type": ["boolean", "null"]},
        },
        ["ids"],
    )
    answer = ok({"type": "array", "items": {"type": "string"}}, "one text per id list", compute=False)
    return post("TEI's decode", body, answer, READ_ERRORS)
