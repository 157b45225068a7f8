"""OpenAI's embeddings API: POST /v1/embeddings (embedding bundles) and GET /v1/models[/{id}].

    POST /v1/embeddings  {"input": str | [str], "model"?, "encoding_format"?: "float" | "base64", "dimensions"?,
                          "user"?} -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}],
                          "model", "usage": {"prompt_tokens", "total_tokens"}}
    GET /v1/models       {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}

`model` is HARE_MODEL_NAME (default the bundle's folder name); the request's `model` is not checked, so a
client configured with any model name works.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from api.engine.pipeline import PredictRequest
from api.web import schemas
from api.web.errors import NotFound
from api.web.openapi_parts import (
    INFER_ERRORS,
    MODEL_ERRORS,
    OPENAI_ERROR,
    Shapes,
    closed,
    get,
    ok,
    post,
    response,
)
from api.web.protocols.base import embeddings as needs_embeddings
from api.web.protocols.base import guarded, infer, json_response, reply
from api.web.state import Resources
from container.bundle import MANIFEST_FILE
from tasks import params
from tasks.base import TRUNCATED, Inputs
from tasks.errors import InvalidRequest
from tasks.feature_extraction import VECTOR
from tasks.quantize import FLOATS

FIELDS = ("input", "model", "encoding_format", "dimensions", "user")
EXAMPLE = '{"input": "some text"}'
# The task parameters OpenAI's body carries at its root.
PARAMETERS = ("encoding_format", "dimensions")


def _parse(body: bytes, res: Resources) -> tuple[PredictRequest, None]:
    """OpenAI's embeddings request, as a /predict request (inputs always a list: the answer is a list)."""
    data = schemas.parse_json(body, EXAMPLE)
    schemas.only_fields(data, FIELDS)
    schemas.require(data, ("input",), EXAMPLE)
    value = data["input"]
    if isinstance(value, list) and value and not isinstance(value[0], str):
        raise InvalidRequest("input must be a string or a list of strings; token-id arrays are not accepted")
    single = params.texts(value, "input")
    for name in ("model", "user"):
        if data.get(name) is not None and not isinstance(data[name], str):
            raise InvalidRequest(f"{name} must be a string, got {params.kind(data[name])}")
    raw = params.at_root({k: data[k] for k in PARAMETERS if data.get(k) is not None})
    # OpenAI's API (and its client, which decodes base64 itself) knows these two; quantized codes are on
    # /predict, /embed and Cohere's /v2/embed.
    params.choice(raw, "encoding_format", FLOATS, "float")
    inputs = Inputs(single.texts, single=False, name="input")
    return schemas.checked(inputs, raw, res.task, res.model, res.limits), None


async def embeddings(request: Request) -> Response:
    call = await infer(request, _parse, needs_embeddings, "an embeddings bundle")
    served = call.served
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(served.answer.body)]
    answer: dict[str, Any] = {
        "object": "list",
        "data": data,
        "model": call.res.model_name,
        "usage": {"prompt_tokens": served.tokens, "total_tokens": served.tokens},
    }
    if any(served.truncated):
        answer["truncated"] = True
    return reply(call, answer)


def _model(res: Resources) -> dict[str, Any]:
    # created: when the bundle was built (its manifest's modification time), in Unix seconds as OpenAI's.
    created = int((res.settings.bundle / MANIFEST_FILE).stat().st_mtime)
    return {"id": res.model_name, "object": "model", "created": created, "owned_by": "hare"}


async def models(request: Request) -> Response:
    res = guarded(request)
    return json_response({"object": "list", "data": [_model(res)]})


async def model(request: Request) -> Response:
    res = guarded(request)
    if request.path_params["model"] != res.model_name:
        raise NotFound(f"no model {request.path_params['model']!r}; this server serves {res.model_name!r}")
    return json_response(_model(res))


MODEL = closed(
    {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
    ["id", "object", "created", "owned_by"],
)


def embeddings_operation(s: Shapes) -> dict[str, Any] | None:
    if not needs_embeddings(s.task):
        return None
    body = closed(
        {
            "input": {"oneOf": [s.text, s.texts]},
            "model": {"type": ["string", "null"], "description": "any name; the answer names this server's"},
            "user": {"type": ["string", "null"]},
            **s.parameters(PARAMETERS, nullable=True),
            "encoding_format": {"type": ["string", "null"], "enum": [*FLOATS, None]},
        },
        ["input"],
    )
    data = closed(
        {"object": {"const": "embedding"}, "index": {"type": "integer"}, "embedding": VECTOR},
        ["object", "index", "embedding"],
    )
    usage = closed(
        {"prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}, ["prompt_tokens", "total_tokens"]
    )
    answer = closed(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": data},
            "model": {"type": "string"},
            "usage": usage,
            "truncated": TRUNCATED,
        },
        ["object", "data", "model", "usage"],
    )
    return post("OpenAI's embeddings API", body, ok(answer, "the embeddings"), INFER_ERRORS, OPENAI_ERROR)


def models_operation(s: Shapes) -> dict[str, Any]:
    listed = {
        "type": "object",
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL}},
        "required": ["object", "data"],
    }
    return get(
        "OpenAI's model list: this server's one model", response(listed, "the model"), MODEL_ERRORS, OPENAI_ERROR
    )


def model_operation(s: Shapes) -> dict[str, Any]:
    return get("OpenAI's model", response(MODEL, "the model"), MODEL_ERRORS, OPENAI_ERROR)
