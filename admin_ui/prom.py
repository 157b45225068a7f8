"""Live metrics from an appliance's /metrics: parse Prometheus text, then turn successive scrapes into rates.

A scrape is a `Snapshot`; the Live metrics page keeps the last few in a `History` and plots `timeline(history)`.
Counters and histograms are cumulative, so every figure over time is the difference of two scrapes divided by
the seconds between them, as Prometheus' `rate()` does; quantiles come from the histogram buckets' differences
(`histogram_quantile`). Samples of the same name are summed across labels a figure does not split by (for
example the `pid` label of several gunicorn workers).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]

REQUESTS = "hare_requests_total"
REQUEST_SECONDS = "hare_request_duration_seconds"
INFERENCE_SECONDS = "hare_inference_duration_seconds"
QUEUE_DEPTH = "hare_queue_depth"
BATCH_SIZE = "hare_batch_size"
TOKENS = "hare_tokens_per_request"
TRUNCATED = "hare_truncated_total"
UNKNOWN = "hare_unknown_tokens_total"
PREDICTIONS = "hare_predictions_total"
PHASE_SECONDS = "hare_phase_duration_seconds"
QUANTILES = (0.5, 0.9, 0.99)
WINDOW_S = 10.0  # latency quantiles over at least this many seconds of scrapes, as rate(...[10s]) would
PHASES = ("tokenize", "queue", "inference", "postprocess")
# Requests that run the model; the others (/health, /metrics, the console's own scrapes) are not traffic.
# Route labels are the server's route templates (POST / is left out: GET / shares its label).
INFERENCE_ROUTES = (
    "/predict",
    "/similarity",
    "/v1/embeddings",
    "/embed",
    "/embed_all",
    "/embed_sparse",
    "/v1/embed",
    "/v2/embed",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
    "/v2/models/{name}/infer",
    "/v2/models/{name}/versions/{version}/infer",
)


@dataclass(frozen=True)
class Snapshot:
    """One scrape: sample name -> {labels: value}, and when it was taken (seconds, any monotonic origin)."""

    at: float
    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)

    def total(self, name: str, **match: str) -> float:
        """Sum of the samples called `name` whose labels include `match`; 0 when there are none."""
        want = set(match.items())
        return sum(v for labels, v in self.samples.get(name, {}).items() if want <= labels)

    def has(self, name: str) -> bool:
        return name in self.samples

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Sum of the samples called `name`, grouped by the value of one label."""
        out: dict[str, float] = {}
        for labels, v in self.samples.get(name, {}).items():
            key = dict(labels).get(label)
            if key is not None:
                out[key] = out.get(key, 0.0) + v
        return out

    def buckets(self, histogram: str) -> list[tuple[float, float]]:
        """The histogram's cumulative buckets as (upper bound, count), summed across other labels, sorted."""
        by_le: dict[float, float] = {}
        for labels, v in self.samples.get(histogram + "_bucket", {}).items():
            le = dict(labels).get("le")
            if le is not None:
                bound = float(le)
                by_le[bound] = by_le.get(bound, 0.0) + v
        return sorted(by_le.items())


def parse(text: str, at: float) -> Snapshot:
    """Prometheus text format -> Snapshot. Raises ValueError when the text is not that format."""
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # creation timestamps, not measurements
            labels = frozenset(sample.labels.items())
            series = samples.setdefault(sample.name, {})
            series[labels] = series.get(labels, 0.0) + float(sample.value)
    return Snapshot(at, samples)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets; None without observations.

    Linear interpolation inside the bucket holding the q-th observation; a quantile in the +Inf bucket is
    reported as the largest finite bound, as Prometheus does.
    """
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


def bucket_around(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float] | None:
    """The (lower, upper) bounds of the bucket the q-quantile lies in; None without observations or when it
    lies in the +Inf bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev = 0.0
    for bound, count in buckets:
        if count >= rank:
            return None if math.isinf(bound) else (prev, bound)
        prev = bound
    return None


def _bucket_ms(q: float, buckets: list[tuple[float, float]]) -> tuple[float, float] | None:
    around = bucket_around(q, buckets)
    return None if around is None else (around[0] * 1000.0, around[1] * 1000.0)


