"""`create_app(settings)`: the Starlette app. Everything heavy (ONNX Runtime session, tokenizer, batcher,
metrics) is made in the lifespan, once per worker, and warmed up before /ready turns true; nothing is built
at import time.

gunicorn loads `api.web.app:create_app_from_env()` in each worker (see api/process/gunicorn_conf.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tokenizers import Encoding

from api.config import Settings
from api.engine.backend import Backend
from api.engine.batching import Batcher
from api.engine.cores import CorePool, slots_for
from api.engine.opened import open_bundle
from api.engine.pipeline import Pipeline
from api.engine.policy import BatchPolicy
from api.engine.remote import RemoteBackend
from api.web import errors, openapi, routes
from api.web.metrics import Metrics, MetricsMiddleware
from api.web.public import RateLimiter
from api.web.schemas import Limits, accepted_parameters
from api.web.state import Resources
from container.bundle import MODEL_FILE, Manifest, resolve_max_batch_tokens
from container.machine import cpu_record, int8_check, same_cpu, versions
from container.runtime import trim_malloc

log = logging.getLogger("hare")

EXPOSED_HEADERS = [
    "x-compute-time",
    "x-compute-type",
    "x-compute-characters",
    "x-compute-tokens",
    "x-truncated",
    "server-timing",
    "retry-after",
]
VERSIONED = ("hare", "onnxruntime", "tokenizers", "numpy", "starlette", "uvicorn", "gunicorn", "orjson")


def create_app(settings: Settings) -> Starlette:
    middleware = [Middleware(errors.RefuseEarly), Middleware(Rebalance), Middleware(MetricsMiddleware)]
    if settings.probe_port is not None:
        middleware.insert(0, Middleware(errors.ProbesOnly, port=settings.probe_port))
    if settings.cors_origins:
        middleware.insert(
            0,
            Middleware(
                errors.JsonCors,
                allow_origins=list(settings.cors_origins),
                allow_methods=["GET", "POST"],
                allow_headers=["content-type", "authorization"],
                expose_headers=EXPOSED_HEADERS,
                max_age=3600,
            ),
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        _configure_logging(settings.log_level)
        res = await load(settings)
        app.state.hare = res
        try:
            s = res.settings
            await res.pipeline.warm_up(min(s.streams, s.queue_size), s.max_batch_size)
            # The longest sequences grew the arena past what most requests need: give that back before serving.
            await asyncio.to_thread(res.backend.trim)
            # What compiling and warming freed inside malloc's heaps: 10 MB a worker of the default MiniLM
            # (int8-grouped on OpenVINO, AMD EPYC), which serving did not take up again.
            await asyncio.to_thread(trim_malloc)
            res.ready = True
            log.info(
                "ready: %s %s (%s) pid %d, %d stream(s) of %s thread(s) on %d shared cores, providers %s",
                res.task.name,
                res.model_name,
                res.manifest.variant,
                os.getpid(),
                settings.streams,
                "/".join(map(str, res.backend.widths)),
                settings.cores,
                ",".join(res.backend.providers) + (" (the shared engine's)" if settings.engine_socket else ""),
            )
            yield
        finally:
            res.ready = False  # draining: /ready answers 503 from here on
            await res.batcher.close()
            res.metrics.flush()  # the last answers' samples, tallied and not yet written
            if res.pool is not None:
                res.pool.close()
            if res.limiter is not None:
                res.limiter.close()

    app = Starlette(
        routes=routes.ROUTES,
        middleware=middleware,
        exception_handlers=errors.HANDLERS,
        lifespan=lifespan,
    )
    # A path with a trailing slash is an unknown route, answered as any other (404, the JSON error): Starlette's
    # default redirected it, a 307 with an empty body and a Location built from the client's Host header.
    app.router.redirect_slashes = False
    return app


def create_app_from_env() -> Starlette:
    """The gunicorn entry point: settings from the HARE_* environment `hare serve` prepared."""
    return create_app(Settings.from_env())


async def load(settings: Settings) -> Resources:
    """Open the bundle and build the worker's resources; the batching loop starts on the running loop."""
    opened = open_bundle(settings)
    _check_machine(settings, opened.manifest)  # the operator's settings: what they left to the bundle
    settings, manifest, task, encoder = opened.settings, opened.manifest, opened.task, opened.encoder
    metrics = Metrics()
    # Session creation can take seconds on big models (and the engine its start): off the loop, so the worker
    # keeps its heartbeat.
    backend: Backend | RemoteBackend
    if settings.engine_socket is not None:
        backend = await asyncio.to_thread(
            RemoteBackend, settings.engine_socket, manifest.pad_id, opened.words.unk_id, metrics.unknown_tokens.inc
        )
    else:
        backend = await asyncio.to_thread(
            Backend,
            settings.bundle / MODEL_FILE,
            settings.target or manifest.target,
            settings.widths,
            manifest.output,
            opened.words.unk_id,
            metrics.unknown_tokens.inc,
            settings.cpu_arena,
            manifest.pad_id,
            opened.graph_shapes,
            manifest.variant,
            # The worker's model threads; its event loop runs a call only while no other runs (its fast lane,
            # api/engine/batching.py), so it shares their models rather than keeping a copy of its own.
            callers=settings.streams,
            max_length=manifest.max_length,
        )
    model = opened.model
    on_gpu = "CUDAExecutionProvider" in backend.providers
    # The device does a GPU bundle's work: no CPU cores to account for.
    pool = None if on_gpu else CorePool(settings.cores, settings.core_pool, slots=slots_for(settings.workers))
    policy = BatchPolicy.from_settings(settings)
    if backend.copy_per_caller:  # a copy for each core of every worker would not fit: its streams only
        policy = dataclasses.replace(policy, spread=policy.streams)
    batcher: Batcher[Encoding] = Batcher(
        backend.run,
        policy,
        pool=pool,
        widths=backend.widths,
        on_batch=metrics.observe_batch,
        on_depth=metrics.queue_depth.set,
        on_idle=backend.trim,  # a burst's memory back after a second without batches
        remote=settings.engine_socket is not None,
    )
    batcher.start()
    metrics.track_loop(lambda: batcher.loop_model_cpu)  # load() runs on the event loop: its thread is tracked
    res = Resources(
        settings=settings,
        manifest=manifest,
        task=task,
        model=model,
        backend=backend,
        pool=pool,
        encoder=encoder,
        batcher=batcher,
        pipeline=Pipeline(task, model, encoder, batcher, settings.max_answer_values),
        metrics=metrics,
        limits=Limits(
            settings.max_body_bytes,
            settings.max_inputs,
            settings.max_input_chars,
            settings.truncate,
            encoder.window_tokens,
            settings.read_timeout,
        ),
        limiter=(
            RateLimiter(settings.rate_limit, settings.rate_burst, settings.core_pool)
            if settings.rate_limit > 0
            else None
        ),
        model_name=settings.model_name or manifest.name or settings.bundle.resolve().name,
        compute_type="gpu+optimized" if on_gpu else "cpu+optimized",
    )
    res.info = orjson.dumps(_info(res))
    res.openapi = orjson.dumps(openapi.spec(res))
    return res


