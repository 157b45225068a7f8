"""The shared engine (api/process/engine.py) and its worker side (api/engine/remote.py): calls from several
threads merged into batches within the budget, each answered with exactly the rows a worker's own session
gives; an engine that goes away answers with an error, never a hang; a real `hare serve` with HARE_ENGINE=shared
answers over HTTP as one without, and leaves no engine behind when it stops."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from tokenizers import Tokenizer

from api.engine.backend import Backend
from api.engine.remote import FRAME, RemoteBackend, receive
from api.process.engine import Call, Engine, listen, merge, take
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_manifest
from container.runtime import InferenceFailed, OnnxModel
from tasks.ops import POOLINGS, pool_tokens
from tests.conftest import ModelFactory
from tests.live_server import alive, group, hare_serve

TEXTS = ["one", "a second, longer text than the first", "three words here", "and a fourth one, the longest of them all"]


def call(n: int, length: int, fill: int) -> Call:
    ids = np.full((n, length), fill, dtype=np.int64)
    return Call({"input_ids": ids, "attention_mask": np.ones_like(ids)})


def test_pending_calls_merge_within_the_budget_padded_to_the_longest() -> None:
    pending: queue.Queue[Call] = queue.Queue()
    for c in (call(2, 5, 2), call(1, 8, 3), call(4, 8, 4)):
        pending.put(c)
    first = call(1, 3, 1)
    batch, lead = take(pending, first, max_size=8, max_tokens=40)
    assert [c.shape for c in batch] == [(1, 3), (2, 5), (1, 8)]  # 8 x 8 = 64 tokens would pass 40
    assert lead is not None and lead.shape == (4, 8)  # leads the next batch, not lost
    merged = merge(batch, pad_id=0)
    assert merged["input_ids"].shape == (4, 8)
    assert merged["input_ids"][0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert merged["attention_mask"][1].tolist() == [1] * 5 + [0] * 3  # padding masked out
    # A call above the budget on its own still runs, alone.
    assert take(pending, call(16, 16, 5), max_size=8, max_tokens=40)[0][0].shape == (16, 16)


def test_a_merged_batch_is_padded_to_the_runtimes_length_multiple(
    fp32_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine pads a batch as a worker's own Backend does: to the runtime's length multiple (OpenVINO's 8,
    where each new shape is kernels to compile and keep), never past the bundle's maximum, and each call gets
    the rows it gets alone."""
    monkeypatch.setattr(OnnxModel, "length_multiple", 8)
    bundle = fp32_bundle("feature-extraction")
    manifest = read_manifest(bundle)
    backend = Backend(bundle / MODEL_FILE, "cpu", (1,), manifest.output, max_length=manifest.max_length)
    lengths: list[int] = []
    run_padded = backend.run_padded

    def recorded(feeds: dict[str, np.ndarray], width: int = 1, pooling: str | None = None) -> np.ndarray:
        lengths.append(feeds["input_ids"].shape[1])
        return run_padded(feeds, width, pooling)

    monkeypatch.setattr(backend, "run_padded", recorded)
    engine = Engine(backend, manifest.pad_id, max_size=32, max_tokens=4096, registry=CollectorRegistry())
    shapes = [(1, 3), (2, 5), (1, manifest.max_length - 1)]
    calls = [call(n, length, 5 + i) for i, (n, length) in enumerate(shapes)]
    for c in calls:  # the graph's other inputs (BERT's token types)
        c.feeds = {name: c.feeds.get(name, np.zeros_like(c.feeds["input_ids"])) for name in backend.input_names}
    alone = [run_padded(c.feeds) for c in calls]
    engine.run(calls[:2])
    engine.run(calls[2:])
    assert lengths == [8, manifest.max_length]  # 5 rounded up to 8; max_length - 1 only up to the maximum
    for c, want in zip(calls, alone, strict=True):
        assert c.error is None and c.rows is not None
        np.testing.assert_allclose(c.rows, want, atol=1e-5)  # the padding masked, trimmed off the call's rows