def bucket_delta(prev: list[tuple[float, float]], cur: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Observations between two scrapes, bucket by bucket; a counter reset (restart) gives the new counts."""
    before = dict(prev)
    delta = [(bound, count - before.get(bound, 0.0)) for bound, count in cur]
    if any(d < 0 for _, d in delta):
        return cur
    return delta


def _counter_delta(prev: float, cur: float) -> float:
    return cur if cur < prev else cur - prev  # a restart resets counters to zero


@dataclass(frozen=True)
class Interval:
    """What happened between two scrapes, in per-second rates and per-interval distributions."""

    at: float
    seconds: float
    requests_per_s: float
    errors_per_s: float
    latency_ms: dict[float, float | None]  # quantile -> request latency
    inference_ms: dict[float, float | None]
    queue_depth: float
    mean_batch_size: float | None
    mean_tokens: float | None
    truncated_share: float | None  # truncated inputs per request
    unknown_share: float | None  # unknown tokens per token
    labels: dict[str, float]  # predictions per label in the interval
    phase_ms: dict[str, float | None]  # mean server time per phase (Server-Timing's phases)
    latency_count: float = 0.0  # requests the latency quantiles come from (those of the quantile window)
    p99_bucket_ms: tuple[float, float] | None = None  # the histogram bucket the request p99 lies in
    window_s: float = 0.0  # seconds the latency quantiles cover (at least WINDOW_S once there are enough scrapes)


def _mean(prev: Snapshot, cur: Snapshot, histogram: str, **match: str) -> float | None:
    """Mean observation between two scrapes (sum delta / count delta), None without observations."""
    count = _counter_delta(prev.total(histogram + "_count", **match), cur.total(histogram + "_count", **match))
    if count <= 0:
        return None
    return _counter_delta(prev.total(histogram + "_sum", **match), cur.total(histogram + "_sum", **match)) / count


def interval(prev: Snapshot, cur: Snapshot, base: Snapshot | None = None) -> Interval:
    """The rates between two scrapes of the same appliance; latency quantiles between `base` (an earlier
    scrape, default `prev`) and `cur`, so they rest on more than one scrape interval's requests."""
    base = prev if base is None else base
    seconds = max(cur.at - prev.at, 1e-9)
    requests = errors = 0.0
    for route in INFERENCE_ROUTES:
        before = _by_status(prev, route)
        for status, count in _by_status(cur, route).items():
            delta = _counter_delta(before.get(status, 0.0), count)
            requests += delta
            if not status.startswith(("1", "2", "3")):
                errors += delta

    def quantiles(histogram: str) -> dict[float, float | None]:
        delta = bucket_delta(base.buckets(histogram), cur.buckets(histogram))
        return {q: _ms(histogram_quantile(q, delta)) for q in QUANTILES}

    latency_delta = bucket_delta(base.buckets(REQUEST_SECONDS), cur.buckets(REQUEST_SECONDS))
    served = _counter_delta(prev.total(TOKENS + "_count"), cur.total(TOKENS + "_count"))
    tokens = _counter_delta(prev.total(TOKENS + "_sum"), cur.total(TOKENS + "_sum"))
    truncated = _counter_delta(prev.total(TRUNCATED), cur.total(TRUNCATED))
    unknown = _counter_delta(prev.total(UNKNOWN), cur.total(UNKNOWN))
    before = prev.by_label(PREDICTIONS, "label")
    labels = {k: _counter_delta(before.get(k, 0.0), v) for k, v in cur.by_label(PREDICTIONS, "label").items()}
    return Interval(
        at=cur.at,
        seconds=seconds,
        requests_per_s=requests / seconds,
        errors_per_s=errors / seconds,
        latency_ms=quantiles(REQUEST_SECONDS),
        inference_ms=quantiles(INFERENCE_SECONDS),
        queue_depth=cur.total(QUEUE_DEPTH),
        mean_batch_size=_mean(prev, cur, BATCH_SIZE),
        mean_tokens=_mean(prev, cur, TOKENS),
        truncated_share=truncated / served if served > 0 else None,
        unknown_share=unknown / tokens if tokens > 0 else None,
        labels=labels,
        phase_ms={phase: _ms(_mean(prev, cur, PHASE_SECONDS, phase=phase)) for phase in PHASES},
        latency_count=latency_delta[-1][1] if latency_delta else 0.0,
        p99_bucket_ms=_bucket_ms(0.99, latency_delta),
        window_s=max(cur.at - base.at, 0.0),
    )


def _by_status(snapshot: Snapshot, route: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in snapshot.samples.get(REQUESTS, {}).items():
        d = dict(labels)
        if d.get("route") == route and "status" in d:
            out[d["status"]] = out.get(d["status"], 0.0) + v
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


class History:
    """The last `keep` scrapes of one appliance; a scrape from a restarted server is kept like any other."""

    def __init__(self, keep: int = 120) -> None:
        self.snapshots: deque[Snapshot] = deque(maxlen=keep)

    def add(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    def intervals(self, window_s: float = WINDOW_S) -> list[Interval]:
        """Every interval between successive scrapes; its latency quantiles cover the last `window_s` seconds
        (from the latest scrape at least that old, else the first): one 2-second interval holds too few
        requests for a steady p99."""
        snaps = list(self.snapshots)
        out = []
        j = 0
        for i in range(1, len(snaps)):
            while j + 1 < i and snaps[i].at - snaps[j + 1].at >= window_s:
                j += 1
            out.append(interval(snaps[i - 1], snaps[i], snaps[j]))
        return out

    @property
    def watched_s(self) -> float:
        """Seconds between the first and the last scrape kept."""
        return self.snapshots[-1].at - self.snapshots[0].at if self.snapshots else 0.0


@dataclass(frozen=True)
class Lifetime:
    """What a scrape says about everything since the appliance (re)started: inference requests answered,
    those that failed, and the request latency quantiles over all of them."""

    requests: float
    errors: float
    latency_ms: dict[float, float | None]


def lifetime(snapshot: Snapshot) -> Lifetime:
    requests = errors = 0.0
    for route in INFERENCE_ROUTES:
        for status, count in _by_status(snapshot, route).items():
            requests += count
            if not status.startswith(("1", "2", "3")):
                errors += count
    buckets = snapshot.buckets(REQUEST_SECONDS)
    return Lifetime(requests, errors, {q: _ms(histogram_quantile(q, buckets)) for q in QUANTILES})


def needed_requests(q: float) -> int:
    """Requests a quantile needs before it is one: p50 2, p90 10, p99 100."""
    return math.ceil(1 / (1 - q) - 1e-9)


def cumulative_labels(snapshot: Snapshot) -> dict[str, float]:
    """Predictions per label since the appliance started."""
    return snapshot.by_label(PREDICTIONS, "label")


def quantile_label(q: float) -> str:
    return f"p{q * 100:g}"


def timeline_rows(intervals: Iterable[Interval], origin: float = 0.0) -> list[dict[str, float | None]]:
    """One flat row per interval (seconds since `origin`), the shape st.line_chart and tables want."""
    rows: list[dict[str, float | None]] = []
    for iv in intervals:
        row: dict[str, float | None] = {
            "t": round(iv.at - origin, 1),
            "requests/s": iv.requests_per_s,
            "errors/s": iv.errors_per_s,
            "queue depth": iv.queue_depth,
            "mean batch size": iv.mean_batch_size,
            "mean tokens/request": iv.mean_tokens,
            "truncated/request": iv.truncated_share,
            "unknown tokens/token": iv.unknown_share,
        }
        for q, v in iv.latency_ms.items():
            row[f"latency {quantile_label(q)} ms"] = v
        for q, v in iv.inference_ms.items():
            row[f"inference {quantile_label(q)} ms"] = v
        for phase, v in iv.phase_ms.items():
            row[f"{phase} ms"] = v
        rows.append(row)
    return rows


def label_share_rows(intervals: Iterable[Interval], origin: float = 0.0) -> list[dict[str, float | str]]:
    """Long-form rows (t, label, share) of each interval's predicted label distribution, for a drift chart."""
    rows: list[dict[str, float | str]] = []
    for iv in intervals:
        total = sum(iv.labels.values())
        if total <= 0:
            continue
        for label, count in sorted(iv.labels.items()):
            rows.append({"t": round(iv.at - origin, 1), "label": label, "share": count / total})
    return rows
