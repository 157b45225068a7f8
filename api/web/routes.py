"""Every route, registered here and nowhere else: the operational ones below, the client protocols from
api/web/protocols/ (each a short module; all of them run inference through api/web/protocols/base.py's `infer`).

Each entry also names, per method, the operation /openapi.json states for it, written beside its handler (the
operational ones here, each protocol's in its module); api/web/openapi.py walks this table to write the
document, so a route cannot be served without being described, nor described without being served.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.web.metrics import CONTENT_TYPE
from api.web.openapi_parts import ADMIN_ERRORS, Operation, Shapes, docs_page, get, response
from api.web.protocols import cohere_embed, hf, kserve, openai, rerank, tei
from api.web.protocols.base import JSON
from api.web.protocols.kserve import Endpoint
from api.web.public import check_admin
from api.web.state import Resources, resources

OK = b'{"status":"ok"}'
BROKEN = b'{"status":"broken"}'
READY = b'{"ready":true}'
NOT_READY = b'{"ready":false}'


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
    return HTMLResponse(docs_page(orjson.loads(resources(request).openapi)))


async def root(request: Request) -> Response:
    return await (hf.predict(request) if request.method == "POST" else index(request))


async def index(request: Request) -> Response:
    res = resources(request)
    return Response(orjson.dumps({"hare": res.task.name, "model": res.model_name, "docs": "/docs"}), media_type=JSON)


STATUS = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}
READINESS = {"type": "object", "properties": {"ready": {"type": "boolean"}}, "required": ["ready"]}


def health_operation(s: Shapes) -> dict[str, Any]:
    responses = {"200": response(STATUS, "alive"), "503": response(STATUS, "the model loop died")}
    return {"summary": "liveness", "responses": responses}


def ready_operation(s: Shapes) -> dict[str, Any]:
    responses = {"200": response(READINESS, "ready"), "503": response(READINESS, "not ready")}
    return {"summary": "readiness: model loaded and warm, not draining", "responses": responses}


def info_operation(s: Shapes) -> dict[str, Any]:
    required = ["task", "model", "labels", "max_length", "variant", "parameters", "limits", "versions"]
    answer = response({"type": "object", "required": required}, "the bundle and the process")
    return get("model, variant, validation figures, workers, versions", answer, ADMIN_ERRORS)


def metrics_operation(s: Shapes) -> dict[str, Any]:
    text = {"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}}
    return get("Prometheus metrics, merged across workers", text, ADMIN_ERRORS)


def openapi_operation(s: Shapes) -> dict[str, Any]:
    return get("this document", response({"type": "object"}, "OpenAPI 3.1"))


def docs_operation(s: Shapes) -> dict[str, Any]:
    page = {"description": "the API as a page", "content": {"text/html": {"schema": {"type": "string"}}}}
    return {"summary": "this API as a page", "responses": {"200": page}}


def index_operation(s: Shapes) -> dict[str, Any]:
    index = {"type": "object", "required": ["hare", "model", "docs"]}
    return get("what this server serves", response(index, "task, model, docs"))


class Documented(Route):
    """A route with, per method, the operation /openapi.json states for it (its methods are those keys).

    Its endpoint answers without Starlette's per-route exception layer (request_response wraps every endpoint
    in one, a coroutine and a send wrapper a request): the app's ExceptionMiddleware, one layer up, maps
    whatever an endpoint raises through the same table (api/web/errors.py's HANDLERS) before an answer starts,
    and no endpoint here raises after its answer started."""

    def __init__(self, path: str, endpoint: Endpoint, operations: Mapping[str, Operation]) -> None:
        super().__init__(path, endpoint, methods=list(operations))
        self.operations = dict(operations)
        self.app = _answering(endpoint)


def _answering(endpoint: Endpoint) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)

    return app


def _post(path: str, endpoint: Endpoint, operation: Operation) -> Documented:
    return Documented(path, endpoint, {"POST": operation})


def _get(path: str, endpoint: Endpoint, operation: Operation) -> Documented:
    return Documented(path, endpoint, {"GET": operation})


ROUTES: list[Documented] = [
    # Hugging Face Inference API, and sentence similarity (also TEI's route)
    _post("/predict", hf.predict, hf.predict_operation),
    _post("/similarity", hf.similarity, hf.similarity_operation),
    # OpenAI
    _post("/v1/embeddings", openai.embeddings, openai.embeddings_operation),
    _get("/v1/models", openai.models, openai.models_operation),
    _get("/v1/models/{model:path}", openai.model, openai.model_operation),
    # Cohere v1 (and Jina), Cohere v2
    _post("/v1/rerank", rerank.rerank, rerank.v1_operation),
    _post("/v2/rerank", rerank.rerank, rerank.v2_operation),
    _post("/v1/embed", cohere_embed.embed, cohere_embed.v1_operation),
    _post("/v2/embed", cohere_embed.embed, cohere_embed.v2_operation),
    # text-embeddings-inference
    _post("/embed", tei.embed, tei.embed_operation),
    _post("/embed_all", tei.embed_all, tei.embed_all_operation),
    _post("/embed_sparse", tei.embed_sparse, tei.embed_sparse_operation),
    _post("/rerank", tei.rerank, tei.rerank_operation),
    _post("/tokenize", tei.tokenize, tei.tokenize_operation),
    _post("/decode", tei.decode, tei.decode_operation),
    # KServe Open Inference Protocol v2 (REST)
    _get("/v2", kserve.server, kserve.server_operation),
    _get("/v2/health/live", kserve.live, kserve.live_operation),
    _get("/v2/health/ready", kserve.ready, kserve.ready_operation),
    _get("/v2/models/{name}", kserve.metadata, kserve.metadata_operation),
    _get("/v2/models/{name}/versions/{version}", kserve.metadata, kserve.metadata_operation),
    _get("/v2/models/{name}/ready", kserve.model_ready, kserve.model_ready_operation),
    _get("/v2/models/{name}/versions/{version}/ready", kserve.model_ready, kserve.model_ready_operation),
    _post("/v2/models/{name}/infer", kserve.infer, kserve.infer_operation),
    _post("/v2/models/{name}/versions/{version}/infer", kserve.infer, kserve.infer_operation),
    # operations
    _get("/health", health, health_operation),
    _get("/ready", ready, ready_operation),
    _get("/info", info, info_operation),
    _get("/metrics", metrics, metrics_operation),
    _get("/openapi.json", openapi, openapi_operation),
    _get("/docs", docs, docs_operation),
    # POST: an Inference Endpoint's URL, which InferenceClient(model=URL) posts to; GET: what this server is
    Documented("/", root, {"POST": hf.predict_operation, "GET": index_operation}),
]