@pytest.fixture
def engine(fp32_bundle: ModelFactory, tmp_path: Path) -> Iterator[tuple[Path, Engine, Path]]:
    """An engine on a tiny fp32 bundle's CPU session (int8's batch-wide scales would make merged batches
    differ a little), listening on a socket in tmp_path as the process does."""
    bundle = fp32_bundle("feature-extraction")
    manifest = read_manifest(bundle)
    backend = Backend(
        bundle / MODEL_FILE, "cpu", (1,), manifest.output, pad_id=manifest.pad_id, max_length=manifest.max_length
    )
    engine = Engine(backend, manifest.pad_id, max_size=32, max_tokens=4096, registry=CollectorRegistry())
    socket = tmp_path / "engine.sock"
    listener = listen(socket)
    threading.Thread(target=engine.run_forever, daemon=True).start()
    threading.Thread(target=engine.serve_forever, args=(listener,), daemon=True).start()
    yield socket, engine, bundle
    listener.close()


def test_calls_from_many_threads_get_the_rows_their_own_session_gives(engine: tuple[Path, Engine, Path]) -> None:
    socket, served, bundle = engine
    backend = served.backend
    manifest = read_manifest(bundle)
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    unknown: list[int] = []
    remote = RemoteBackend(socket, manifest.pad_id, tokenizer.token_to_id("[UNK]"), unknown.append)
    assert remote.providers == backend.providers and remote.input_names == backend.input_names
    batches = [tokenizer.encode_batch(TEXTS[i % 4 :] + ["\u2603"] * (i % 2)) for i in range(24)]

    def both(batch: list) -> tuple[list, list]:  # type: ignore[type-arg]
        return remote.run(batch), backend.run(batch)

    with ThreadPoolExecutor(8) as pool:
        for got, want in pool.map(both, batches):
            assert [g.shape for g in got] == [w.shape for w in want]  # token rows trimmed to each sequence
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, atol=1e-5)  # merged with other calls, padded further
    assert sum(unknown) == 12  # the snowman, counted on the worker's side, once per call that carried it


def test_a_pooled_call_gets_the_vectors_the_worker_would_pool_from_its_rows(engine: tuple[Path, Engine, Path]) -> None:
    """With a pooling the engine sends one vector per sequence in place of its token states; every pooling,
    calls of different poolings (and none) merged into one batch, each answered as asked."""
    socket, served, bundle = engine
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    remote = RemoteBackend(socket)
    batch = tokenizer.encode_batch(TEXTS)
    states = served.backend.run(batch)
    asked = [*POOLINGS, None] * 3

    def run(pool: str | None) -> list[np.ndarray]:  # type: ignore[type-arg]
        return remote.run(batch, pooling=pool)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(run, asked))
    for mode, rows in zip(asked, answers, strict=True):
        for row, own in zip(rows, states, strict=True):
            want = own if mode is None else pool_tokens(own, mode)
            assert row.shape == want.shape, mode  # [dim] pooled, [tokens, dim] otherwise
            np.testing.assert_allclose(row, want, atol=1e-5, err_msg=str(mode))


def counted_runs(served: Engine) -> list[int]:
    """The sequences of each model call the engine makes from now on, in order."""
    batches: list[int] = []
    run_padded = served.backend.run_padded

    def counted(feeds: dict[str, np.ndarray], width: int = 1, pooling: str | None = None) -> np.ndarray:  # type: ignore[type-arg]
        batches.append(len(feeds["input_ids"]))
        return run_padded(feeds, width, pooling)

    served.backend.run_padded = counted  # type: ignore[method-assign]
    return batches


