"""The process model for real: `hare serve` (gunicorn, 2 uvicorn workers) on loopback. Concurrent clients
each get their own answer, batching shows in the merged /metrics, SIGTERM drains in-flight requests and
exits cleanly. Also: serving never imports torch or transformers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import http.client
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
import uvloop
from starlette.applications import Starlette

from api.config import Settings
from api.process.worker import MAX_HEAD_BYTES, PacedServer
from api.web.app import create_app
from api.web.metrics import FLUSH_SECONDS
from container.bundle import TOKENIZER_FILE
from container.machine import usable_cpus
from container.optimize.textset import SENTENCES
from tests.conftest import ModelFactory
from tests.live_server import ROOT, alive, group, hare_serve, wait_ready

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = pytest.mark.serial


def metric(text: str, name: str) -> float:
    """Sum of a metric's samples in exposition text (labels ignored)."""
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def server(
    tiny_bundle: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    # HARE_MAX_WAIT_MS generous, so concurrent requests visibly share batches on a busy machine. No time bound
    # at admission (HARE_MAX_QUEUE_MS 0): these tests send seconds of work at once and check that every request
    # is answered, which the default bound (1 s of expected wait) would refuse on a slow or loaded machine.
    env = {"HARE_MAX_WAIT_MS": "5", "HARE_MAX_QUEUE_MS": "0"}
    with hare_serve(tiny_bundle("feature-extraction"), log, workers=2, env=env) as (url, process):
        yield url, process, log


def test_curl_predict(server: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    url, _, _ = server
    # curl -d sends application/x-www-form-urlencoded: the body is JSON all the same.
    done = subprocess.run(
        ["curl", "-s", "-i", "-X", "POST", f"{url}/predict", "-d", '{"inputs":"I like you. I love you"}'],
        capture_output=True,
        timeout=30,
    )
    head, _, body = done.stdout.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 200"), done.stdout
    assert re.search(r"^x-compute-time: \d+\.\d{6}\r$", head, re.M | re.I), head
    assert len(json.loads(body)) == 32


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /predict HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n",  # a broken chunk
        b"POST /predict HTTP/1.1\r\nHost: h\r\nContent-Length: many\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS hello sent to plain HTTP
    ],
    ids=["chunk", "length", "tls"],
)
def test_a_request_the_parser_cannot_read_gets_the_json_error_shape(
    server: tuple[str, subprocess.Popen[bytes], Path], request_bytes: bytes
) -> None:
    # uvicorn answered "Invalid HTTP request received." as text/plain, where every other error is JSON.
    url, _, _ = server
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(request_bytes)
        response = http.client.HTTPResponse(conn)
        response.begin()
        body = json.loads(response.read())
    assert response.status == 400 and response.getheader("content-type") == "application/json"
    assert response.getheader("connection") == "close"
    assert body["type"] == "InputError" and "not HTTP/1.1 this server can read" in body["error"]
    assert httpx.post(f"{url}/predict", json={"inputs": "still here"}).status_code == 200


@pytest.mark.parametrize("broken", ["unreadable", "head too large", "broken body"])
def test_pipelined_requests_are_answered_before_the_refusal_of_the_one_after_them(
    server: tuple[str, subprocess.Popen[bytes], Path], broken: str
) -> None:
    # Requests read whole before one the parser cannot read are answered first, in order, and then it: uvicorn
    # closed the connection at once, and the answers owed to the requests before were lost.
    url, _, _ = server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"inputs": ["word " * 50] * 8}).encode()  # long enough to be under way when the rest comes
    good = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    after = {
        "unreadable": b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n",
        "head too large": b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1024) + b"\r\n\r\n",
        "broken body": b"POST /predict HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nxx\r\n",
    }[broken]
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(good + good + after)
        answers = b""
        while data := conn.recv(1 << 16):  # until the server closes
            answers += data
    statuses = re.findall(rb"HTTP/1.1 (\d+) ", answers)
    assert statuses == [b"200", b"200", b"431" if broken == "head too large" else b"400"], answers[-400:]
    last = answers[answers.rindex(b"HTTP/1.1 4") :]
    assert b"\r\nconnection: close\r\n" in last.lower() and b'"error":' in last
    assert httpx.post(f"{url}/predict", json={"inputs": "still here"}).status_code == 200


