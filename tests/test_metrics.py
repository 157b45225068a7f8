"""The metrics' Tally: samples held in plain Python and written in bulk render exactly as prometheus_client's own
observe/inc would have rendered them, and reach /metrics within FLUSH_SECONDS without a scrape of this worker."""

from __future__ import annotations

import asyncio

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from api.web.metrics import FLUSH_SECONDS, SECONDS, Metrics, Tally


def _pair() -> tuple[CollectorRegistry, Histogram, Counter]:
    registry = CollectorRegistry()
    histogram = Histogram("h_seconds", "h", ["route"], buckets=SECONDS, registry=registry)
    counter = Counter("c", "c", ["status"], registry=registry)
    return registry, histogram, counter


def test_a_flushed_tally_renders_as_direct_observations() -> None:
    rng = np.random.default_rng(0)
    # Values on bucket bounds too: Histogram.observe puts a value equal to a bound in that bound's bucket.
    values = [*rng.lognormal(-5, 2, 500).tolist(), *SECONDS[:5], 0.0, 100.0]
    direct, h1, c1 = _pair()
    tallied, h2, c2 = _pair()
    tally = Tally()
    for i, v in enumerate(values):
        route, status = f"/r{i % 3}", str(200 + i % 2)
        h1.labels(route).observe(v)
        c1.labels(status).inc()
        tally.observe(h2, v, (route,))
        tally.inc(c2, (status,))
        if i % 97 == 0:  # flushed now and then, as the worker's timer does
            tally.flush()
    tally.flush()
    assert _samples(tallied) == _samples(direct)
    tally.flush()  # nothing pending: nothing written twice
    assert _samples(tallied) == _samples(direct)


def _samples(registry: CollectorRegistry) -> dict[str, float]:
    """Every rendered sample but the creation times; sums rounded (the tally adds them in another order)."""
    found = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("#") or "_created" in line:
            continue
        name, value = line.rsplit(" ", 1)
        found[name] = round(float(value), 9)
    assert len(found) > 100  # every bucket of three series, and the counters
    return found


def test_samples_reach_the_registry_within_the_flush_interval_without_a_render() -> None:
    metrics = Metrics()

    def count() -> float:
        value = metrics.registry.get_sample_value("hare_requests_total", {"route": "/predict", "status": "200"})
        return value or 0.0

    async def serve_one_and_wait() -> tuple[float, float]:
        metrics.observe_request("/predict", 200, 0.001)
        at_once = count()
        await asyncio.sleep(3 * FLUSH_SECONDS)
        return at_once, count()

    at_once, later = asyncio.run(serve_one_and_wait())
    assert (at_once, later) == (0.0, 1.0)
    metrics.observe_request("/predict", 200, 0.001)  # outside a loop: written at once
    assert count() == 2.0


def test_a_refusal_before_routing_counts_as_its_routes_429() -> None:
    from api.web.routes import ROUTES

    metrics = Metrics()
    for path in ("/predict", "/v2/models/any-name/infer", "/v2/models/other/infer", "/no/such/route"):
        metrics.refused(ROUTES, path)
    text = metrics.render().decode()
    for route, count in (("/predict", 1), ("/v2/models/{name}/infer", 2), ("other", 1)):
        assert f'hare_requests_total{{route="{route}",status="429"}} {count}.0' in text
    assert 'hare_errors_total{type="Overloaded"} 4.0' in text