def test_calls_queued_behind_a_busy_model_run_as_one_batch(engine: tuple[Path, Engine, Path]) -> None:
    socket, served, bundle = engine
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    remote = RemoteBackend(socket)
    alone = {t: served.backend.run(tokenizer.encode_batch([t]))[0] for t in TEXTS}
    batches = counted_runs(served)
    queued: list[Call] = []
    put = served.pending.put

    def counted_put(call: Call, block: bool = True, timeout: float | None = None) -> None:
        queued.append(call)
        put(call, block, timeout)

    served.pending.put = counted_put  # type: ignore[method-assign,assignment]
    with ThreadPoolExecutor(4) as pool:
        with served.busy:  # the model is busy: the calls queue
            answers = [pool.submit(remote.run, tokenizer.encode_batch([t])) for t in TEXTS]
            # Every call queued, whether the GPU thread already holds the first or not: released before the
            # last arrived, the model would run the ones queued so far (a loaded machine did: [3, 1]).
            deadline = time.monotonic() + 10
            while len(queued) < len(TEXTS) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(queued) == len(TEXTS)
        rows = [a.result(timeout=30)[0] for a in answers]
    assert batches == [4]  # one model call for the four
    for text, row in zip(TEXTS, rows, strict=True):
        np.testing.assert_allclose(row, alone[text], atol=1e-5)


class SlowToWake:
    """The engine's model lock, whose blocking acquire (the GPU thread's) takes `delay` seconds to start, as a
    thread woken by a release can take on a busy machine; a non-blocking one (a connection's) is the lock's own."""

    def __init__(self, lock: threading.Lock, delay: float) -> None:
        self.lock, self.delay = lock, delay

    def acquire(self, blocking: bool = True) -> bool:
        if blocking:
            time.sleep(self.delay)
        return self.lock.acquire(blocking)

    def release(self) -> None:
        self.lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_call_the_gpu_thread_holds_is_not_overtaken_by_a_later_one(engine: tuple[Path, Engine, Path]) -> None:
    """A call that arrives while the GPU thread waits for the model with the call it took joins that call's
    batch: run alone at once on its connection (the model free, nothing pending), it overtook the call taken
    before it, again and again under load."""
    socket, served, bundle = engine
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    remote = RemoteBackend(socket)
    batches = counted_runs(served)
    queued = threading.Event()
    put = served.pending.put

    def noted_put(call: Call, block: bool = True, timeout: float | None = None) -> None:
        put(call, block, timeout)
        queued.set()

    served.pending.put = noted_put  # type: ignore[method-assign,assignment]
    model = served.busy
    served.busy = SlowToWake(model, delay=1.0)  # type: ignore[assignment]
    with ThreadPoolExecutor(2) as pool:
        with model:  # another connection's lone call runs
            first = pool.submit(remote.run, tokenizer.encode_batch([TEXTS[0]]))
            assert queued.wait(10)
            deadline = time.monotonic() + 10
            while not served.pending.empty():  # taken by the GPU thread, which waits for the model with it
                assert time.monotonic() < deadline
                time.sleep(0.01)
            time.sleep(0.1)
        second = pool.submit(remote.run, tokenizer.encode_batch([TEXTS[1]]))  # the model free, nothing pending
        first.result(timeout=30), second.result(timeout=30)
    assert batches == [2]  # one run for both, not the second alone before the first


def test_a_gone_engine_is_an_error_not_a_hang(engine: tuple[Path, Engine, Path], tmp_path: Path) -> None:
    socket, _, bundle = engine
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    remote = RemoteBackend(socket)
    batch = tokenizer.encode_batch(TEXTS)
    remote.run(batch)
    remote._local.line.sock.close()  # the connection breaks (the engine died, say)
    with pytest.raises(InferenceFailed, match="engine is gone"):
        remote.run(batch)


def test_a_worker_that_breaks_off_costs_the_engine_only_its_connection(engine: tuple[Path, Engine, Path]) -> None:
    """A worker that dies mid-call, or writes what is not a call, loses its own connection and nothing else: the
    engine answers the others (a server stops when its engine dies)."""
    socket_path, served, bundle = engine
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    batch = tokenizer.encode_batch(TEXTS)
    want = served.backend.run(batch)
    for broken in (
        FRAME.pack(2, 0) + b"{}",  # a header without the call's inputs
        FRAME.pack(5, 0) + b"{nope",  # not JSON
        FRAME.pack(40, 10) + b'{"inputs": ["input_ids"], "ar',  # cut off mid-frame: the worker died
    ):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(socket_path))
            receive(sock)  # the greeting
            sock.sendall(broken)
            if b'"ar' not in broken:  # the engine drops the connection: nothing comes back
                sock.settimeout(10)
                assert sock.recv(1) == b""
        got = RemoteBackend(socket_path).run(batch)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)


