"""Quick mode end to end: a tiny bundle, two points, the vanilla baseline and the model-only figure, checked
for consistency (not speed), with the JSON-lines progress the console reads and the SQLite rows it shows."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import BaseRequestHandler
from typing import Any, ClassVar

import pytest

from bench.servers import trivial_server, wait_ready_once
from bench.store import Store
from bench.tables import POINT_COLUMNS, point_row
from hare.cli import main as hare
from tests.conftest import ModelFactory


def bench(*args: str, timeout: float = 150) -> tuple[int, list[dict[str, Any]]]:
    proc = subprocess.run(
        [sys.executable, "-m", "hare.cli", "bench", *args, "--progress", "jsonl"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert events, proc.stderr[-2000:]
    return proc.returncode, events


def check_events(events: list[dict[str, Any]], n: int) -> int:
    assert events[0]["event"] == "start" and events[0]["n"] == n
    assert events[-1]["event"] == "done" and events[-1]["status"] == "done", events[-1]
    assert [e["k"] for e in events if e["event"] == "point"] == list(range(1, n + 1))
    assert all(e["n"] == n for e in events if e["event"] in ("point_start", "tick", "point"))
    return int(events[-1]["run_id"])


def check_points(store: Store, run_id: int, targets: dict[str, int]) -> None:
    points = store.points(run_id)
    assert {t: sum(p.target == t for p in points) for t in targets} == targets
    for p in points:
        assert p.ok > 0 and p.ok + sum(p.errors.values()) == p.requests, p
        assert p.lat_min <= p.lat_p50 <= p.lat_p90 <= p.lat_p95 <= p.lat_p99 <= p.lat_max
        assert p.req_s == pytest.approx(p.ok / p.duration_s, rel=0.02)
        assert p.seq_s == pytest.approx(p.req_s * p.batch) and p.tokens_s == pytest.approx(p.seq_s * p.seq_len)
        assert p.seq_len in (8, 16) and p.client_cpu >= 0
    run = store.run(run_id)
    assert run.status == "done" and run.kind == "quick" and len(run.manifest_hash) == 64
    assert run.machine["physical_cores"] >= 1 and "onnxruntime" in run.versions


def test_quick_against_a_url_with_the_vanilla_baseline(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The URL here is the trivial server (so this runs before `hare serve` exists); the baseline is real."""
    bundle = tiny_bundle("text-classification")
    db = tmp_path / "bench.db"
    with trivial_server().start() as server:
        server.wait_ready(timeout=20)
        code, events = bench(
            "run", server.url, "--bundle", str(bundle), "--quick", "--baseline", "vanilla", "--db", str(db)
        )
    assert code == 0
    run_id = check_events(events, 6)
    store = Store(db)
    check_points(store, run_id, {"hare": 2, "vanilla": 2, "model-only": 2})
    assert {e["target"]: e["state"] for e in events if e["event"] == "server"} == {"vanilla": "stopped"}
    ratios = store.ratios(run_id)
    assert [r.key["seq_len"] for r in ratios] == [8, 16] and all(r.req_s_ratio > 0 for r in ratios)
    vanilla = [p for p in store.points(run_id) if p.target == "vanilla"]
    assert all(p.server["compute_p50"] > 0 and p.server_cpu is not None for p in vanilla)

    # The history commands read the same rows.
    capsys.readouterr()
    assert hare(["bench", "export", str(run_id), "--db", str(db), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 7 and lines[0].startswith("run_id,idx,target")
    assert hare(["bench", "export", str(run_id), "--db", str(db), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["points"]) == 6
    for fmt in ("md", "html"):
        out = tmp_path / f"report.{fmt}"
        assert hare(["bench", "report", str(run_id), "--db", str(db), "--format", fmt, "--out", str(out)]) == 0
        text = out.read_text()
        assert "vanilla" in text and ("plot-1.png" in text or "data:image/png;base64" in text)
    assert hare(["bench", "show", str(run_id), "--db", str(db)]) == 0
    assert hare(["bench", "list", "--db", str(db)]) == 0
    assert hare(["bench", "compare", str(run_id), str(run_id), "--db", str(db)]) == 0
    assert hare(["bench", "show", "999", "--db", str(db)]) == 2


def test_rounds_interleave_the_targets_and_store_each_point_once_at_its_median_round(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--rounds 3`: every target's points run three times, every other round backwards (a slow spell falls on
    both), and each point is stored once, as its median round, with every round's figures beside it."""
    db, bundle = tmp_path / "bench.db", str(tiny_bundle("text-classification"))
    short = ("--seq", "8,16", "--concurrency", "1", "--warmup", "0.1", "--duration", "0.3", "--db", str(db))
    with trivial_server().start() as server:
        server.wait_ready(timeout=20)
        code, events = bench("run", server.url, "--bundle", bundle, *short, "--rounds", "3")
    assert code == 0
    run_id = check_events(events, 12)  # 2 lengths x (hare, model-only) x 3 rounds
    measured = [(e["point"]["target"], e["point"]["seq_len"]) for e in events if e["event"] == "point"]
    forward = [("hare", 8), ("hare", 16), ("model-only", 8), ("model-only", 16)]
    backward = forward[2:] + forward[:2]
    assert measured == forward + backward + forward
    store = Store(db)
    points = store.points(run_id)
    assert [(p.idx, p.target, p.seq_len) for p in points] == [(i, *f) for i, f in enumerate(forward, 1)]
    for p in points:
        assert p.ok > 0 and p.req_s == pytest.approx(p.ok / p.duration_s, rel=0.02)
        rounds = p.extra["rounds"]
        assert len(rounds["req_s"]) == len(rounds["lat_p50"]) == len(rounds["lat_p99"]) == 3
        assert p.req_s == sorted(rounds["req_s"])[1] and p.lat_p50 in rounds["lat_p50"]
    assert store.run(run_id).settings["rounds"] == 3
    assert hare(["bench", "run", server.url, "--bundle", bundle, *short, "--rounds", "0"]) == 2
    assert "--rounds must be 1 or more" in capsys.readouterr().err


def test_a_url_nothing_answers_at_fails_the_run_saying_so(tmp_path: Path) -> None:
    db = tmp_path / "bench.db"
    with socket.socket() as s:  # a port just free: nothing listens there
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = hare(["bench", "run", url, "--task", "feature-extraction", "--seq", "comet", "--db", str(db)])
    assert code == 1
    [run] = Store(db).runs()
    assert run.status == "failed"
    assert run.message == f"{url} does not answer (Connection refused): start the server, or check the URL"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("http://localhost", "give the host and a port from 1 to 65535"),
        ("http://127.0.0.1:99999", "give the host and a port from 1 to 65535"),  # "Connection refused" came
        ("https://127.0.0.1:8443", "the bench speaks plain HTTP"),
        ("http://10.0.0.5:8080", "the bench only loads servers on this machine"),
    ],
)
def test_a_url_the_bench_cannot_load_is_refused_before_a_run_is_stored(
    url: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was stored as a failed run, exit 1.
    db = tmp_path / "bench.db"
    assert hare(["bench", "run", url, "--task", "feature-extraction", "--seq", "comet", "--db", str(db)]) == 2
    assert said in capsys.readouterr().err
    assert not db.exists() or Store(db).runs() == []


def test_exact_lengths_against_a_url_without_a_tokenizer_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run was stored, then failed at its first point ("exact-length inputs need the bundle's tokenizer").
    db = tmp_path / "bench.db"
    assert hare(["bench", "run", "http://127.0.0.1:9", "--task", "feature-extraction", "--db", str(db)]) == 2
    assert "exact token lengths (--seq 8,128) need the served model's tokenizer" in capsys.readouterr().err
    assert not db.exists() or Store(db).runs() == []


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("missing", r"is not a Hugging Face model folder \(no config.json\)"),
        ("gpt2", "is a 'gpt2' model, and .+ serves a 'bert' one: the baselines must run the model"),
    ],
)
def test_a_baseline_model_other_than_the_bundles_is_refused_before_a_run(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, said: str
) -> None:
    # The baselines loaded it after hare's points had run: a missing folder failed them minutes into the run,
    # and another model was measured as hare's baseline.
    folder = tmp_path / model
    if model != "missing":
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model}))
    db = tmp_path / "bench.db"
    bundle = str(tiny_bundle("feature-extraction"))
    flags = ["--baseline", "vanilla", "--model", str(folder), "--quick", "--db", str(db)]
    assert hare(["bench", "run", bundle, *flags]) == 2
    assert re.search(said, capsys.readouterr().err)
    assert not db.exists() or Store(db).runs() == []


def test_a_url_that_is_not_hare_fails_the_run_saying_so(tmp_path: Path) -> None:
    # A web server that is not hare was measured: 1,123 errors (501), stored as a run done, exit 0.
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    db = tmp_path / "bench.db"
    server = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code = hare(["bench", "run", url, "--task", "feature-extraction", "--seq", "comet", "--db", str(db)])
    finally:
        server.shutdown()
        server.server_close()
    assert code == 1
    [run] = Store(db).runs()
    assert run.status == "failed" and not Store(db).points(run.id)
    assert run.message == f"{url} does not answer GET /info as a hare server does (status 404): check the URL"


@contextlib.contextmanager
def web_server(handler: Callable[..., BaseRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server on a free loopback port with `handler`, its URL."""
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_web_page_at_info_is_not_taken_for_a_hare_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A folder served by `python -m http.server` with a file named info answered GET /info 200: every request
    # failed (501), and the run was reported done, exit 0.
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "info").write_text("<!DOCTYPE html>\n<html><body>hello</body></html>\n")
    db = tmp_path / "bench.db"
    flags = ["--task", "feature-extraction", "--seq", "comet", "--progress", "none", "--db", str(db)]
    with web_server(partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))) as url:
        code = hare(["bench", "run", url, *flags])
    assert code == 1
    [run] = Store(db).runs()
    assert run.status == "failed" and not Store(db).points(run.id)
    assert run.message == (
        f"{url} does not answer GET /info as a hare server does (status 200 and '<!DOCTYPE html>'..., not its "
        "JSON): check the URL"
    )
    # Said on stderr as every hare command says its error (it was only on stdout, above an empty table).
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == f"hare bench: error: run {run.id} failed: {run.message}"  # after the server's log
    assert "message: " in out and "┏" not in out


class _FailingPredict(BaseHTTPRequestHandler):
    """Answers GET /info as hare does, and POST /predict with 500 (every `failing`-th one; 1: all of them)."""

    failing = 1
    count = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer(200, json.dumps({"task": "feature-extraction", "workers": 1, "threads": 1}).encode())

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).count += 1
        self._answer(500 if type(self).count % type(self).failing == 0 else 200, b"[[0.5]]")


@pytest.mark.parametrize(
    ("served", "said"),
    [
        ({"task": "text-classification"}, "serves text-classification, not feature-extraction as --bundle"),
        ({"task": "feature-extraction", "variant": "int8-mixed"}, "serves the int8-mixed variant, not --bundle"),
    ],
    ids=["another task", "another variant"],
)
def test_a_server_that_serves_another_bundle_than_the_one_named_fails_the_run(
    tiny_bundle: ModelFactory, tmp_path: Path, served: dict[str, str], said: str
) -> None:
    # Stored as a run done, exit 0, under --bundle's task and manifest, beside that bundle's model-only figures.
    bundle = tiny_bundle("feature-extraction")
    info = json.dumps(served).encode()
    handler = type("Other", (_FailingPredict,), {"failing": 10**9, "do_GET": lambda self: self._answer(200, info)})
    db = tmp_path / "bench.db"
    with web_server(handler) as url:
        code = hare(["bench", "run", url, "--bundle", str(bundle), "--quick", "--progress", "none", "--db", str(db)])
    [run] = Store(db).runs()
    assert code == 1 and run.status == "failed" and said in run.message and not Store(db).points(run.id)


@pytest.mark.parametrize("failing", [1, 3])
def test_a_run_whose_every_request_failed_fails(
    failing: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A server answering /info as hare does and failing every /predict (another task's, a broken model) was a
    # run done, exit 0. One failing some of them is measured as before: done, its errors counted.
    handler = type("Failing", (_FailingPredict,), {"failing": failing})
    db = tmp_path / "bench.db"
    flags = ["--seq", "comet", "--concurrency", "1", "--warmup", "0", "--duration", "0.5", "--progress", "none"]
    with web_server(handler) as url:
        code = hare(["bench", "run", url, "--task", "feature-extraction", *flags, "--db", str(db)])
    [run] = Store(db).runs()
    [point] = Store(db).points(run.id)
    err = capsys.readouterr().err
    if failing == 3:
        assert (code, run.status, run.message, err) == (0, "done", "", "")
        assert point.ok > 0 and point.errors["500"] > 0
        return
    assert code == 1 and run.status == "failed" and point.ok == 0
    assert run.message == (
        f"hare: every request failed ({point.errors['500']:,} answered 500): check that it serves "
        "feature-extraction at POST /predict, and its log"
    )
    assert err == f"hare bench: error: run {run.id} failed: {run.message}\n"


def bench_with_secrets(
    handler: type[BaseHTTPRequestHandler],
    secrets: dict[str, str | None],
    flags: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, int, Any, list[Any]]:
    """`hare bench run` against a server of `handler` with the variables `secrets` set (None: unset): the
    server's URL, the exit code, the stored run and its points."""
    for name, value in secrets.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    db = tmp_path / "bench.db"
    common = ["--warmup", "0", "--duration", "0.3", "--progress", "none", "--db", str(db)]
    with web_server(handler) as url:
        code = hare(["bench", "run", url, "--task", "feature-extraction", "--seq", "comet", *flags, *common])
    [run] = Store(db).runs()
    return url, code, run, Store(db).points(run.id)


class _AdminToken(_FailingPredict):
    """A hare with HARE_ADMIN_TOKEN: GET /info and /metrics need the bearer token, POST /predict does not."""

    failing = 10**9
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).seen.append(f"{self.path} {self.headers.get('authorization')}")
        if self.headers.get("authorization") != "Bearer s3cret":
            self._answer(401, b'{"error": "missing or wrong API token", "type": "unauthorized"}')
        elif self.path == "/metrics":
            self._answer(200, b"hare_loop_cpu_seconds_total 0.5\n")
        else:
            super().do_GET()


@pytest.mark.parametrize("token", [None, "wrong", "s3cret"])
def test_a_server_with_an_admin_token_is_measured_with_hare_bench_token(
    token: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench sent no token: "does not answer GET /info as a hare server does (status 401): check the URL".
    handler: type[_AdminToken] = type("Admin", (_AdminToken,), {"seen": []})
    secrets = {"HARE_ADMIN_TOKEN": None, "HARE_BENCH_TOKEN": token}
    url, code, run, points = bench_with_secrets(handler, secrets, ["--concurrency", "1"], tmp_path, monkeypatch)
    if token == "s3cret":
        assert (code, run.status) == (0, "done") and points[0].ok > 0
        assert set(handler.seen) >= {"/info Bearer s3cret", "/metrics Bearer s3cret"}
        return
    assert code == 1 and run.status == "failed" and not points
    assert (
        run.message
        == {
            None: f"{url} needs its admin token for GET /info (status 401): set HARE_BENCH_TOKEN (or HARE_ADMIN_TOKEN) "
            "to the server's HARE_ADMIN_TOKEN before `hare bench run`",
            "wrong": f"{url} refuses the admin token the bench sent to GET /info (status 401): set HARE_BENCH_TOKEN to "
            "its HARE_ADMIN_TOKEN",
        }[token]
    )


class _ApiKey(_FailingPredict):
    """A hare with HARE_API_KEY: POST /predict needs the bearer token, GET /info does not."""

    failing = 10**9
    seen: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        type(self).seen.append(self.headers.get("authorization"))
        if self.headers.get("authorization") != "Bearer k3y":
            self.rfile.read(int(self.headers["content-length"]))
            self._answer(401, b'{"error": "/predict needs the header Authorization: Bearer <HARE_API_KEY>"}')
        else:
            super().do_POST()


@pytest.mark.parametrize("key", [None, "wrong", "k3y"])
def test_a_server_with_an_api_key_is_measured_with_hare_api_key(
    key: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The bench sent no key: every point thousands of 401s, and at the end "check that it serves
    # feature-extraction at POST /predict" (the console's bench of such a server, the same).
    handler: type[_ApiKey] = type("Key", (_ApiKey,), {"seen": []})
    _, code, run, points = bench_with_secrets(handler, {"HARE_API_KEY": key}, ["--batch", "1,2"], tmp_path, monkeypatch)
    if key == "k3y":
        assert (code, run.status) == (0, "done") and [p.ok > 0 for p in points] == [True, True]
        assert set(handler.seen) == {"Bearer k3y"}
        return
    [point] = points  # the second point is not measured: it would be refused as well
    assert code == 1 and run.status == "failed" and point.ok == 0
    refused = "it refuses the HARE_API_KEY the bench sent" if key else "it has an API key"
    assert run.message == (
        f"hare: every request failed ({point.errors['401']:,} answered 401): {refused}; set HARE_API_KEY to its "
        "API key: the bench sends it as the bearer token on POST /predict"
    )


class _Dying(_FailingPredict):
    """Answers as hare does until it has answered `lives` requests, then closes every connection unanswered."""

    lives = 20

    def handle(self) -> None:
        if type(self).count < type(self).lives:
            super().handle()


def test_a_server_that_dies_mid_run_fails_it_at_the_point_it_stopped(tmp_path: Path) -> None:
    # Stored as "done: 3 of 3 points measured", its last points 0 answers and thousands of connect errors,
    # charted as 0 req/s.
    handler = type("Dying", (_Dying,), {"failing": 10**9})
    db = tmp_path / "bench.db"
    flags = ["--seq", "comet", "--concurrency", "1,2,3", "--warmup", "0", "--duration", "0.5", "--progress", "none"]
    with web_server(handler) as url:
        code = hare(["bench", "run", url, "--task", "feature-extraction", *flags, "--db", str(db)])
    [run] = Store(db).runs()
    points = Store(db).points(run.id)
    assert code == 1 and run.status == "failed"
    assert [p.ok > 0 for p in points] == [True, False]  # the third point was not measured
    assert run.message == (
        f"hare stopped answering at point 2: 0 answers, {points[1].errors['connect']:,} could not connect; its "
        "later points were not measured"
    )


def test_a_run_outlives_the_console_that_followed_it(tmp_path: Path) -> None:
    # A console restarted mid-run closed the bench's stdout: the run failed with "BrokenPipeError: [Errno 32]
    # Broken pipe" at its next progress line.
    handler = type("Fine", (_FailingPredict,), {"failing": 10**9})
    db = tmp_path / "bench.db"
    flags = ["--seq", "comet", "--concurrency", "1,2", "--warmup", "0", "--duration", "0.5", "--progress", "jsonl"]
    with web_server(handler) as url:
        bench = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hare.cli",
                "bench",
                "run",
                url,
                "--task",
                "feature-extraction",
                *flags,
                "--db",
                str(db),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert bench.stdout is not None and b'"start"' in bench.stdout.readline()
        bench.stdout.close()  # the console goes
        _, err = bench.communicate(timeout=60)
    [run] = Store(db).runs()
    assert (bench.returncode, run.status, run.message) == (0, "done", ""), err.decode()
    assert len(Store(db).points(run.id)) == 2 and b"BrokenPipe" not in err


@pytest.mark.parametrize(
    "flags",
    [
        ["run", "{url}", "--load", "open", "--rate", "1e12"],  # grew the bench to 23 GB, deaf to SIGTERM
        ["run", "{url}", "--duration", "nan"],  # never ended
        ["run", "{url}", "--duration", "0"],  # a run "done" at 0.0 req/s
        ["run", "{url}", "--warmup", "-5"],
        ["run", "{url}", "--timeout", "-1"],  # every request timed out, the run "done"
        ["run", "{url}", "--max-requests", "0"],
        ["run", "{url}", "--comet-workers", "-1"],
        ["ceiling", "--duration", "-1"],  # ZeroDivisionError
        ["list", "--limit", "0"],  # listed every run
        ["bulk", "{url}", "--streams", "-1"],  # a traceback from the job it started
        ["peers", "--seconds", "-1"],
    ],
)
def test_a_number_no_measurement_can_use_is_a_usage_error(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        hare(["bench", *[f.format(url="http://127.0.0.1:9") for f in flags], "--db", str(tmp_path / "b.db")])
    assert exit_.value.code == 2 and "expected" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_quick_starts_hare_serve_itself(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    db = tmp_path / "bench.db"
    code, events = bench("run", str(tiny_bundle("text-classification")), "--quick", "--db", str(db))
    assert code == 0
    run_id = check_events(events, 4)
    assert [e["state"] for e in events if e["event"] == "server"] == ["starting", "ready", "stopped"]
    store = Store(db)
    check_points(store, run_id, {"hare": 2, "model-only": 2})
    hare_points = [p for p in store.points(run_id) if p.target == "hare"]
    assert all(p.workers >= 1 and p.extra["streams"] >= 1 and p.server_cpu is not None for p in hare_points)
    # The cores the event loops spent on their own work over each window (the server's /metrics, the model
    # calls left out): some, and less than all the server used.
    for p in hare_points:
        assert p.server_cpu is not None and 0 < p.extra["own_cores"] < p.server_cpu, (p.extra, p.server_cpu)


def test_a_mix_of_lengths_is_measured_and_stored_under_its_name(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """`--seq mix`: texts of 3-140 words, most short, for the server and the model alone; each point stores the
    mix's name and its mean length, its tokens a second counted from it."""
    db = tmp_path / "bench.db"
    code, events = bench("run", str(tiny_bundle("feature-extraction")), "--seq", "mix", "--concurrency", "1",
                         "--warmup", "0.2", "--duration", "1", "--db", str(db))  # fmt: skip
    assert code == 0
    run_id = check_events(events, 2)
    points = Store(db).points(run_id)
    assert sorted(p.target for p in points) == ["hare", "model-only"]
    for p in points:
        assert p.extra["inputs"] == "mix" and p.ok > 0
        assert 20 < p.seq_len < 60  # the mean of texts of 26 words on average, with their special tokens
        assert p.tokens_s == pytest.approx(p.seq_s * p.seq_len, rel=0.05)
        assert dict(zip(POINT_COLUMNS, point_row(p), strict=True))["seq"] == f"mix ~{p.seq_len}"


def test_sigterm_cancels_the_run_and_stops_the_server(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """What the console does to a run it no longer wants: SIGTERM, then it reads the last line."""
    db = tmp_path / "bench.db"
    cmd = [sys.executable, "-m", "hare.cli", "bench", "run", str(tiny_bundle("text-classification")),
           "--seq", "8", "--concurrency", "1", "--warmup", "0.2", "--duration", "60", "--no-model-only",
           "--db", str(db), "--progress", "jsonl"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    events = []
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["event"] == "tick" or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=30)
    events += [json.loads(line) for line in rest.splitlines()]
    assert proc.returncode == 130
    assert events[-1]["event"] == "done" and events[-1]["status"] == "cancelled"
    url = next(e["url"] for e in events if e["event"] == "server")
    assert [e["state"] for e in events if e["event"] == "server"][-1] == "stopped"
    assert not wait_ready_once(url), "the server the bench started must be gone"
    run = Store(db).run(events[-1]["run_id"])
    assert run.status == "cancelled" and run.finished_at


def test_a_bench_killed_outright_takes_its_server_with_it(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    # SIGKILL (or the OOM killer) left the server it started running, holding its port and cores.
    cmd = [sys.executable, "-m", "hare.cli", "bench", "run", str(tiny_bundle("text-classification")),
           "--seq", "8", "--concurrency", "1", "--warmup", "0.2", "--duration", "60", "--no-model-only",
           "--db", str(tmp_path / "bench.db"), "--progress", "jsonl"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    url = ""
    for line in proc.stdout:
        event = json.loads(line)
        url = event.get("url", url)
        if event["event"] == "tick":
            break
    assert wait_ready_once(url)
    [server] = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    proc.kill()
    proc.wait(timeout=30)
    proc.stdout.close()
    deadline = time.monotonic() + 60
    try:
        while wait_ready_once(url) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not wait_ready_once(url), "the server the bench started must be gone"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(server), signal.SIGKILL)  # when it failed: no orphan outlives the test


def test_an_unknown_task_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A KeyError traceback, and a failed run stored with "KeyError: 'nonsense'".
    with pytest.raises(SystemExit) as exit_:
        hare(["bench", "run", "http://127.0.0.1:9", "--task", "nonsense", "--db", str(tmp_path / "b.db")])
    assert exit_.value.code == 2 and "invalid choice: 'nonsense'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
