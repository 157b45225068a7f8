"""Helpers for the console tests (no tests here): a fake appliance on loopback that answers with recorded
JSON in the appliance contract, and AppTest scripts that render one page.

The fake is a real HTTP server (stdlib, one thread), so the console's httpx client, its error handling and
its timeouts are exercised as they are against `hare serve`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSIONS = {"hare": "0.1.0", "onnxruntime": "1.32.0", "tokenizers": "0.22.2", "python": "3.11.2"}


def _variant(name: str, precision: str, chosen: bool, metric: str, value: float) -> dict[str, Any]:
    gates = {metric: {"value": value, "threshold": 0.98, "passed": value >= 0.98}}
    if precision == "fp32":
        gates["max_abs_diff"] = {"value": 3.1e-6, "threshold": 1e-4, "passed": True}
    return {
        "name": name,
        "precision": precision,
        "metrics": {metric: value, "max_abs_diff": 3.1e-6 if precision == "fp32" else 0.012},
        "gates": gates,
        "passed": all(bool(g["passed"]) for g in gates.values()),
        "size_mb": 0.5 if precision == "fp32" else 0.2,
        "timings_ms": {"s8xb1": 0.41 if precision == "fp32" else 0.33, "s128xb1": 2.1},
        "chosen": chosen,
    }


GATE_METRIC = {
    "text-classification": "top1_agreement",
    "token-classification": "token_agreement",
    "feature-extraction": "cosine_p1",
    "text-ranking": "spearman_min",
}
LABELS = {
    "text-classification": {"0": "NEGATIVE", "1": "POSITIVE"},
    "token-classification": {"0": "O", "1": "B-PER", "2": "I-PER", "3": "B-LOC", "4": "I-LOC"},
    "feature-extraction": {},
    "text-ranking": {"0": "LABEL_0"},
}


def info(task: str) -> dict[str, Any]:
    """/info of a tiny bundle of `task`, as the API describes it."""
    metric = GATE_METRIC.get(task, "agreement")
    return {
        "task": task,
        "model": f"tiny-{task}",
        "architecture": "BertForSequenceClassification" if task != "feature-extraction" else "BertModel",
        "model_type": "bert",
        "labels": LABELS.get(task, {}),
        "max_length": 128,
        "variant": "int8",
        "precision": "int8",
        "target": "cpu",
        "variants": [_variant("fp32", "fp32", False, metric, 1.0), _variant("int8", "int8", True, metric, 0.995)],
        "pooling": "mean" if task == "feature-extraction" else None,
        "normalize": task == "feature-extraction",
        "workers": 1,
        "streams": 2,
        "threads": 1,
        "batching": {"max_batch_size": 32, "max_batch_tokens": 8192, "max_wait_ms": 2.0, "max_queue": 256},
        "versions": VERSIONS,
        "pid": 4242,
    }


def predict_output(task: str, inputs: Any) -> Any:
    """A recorded-shape /predict answer for `inputs`."""
    if task == "text-classification":
        return [{"label": "POSITIVE", "score": 0.87}, {"label": "NEGATIVE", "score": 0.13}]
    if task == "token-classification":
        text = str(inputs)
        out = []
        for word, group in (("Ada Lovelace", "PER"), ("London", "LOC")):
            start = text.find(word)
            if start >= 0:
                out.append(
                    {"entity_group": group, "score": 0.91, "word": word, "start": start, "end": start + len(word)}
                )
        return out
    if task == "feature-extraction":
        texts = inputs if isinstance(inputs, list) else [inputs]
        vecs = [[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 0.0, 1.0], [0.6, 0.8, 0.0]]
        out_vecs = [vecs[i % len(vecs)] for i in range(len(texts))]
        return out_vecs if isinstance(inputs, list) else out_vecs[0]
    docs = inputs["documents"]
    return sorted(({"index": i, "score": round(1.0 / (i + 1), 4)} for i in range(len(docs))), key=lambda r: -r["score"])


def metrics_text(n: int, task: str) -> str:
    """Prometheus text after `n` scrapes: every counter grows by a fixed step per scrape."""
    req = 10 * n
    lines = [
        "# HELP hare_requests_total Requests by route and status.",
        "# TYPE hare_requests_total counter",
        f'hare_requests_total{{route="/predict",status="200"}} {req}',
        f'hare_requests_total{{route="/predict",status="422"}} {n}',
        f'hare_requests_total{{route="/metrics",status="200"}} {n}',  # the console's own scrapes: not traffic
        "# HELP hare_request_duration_seconds Request latency.",
        "# TYPE hare_request_duration_seconds histogram",
    ]
    for le, share in (("0.005", 0.5), ("0.01", 0.9), ("0.05", 1.0), ("+Inf", 1.0)):
        lines.append(f'hare_request_duration_seconds_bucket{{le="{le}",route="/predict"}} {req * share}')
    lines += [
        f'hare_request_duration_seconds_sum{{route="/predict"}} {req * 0.006}',
        f'hare_request_duration_seconds_count{{route="/predict"}} {req}',
        "# HELP hare_phase_duration_seconds Server time per phase.",
        "# TYPE hare_phase_duration_seconds histogram",
    ]
    for phase, ms in (("tokenize", 0.2), ("queue", 0.1), ("inference", 2.0), ("postprocess", 0.05)):
        lines += [
            f'hare_phase_duration_seconds_bucket{{le="+Inf",phase="{phase}"}} {req}',
            f'hare_phase_duration_seconds_sum{{phase="{phase}"}} {req * ms / 1000}',
            f'hare_phase_duration_seconds_count{{phase="{phase}"}} {req}',
        ]
    lines += [
        "# HELP hare_inference_duration_seconds Inference latency.",
        "# TYPE hare_inference_duration_seconds histogram",
    ]
    for le, share in (("0.002", 0.6), ("0.005", 1.0), ("+Inf", 1.0)):
        lines.append(f'hare_inference_duration_seconds_bucket{{le="{le}"}} {req * share}')
    lines += [
        f"hare_inference_duration_seconds_sum {req * 0.002}",
        f"hare_inference_duration_seconds_count {req}",
        "# HELP hare_queue_depth Requests waiting.",
        "# TYPE hare_queue_depth gauge",
        f"hare_queue_depth {n % 3}",
        "# HELP hare_batch_size Batch sizes.",
        "# TYPE hare_batch_size histogram",
        f'hare_batch_size_bucket{{le="1.0"}} {req}',
        f'hare_batch_size_bucket{{le="+Inf"}} {req}',
        f"hare_batch_size_sum {req}",
        f"hare_batch_size_count {req}",
        "# HELP hare_tokens_per_request Tokens per request.",
        "# TYPE hare_tokens_per_request histogram",
        f'hare_tokens_per_request_bucket{{le="+Inf"}} {req}',
        f"hare_tokens_per_request_sum {req * 12}",
        f"hare_tokens_per_request_count {req}",
        "# HELP hare_truncated_total Truncated inputs.",
        "# TYPE hare_truncated_total counter",
        f"hare_truncated_total {n}",
        "# HELP hare_unknown_tokens_total Unknown tokens.",
        "# TYPE hare_unknown_tokens_total counter",
        f"hare_unknown_tokens_total {2 * n}",
        "# HELP hare_predictions_total Predictions by label.",
        "# TYPE hare_predictions_total counter",
    ]
    if task == "text-classification":
        lines += [
            f'hare_predictions_total{{label="POSITIVE"}} {7 * n}',
            f'hare_predictions_total{{label="NEGATIVE"}} {3 * n}',
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Fake:
    """What the fake serves. mode: "hare" (the contract), "html" (some other web server), "error" (/predict
    fails with the contract's error body), "idle" (the contract, but nobody sends traffic: counters stand still
    at zero), "quiet" (counters stand still after 500 requests answered before the console looked)."""

    task: str = "text-classification"
    mode: str = "hare"
    token: str | None = None  # its HARE_ADMIN_TOKEN: /info and /metrics need it
    api_key: str | None = None  # its HARE_API_KEY: POST /predict needs it
    scrapes: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(
            self, status: int, body: Any, ctype: str = "application/json", headers: dict[str, str] | None = None
        ) -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self, secret: str | None) -> bool:
            if secret and self.headers.get("authorization") != f"Bearer {secret}":
                self._send(401, {"error": "missing or wrong API token", "type": "unauthorized"})
                return False
            return True

        def do_GET(self) -> None:
            if fake.mode == "html":
                self._send(404, "<html><body>Not Found</body></html>", "text/html")
            elif self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/ready":
                self._send(200, {"ready": True})
            elif self.path == "/info" and self._authorized(fake.token):
                self._send(200, info(fake.task))
            elif self.path == "/metrics" and self._authorized(fake.token):
                fake.scrapes += 1
                n = {"idle": 0, "quiet": 50}.get(fake.mode, fake.scrapes)
                self._send(200, metrics_text(n, fake.task), "text/plain; version=0.0.4")
            elif self.path not in ("/info", "/metrics"):
                self._send(404, {"error": "not found", "type": "not_found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            fake.requests.append(body)
            if fake.mode == "html":
                self._send(404, "<html>Not Found</html>", "text/html")
            elif fake.mode == "error":
                self._send(422, {"error": "input 0 has 900 tokens; this model takes 128", "type": "input_too_long"})
            elif self.path == "/predict" and self._authorized(fake.api_key):
                timing = "tokenize;dur=0.21, queue;dur=0.05, inference;dur=1.9, postprocess;dur=0.04"
                headers = {"x-compute-time": "0.0022", "server-timing": timing}
                # As hare does: one token a word and two special tokens, cut at max_length (128) unless told not to.
                words = len(json.dumps(body["inputs"]).split()) + 2
                headers["x-compute-tokens"] = str(min(words, 128))
                if words > 128:
                    headers["x-truncated"] = "true"
                self._send(200, predict_output(fake.task, body["inputs"]), headers=headers)

    return Handler


@contextmanager
def fake_appliance(
    task: str = "text-classification", mode: str = "hare", token: str | None = None, api_key: str | None = None
) -> Iterator[Fake]:
    """A Fake listening on a free loopback port for the duration of the block; `fake.url` is its address."""
    fake = Fake(task, mode, token, api_key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def closed_port_url() -> str:
    """A loopback URL where nothing listens (the port was free a moment ago)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# AppTest scripts: AppTest.from_function runs the function's source as a page script.