@pytest.mark.parametrize("piece", [None, 1024], ids=["at once", "trickled"])
def test_a_head_over_its_bound_gets_a_431_and_bodies_and_heads_within_it_are_served(
    server: tuple[str, subprocess.Popen[bytes], Path], piece: int | None
) -> None:
    # httptools bounds no head and copies a header it reads in pieces whole at each piece: a header trickled
    # in at 3 MB/s held a worker's other clients, and 40 connections of 8 MB headers took 320 MB.
    url, _, _ = server
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"inputs": "a text"}).encode()
    head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    big = (head + "X-Big: " + "a" * (MAX_HEAD_BYTES + (8 << 10)) + "\r\n\r\n").encode() + body
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        with contextlib.suppress(OSError):  # the server may answer and close before the rest is sent
            for at in range(0, len(big), piece or len(big)):
                conn.sendall(big[at : at + (piece or len(big))])
        response = http.client.HTTPResponse(conn)
        response.begin()
        answer = json.loads(response.read())
    assert response.status == 431 and response.getheader("connection") == "close"
    assert answer["type"] == "HeadTooLarge" and "send long values in the body" in answer["error"]
    # Within the bound: a large head, and on one connection two requests whose large bodies come in one write
    # with the next head (the bytes of a read that ends a body are not a head's).
    fits = {"x-fits": "a" * (MAX_HEAD_BYTES - 4096)}
    assert httpx.post(f"{url}/predict", json={"inputs": "a text"}, headers=fits).status_code == 200
    long = json.dumps({"inputs": ["word " * 100] * 100}).encode()  # 50 kB
    one = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {len(long)}\r\n\r\n".encode() + long
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(one + one)
        for _ in range(2):
            response = http.client.HTTPResponse(conn)
            response.begin()
            assert response.status == 200 and len(json.loads(response.read())) == 100


def test_concurrent_clients_each_get_their_own_answer_and_batches_form(
    server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    url, _, _ = server
    words = " ".join(SENTENCES).split()
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(words, size=3 + i % 20)) for i in range(48)]  # 48 quite different texts
    alone = np.array([httpx.post(f"{url}/predict", json={"inputs": t}, timeout=30).json() for t in texts])
    time.sleep(2 * FLUSH_SECONDS)  # each worker writes its samples to the shared values within FLUSH_SECONDS
    before = httpx.get(f"{url}/metrics").text

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=48)) as client:
            return await asyncio.gather(*[client.post("/predict", json={"inputs": t}) for t in texts])

    answers = asyncio.run(together())
    assert all(a.status_code == 200 for a in answers)
    mine = np.array([a.json() for a in answers])
    # Each its own vector, not a neighbour's. Not bit-identical to the lone run: dynamic int8 quantization
    # scales activations over the whole batch, so batch company moves the last digits.
    assert np.abs(mine - alone).max() < 1e-3
    assert ((mine @ alone.T).argmax(axis=1) == np.arange(48)).all()
    time.sleep(2 * FLUSH_SECONDS)
    after = httpx.get(f"{url}/metrics").text
    sequences = metric(after, "hare_batch_size_sum") - metric(before, "hare_batch_size_sum")
    batches = metric(after, "hare_batch_size_count") - metric(before, "hare_batch_size_count")
    assert sequences == 48 and batches < 48, (sequences, batches)  # some requests shared a model call
    # Both workers' samples are merged: every request counted once.
    assert metric(after, "hare_requests_total") - metric(before, "hare_requests_total") >= 48 + 1


def worker_of(connection: http.client.HTTPConnection) -> int:
    """The pid of the worker serving `connection` (its /info says)."""
    return answered_by(connection)[0]


def answered_by(connection: http.client.HTTPConnection) -> tuple[int, bool]:
    """The pid of the worker that answers a request on `connection`, and whether it asked the client to reconnect."""
    connection.request("GET", "/info")
    answer = connection.getresponse()
    pid: int = json.loads(answer.read())["pid"]
    return pid, answer.getheader("connection") == "close"


def keep_alive(url: str, count: int) -> list[http.client.HTTPConnection]:
    """`count` keep-alive connections, opened one after another, each with one answered request."""
    host, port = url.removeprefix("http://").split(":")
    connections = [http.client.HTTPConnection(host, int(port), timeout=30) for _ in range(count)]
    for connection in connections:
        connection.request("POST", "/predict", json.dumps({"inputs": "balanced"}), {"content-type": "application/json"})
        assert connection.getresponse().read()
    return connections


