"""Prometheus metrics, correct across gunicorn workers.

`hare serve` (api/process/gunicorn_conf.py) points PROMETHEUS_MULTIPROC_DIR at a fresh folder before any worker
starts; prometheus_client then writes every worker's samples there and /metrics merges them. Without that
variable (tests, one process) the samples live in this object's own registry.

Recording happens in the middleware's tail, after the answer is on the wire, so metrics never add to a
request's latency; inference handlers leave their figures in the ASGI scope under SERVED for it.

Per request, the samples go into a `Tally` (plain Python counts), which writes them into prometheus_client's
values in bulk at most every FLUSH_SECONDS and before this worker renders /metrics: a request used to make
about twenty value writes (in multiprocess mode each an mmap write behind a pid check, and each histogram
observation a linear walk over its 40 buckets), 7-10% of a short request's server time (py-spy, AMD EPYC).
Another worker's samples thus reach the merged /metrics within FLUSH_SECONDS.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.engine.batching import BatchStats
from api.engine.pipeline import Served

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
FLUSH_SECONDS = 0.05  # a worker's samples reach the shared values at most this late
ROUTES_SEEN = 256  # refused paths whose route label a worker keeps
PHASES = ("tokenize", "queue", "inference", "postprocess")


class Tally:
    """Counter increments and histogram observations held in plain Python until `flush` writes them into
    prometheus_client's values, one write per touched series and bucket instead of one per sample.

    Relies on prometheus_client's histogram children keeping `_sum` and `_buckets` (one value per upper
    bound, non-cumulative, as `observe` writes them): true of the pinned 0.26; tests/test_metrics.py renders a
    flushed tally against direct observations, so a change there fails a test."""

    def __init__(self) -> None:
        self._counts: dict[tuple[Counter, tuple[str, ...]], float] = {}
        # Per histogram series: [sum, count in bucket 0, count in bucket 1, ...].
        self._observed: dict[tuple[Histogram, tuple[str, ...]], list[float]] = {}
        self._bounds: dict[Histogram, tuple[float, ...]] = {}

    def inc(self, counter: Counter, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        key = (counter, labels)
        self._counts[key] = self._counts.get(key, 0.0) + amount

    def observe(self, histogram: Histogram, value: float, labels: tuple[str, ...] = ()) -> None:
        key = (histogram, labels)
        row = self._observed.get(key)
        bounds = self._bounds.get(histogram)
        if bounds is None:
            bounds = self._bounds[histogram] = tuple(histogram._upper_bounds)
        if row is None:
            row = self._observed[key] = [0.0] * (len(bounds) + 1)
        row[0] += value
        # The first bound at or above the value, as Histogram.observe picks it (the last bound is +Inf).
        row[1 + bisect_left(bounds, value)] += 1

    def flush(self) -> None:
        counts, observed = self._counts, self._observed
        self._counts, self._observed = {}, {}
        for (counter, labels), amount in counts.items():
            (counter.labels(*labels) if labels else counter).inc(amount)
        for (histogram, labels), row in observed.items():
            child = histogram.labels(*labels) if labels else histogram
            child._sum.inc(row[0])
            for bucket, n in zip(child._buckets, row[1:], strict=True):
                if n:
                    bucket.inc(n)


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
        # The server's own work per request, whatever the model's size: `hare bench` reports it per answer.
        self.loop_cpu = Counter(
            "hare_loop_cpu_seconds_total",
            "CPU seconds of the event loops' own work (reading, parsing, tokenizing, batching, answering), the "
            "model calls they ran themselves left out",
            registry=r,
        )
        self._loop: tuple[int, Callable[[], float], float, float] | None = None  # see track_loop
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
        self._phases = [(p,) for p in PHASES]
        self.tally = Tally()
        self._flush_pending: asyncio.TimerHandle | None = None
        self._routes: dict[str, str] = {}  # a refused request's path -> its route's label (see refused)

    def render(self) -> bytes:
        """The exposition text: every worker's samples in multiprocess mode, else this registry's."""
        self.flush()
        if self.multiprocess:
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return generate_latest(merged)
        return generate_latest(self.registry)

    def track_loop(self, model_cpu: Callable[[], float]) -> None:
        """Count this thread's CPU (call it on the event loop's) less `model_cpu`, the CPU seconds of the model
        calls it ran, into hare_loop_cpu_seconds_total at each flush."""
        self._loop = (threading.get_ident(), model_cpu, time.thread_time(), model_cpu())

    def flush(self) -> None:
        """Write the tallied samples into the registry's values (multiprocess mode: the shared files)."""
        if self._flush_pending is not None:
            self._flush_pending.cancel()
            self._flush_pending = None
        if self._loop is not None and self._loop[0] == threading.get_ident():  # thread_time is the caller's
            thread, model_cpu, seen, seen_model = self._loop
            now, model = time.thread_time(), model_cpu()
            self.tally.inc(self.loop_cpu, (), max(0.0, (now - seen) - (model - seen_model)))
            self._loop = (thread, model_cpu, now, model)
        self.tally.flush()

    def _soon(self) -> None:
        """Flush within FLUSH_SECONDS (on the running loop; at once without one)."""
        if self._flush_pending is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.tally.flush()
                return
            self._flush_pending = loop.call_later(FLUSH_SECONDS, self.flush)

    def observe_batch(self, stats: BatchStats) -> None:
        self.tally.observe(self.batch_size, stats.size)
        self.tally.observe(self.inference_seconds, stats.seconds)
        self._soon()

    def observe_request(
        self,
        route: str,
        status: int,
        seconds: float | None,
        served: Served | None = None,
    ) -> None:
        """One HTTP answer: counted by route and status; an inference route's (`seconds` given) timed, and
        with what it `served`, its phases, tokens, truncations and predicted labels."""
        tally = self.tally
        tally.inc(self.requests, (route, str(status)))
        if seconds is not None:
            tally.observe(self.request_seconds, seconds, (route,))
        if served is not None:
            for labels, value in zip(self._phases, served.phases, strict=True):
                tally.observe(self.phase_seconds, value, labels)
            tally.observe(self.tokens, served.tokens)
            if cut := sum(served.truncated):
                tally.inc(self.truncated, (), cut)
            for label in served.answer.labels:
                tally.inc(self.predictions, (label,))
        self._soon()

    def refused(self, routes: Sequence[BaseRoute], path: str) -> None:
        """One POST to `path` refused before the app routed it (RefuseEarly, or the accept loop's canned 429):
        counted as the route's 429, as the middleware counts the answers it sees. Those refusals were counted
        only as errors, so under a flood hare_requests_total held a third of the 429s clients got."""
        route = self._routes.get(path)
        if route is None:
            route = route_label(routes, path)
            if len(self._routes) < ROUTES_SEEN:  # paths are the client's: a scanner's must not grow this
                self._routes[path] = route
        self.tally.inc(self.requests, (route, "429"))
        self.tally.inc(self.errors, ("Overloaded",))
        self._soon()


def route_label(routes: Sequence[BaseRoute], path: str) -> str:
    """The label a POST to `path` is counted under: its route's template, as Starlette's router leaves it in
    the scope (/v2/models/{name}/infer whatever the name), or "other"."""
    scope = {"type": "http", "method": "POST", "path": path, "root_path": ""}
    for route in routes:
        if route.matches(scope)[0] is Match.FULL:
            return str(getattr(route, "path", "other"))
    return "other"


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
                route = getattr(scope.get("route"), "path", "other")
                metrics: Metrics = resources.metrics
                if scope["method"] == "POST":  # every POST route is an inference route
                    metrics.observe_request(route, status, time.perf_counter() - start, scope.get(SERVED))
                else:
                    metrics.observe_request(route, status, None)