def overview_page() -> None:
    from admin_ui.views import overview

    overview.render()


def playground_page() -> None:
    from admin_ui.views import playground

    playground.render()


def live_page() -> None:
    from admin_ui.views import live

    live.render()


def benchmarks_page() -> None:
    from admin_ui.views import benchmarks

    benchmarks.render()


def benchmarks_page_or_elsewhere() -> None:
    """The Benchmarks page, or a page without its form while the session says `elsewhere`."""
    import streamlit as st

    from tests.test_console_support import benchmarks_page

    if st.session_state.get("elsewhere"):
        st.write("another page")
    else:
        benchmarks_page()


def containers_page() -> None:
    from admin_ui.views import containers

    containers.render()


def make_point(run_id: int, idx: int, target: str = "hare", seq_len: int = 16, concurrency: int = 1, **kw: Any) -> Any:
    """A bench store Point with plausible figures; `kw` overrides any field."""
    from bench.store import Point

    base = 2.0 + seq_len / 32 + concurrency / 2 + (3.0 if target != "hare" else 0.0)
    fields: dict[str, Any] = {
        "run_id": run_id,
        "idx": idx,
        "target": target,
        "load": "closed",
        "workers": 1,
        "threads": 1,
        "seq_len": seq_len,
        "batch": 1,
        "concurrency": concurrency,
        "rate": 0.0,
        "duration_s": 2.0,
        "requests": 200,
        "ok": 200,
        "errors": {},
        "req_s": 1000.0 * concurrency / base,
        "seq_s": 1000.0 * concurrency / base,
        "tokens_s": 1000.0 * concurrency * seq_len / base,
        "lat_min": base * 0.6,
        "lat_avg": base * 1.05,
        "lat_p50": base,
        "lat_p90": base * 1.3,
        "lat_p95": base * 1.5,
        "lat_p99": base * 2.0,
        "lat_max": base * 3.0,
        "server": {"compute_p50": base * 0.7},
        "client_cpu": 0.4,
    }
    fields.update(kw)
    return Point(**fields)