def accepted_by(url: str) -> tuple[http.client.HTTPConnection, int, bool]:
    """A new keep-alive connection, the pid of the worker that accepted it (its first answer's, so that no later
    rebalancing can have moved it) and whether that answer asked the client to reconnect (Connection: close:
    its worker was crowded)."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    return connection, *answered_by(connection)


def both_accepting(url: str) -> None:
    """Return once both workers of a two-worker server have accepted a connection, and seen it closed."""
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2:
        assert time.monotonic() < deadline, seen
        connection, pid, _ = accepted_by(url)
        connection.close()
        seen.add(pid)
        time.sleep(0.1)
    time.sleep(0.2)  # the server sees them gone


def test_two_clients_of_a_two_worker_server_are_served_by_two_workers(
    server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    """Each worker alone on one connection runs its short calls on its own event loop (api/engine/batching.py); two
    users on one worker would share its loop and its model threads. Balanced when each is accepted: a worker
    holding a connection leaves the next one to the other until it is taken (up to 50 ms, api/process/worker.py).
    Should the other not run within that (the real clock decides, hence the serial phase), the crowded worker's
    answer asks the client to reconnect, and the reconnection lands on the other."""
    url, _, _ = server
    both_accepting(url)  # the fixture waited for one to be ready
    moved = 0
    for _ in range(12):  # one after the other: with no balancing, the second lands on either worker
        first, first_pid, first_closing = accepted_by(url)
        try:
            second, second_pid, closing = accepted_by(url)
            try:
                if closing:  # http.client reconnects for the next request
                    moved += 1
                    second_pid = worker_of(second)
            finally:
                second.close()
        finally:  # closed either way: a socket left open fails the next test as an unraisable warning
            first.close()
        assert not first_closing and first_pid != second_pid, (first_pid, second_pid, closing)
        time.sleep(0.2)  # the server sees them gone
    # Balanced at accept: 0 of 12 moved in each of 14 runs, 11 of them beside 6 to 12 CPU-bound processes on the
    # 2 cores (a deferral of a fixed 3 ms moved 2 of 12 there). One is allowed for a worker kept off the CPU
    # 50 ms. With no balancing at accept the reconnection lands on the busy worker too and the pid assertion
    # above fails (BALANCE_IDLE_S = 0: every run).
    assert moved <= 1, f"{moved} of 12 second clients were asked to reconnect"


def test_a_clients_rate_limit_is_counted_by_all_workers_together(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """Each worker kept its own buckets, so a client whose connections landed on two workers got twice
    HARE_RATE_LIMIT's burst (and rate): the buckets are one page every worker counts in."""
    env = {"HARE_RATE_LIMIT": "1", "HARE_RATE_BURST": "3"}
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "s.log", workers=2, env=env) as (url, _):
        both_accepting(url)  # hare_serve waited for one to be ready
        first, first_pid, _ = accepted_by(url)
        second, second_pid, _ = accepted_by(url)  # left to the other worker while the first is held
        try:
            assert first_pid != second_pid
            statuses = []
            for connection in (first, second, first, second):
                connection.request("POST", "/predict", '{"inputs": "hi"}', {"content-type": "application/json"})
                answer = connection.getresponse()
                answer.read()
                statuses.append(answer.status)
        finally:
            first.close()
            second.close()
    assert statuses == [200, 200, 200, 429], statuses