def test_an_engine_restarted_on_the_same_path_listens_over_what_the_last_one_left(tmp_path: Path) -> None:
    """An engine that died leaves its socket file: the next one on that path listens there all the same; while
    one lives there, another is refused rather than taking its path."""
    path = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(path))
    with listen(path) as listener, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(path))
        listener.accept()[0].close()
        with pytest.raises(RuntimeError, match="another engine already listens"):
            listen(path)
        assert path.is_socket()


def test_the_accept_loop_ends_with_its_listener_and_fails_loudly_on_any_other_error(
    engine: tuple[Path, Engine, Path], tmp_path: Path
) -> None:
    """A closed listener is the engine's way out of its accept loop; any other accept error stops the engine
    with that error (its workers then say it is gone) rather than ending it as if asked to."""
    served = engine[1]
    listener = listen(tmp_path / "second.sock")
    listener.close()
    served.serve_forever(listener)  # returns
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as not_listening, pytest.raises(OSError):
        served.serve_forever(not_listening)


def test_a_shared_engine_server_answers_as_one_without(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    bundle = fp32_bundle("feature-extraction")
    answers = []
    asked: dict[str, list[list[np.ndarray]]] = {"per-worker": [], "shared": []}  # type: ignore[type-arg]
    for engine in ("per-worker", "shared"):
        log, env = tmp_path / f"{engine}.log", {"HARE_ENGINE": engine}
        with hare_serve(bundle, log, 2, env) as (url, process), httpx.Client(base_url=url) as client:
            answer = client.post("/predict", json={"inputs": TEXTS})
            assert answer.status_code == 200, answer.text
            answers.append(np.array(answer.json()))
            # The engine pools the default request's rows; token states and other poolings come as asked.
            for parameters in ({"output_value": "token_embeddings"}, {"pooling": "max"}, {"pooling": "cls"}):
                other = client.post("/predict", json={"inputs": TEXTS, "parameters": parameters})
                assert other.status_code == 200, other.text
                asked[engine].append([np.array(v) for v in other.json()])
            # Several clients at once: each gets its own text's vector back.
            with ThreadPoolExecutor(6) as pool:
                rows = list(pool.map(lambda t: client.post("/predict", json={"inputs": [t]}).json()[0], TEXTS * 3))
            for i, row in enumerate(rows):
                np.testing.assert_allclose(row, answers[-1][i % 4], atol=1e-4)
            metrics = client.get("/metrics").text
            # The engine's batches reach any worker's /metrics (the shared metrics folder): 13 calls at least.
            engine_calls = re.search(r"^hare_engine_batch_calls_sum (\S+)$", metrics, re.MULTILINE)
            assert (engine_calls is not None) == (engine == "shared"), metrics[-2000:]
            assert engine_calls is None or float(engine_calls.group(1)) >= 13
        assert process.returncode is not None
    np.testing.assert_allclose(answers[0], answers[1], atol=1e-4)
    for mine, theirs in zip(asked["per-worker"], asked["shared"], strict=True):
        assert [m.shape for m in mine] == [t.shape for t in theirs]
        for m, t in zip(mine, theirs, strict=True):
            np.testing.assert_allclose(m, t, atol=1e-4)
    assert "[ENGINE]" not in (tmp_path / "per-worker.log").read_text()
    assert "providers CPUExecutionProvider (the shared engine's)" in (tmp_path / "shared.log").read_text()
    started = re.search(r"\[(\d+)\] \[ENGINE\] engine ready", (tmp_path / "shared.log").read_text())
    assert started, "the shared server started no engine"
    with pytest.raises(ProcessLookupError):  # stopped with the server
        os.kill(int(started.group(1)), 0)


def test_a_server_whose_engine_dies_stops_saying_why(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    """Every call would fail from then on: the server stops, so that its supervisor restarts the whole."""
    log = tmp_path / "serve.log"
    with hare_serve(fp32_bundle("feature-extraction"), log, 2, {"HARE_ENGINE": "shared"}) as (url, process):
        assert httpx.post(f"{url}/predict", json={"inputs": TEXTS[:1]}).status_code == 200
        deadline = time.monotonic() + 30
        while log.read_text().count("ready: feature-extraction") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # both workers up
        started = re.search(r"\[(\d+)\] \[ENGINE\] engine ready", log.read_text())
        assert started
        os.kill(int(started.group(1)), signal.SIGKILL)
        assert process.wait(timeout=60) == 1  # the workers drain; the status says it failed
    assert f"the shared engine (pid {started.group(1)}) is gone: stopping the server" in log.read_text()


@pytest.mark.serial  # seconds of work, timed against the drain: alone, after the rest
@pytest.mark.parametrize("everyone", [False, True], ids=["the master (Docker, Kubernetes)", "every process (systemd)"])
def test_sigterm_drains_what_the_engine_is_running_then_stops_it(
    fp32_bundle: ModelFactory, tmp_path: Path, everyone: bool
) -> None:
    """The GPU profile's shutdown: requests in flight through the engine when the server is told to stop are
    all answered, then the workers and the engine exit, whether the signal reached the master alone or every
    process of the server at once (systemd's default; a terminal's Ctrl-C is the same with SIGINT)."""
    log = tmp_path / "serve.log"
    big = {"inputs": ["word " * 100] * 1500}  # many of the engine's batches each
    env = {"HARE_ENGINE": "shared", "HARE_MAX_QUEUE_MS": "0"}  # no time bound at admission: all of it is answered
    with hare_serve(fp32_bundle("feature-extraction"), log, 2, env, own_group=True) as (url, process):
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(httpx.post, f"{url}/predict", json=big, timeout=120) for _ in range(4)]
            deadline = time.monotonic() + 30
            while not re.search(r"^hare_queue_depth(?:{[^}]*})? [1-9]", httpx.get(f"{url}/metrics").text, re.M):
                assert time.monotonic() < deadline, "no request reached the model"
                time.sleep(0.02)
            (os.killpg if everyone else os.kill)(process.pid, signal.SIGTERM)
            in_flight = sum(not f.done() for f in futures)
            answers = [f.result() for f in futures]
        assert in_flight > 0
        assert [a.status_code for a in answers] == [200] * 4, [a.text[:200] for a in answers]
        assert all(len(a.json()) == 1500 for a in answers)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
    started = re.search(r"\[(\d+)\] \[ENGINE\] engine ready", log.read_text())
    assert started, "the server started no engine"
    with pytest.raises(ProcessLookupError):  # stopped after the workers
        os.kill(int(started.group(1)), 0)


def test_an_engine_ends_once_its_server_is_gone(fp32_bundle: ModelFactory, tmp_path: Path) -> None:
    """A master killed outright (kill -9) runs no stop hook: its workers stop on their own (api/process/worker.py)
    and the engine after them, rather than holding the GPU for good."""
    log = tmp_path / "serve.log"
    with hare_serve(fp32_bundle("feature-extraction"), log, 2, {"HARE_ENGINE": "shared"}, own_group=True) as (
        url,
        process,
    ):
        assert httpx.post(f"{url}/predict", json={"inputs": TEXTS[:1]}).status_code == 200
        assert re.search(r"\[(\d+)\] \[ENGINE\] engine ready", log.read_text())
        rest = group(process.pid) - {process.pid}  # the engine and the workers
        assert len(rest) == 3
        process.kill()
        process.wait()
    deadline = time.monotonic() + 30
    while left := [pid for pid in rest if alive(pid)]:
        assert time.monotonic() < deadline, f"{len(left)} of the server's processes outlived its master"
        time.sleep(0.05)
    assert log.read_text().count("is gone: this worker stops") == 2