def fill_store(db: Any, baselines: bool = False) -> tuple[int, int]:
    """Two finished runs of a small grid in the store at `db`; returns their ids (older, newer)."""
    from bench.store import Store

    store = Store(db)
    ids = []
    for speed in (1.0, 1.25):
        run_id = store.create_run("run", task="text-classification", target="http://127.0.0.1:8080", name=f"x{speed}")
        idx = 0
        for target in ("hare", "vanilla") if baselines else ("hare",):
            for seq in (16, 64):
                for conc in (1, 4):
                    p = make_point(run_id, idx, target, seq, conc)
                    p.req_s *= speed
                    store.add_point(p)
                    idx += 1
        store.finish_run(run_id, "done")
        ids.append(run_id)
    return ids[0], ids[1]


FAKE_BENCH = r"""
import json, signal, sys, time
from bench.store import Store
from tests.test_console_support import make_point
db, mode = sys.argv[1], sys.argv[2]
store = Store(db)
asked = 20.0 if mode == "slow" else 2.0  # seconds per point
grid = {"duration_s": asked}
run_id = store.create_run("run", task="text-classification", target="http://127.0.0.1:1", settings={"grid": grid})
def emit(event, **kw):
    print(json.dumps({"event": event, **kw}), flush=True)
current = None
def cancelled(*_):
    if current is not None:  # as the bench does: the point being measured is kept with what it measured
        p = make_point(run_id, current, "hare", 16, 1, duration_s=1.0, requests=10, ok=10)
        store.add_point(p)
        emit("point", k=current, n=2, point=p.to_dict())
    store.finish_run(run_id, "cancelled", "stopped by the operator")
    emit("done", run_id=run_id, status="cancelled", message="stopped by the operator")
    sys.exit(130)
signal.signal(signal.SIGTERM, cancelled)
emit("start", run_id=run_id, n=2, db=db)
if mode == "fail":
    print("hare bench: error: cannot reach http://127.0.0.1:1 (connection refused)", file=sys.stderr, flush=True)
    sys.exit(1)
for k, seq in enumerate((16, 64), start=1):
    settings = {"seq_len": seq, "batch": 1, "concurrency": 1, "duration_s": asked}
    emit("point_start", k=k, n=2, target="hare", settings=settings)
    current = k
    emit("tick", k=k, n=2, elapsed_s=0.5, duration_s=1.0, requests=10, errors=0, req_s=20.0, p50_ms=4.0, p99_ms=9.0)
    if mode == "slow":
        time.sleep(60)
    p = make_point(run_id, k, "hare", seq, 1)  # the bench numbers its points from 1
    store.add_point(p)
    emit("point", k=k, n=2, point=p.to_dict())
    current = None
store.finish_run(run_id, "done")
emit("done", run_id=run_id, status="done", message="")
"""


def fake_bench_argv(db: Any, mode: str = "ok") -> list[str]:
    """A stand-in for `hare bench run --progress jsonl`: same events, same store, chosen outcome."""
    import sys

    return [sys.executable, "-c", FAKE_BENCH, str(db), mode]
