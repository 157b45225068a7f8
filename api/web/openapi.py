"""GET /openapi.json and GET /docs: this server's API for its task, derived from the tables the code enforces:
the task's parameter specs and COMMON (tasks/params.py: types, choices, ranges), the server's limits
(settings), the error table (api/web/errors.py STATUS: every status a route can answer), and the routes this task
serves. The docs page is plain HTML with no external assets: the appliance often runs offline."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from typing import Any

from api.engine.errors import NotReady, Overloaded
from api.web.errors import STATUS, NotFound, Unauthorized
from api.web.protocols import cohere_embed, openai, rerank, tei
from api.web.schemas import COMMON
from api.web.state import Resources
from container.runtime import InferenceFailed
from tasks import params, quantize, sparse_embedding
from tasks.base import NUMBER, TRUNCATED, TaskSpec
from tasks.errors import HareError, InputError, InputTooLong, InvalidRequest
from tasks.feature_extraction import EMBEDDING, TOKENS, VECTOR

ERROR = {"$ref": "#/components/schemas/Error"}
# What each kind of route can fail with (their statuses come from api/web/errors.py's table).
INFER_ERRORS: tuple[type[HareError], ...] = (
    InputError,
    Unauthorized,
    InputTooLong,
    InvalidRequest,
    Overloaded,
    InferenceFailed,
    NotReady,
)
READ_ERRORS: tuple[type[HareError], ...] = (InputError, Unauthorized, InputTooLong, InvalidRequest, NotReady)
MODEL_ERRORS: tuple[type[HareError], ...] = (Unauthorized, NotFound, NotReady)
ADMIN_ERRORS: tuple[type[HareError], ...] = (Unauthorized, NotFound, NotReady)
WHY = {
    400: "an empty input (empty string or list)",
    401: "a missing or wrong bearer token (HARE_API_KEY, or HARE_ADMIN_TOKEN on admin routes)",
    404: "no such model or version, or a route off in public mode",
    413: "the body, the number of inputs, a text's characters, or its tokens with truncate false exceed a limit",
    422: "malformed JSON, a wrong type, an unknown field, parameter or value; the message names it",
    429: "the worker's queue is full, or the client's rate limit is spent: retry after Retry-After seconds",
    500: "the runtime failed (InferenceFailed) or a bug; the log has the trace",
    503: "the model is loading or the worker is draining",
}
COMPUTE_HEADERS = {
    "x-compute-time": "server time for the request in seconds (microsecond resolution)",
    "x-compute-type": "cpu+optimized or gpu+optimized",
    "x-compute-characters": "characters of the inputs",
    "x-compute-tokens": "tokens fed to the model",
    "server-timing": "tokenize, queue, inference and postprocess durations (ms)",
}


def _json(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(kinds: Iterable[type[HareError]]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for status in sorted({STATUS[k] for k in kinds}):
        answer = _json(ERROR, WHY[status])
        if status == STATUS[Overloaded]:
            answer["headers"] = {"retry-after": {"required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
        answers[str(status)] = answer
    return answers


def _ok(schema: Mapping[str, Any], description: str, compute: bool = True) -> dict[str, Any]:
    answer = _json(schema, description)
    if compute:
        answer["headers"] = {
            name: {"description": help, "required": True, "schema": {"type": "string"}}
            for name, help in COMPUTE_HEADERS.items()
        }
    return answer


def _post(
    summary: str, body: Mapping[str, Any], ok: dict[str, Any], kinds: Iterable[type[HareError]]
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {"200": ok, **_errors(kinds)},
        }
    }


def _get(summary: str, ok: dict[str, Any], kinds: Iterable[type[HareError]] = ()) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {"200": ok, **_errors(kinds)}}}


def _object(properties: Mapping[str, Any], required: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


def _nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"anyOf": [dict(schema), {"type": "null"}]}


class Shapes:
    """The JSON Schema building blocks for one server: its texts within its limits, its parameters."""

    def __init__(self, res: Resources) -> None:
        self.task = res.task
        limits = res.limits
        self.text = {"type": "string", "minLength": 1, "maxLength": limits.max_input_chars}
        self.texts = {"type": "array", "items": self.text, "minItems": 1, "maxItems": limits.max_inputs}
        self.bounds: dict[str, Any] = {
            "stride": limits.content_length - 1,
            "prompts": list(res.model.prompts),
            "pair_template": bool(res.model.pair_template),
            "heads": list(res.model.heads),
        }
        self.max_length = res.model.max_length
        width = cohere_embed.width(res)
        if width is not None:
            self.bounds["width"] = width
        specs = {**self.task.parameters, **COMMON}
        if not self.task.windows:  # ranking reads pairs whole: no windows, so no stride and no window choice
            specs.pop("stride")
            specs["long_input"] = params.Choice(COMMON["long_input"].help, options=("truncate",))
        described = {name: spec.schema(self.bounds) for name, spec in specs.items()}
        self.params = {name: schema for name, schema in described.items() if schema is not None}

    def parameters(self, names: Iterable[str] | None = None, nullable: bool = False) -> dict[str, Any]:
        chosen = {n: s for n, s in self.params.items() if names is None or n in names}
        return {n: _nullable(s) if nullable else s for n, s in chosen.items()}

    def parameters_object(self) -> dict[str, Any]:
        return _object(self.parameters())

    def similarity(self) -> dict[str, Any]:
        return _object({"source_sentence": self.text, "sentences": self.texts}, ["source_sentence", "sentences"])

    def inputs(self) -> dict[str, Any]:
        if self.task.pairs:
            return {
                "oneOf": [
                    _object({"query": self.text, "documents": self.texts}, ["query", "documents"]),
                    _object({"query": self.text, "texts": self.texts}, ["query", "texts"]),
                ]
            }
        shapes = [self.text, self.texts]
        if self.task.embeddings:
            shapes.append(self.similarity())
        return {"oneOf": shapes}


COSINES = {"type": "array", "items": NUMBER}


def _predict(s: Shapes) -> dict[str, Any]:
    # Any parameter may also sit at the body's root, as huggingface_hub sends embedding options: stated in the
    # description rather than the schema, where each would need a rule that it is not in both places.
    body = _object(
        {
            "inputs": s.inputs(),
            "parameters": _nullable(s.parameters_object()),
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
    return _post(summary, body, _ok(answer, "the task's answer"), INFER_ERRORS)


def _embedding_routes(s: Shapes) -> dict[str, Any]:
    openai_body = _object(
        {
            "input": {"oneOf": [s.text, s.texts]},
            "model": {"type": ["string", "null"], "description": "any name; the answer names this server's"},
            "user": {"type": ["string", "null"]},
            **s.parameters(openai.PARAMETERS, nullable=True),
            "encoding_format": {"type": ["string", "null"], "enum": [*quantize.FLOATS, None]},
        },
        ["input"],
    )
    data = _object(
        {"object": {"const": "embedding"}, "index": {"type": "integer"}, "embedding": VECTOR},
        ["object", "index", "embedding"],
    )
    usage = _object(
        {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}, ["prompt_tokens", "total_tokens"]
    )
    openai_answer = _object(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": data},
            "model": {"type": "string"},
            "usage": usage,
            "truncated": TRUNCATED,
        },
        ["object", "data", "model", "usage"],
    )
    similarity_body = _object(
        {"inputs": s.similarity(), "parameters": _nullable(_object(s.parameters(nullable=True)))}, ["inputs"]
    )
    tei_body = _object({"inputs": {"oneOf": [s.text, s.texts]}, **s.parameters(nullable=True)}, ["inputs"])
    return {
        "/v1/embeddings": _post(
            "OpenAI's embeddings API", openai_body, _ok(openai_answer, "the embeddings"), INFER_ERRORS
        ),
        "/similarity": _post(
            "sentence similarity (TEI): cosine of the source sentence with each sentence",
            similarity_body,
            _ok(COSINES, "one cosine per sentence"),
            INFER_ERRORS,
        ),
        "/embed": _post(
            "TEI's embed: one vector per input (normalize defaults to true, as TEI)",
            tei_body,
            _ok({"type": "array", "items": EMBEDDING}, "the vectors"),
            INFER_ERRORS,
        ),
        "/embed_all": _post(
            "TEI's embed_all: per input, its tokens' last hidden states (special tokens included, not pooled)",
            _object(
                {
                    "inputs": {"oneOf": [s.text, s.texts]},
                    **s.parameters(tei.EMBED_ALL_FIELDS, nullable=True),
                },
                ["inputs"],
            ),
            _ok({"type": "array", "items": TOKENS}, "token vectors per input"),
            INFER_ERRORS,
        ),
        **_cohere_embed_routes(s),
    }


def _cohere_embed_routes(s: Shapes) -> dict[str, Any]:
    def nullable(schema: dict[str, Any]) -> dict[str, Any]:
        return {"anyOf": [schema, {"type": "null"}]}

    encodings = {"type": "string", "enum": list(quantize.ENCODINGS)}
    width = s.bounds.get("width", params.INT64)
    body = _object(
        {
            "texts": s.texts,
            "input_type": nullable({"type": "string", "enum": list(cohere_embed.INPUT_PROMPTS)}),
            "embedding_types": nullable({"type": "array", "items": encodings, "minItems": 1}),
            "output_dimension": nullable({"type": "integer", "minimum": 1, "maximum": width}),
            "truncate": nullable({"type": "string", "enum": list(cohere_embed.TRUNCATE)}),
            "model": {"type": ["string", "null"]},
            "max_tokens": nullable({"type": "integer", "minimum": s.max_length, "maximum": params.INT64}),
            "priority": {"type": ["integer", "null"], "minimum": -params.INT64, "maximum": params.INT64},
        },
        ["texts"],
    )
    assert set(body["properties"]) == set(cohere_embed.FIELDS)
    codes = {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}
    by_type = _object(
        {
            "float": {"type": "array", "items": {"type": "array", "items": NUMBER}},
            **{kind: codes for kind in ("int8", "uint8", "binary", "ubinary")},
            "base64": {"type": "array", "items": {"type": "string"}},
        }
    )
    answer = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "embeddings": {"anyOf": [by_type, {"type": "array", "items": {"type": "array", "items": NUMBER}}]},
            "texts": {"type": "array", "items": {"type": "string"}},
            "meta": {"type": "object"},
            "response_type": {"type": "string", "enum": ["embeddings_by_type", "embeddings_floats"]},
        },
        "required": ["id", "embeddings", "texts", "meta", "response_type"],
    }
    ok = _ok(answer, "per embedding type asked, one entry per text (v1 without embedding_types: floats)")
    return {
        "/v2/embed": _post("Cohere v2 embed", body, ok, INFER_ERRORS),
        "/v1/embed": _post("Cohere v1 embed", body, ok, INFER_ERRORS),
    }


def _sparse_routes(s: Shapes) -> dict[str, Any]:
    body = _object(
        {"inputs": {"oneOf": [s.text, s.texts]}, **s.parameters(tei.SPARSE_FIELDS[1:], nullable=True)}, ["inputs"]
    )
    answer = _ok({"type": "array", "items": sparse_embedding.SPARSE}, "one sparse vector per input")
    return {
        "/embed_sparse": _post("TEI's embed_sparse: the non-zero weights of each input", body, answer, INFER_ERRORS)
    }


def _ranking_routes(s: Shapes) -> dict[str, Any]:
    fields = {"type": ["string", "number", "boolean", "null"]}
    document = {
        "oneOf": [
            s.text,
            {"type": "object", "properties": {"text": s.text}, "required": ["text"], "additionalProperties": fields},
        ]
    }
    positive = {"type": ["integer", "null"], "minimum": 1, "maximum": params.INT64}
    cohere_body = _object(
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
    assert set(cohere_body["properties"]) == set(rerank.FIELDS)
    result = _object(
        {
            "index": {"type": "integer"},
            "relevance_score": NUMBER,
            "document": {"type": "object"},
            "truncated": TRUNCATED,
        },
        ["index", "relevance_score"],
    )
    cohere_answer = {
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
    tei_body = _object(
        {
            "query": s.text,
            "texts": s.texts,
            "return_text": {"type": ["boolean", "null"]},
            **s.parameters(["raw_scores", "truncate", "truncation_direction"], nullable=True),
        },
        ["query", "texts"],
    )
    assert set(tei_body["properties"]) == set(tei.RERANK_FIELDS)
    tei_item = _object(
        {"index": {"type": "integer"}, "score": NUMBER, "text": {"type": "string"}, "truncated": TRUNCATED},
        ["index", "score"],
    )
    ok = _ok(cohere_answer, "results best first: Cohere's id and meta, Jina's model and usage")
    return {
        "/v1/rerank": _post("Cohere v1 rerank (and Jina's)", cohere_body, ok, INFER_ERRORS),
        "/v2/rerank": _post("Cohere v2 rerank", cohere_body, ok, INFER_ERRORS),
        "/rerank": _post(
            "TEI's rerank", tei_body, _ok({"type": "array", "items": tei_item}, "best first"), INFER_ERRORS
        ),
    }


def _tokenizer_routes(s: Shapes, res: Resources) -> dict[str, Any]:
    token = _object(
        {
            "id": {"type": "integer"},
            "text": {"type": "string"},
            "special": {"type": "boolean"},
            "start": {"type": ["integer", "null"]},
            "stop": {"type": ["integer", "null"]},
        },
        ["id", "text", "special", "start", "stop"],
    )
    tokenize = _object(
        {"inputs": {"oneOf": [s.text, s.texts]}, "add_special_tokens": {"type": ["boolean", "null"]}}, ["inputs"]
    )
    top = res.encoder.whole.get_vocab_size() - 1
    row = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": top},
        "minItems": 1,
        "maxItems": res.limits.max_input_chars,
    }
    decode = _object(
        {
            "ids": {"oneOf": [row, {"type": "array", "items": row, "minItems": 1, "maxItems": res.limits.max_inputs}]},
            "skip_special_tokens": {"type": ["boolean", "null"]},
        },
        ["ids"],
    )
    strings = {"type": "array", "items": {"type": "string"}}
    return {
        "/tokenize": _post(
            "TEI's tokenize (character offsets; special tokens have null ones)",
            tokenize,
            _ok({"type": "array", "items": {"type": "array", "items": token}}, "tokens per input", compute=False),
            READ_ERRORS,
        ),
        "/decode": _post("TEI's decode", decode, _ok(strings, "one text per id list", compute=False), READ_ERRORS),
    }


def _kserve_routes(res: Resources) -> dict[str, Any]:
    signature = res.task.tensors
    io = {"type": "array", "items": {"type": "object"}}
    meta = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array"},
            "platform": {"type": "string"},
            "inputs": io,
            "outputs": io,
        },
        "required": ["name", "versions", "platform", "inputs", "outputs"],
    }
    ready = _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "ready")
    not_ready = _json({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "not ready")
    scalars = {"type": ["object", "null"], "additionalProperties": {"type": ["string", "number", "boolean", "null"]}}
    tensor_in = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": params.INT64}},
            "datatype": {"const": "BYTES"},
            "parameters": scalars,
            "data": {"type": "array", "items": {"type": "string"}},
        },
    }
    infer_body = {
        "type": "object",
        "required": ["inputs"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": ["string", "null"]},
            "parameters": scalars,
            "inputs": {"type": "array", "items": tensor_in, "minItems": 1},
            "outputs": {
                "type": ["array", "null"],
                "items": _object({"name": {"type": "string"}, "parameters": scalars}, ["name"]),
            },
        },
        "description": "inputs: "
        + ", ".join(f"{t['name']} {t['datatype']} {t['shape']}" for t in signature.inputs)
        + "; outputs: "
        + ", ".join(f"{t['name']} {t['datatype']} {t['shape']}" for t in signature.outputs)
        + "; the shape must count the data's elements; parameters are the task's",
    }
    infer_ok = _ok({"type": "object", "required": ["model_name", "outputs"]}, "the output tensors")
    infer_ok["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    infer = _post(
        "KServe v2 infer (BYTES text tensors; binary tensor extension)", infer_body, infer_ok, (*INFER_ERRORS, NotFound)
    )
    metadata = _get("KServe v2 model metadata", _json(meta, "the model's tensors"), MODEL_ERRORS)
    model_ready = {
        "get": {
            "summary": "KServe v2 model ready",
            "responses": {"200": ready, "503": not_ready, **_errors(MODEL_ERRORS)},
        }
    }
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    version = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
    paths = {}
    for prefix, parameters in (
        ("/v2/models/{name}", [name]),
        ("/v2/models/{name}/versions/{version}", [name, version]),
    ):
        for suffix, op in (("", metadata), ("/ready", model_ready), ("/infer", infer)):
            paths[prefix + suffix] = {**op, "parameters": parameters}
    server = {"type": "object", "required": ["name", "version", "extensions"]}
    live = _json({"type": "object", "properties": {"live": {"type": "boolean"}}}, "live")
    paths["/v2"] = _get("KServe v2 server metadata", _json(server, "name, version, extensions"))
    paths["/v2/health/live"] = {"get": {"summary": "KServe v2 liveness", "responses": {"200": live, "503": live}}}
    paths["/v2/health/ready"] = {
        "get": {"summary": "KServe v2 readiness", "responses": {"200": ready, "503": not_ready}}
    }
    return paths


def _operations(res: Resources) -> dict[str, Any]:
    status = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}
    ready = {"type": "object", "properties": {"ready": {"type": "boolean"}}, "required": ["ready"]}
    model = _object(
        {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
        },
        ["id", "object", "created", "owned_by"],
    )
    models = {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": model}},
        "required": ["object", "data"],
    }
    text = {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    page = {"description": "the API as a page", "content": {"text/html": {"schema": {"type": "string"}}}}
    info = {
        "type": "object",
        "required": ["task", "model", "labels", "max_length", "variant", "parameters", "limits", "versions"],
    }
    path_model = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "/v1/models": _get("OpenAI's model list: this server's one model", _json(models, "the model"), MODEL_ERRORS),
        "/v1/models/{model}": {
            **_get("OpenAI's model", _json(model, "the model"), MODEL_ERRORS),
            "parameters": path_model,
        },
        "/health": {
            "get": {
                "summary": "liveness",
                "responses": {"200": _json(status, "alive"), "503": _json(status, "the model loop died")},
            }
        },
        "/ready": {
            "get": {
                "summary": "readiness: model loaded and warm, not draining",
                "responses": {"200": _json(ready, "ready"), "503": _json(ready, "not ready")},
            }
        },
        "/info": _get(
            "model, variant, validation figures, workers, versions",
            _json(info, "the bundle and the process"),
            ADMIN_ERRORS,
        ),
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics, merged across workers",
                "responses": {"200": text, **_errors(ADMIN_ERRORS)},
            }
        },
        "/openapi.json": _get("this document", _json({"type": "object"}, "OpenAPI 3.1")),
        "/docs": {"get": {"summary": "this API as a page", "responses": {"200": page}}},
    }


def spec(res: Resources) -> dict[str, Any]:
    """The OpenAPI 3.1 document for the server `res` describes (its task, limits and model)."""
    task: TaskSpec = res.task
    s = Shapes(res)
    index = {"type": "object", "required": ["hare", "model", "docs"]}
    predict = _predict(s)
    paths: dict[str, Any] = {"/predict": predict}
    if task.embeddings:
        paths.update(_embedding_routes(s))
    if task.pairs:
        paths.update(_ranking_routes(s))
    if task.sparse:
        paths.update(_sparse_routes(s))
    paths.update(_tokenizer_routes(s, res))
    paths.update(_kserve_routes(res))
    paths.update(_operations(res))
    paths["/"] = {**predict, **_get("what this server serves", _json(index, "task, model, docs"))}
    security: list[dict[str, list[str]]] = [{"bearer": []}] if res.settings.api_key else []
    return {
        "openapi": "3.1.0",
        "info": {"title": f"hare · {res.model_name}", "version": "1", "description": f"Serves {task.name}."},
        "paths": paths,
        "security": security,
        "components": {
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error", "type"],
                    "properties": {
                        "error": {"type": "string"},
                        "type": {"type": "string"},
                        "error_type": {"type": "string"},
                    },
                }
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def docs_page(document: dict[str, Any]) -> str:
    """A self-contained HTML page listing the routes and /predict's parameters."""
    e = html.escape
    rows = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            if method == "parameters":
                continue
            rows.append(f"<tr><td><code>{method.upper()} {e(path)}</code></td><td>{e(op.get('summary', ''))}</td></tr>")
    body = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    items = body["properties"]["parameters"]["anyOf"][0]["properties"]
    plist = "".join(f"<li><code>{e(k)}</code>: {e(v.get('description', ''))}</li>" for k, v in items.items())
    title = e(document["info"]["title"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body style='font-family:sans-serif;max-width:60em;margin:2em auto'><h1>{title}</h1>"
        f"<p>{e(document['info']['description'])} Machine-readable: <a href='/openapi.json'>/openapi.json</a>.</p>"
        f"<table>{''.join(rows)}</table><h2>/predict parameters</h2><ul>{plist}</ul>"
        "<h2>Try it</h2><pre>curl -i -X POST localhost:8080/predict -H 'content-type: application/json' "
        '-d \'{"inputs": "I like you. I love you"}\'</pre></body></html>'
    )