def _check_machine(settings: Settings, manifest: Manifest) -> None:
    """Say so at start when the bundle's max_batch_tokens or its int8 figures were measured on another CPU."""
    resolved = resolve_max_batch_tokens(manifest, settings.max_batch_tokens, settings.target)
    if manifest.target == "cpu" and resolved.source != "setting":
        if manifest.max_batch_tokens is None:
            log.info(
                "%s has no measured max_batch_tokens (built before hare measured it): batching up to %d padded "
                "tokens; `hare tune %s` measures this machine's, or set HARE_MAX_BATCH_TOKENS",
                settings.bundle,
                resolved.max_batch_tokens,
                settings.bundle,
            )
        elif resolved.source == "bundle" and not same_cpu(measured_on := manifest.budget_machine or manifest.machine):
            here = cpu_record()
            log.warning(
                "%s's max_batch_tokens (%d padded tokens) was measured on another machine (%s, %s cores; this "
                "one: %s, %s cores): `hare tune %s` measures this one's, or set HARE_MAX_BATCH_TOKENS",
                settings.bundle,
                manifest.max_batch_tokens,
                measured_on.get("cpu"),
                measured_on.get("physical_cores"),
                here["cpu"],
                here["physical_cores"],
                settings.bundle,
            )
    int8 = int8_check(manifest.machine, manifest.int8_levels)
    if manifest.precision == "int8" and manifest.target == "cpu" and not int8["same"]:
        where = (
            f"{settings.bundle}'s int8 variant {manifest.variant} was checked against PyTorch and timed on the "
            f"{int8['checked_on']} int8 path ({manifest.machine.get('cpu')}); this CPU takes the "
            f"{int8['serving_on']} path"
        )
        if int8["exact"]:  # the same integer sums on both paths: only the speed is another CPU's
            log.info(
                "%s. Its int8 weights (%d levels a side) add exactly on both, so its answers are the ones checked; "
                "`hare optimize` on this machine times the variants here",
                where,
                int8["levels"],
            )
        else:
            log.warning(
                "%s, whose kernels add differently (x86 without VNNI adds int8 products in saturating 16-bit "
                "pairs, which weights of %d levels a side can overflow): its error and speed were not measured "
                "here. `hare tune --check BUNDLE` runs its gates here; `hare optimize` on this machine checks and "
                "picks again (--int8-weights narrow builds a bundle whose int8 answers are the same on every x86 "
                "CPU)",
                where,
                int8["levels"],
            )