def test_a_proxy_whose_forwarded_addresses_are_not_trusted_is_said_once(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """Behind a proxy missing from HARE_FORWARDED_ALLOW_IPS every client is the proxy to the rate limit, and a busy
    demo refused them all together, with nothing in the log to say why; a trusted one's clients count apart."""
    log = tmp_path / "s.log"
    env = {"HARE_RATE_LIMIT": "600", "HARE_RATE_BURST": "2", "HARE_FORWARDED_ALLOW_IPS": "10.9.9.9"}
    with hare_serve(tiny_bundle("feature-extraction"), log, env=env) as (url, _):
        for client in ("203.0.113.7", "203.0.113.8", "203.0.113.9"):  # three clients behind the proxy
            sent = httpx.post(f"{url}/predict", json={"inputs": "hi"}, headers={"x-forwarded-for": client})
        assert sent.status_code == 429  # one bucket of 2 for the three
        said = [line for line in log.read_text().splitlines() if "X-Forwarded-For" in line]
        assert len(said) == 1 and "counts 127.0.0.1's requests as one client's" in said[0], said
        assert "HARE_FORWARDED_ALLOW_IPS" in said[0]
    log, trusted = tmp_path / "trusted.log", {**env, "HARE_FORWARDED_ALLOW_IPS": "127.0.0.1"}
    with hare_serve(tiny_bundle("feature-extraction"), log, env=trusted) as (url, _):
        for client in ("203.0.113.7", "203.0.113.8", "203.0.113.9"):
            sent = httpx.post(f"{url}/predict", json={"inputs": "hi"}, headers={"x-forwarded-for": client})
            assert sent.status_code == 200
    assert "X-Forwarded-For" not in log.read_text()


def test_connections_spread_again_once_a_replaced_worker_is_up(
    server: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    """Keep-alive connections made while one worker was down all stay on the other; once the replacement is
    up, the crowded worker asks clients to reconnect (Connection: close) until both serve some. Not before:
    while the replacement loads its model, a reconnection could only land on the survivor again."""
    url, _, _ = server
    probe = keep_alive(url, 1)[0]
    os.kill(worker_of(probe), signal.SIGKILL)  # gunicorn starts a replacement, which loads the model
    probe.close()
    connections = keep_alive(url, 4)  # all on the survivor, while the replacement boots
    survivor = {worker_of(c) for c in connections}
    assert len(survivor) == 1
    deadline = time.monotonic() + 60
    asked = 0  # answers that asked their client to reconnect
    while True:
        answers = [answered_by(c) for c in connections]  # http.client reconnects after Connection: close
        asked += sum(closing for _, closing in answers)
        if len({pid for pid, _ in answers}) == 2:
            break
        assert time.monotonic() < deadline, "the connections never left the survivor"
        time.sleep(0.05)
    # 4 against 0: one client asked to move makes it 3 against 1, a second 2 against 2 (REBALANCE_AT). One asked
    # while the replacement could not take it would come back to the survivor, to be asked again.
    assert asked <= 2, f"{asked} clients were asked to reconnect"
    for connection in connections:
        connection.close()


def test_sigterm_drains_in_flight_requests_and_exits(server: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    url, process, log = server
    big = {"inputs": ["word " * 100] * 1500}  # about a second of work each on this machine

    def post() -> httpx.Response:
        return httpx.post(f"{url}/predict", json=big, timeout=120)

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(post) for _ in range(4)]
        deadline = time.monotonic() + 30
        while metric(httpx.get(f"{url}/metrics").text, "hare_queue_depth") == 0:  # the model is busy on them
            assert time.monotonic() < deadline
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200] * 4
    assert all(len(a.json()) == 1500 for a in answers)
    assert process.wait(timeout=60) == 0, log.read_text()
    assert "Shutting down: Master" in log.read_text()


def test_a_request_sent_just_after_sigterm_on_a_connection_already_accepted_is_answered(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """A connection accepted whose client had not sent its request yet was closed at once by the worker's
    shutdown, and the request the client sent a moment later met a reset ('Server disconnected without sending a
    response': one or two a SIGTERM under load, and in a SIGHUP under load). It is answered, then closed."""
    body = b'{"inputs": "hello"}'
    head = f"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "s.log", 1) as (url, process):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as conn:
            time.sleep(0.3)  # accepted and handed to uvicorn, with nothing to read yet
            process.send_signal(signal.SIGTERM)
            time.sleep(0.1)  # the worker's shutdown has begun
            conn.sendall(head.encode() + body)
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := conn.recv(65536):
                    answer += chunk
        assert process.wait(30) == 0
    assert answer.startswith(b"HTTP/1.1 200"), answer  # and the connection closed: the reads above ended


def test_a_body_still_coming_at_sigterm_is_answered_503_in_seconds(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """A client that sent a request's head and part of its body, then stalled, held a SIGTERM's drain for
    HARE_READ_TIMEOUT (30 s: a pod's whole grace period). Its body now gets a moment to come whole, then the
    request is answered 503 (send it again) and the worker exits."""
    head = "POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "s.log", 1) as (url, process):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=30) as conn:
            conn.sendall(head.encode() + b'{"inputs": "a')  # and nothing more
            time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            began = time.monotonic()
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := conn.recv(65536):
                    answer += chunk
        assert process.wait(30) == 0
        took = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 503"), answer
    assert b"NotReady" in answer and b"send it again" in answer, answer
    assert took < 10, f"the server took {took:.1f} s to stop"
    assert "Traceback" not in (tmp_path / "s.log").read_text()


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGQUIT], ids=["SIGINT", "SIGQUIT"])
def test_gunicorns_quick_stop_answers_what_is_in_flight_and_exits_at_once(
    tiny_bundle: ModelFactory, tmp_path: Path, stop: signal.Signals
) -> None:
    """kill -INT or -QUIT of the master alone (a supervisor's stop signal, `docker kill -s INT`): the workers
    served on, new requests too, until the master SIGKILLed them 30 s later, cutting the requests they held and
    logging "Perhaps out of memory?"."""
    log = tmp_path / "server.log"
    big = {"inputs": ["word " * 100] * 1500}  # about a second of work on this machine
    with hare_serve(tiny_bundle("feature-extraction"), log, 1, {"HARE_MAX_QUEUE_MS": "0"}) as (url, process):
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(lambda: httpx.post(f"{url}/predict", json=big, timeout=120))
            deadline = time.monotonic() + 30
            while metric(httpx.get(f"{url}/metrics").text, "hare_queue_depth") == 0:  # the model is busy on it
                assert time.monotonic() < deadline
                time.sleep(0.02)
            process.send_signal(stop)
            stopped = time.monotonic()
            assert answer.result().status_code == 200
        process.wait(timeout=60)
        assert time.monotonic() - stopped < 15, "the workers waited for the graceful timeout (30 s)"
    assert "SIGKILL" not in log.read_text()


def test_a_master_killed_outright_leaves_the_port_to_the_next_server(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """kill -9 of gunicorn's master runs no stop: its workers see it gone within a second or two and drain, so
    the server started again can bind its port (they served on it unsupervised for good, and it could not), and
    removes the scratch folders the killed one left (its metrics, its core pool)."""
    bundle = tiny_bundle("text-classification")
    with hare_serve(bundle, tmp_path / "first.log", 2, own_group=True) as (url, process):
        both_accepting(url)  # hare_serve waited for one to be ready
        workers = group(process.pid) - {process.pid}
        assert len(workers) == 2
        process.kill()
        process.wait()
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "the workers outlived their master"
            time.sleep(0.05)
    left = scratch_of(process.pid)
    assert {p.name.split("-")[1] for p in left} == {"metrics", "cores"}
    with hare_serve(bundle, tmp_path / "again.log", 1, port=int(url.rsplit(":", 1)[1])) as (again, _):
        assert httpx.post(f"{again}/predict", json={"inputs": "I like you"}).status_code == 200
        assert not any(p.exists() for p in left)


def test_sighup_reloads_a_good_bundle_and_refuses_a_broken_one_serving_on(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """kill -HUP, gunicorn's reload, after the bundle on disk was replaced: onto a broken one it stopped the whole
    server (its new workers failed to boot); now it is refused with the check's reason and the old workers serve
    on, and a good one is still reloaded onto new workers."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle("text-classification"), bundle)
    tokenizer = (bundle / TOKENIZER_FILE).read_bytes()
    log = tmp_path / "server.log"

    def workers() -> set[int]:
        return group(process.pid) - {process.pid}

    with hare_serve(bundle, log, 1, own_group=True) as (url, process):
        first = workers()
        (bundle / TOKENIZER_FILE).write_text("{")
        process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "SIGHUP: not reloaded" not in log.read_text():
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert f"{bundle / TOKENIZER_FILE} is unreadable" in log.read_text()
        assert httpx.post(f"{url}/predict", json={"inputs": "I like you"}).status_code == 200
        assert workers() == first

        (bundle / TOKENIZER_FILE).write_bytes(tokenizer)
        process.send_signal(signal.SIGHUP)
        while not (workers() and workers().isdisjoint(first)):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline + 60, log.read_text()
            time.sleep(0.1)
        wait_ready(url, process, log)
        assert httpx.post(f"{url}/predict", json={"inputs": "I like you"}).status_code == 200


# Makes every process of a server started with this folder first on PYTHONPATH see `TEST_MEMORY_ROOM` bytes free.
TIGHT_MEMORY = """
import os
if os.environ.get("TEST_MEMORY_ROOM"):
    import container.machine
    container.machine.memory_room = lambda root=None: int(os.environ["TEST_MEMORY_ROOM"])
"""


@pytest.mark.parametrize("memory", ["ample", "tight"])
def test_sighup_stops_the_old_workers_only_once_the_new_ones_accept(
    tiny_bundle: ModelFactory, tmp_path: Path, memory: str
) -> None:
    """gunicorn's reload stopped the old workers at once, so nothing accepted while the new ones loaded and warmed
    their model: with the default MiniLM a /ready probe waited 0.7 s and requests under load up to 1.9 s, and a
    SIGTERM in that window reset the requests waiting in the listen backlog. The old ones now serve until the
    new ones accept, and every request sent meanwhile is answered; where the new ones may not fit in the memory
    left beside the old, the old ones stop first (the kernel would kill workers, old and new), as it says."""
    log, env = tmp_path / "server.log", {}
    if memory == "tight":
        (tmp_path / "site").mkdir()
        (tmp_path / "site" / "sitecustomize.py").write_text(TIGHT_MEMORY)
        env = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}", "TEST_MEMORY_ROOM": "1"}
    with hare_serve(tiny_bundle("feature-extraction"), log, 1, env, own_group=True) as (url, process):
        (first,) = group(process.pid) - {process.pid}
        stop, statuses = threading.Event(), []

        def ask() -> None:
            with httpx.Client(timeout=60, headers={"connection": "close"}) as client:  # a new connection each
                while not stop.is_set():
                    statuses.append(client.post(f"{url}/predict", json={"inputs": "I like you"}).status_code)

        asking = threading.Thread(target=ask)
        asking.start()
        try:
            time.sleep(0.5)
            process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 60
            while alive(first):
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            wait_ready(url, process, log)
        finally:
            stop.set()
            asking.join(60)
        text = log.read_text()
        (second,) = group(process.pid) - {process.pid}
        ready = re.search(rf"\[INFO\] ready: .* pid {second}, ", text)  # the new worker's
        assert ready is not None, text
        if memory == "tight":
            assert "SIGHUP: the new workers may need 0.1 GB beside the old ones, and 0.0 GB is free" in text, text
            assert text.index(f"[{first}] [INFO] Shutting down") < ready.start(), text
            return
        assert text.index(f"[{first}] [INFO] Shutting down") > ready.start(), text
        assert statuses and set(statuses) == {200}, statuses


def scratch_of(pid: int) -> list[Path]:
    """The scratch folders of the server whose master is `pid` (api/process/scratch.py)."""
    return [p for parent in (Path(tempfile.gettempdir()), Path("/dev/shm")) for p in parent.glob(f"hare-*-{pid}-*")]


def test_requests_never_sent_whole_are_closed_and_free_their_places(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """A client that opens connections and sends half a head (slowloris), trickles one, or sends a head and never
    its body (which takes a place in admission) has them closed after HARE_READ_TIMEOUT, a body begun and not
    ended answered 408 first, and the places come back; a request slower than that to answer is not cut. The
    server raises its descriptor limit to the hard one (systemd gives 1,024), so such connections do not lock
    everyone out before that."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, soft), hard))  # what the server inherits
    env = {"HARE_READ_TIMEOUT": "0.5", "HARE_QUEUE_SIZE": "4", "HARE_MAX_QUEUE_MS": "0"}  # 8 places in all
    try:
        with hare_serve(tiny_bundle("text-classification"), tmp_path / "s.log", 2, env) as (url, process):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # the server has its own
            raised = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
            for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split():
                limits = Path(f"/proc/{pid}/limits").read_text()  # a worker's
                assert re.search(rf"^Max open files\s+{raised}\s", limits, re.M), limits
            host, port = url.removeprefix("http://").split(":")
            slow = {"inputs": ["word " * 100] * 3000}  # seconds of work: a request under way is never cut
            with ThreadPoolExecutor(1) as pool:
                answer = pool.submit(httpx.post, f"{url}/predict", json=slow, timeout=120)
                deadline = time.monotonic() + 30
                while metric(httpx.get(f"{url}/metrics").text, "hare_queue_depth") == 0:  # the model is busy on it
                    assert time.monotonic() < deadline, "the slow request never reached the model"
                    time.sleep(0.02)
                started = time.monotonic()
                held = [socket.create_connection((host, int(port))) for _ in range(30)]
                head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                for i, sock in enumerate(held):  # a third half heads, the rest whole heads without their bodies
                    sock.sendall(head if i < 10 else head + b'Content-Length: 100\r\n\r\n{"inputs"')
                trickling = socket.create_connection((host, int(port)))
                for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.3 s: never done in time
                    try:
                        trickling.sendall(bytes([byte]))
                    except OSError:  # closed already
                        break
                    time.sleep(0.3)
                answers = []
                for sock in [*held, trickling]:  # closed, after a 429 for the bodies admission had no place for
                    sock.settimeout(max(0.1, started + 6 - time.monotonic()))
                    answers.append(b"")
                    while data := sock.recv(4096):
                        answers[-1] += data
                    sock.close()
                assert answers[:10] == [b""] * 10 and answers[-1] == b"", answers  # heads never whole: no answer
                # A body begun and never ended is answered 408, saying how much came (or 429: no place for it).
                assert {a[9:12] for a in answers[10:-1]} == {b"408", b"429"}, answers
                late = next(a for a in answers if a.startswith(b"HTTP/1.1 408"))
                assert b"connection: close" in late.lower()
                assert b"9 of the 100 bytes its Content-Length announces came" in late, late
                assert httpx.post(f"{url}/predict", json={"inputs": "I like you"}).status_code == 200
                assert answer.result().status_code == 200
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_worker_out_of_descriptors_says_so_once_with_what_to_change_and_serves_again(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """Out of descriptors, the accept loop retries every 0.1 s: it logged 'accept failed: [Errno 24] Too many open
    files' at each try (596 identical lines from two workers in 30 s, with nothing on what to change). Now one
    line says what to raise; the clients waiting in the backlog are served once connections close."""
    log = tmp_path / "s.log"
    with hare_serve(tiny_bundle("feature-extraction"), log, 1, own_group=True) as (url, process):
        (worker,) = group(process.pid) - {process.pid}
        spare = 8
        held = len(os.listdir(f"/proc/{worker}/fd")) + spare
        resource.prlimit(worker, resource.RLIMIT_NOFILE, (held, held))
        port = int(url.rsplit(":", 1)[1])
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(spare + 8)]
        waiting = ThreadPoolExecutor(1).submit(httpx.post, f"{url}/predict", json={"inputs": "hi"}, timeout=60)
        time.sleep(2.5)  # 25 tries at accepting
        lines = [line for line in log.read_text().splitlines() if "accept failed" in line]
        assert len(lines) == 1, lines
        assert "Too many open files" in lines[0] and f"may open {held} descriptors" in lines[0], lines[0]
        assert "LimitNOFILE" in lines[0] and not waiting.done()
        for sock in idle:
            sock.close()
        assert waiting.result().status_code == 200


def test_an_answer_nobody_reads_is_dropped_and_a_slow_reader_gets_all_of_it(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """An answer waits in the worker's memory until its client takes it: a client that takes none of it for
    HARE_READ_TIMEOUT has its connection dropped, answer and all (12 unread 14 MB answers held 53-74 MB in each
    worker for as long as their clients stayed); one that reads slowly, but reads, gets every byte."""
    body = json.dumps({"inputs": ["word " * 100] * 800, "parameters": {"output_value": "token_embeddings"}}).encode()
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "s.log", 1, {"HARE_READ_TIMEOUT": "2"}) as (url, _):
        host, port = url.removeprefix("http://").split(":")

        def ask() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2**16)  # the answer waits in the server, not here
            sock.connect((host, int(port)))
            sock.sendall(head % len(body) + body)
            return sock

        idle, slow = ask(), ask()
        answer = b""
        started = time.monotonic()
        while time.monotonic() - started < 5:  # 32 KB every 0.25 s: past the timeout and a look, never still
            answer += slow.recv(2**15)
            time.sleep(0.25)
        size = int(re.search(rb"content-length: (\d+)", answer, re.I).group(1))  # type: ignore[union-attr]
        start = answer.index(b"\r\n\r\n") + 4
        assert size > 8 * 2**20  # more than the kernel's buffers hold (4 MB on loopback): most waits in the worker
        while len(answer) - start < size:
            chunk = slow.recv(2**16)
            assert chunk, "the slow reader's connection was closed"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and len(json.loads(answer[start:])) == 800
        idle.settimeout(10)
        taken = 0
        try:
            while chunk := idle.recv(2**16):
                taken += len(chunk)
        except ConnectionResetError:
            pass
        assert taken < size, "the unread answer was kept and sent whole"  # a reset: dropped at once
        idle.close()
        slow.close()
        assert httpx.post(f"{url}/predict", json={"inputs": "I like you"}).status_code == 200


def test_serve_refuses_a_missing_bundle_with_its_reason(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hare.cli", "serve", str(tmp_path / "nope")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "does not exist" in done.stderr and "hare optimize" in done.stderr


def test_serve_refuses_more_than_four_workers_a_cpu(tmp_path: Path) -> None:
    # --workers 500 on 2 cores asked for 500 copies of the model. Four a CPU pass on to the next check.
    def serve(workers: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hare.cli", "serve", str(tmp_path / "nope"), "--workers", str(workers)]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)

    most = 4 * usable_cpus()
    refused = serve(most + 1)
    assert refused.returncode == 2 and f"HARE_WORKERS={most + 1} (--workers)" in refused.stderr
    assert f"give at most {most}" in refused.stderr
    assert "does not exist" in serve(most).stderr


def test_serve_refuses_more_than_four_model_streams_a_cpu(tmp_path: Path) -> None:
    """--streams 1000 on 2 cores started workers that compiled (OpenVINO) and warmed up a model stream each:
    none was ready after 150 s, and the log said nothing past 'Booting worker'."""

    def serve(streams: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hare.cli", "serve", str(tmp_path / "nope"), "--streams", str(streams)]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)

    most = 4 * usable_cpus()
    refused = serve(1000)
    assert refused.returncode == 2 and "HARE_STREAMS=1000 (--streams)" in refused.stderr
    assert f"give at most {most}" in refused.stderr
    assert "does not exist" in serve(most).stderr


def test_serve_refuses_more_cores_than_it_may_use(tmp_path: Path) -> None:
    """--cores 1000 on 2 CPUs was taken as given: the core pool let 1000 model threads run at once, and admission
    and the refusals' pace counted 1000 cores draining the queue (a lone request 1.7x slower, 64 greedy clients
    refused 9,444 times in 10 s against 497)."""

    def serve(cores: int) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hare.cli", "serve", str(tmp_path / "nope"), "--cores", str(cores)]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)

    refused = serve(1000)
    assert refused.returncode == 2 and "HARE_CORES=1000 (--cores)" in refused.stderr
    assert f"give at most {usable_cpus()}" in refused.stderr
    assert "does not exist" in serve(usable_cpus()).stderr


def test_serve_refuses_proxies_that_are_no_address_naming_the_setting(tmp_path: Path) -> None:
    """A HARE_FORWARDED_ALLOW_IPS that is no address reached gunicorn, which exited 1 with `Invalid value for
    forwarded_allow_ips: not-an-ip` and a blank line or two, naming neither the variable nor the flag."""

    def serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "hare.cli", "serve", str(tmp_path / "nope"), *args]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("HARE_")} | (env or {})
        return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)

    refused = serve(env={"HARE_FORWARDED_ALLOW_IPS": "10.0.0.1, not-an-ip"})
    assert refused.returncode == 2, refused.stderr
    assert "HARE_FORWARDED_ALLOW_IPS='10.0.0.1, not-an-ip' is invalid" in refused.stderr
    assert "'not-an-ip' does not appear to be an IPv4 or IPv6 network" in refused.stderr
    flag = serve("--forwarded-allow-ips", "192.168.1.1/24")  # host bits set: gunicorn refuses it too
    assert flag.returncode == 2 and "argument --forwarded-allow-ips" in flag.stderr and "host bits" in flag.stderr
    assert "does not exist" in serve(env={"HARE_FORWARDED_ALLOW_IPS": "*"}).stderr  # on to the next check
    assert "does not exist" in serve(env={"HARE_FORWARDED_ALLOW_IPS": "10.0.0.0/8, ::1,"}).stderr


def test_serve_refuses_an_engine_socket_where_no_engine_listens(tmp_path: Path) -> None:
    """--engine-socket naming a path where nothing listens started gunicorn: each worker waited 5 s, failed with
    a traceback ('the model engine at ... does not answer' its last line), and the server exited 1."""
    for path in (tmp_path / "engine.sock", tmp_path):  # nothing there; a folder
        command = [sys.executable, "-m", "hare.cli", "serve", str(tmp_path / "nope"), "--engine-socket", str(path)]
        refused = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2, refused.stderr
        assert f"HARE_ENGINE_SOCKET={path} (--engine-socket): no model engine listens there" in refused.stderr
    with socket.socket(socket.AF_UNIX) as listening:  # one that listens passes on to the next check
        listening.bind(str(tmp_path / "engine.sock"))
        listening.listen()
        command[-1] = str(tmp_path / "engine.sock")
        assert "does not exist" in subprocess.run(command, cwd=ROOT, capture_output=True, text=True).stderr


def test_serving_never_imports_torch_or_transformers(tiny_bundle: ModelFactory) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, sys, httpx
        from api.web.app import create_app
        from api.config import Settings

        async def main():
            app = create_app(Settings.from_env({{"HARE_BUNDLE": {str(tiny_bundle("token-classification"))!r}}}))
            async with app.router.lifespan_context(app):
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as c:
                    assert (await c.post("/predict", json={{"inputs": "Angela Merkel"}})).status_code == 200
            print(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")))

        asyncio.run(main())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_worker_freezes_what_its_start_made_so_collections_skip_it(tiny_bundle: ModelFactory) -> None:
    """Modules, sessions and the app live as long as the worker: frozen after warm-up, a full collection
    never walks them again (one took 17-20 ms, mid-answer, in a worker that did not freeze)."""
    app = create_app(Settings.from_env({"HARE_BUNDLE": str(tiny_bundle("feature-extraction")), "HARE_WORKERS": "1"}))
    config = uvicorn.Config(app, lifespan="on", log_level="warning")
    config.load()
    server = PacedServer(config, app)
    server.lifespan = config.lifespan_class(config)

    async def start_and_stop() -> tuple[bool, int]:
        await server.startup(sockets=[])
        try:
            return app.state.hare.ready, gc.get_freeze_count()
        finally:
            await server.shutdown(sockets=[])

    gc.unfreeze()
    try:
        ready, frozen = asyncio.run(start_and_stop())
        assert ready and frozen > 1000
    finally:
        gc.unfreeze()  # the test process's own objects go back to the collector


def test_a_worker_stopped_while_it_loads_closes_its_listening_sockets_at_once() -> None:
    """SIGTERM while a worker loads and warms its model (a `docker stop` right after the start, a SIGTERM during
    a SIGHUP's hand-over): it held its copy of the listening socket until the load ended, so the kernel kept
    queueing new connections there after the master had closed its own, for nobody, and reset them seconds
    later (8 clients' requests, a SIGTERM 0.5 s after a SIGHUP). Closed at once, the port refuses them."""
    loading, loaded = asyncio.Event(), asyncio.Event()

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        loading.set()
        await loaded.wait()  # a model loading
        yield

    app = Starlette(lifespan=lifespan)
    config = uvicorn.Config(app, lifespan="on", log_level="warning")
    config.load()
    server = PacedServer(config, app)

    async def main() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        address = listener.getsockname()[:2]
        serving = asyncio.create_task(server._serve(sockets=[listener]))  # (serve would re-raise the signal here)
        await asyncio.wait_for(loading.wait(), 10)
        server.handle_exit(signal.SIGTERM, None)
        try:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(address, timeout=5).close()
        finally:
            loaded.set()
            await asyncio.wait_for(serving, 10)
            listener.close()

    uvloop.run(main())


def test_a_request_on_a_connection_still_being_handed_over_at_shutdown_is_answered(
    tiny_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker stop` while the accept loop hands a new connection to uvicorn: the hand-off completes and its
    request is answered before the worker exits. Cancelled inside uvloop's connect_accepted_socket, the socket
    was closed under the protocol's feet: its answer went nowhere and the worker waited for it until killed."""
    app = create_app(Settings.from_env({"HARE_BUNDLE": str(tiny_bundle("feature-extraction")), "HARE_WORKERS": "1"}))
    config = uvicorn.Config(app, lifespan="on", log_level="warning")
    config.load()
    server = PacedServer(config, app)
    server.lifespan = config.lifespan_class(config)
    handing, hand_over = asyncio.Event(), asyncio.Event()
    connect = server._connect

    async def held_connect(conn: socket.socket) -> None:  # the hand-off, held until shutdown has begun
        handing.set()
        await hand_over.wait()
        await connect(conn)

    monkeypatch.setattr(server, "_connect", held_connect)
    body = b'{"inputs": "hello"}'
    head = f"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    request = head.encode() + body

    async def main() -> bytes:
        listener = socket.create_server(("127.0.0.1", 0))
        await server.startup(sockets=[listener])
        reader, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        writer.write(request)
        await asyncio.wait_for(handing.wait(), 10)
        stopping = asyncio.create_task(server.shutdown(sockets=[listener]))
        await asyncio.sleep(0.05)  # the accept loop is cancelled meanwhile
        hand_over.set()
        try:
            return await asyncio.wait_for(reader.read(), 10)  # up to the server's close
        finally:
            server.force_exit = True  # a connection lost in the hand-off would hold the shutdown for ever
            await asyncio.wait_for(stopping, 30)
            writer.close()
            listener.close()

    answer = uvloop.run(main())
    assert answer.startswith(b"HTTP/1.1 200"), answer
