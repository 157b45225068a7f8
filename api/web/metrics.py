"""Prometheus metrics, correct across gunicorn workers.

`hare serve` (api/process/gunicorn_conf.py) points PROMETHEUS_MULTIPROC_DIR at a fresh folder before any worker
starts; prometheus_client then writes every worker's samples there and /metrics merges them. Without that
variable (tests, one process) the samples live in this object's own registry.

Recording happens in the middleware's tail, after the answer is on the wire, so metrics never add to a
request's latency; inference handlers leave their figures in the ASGI scope under SERVED for it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.engine.batching import BatchStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
# Ten buckets a decade (1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8) from 1 ms to 2.5 s, where requests are served, so
# a quantile interpolated within a bucket is off by well under 25% (with doubling buckets a p99 of ~700 ms read
# anywhere between 512 ms and 1 s); coarser below and above.
SECONDS = (
    0.0005, 0.00075,
    0.001, 0.00125, 0.0015, 0.002, 0.0025, 0.003, 0.004, 0.005, 0.006, 0.008,
    0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.08,
    0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8,
    1.0, 1.25, 1.5, 2.0, 2.5, 4.0, 8.0, 16.0,
)  # fmt: skip
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
# Routes are labelled by name; anything else is "other", so scanners cannot explode the label set.
SERVED = "hare.served"  # scope key: the api.engine.pipeline.Served of an answered inference request


class Metrics:
    """Every metric the server exports; one instance per worker, made in the app's lifespan."""

    def __init__(self) -> None:
        self.multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "hare_requests_total", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.errors = Counter("hare_errors_total", "error answers by error type", ["type"], registry=r)
        self.request_seconds = Histogram(
            "hare_request_duration_seconds", "server time per inference request", ["route"], buckets=SECONDS, registry=r
        )
        self.phase_seconds = Histogram(
            "hare_phase_duration_seconds",
            "server time per inference request and phase (tokenize, queue, inference, postprocess)",
            ["phase"],
            buckets=SECONDS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "hare_inference_duration_seconds", "model time per batch", buckets=SECONDS, registry=r
        )
        self.queue_depth = Gauge(
            "hare_queue_depth", "sequences waiting for the model", multiprocess_mode="livesum", registry=r
        )
        self.batch_size = Histogram("hare_batch_size", "sequences per model call", buckets=SIZES, registry=r)
        self.tokens = Histogram("hare_tokens_per_request", "tokens per inference request", buckets=TOKENS, registry=r)
        self.truncated = Counter("hare_truncated_total", "inputs cut to the model's maximum length", registry=r)
        self.unknown_tokens = Counter("hare_unknown_tokens_total", "unknown-token ids fed to the model", registry=r)
        self.predictions = Counter(
            "hare_predictions_total", "predicted labels (classes, entity types), for drift", ["label"], registry=r
        )
        self._phases = [self.phase_seconds.labels(p) for p in ("tokenize", "queue", "inference", "postprocess")]

    def render(self) -> bytes:
        """The exposition text: every worker's samples in multiprocess mode, else this registry's."""
        if self.multiprocess:
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.size)
        self.inference_seconds.observe(stats.seconds)

    def observe_request(
        self,
        phases: Sequence[float],
        tokens: int,
        truncated: int,
        labels: Sequence[str],
    ) -> None:
        for child, seconds in zip(self._phases, phases, strict=True):
            child.observe(seconds)
        self.tokens.observe(tokens)
        if truncated:
            self.truncated.inc(truncated)
        for label in labels:
            self.predictions.labels(label).inc()


class MetricsMiddleware:
    """Counts every HTTP answer by route and status, and times the inference routes (pure ASGI: no
    per-request objects beyond one closure). The metrics come from the app's state, made in its lifespan."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            resources = getattr(scope["app"].state, "hare", None)
            if resources is not None:
                # The matched route's template (Starlette's router leaves it in the scope), so
                # /v2/models/{name}/infer is one series whatever the name; unknown paths count as "other".
                matched = scope.get("route")
                route = getattr(matched, "path", "other")
                metrics: Metrics = resources.metrics
                metrics.requests.labels(route, str(status)).inc()
                if scope["method"] == "POST":  # every POST route is an inference route
                    metrics.request_seconds.labels(route).observe(time.perf_counter() - start)
                    served = scope.get(SERVED)
                    if served is not None:
                        metrics.observe_request(served.phases, served.tokens, served.truncated, served.answer.labels)