class Rebalance:
    """Answers with Connection: close when the worker says it holds too many connections (api/process/worker.py):
    the client's next request opens a new one, which a less busy worker accepts."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        res = getattr(scope["app"].state, "hare", None) if scope["type"] == "http" else None
        if res is None or not res.rebalance():
            await self.app(scope, receive, send)
            return

        async def closing(message: Message) -> None:
            headers = message.get("headers", [])
            # A 429 says it already: one Connection header, not "close, close".
            if message["type"] == "http.response.start" and all(k.lower() != b"connection" for k, _ in headers):
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


def _info(res: Resources) -> dict[str, object]:
    m, s = res.manifest, res.settings
    return {
        "task": m.task,
        "model": res.model_name,
        "architecture": m.architecture,
        "model_type": m.model_type,
        "labels": list(res.model.labels),
        "max_length": m.max_length,
        "variant": m.variant,
        "precision": m.precision,
        "target": m.target,
        "variants": m.variants,
        "int8_path": int8_check(m.machine, m.int8_levels),
        "pooling": res.model.pooling if res.task.embeddings else m.pooling,
        "normalize": m.normalize,
        "providers": res.backend.providers,
        "profile": s.profile,
        "workers": s.workers,
        "streams": s.streams,
        "threads": s.threads,
        "cores": s.cores,
        "widths": list(res.backend.widths),
        "batching": s.batching,
        "limits": {
            "max_body_bytes": s.max_body_bytes,
            "max_inputs": s.max_inputs,
            "max_input_chars": s.max_input_chars,
            "truncate": s.truncate,
        },
        "parameters": sorted(accepted_parameters(res.task, res.model)),
        "public": s.public,
        "versions": {**versions(VERSIONED), "bundle": m.versions},
        "machine": m.machine,
        "pid": os.getpid(),
    }


def _configure_logging(level: str) -> None:
    """hare's logs go where gunicorn's go (the way uvicorn's worker wires uvicorn.error); elsewhere, to the
    root logger."""
    logger = logging.getLogger("hare")
    logger.setLevel(level.upper())
    gunicorn = logging.getLogger("gunicorn.error")
    if gunicorn.handlers and not logger.handlers:
        logger.handlers = list(gunicorn.handlers)
        logger.propagate = False
