"""HTTP handlers, kept thin: parse (api/schemas.py), run (api/pipeline.py), answer.

Every /predict and /v1/embeddings answer carries:
    x-compute-time        server time for the request in seconds, microsecond resolution (read body to
                          serialized answer), as Hugging Face's Inference API reports it
    x-compute-type        cpu+optimized or gpu+optimized
    x-compute-characters  characters of the inputs
    x-compute-tokens      tokens fed to the model (special tokens and every window included)
    server-timing         tokenize, queue, inference and postprocess durations in milliseconds (W3C)
    x-truncated           "true" when an input was cut to the model's maximum length; the answer's objects
                          for that input (labels, entities, ranked documents) then also carry "truncated": true
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from api import schemas
from api.metrics import CONTENT_TYPE, SERVED
from api.pipeline import Served
from api.public import check_admin
from api.state import Resources, resources
from tasks.errors import NotFound

JSON = "application/json"
OK = b'{"status":"ok"}'
BROKEN = b'{"status":"broken"}'
READY = b'{"ready":true}'
NOT_READY = b'{"ready":false}'


async def predict(request: Request) -> Response:
    start = time.perf_counter()
    res = resources(request)
    if res.limiter is not None:
        res.limiter.check(request)
    with res.batcher.admit() as ticket:
        body = await schemas.read_body(request, res.limits.max_body_bytes)
        parsed = schemas.parse_predict(body, res.task, res.model, res.limits)
        served = await res.pipeline.run(ticket, parsed, request.receive)
    return _answer(served.answer.body, served, start, res, request)


async def embeddings(request: Request) -> Response:
    """OpenAI's POST /v1/embeddings, for embedding bundles."""
    start = time.perf_counter()
    res = resources(request)
    if not res.task.embeddings:
        raise NotFound(f"/v1/embeddings needs an embeddings bundle; this server answers {res.task.name} on /predict")
    if res.limiter is not None:
        res.limiter.check(request)
    with res.batcher.admit() as ticket:
        body = await schemas.read_body(request, res.limits.max_body_bytes)
        parsed = schemas.parse_embeddings(body, res.task, res.model, res.limits)
        served = await res.pipeline.run(ticket, parsed, request.receive)
    data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(served.answer.body)]
    answer: dict[str, Any] = {
        "object": "list",
        "data": data,
        "model": res.model_name,
        "usage": {"prompt_tokens": served.tokens, "total_tokens": served.tokens},
    }
    if served.truncated:
        answer["truncated"] = True
    return _answer(answer, served, start, res, request)


def _answer(body: Any, served: Served, start: float, res: Resources, request: Request) -> Response:
    content = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    tokenize, queue, inference, postprocess = served.phases
    response = Response(content, media_type=JSON)
    # Raw header bytes: no per-request header parsing; the metrics middleware records `served` afterwards.
    response.raw_headers += [
        (b"x-compute-time", b"%.6f" % (time.perf_counter() - start)),
        (b"x-compute-type", res.compute_type_header),
        (b"x-compute-characters", b"%d" % served.characters),
        (b"x-compute-tokens", b"%d" % served.tokens),
        (
            b"server-timing",
            b"tokenize;dur=%.3f, queue;dur=%.3f, inference;dur=%.3f, postprocess;dur=%.3f"
            % (tokenize * 1e3, queue * 1e3, inference * 1e3, postprocess * 1e3),
        ),
    ]
    if served.truncated:
        response.raw_headers.append((b"x-truncated", b"true"))
    request.scope[SERVED] = served
    return response


async def health(request: Request) -> Response:
    """Liveness: the process answers, and its model loop is alive (if that died, restart the worker)."""
    res = getattr(request.app.state, "hare", None)
    if isinstance(res, Resources) and res.batcher.broken:
        return Response(BROKEN, status_code=503, media_type=JSON)
    return Response(OK, media_type=JSON)


async def ready(request: Request) -> Response:
    """Readiness: the model is loaded and warm, and the worker is not draining."""
    res = getattr(request.app.state, "hare", None)
    if isinstance(res, Resources) and res.ready and res.batcher.healthy:
        return Response(READY, media_type=JSON)
    return Response(NOT_READY, status_code=503, media_type=JSON)


async def info(request: Request) -> Response:
    res = resources(request)
    check_admin(request, res.settings)
    return Response(res.info, media_type=JSON)


async def metrics(request: Request) -> Response:
    res = resources(request)
    check_admin(request, res.settings)
    return Response(res.metrics.render(), media_type=CONTENT_TYPE)


async def openapi(request: Request) -> Response:
    return Response(resources(request).openapi, media_type=JSON)


async def docs(request: Request) -> Response:
    from api.openapi import docs_page

    return HTMLResponse(docs_page(orjson.loads(resources(request).openapi)))


async def index(request: Request) -> Response:
    res = resources(request)
    return Response(orjson.dumps({"hare": res.task.name, "model": res.model_name, "docs": "/docs"}), media_type=JSON)


ROUTES: list[BaseRoute] = [
    Route("/predict", predict, methods=["POST"]),
    Route("/v1/embeddings", embeddings, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/ready", ready, methods=["GET"]),
    Route("/info", info, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
    Route("/docs", docs, methods=["GET"]),
    Route("/", index, methods=["GET"]),
]
