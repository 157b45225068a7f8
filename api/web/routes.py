"""Every route, registered here and nowhere else: the operational ones below, the client protocols from
api/web/protocols/ (each a short module; all of them run inference through api/web/protocols/base.py's `infer`).
"""

from __future__ import annotations

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import BaseRoute, Route

from api.web.metrics import CONTENT_TYPE
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
    from api.web.openapi import docs_page

    return HTMLResponse(docs_page(orjson.loads(resources(request).openapi)))


async def root(request: Request) -> Response:
    return await (hf.predict(request) if request.method == "POST" else index(request))


async def index(request: Request) -> Response:
    res = resources(request)
    return Response(orjson.dumps({"hare": res.task.name, "model": res.model_name, "docs": "/docs"}), media_type=JSON)


def _post(path: str, endpoint: Endpoint) -> Route:
    return Route(path, endpoint, methods=["POST"])


def _get(path: str, endpoint: Endpoint) -> Route:
    return Route(path, endpoint, methods=["GET"])


ROUTES: list[BaseRoute] = [
    # Hugging Face Inference API, and sentence similarity (also TEI's route)
    _post("/predict", hf.predict),
    _post("/similarity", hf.similarity),
    # OpenAI
    _post("/v1/embeddings", openai.embeddings),
    _get("/v1/models", openai.models),
    _get("/v1/models/{model:path}", openai.model),
    # Cohere v1 (and Jina), Cohere v2
    _post("/v1/rerank", rerank.rerank),
    _post("/v2/rerank", rerank.rerank),
    _post("/v1/embed", cohere_embed.embed),
    _post("/v2/embed", cohere_embed.embed),
    # text-embeddings-inference
    _post("/embed", tei.embed),
    _post("/embed_all", tei.embed_all),
    _post("/embed_sparse", tei.embed_sparse),
    _post("/rerank", tei.rerank),
    _post("/tokenize", tei.tokenize),
    _post("/decode", tei.decode),
    # KServe Open Inference Protocol v2 (REST)
    _get("/v2", kserve.server),
    _get("/v2/health/live", kserve.live),
    _get("/v2/health/ready", kserve.ready),
    _get("/v2/models/{name}", kserve.metadata),
    _get("/v2/models/{name}/versions/{version}", kserve.metadata),
    _get("/v2/models/{name}/ready", kserve.model_ready),
    _get("/v2/models/{name}/versions/{version}/ready", kserve.model_ready),
    _post("/v2/models/{name}/infer", kserve.infer),
    _post("/v2/models/{name}/versions/{version}/infer", kserve.infer),
    # operations
    _get("/health", health),
    _get("/ready", ready),
    _get("/info", info),
    _get("/metrics", metrics),
    _get("/openapi.json", openapi),
    _get("/docs", docs),
    # GET: what this server is; POST: an Inference Endpoint's URL, which InferenceClient(model=URL) posts to
    Route("/", root, methods=["GET", "POST"]),
]
