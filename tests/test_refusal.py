"""Refusal as a client sees it, on a real `hare serve` (loopback): while the server is full, a burst of new
clients each gets an answer or a 429 with Retry-After (the accept loop's prebuilt one, api/process/refuser.py),
and no connection is reset or left hanging; other methods still reach the app."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import h11
import httpx
import pytest

from api.engine.errors import Overloaded
from api.process.refuser import LINGER_S, whole_request
from api.web.errors import error_response, raw_answer
from tests.api_helpers import error_in
from tests.conftest import ModelFactory
from tests.live_server import free_port, hare_serve

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = pytest.mark.serial

HEAVY = {"inputs": ["word " * 60] * 400}
BURST = 48
TIMEOUT_S = 60.0  # a hung connection fails the test instead of hanging it
SPLIT_PAUSE_S = 0.5  # between a split request's parts; under LINGER_S, after which uvicorn gets it anyway


@pytest.fixture(scope="module", params=["0", "3"], ids=["unpaced", "paced"])
def full_server(
    request: pytest.FixtureRequest, tiny_bundle: ModelFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A one-worker server that holds one request at a time, kept busy by a client sending heavy requests
    back to back, so that admission refuses nearly always; refusing every new connection at once, or at the
    default pace (3 a second per answer a second of capacity)."""
    env = {"HARE_REFUSALS_PER_ANSWER": request.param}
    with busy_server(tiny_bundle("feature-extraction"), tmp_path_factory.mktemp("refusal"), env) as url:
        yield url


@contextmanager
def busy_server(bundle: Path, logs: Path, env: dict[str, str], heavy: object = HEAVY) -> Iterator[str]:
    """A one-worker server that holds one request at a time, kept busy by a client sending `heavy` requests
    back to back, with `env` on top."""
    env = {"HARE_QUEUE_SIZE": "1", "HARE_REFUSAL_INTERVAL_MS": "0", **env}
    with hare_serve(bundle, logs / "server.log", env=env) as (url, _):
        stop = threading.Event()

        def busy() -> None:
            with httpx.Client(timeout=TIMEOUT_S) as client:
                while not stop.is_set():
                    client.post(f"{url}/predict", json=heavy)

        thread = threading.Thread(target=busy)
        thread.start()
        try:
            # Full before the test's burst: the busy client's first request takes a while to be sent, and a burst
            # ahead of it found a free server and got 200 each (one run in four, either pace).
            probe = json.dumps({"inputs": "probe"}).encode()
            deadline = time.monotonic() + TIMEOUT_S
            while raw_post(url, probe)[0] != 429:
                assert time.monotonic() < deadline, "the busy client never filled the server"
            yield url
        finally:
            stop.set()
            thread.join(TIMEOUT_S)


def post_bytes(url: str, body: bytes, connection: str = "close", path: str = "/predict") -> bytes:
    host = url.removeprefix("http://").split(":")[0]
    return (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: {connection}\r\n\r\n"
    ).encode() + body


def raw_post(
    url: str, body: bytes, split: int | None = None, request: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One POST /predict (or the bytes of `request`) on a fresh connection, read to the server's close (a reset
    would raise); `split`: sent in two parts that far in, SPLIT_PAUSE_S apart."""
    host, port = url.removeprefix("http://").split(":")
    request = request or post_bytes(url, body)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        if split is None:
            sock.sendall(request)
        else:  # the rest sent once the accept loop has read the first part (a pause: both parts in one read
            # would make it one whole request)
            sock.sendall(request[:split])
            time.sleep(SPLIT_PAUSE_S)
            sock.sendall(request[split:])
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


@pytest.mark.parametrize(("path", "text"), [("/predict", "inputs"), ("/v1/embeddings", "input")])
def test_a_burst_at_a_full_server_gets_an_answer_or_a_429_each(full_server: str, path: str, text: str) -> None:
    """Each 429 in the error shape of its route (OpenAI's on OpenAI's routes: the accept loop's answered
    hare's there)."""
    body = json.dumps({text: "a short text"}).encode()
    request = post_bytes(full_server, body, path=path)
    counted = refusals_counted(full_server, path)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: raw_post(full_server, body, request=request), range(BURST)))
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429} and 429 in statuses, statuses  # every connection answered, no 5xx
    # Every one counted as its route's 429 (the accept loop's and RefuseEarly's were counted only as errors),
    # the busy client's own refusals (on /predict) besides.
    time.sleep(0.2)  # each worker's samples reach the shared values within FLUSH_SECONDS
    seen = refusals_counted(full_server, path) - counted
    assert seen >= statuses.count(429) if path == "/predict" else seen == statuses.count(429)
    for status, headers, rest in answers:
        if status == 429:
            assert int(headers["retry-after"]) >= 1
            assert headers["connection"] == "close"
            assert error_in(path, json.loads(rest[: int(headers["content-length"])]))[1] == "Overloaded"
    # Most came from the accept loop, not the app (uvicorn names itself in a `server` header).
    assert any("server" not in headers for status, headers, _ in answers if status == 429)


def refusals_counted(url: str, route: str) -> int:
    """hare_requests_total's 429s of `route` on the server at `url`."""
    text = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    found = re.search(rf'^hare_requests_total{{route="{re.escape(route)}",status="429"}} (\S+)$', text, re.M)
    return int(float(found[1])) if found else 0


# Unpaced only: paced, a connection waits in the listen backlog for its turn, its whole request arrives
# meanwhile, and the prebuilt refusal is then the right answer (a CI run saw it at 16 connections at a time).
@pytest.mark.parametrize("full_server", ["0"], ids=["unpaced"], indirect=True)
def test_a_request_split_before_its_method_and_other_methods_reach_the_app(full_server: str) -> None:
    """A burst of requests whose first read is not a whole "POST ": the app answers each, with an answer or
    its own 429 (uvicorn names itself in a `server` header, which the accept loop's prebuilt refusal has not,
    as the burst of whole requests above shows). The real clock decides the split (SPLIT_PAUSE_S), hence the
    serial phase."""
    body = json.dumps({"inputs": "a short text"}).encode()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: raw_post(full_server, body, split=2), range(BURST)))
    for status, headers, _ in answers:
        assert status in (200, 429) and "server" in headers, (status, headers)
        assert status == 200 or int(headers["retry-after"]) >= 1
    assert httpx.get(f"{full_server}/health", timeout=TIMEOUT_S).status_code == 200  # not refused: not a POST


@pytest.mark.parametrize("how", ["body late", "large body"])
def test_a_refused_request_not_read_whole_at_once_still_reads_its_429(full_server: str, how: str) -> None:
    """The accept loop closes a refused connection at once only when one read took the whole request. With
    the body still on the way it answers and lingers for the rest; with more than one read takes (a large
    body), closing would leave bytes unread and the kernel would reset the connection: the client's write of
    its body would fail (and on a real network the reset can overtake the 429). Either way the client writes
    its whole request and reads its 429 whole."""
    if how == "body late":
        body = json.dumps({"inputs": "a short text"}).encode()
        request = post_bytes(full_server, body)
        at: int | None = len(request) - len(body) // 2
    else:
        body = json.dumps({"inputs": "word " * 40_000}).encode()  # 200 kB: over READ_BYTES
        request, at = post_bytes(full_server, body), None
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: raw_post(full_server, body, split=at, request=request), range(BURST)))
    assert {status for status, _, _ in answers} <= {200, 429}
    canned = [(headers, rest) for status, headers, rest in answers if status == 429 and "server" not in headers]
    assert canned, "no refusal from the accept loop in the burst"
    for headers, rest in canned:
        assert error_in("/predict", json.loads(rest[: int(headers["content-length"])]))[1] == "Overloaded"


def test_a_large_body_refused_by_the_app_reads_its_429(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """Refused in the app (RefuseEarly, or admission in the route), a request's body is read before the 429
    closes the connection: closed with 200 kB still arriving, the kernel would reset it, and the client would
    see a broken connection instead of its 429."""
    env = {"HARE_REFUSE_IN_ACCEPT": "0"}  # every refusal through uvicorn and the app
    body = json.dumps({"inputs": "word " * 40_000}).encode()
    with busy_server(tiny_bundle("feature-extraction"), tmp_path, env) as url, ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: raw_post(url, body), range(2 * BURST)))
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429} and 429 in statuses, statuses


def test_a_client_that_expects_100_continue_gets_its_429_without_sending_its_body(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """A client that sends `Expect: 100-continue` (curl does, for bodies over 1 MB) waits for leave to send
    its body: refused, it gets its 429 at once instead of being asked for a body only to drop it."""
    env = {"HARE_REFUSE_IN_ACCEPT": "0"}  # every refusal through uvicorn and the app

    def ask(url: str) -> bytes:
        host, port = url.removeprefix("http://").split(":")
        head = (
            f"POST /predict HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            "content-length: 2000000\r\nexpect: 100-continue\r\nconnection: close\r\n\r\n"
        )
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
            sock.sendall(head.encode())
            return sock.recv(65536).split(b"\r\n", 1)[0]  # the status line: 429, or 100 when admitted

    with busy_server(tiny_bundle("feature-extraction"), tmp_path, env) as url, ThreadPoolExecutor(8) as pool:
        lines = list(pool.map(lambda _: ask(url), range(BURST)))
    assert set(lines) <= {b"HTTP/1.1 429 Too Many Requests", b"HTTP/1.1 100 Continue"}, set(lines)
    assert b"HTTP/1.1 429 Too Many Requests" in lines


def test_a_connection_silent_past_the_linger_is_still_served(full_server: str) -> None:
    host, port = full_server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        time.sleep(LINGER_S + 0.5)  # the accept loop hands it to uvicorn, which waits for its request
        sock.sendall(f"GET /health HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200 ")


def test_the_prebuilt_429_parses_as_http_and_is_the_apps_answer() -> None:
    """The accept loop's bytes come from the app's one error answer: the same status, headers and body."""
    refusal = Overloaded("the server's queue would take 3.0 s; retry after the time in Retry-After", retry_after=2)
    client = h11.Connection(h11.CLIENT)  # a real HTTP/1.1 parser (httpx's)
    client.send(h11.Request(method="POST", target="/predict", headers=[("host", "x"), ("content-length", "0")]))
    client.send(h11.EndOfMessage())
    client.receive_data(raw_answer(refusal))
    response = client.next_event()
    assert isinstance(response, h11.Response) and response.status_code == 429
    headers = {k.decode(): v.decode() for k, v in response.headers}
    assert headers["retry-after"] == "2" and headers["connection"] == "close"
    data = client.next_event()
    assert isinstance(data, h11.Data)
    assert json.loads(data.data) == {"error": refusal.message, "type": "Overloaded", "error_type": "Overloaded"}
    assert isinstance(client.next_event(), h11.EndOfMessage)
    app = error_response(refusal)
    assert app.status_code == 429 and app.body == data.data
    openai = raw_answer(refusal, "/v1/embeddings").partition(b"\r\n\r\n")[2]
    assert openai == error_response(refusal, "/v1/embeddings").body
    assert error_in("/v1/embeddings", json.loads(openai)) == (refusal.message, "Overloaded")
    assert {k: v for k, v in app.headers.items() if k not in ("content-length", "content-type")} == {
        k: v for k, v in headers.items() if k not in ("content-length", "content-type")
    }


@pytest.mark.parametrize(
    ("request_bytes", "whole"),
    [
        (b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", True),
        (b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{", False),  # the body still coming
        (b"POST /predict HTTP/1.1\r\nhost: x\r\n\r\n", True),  # no body
        (b"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-le", False),  # the head still coming
        (b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}POST / HTTP/1.1\r\n", False),  # another behind it
        (b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", False),  # never judged
        (b"POST / HTTP/1.1\r\ncontent-length: x\r\n\r\n", False),
    ],
)
def test_a_refusal_closes_at_once_only_after_one_whole_request(request_bytes: bytes, whole: bool) -> None:
    """Whatever is left unread at close makes the kernel reset the connection: only a read holding exactly one
    whole request lets the accept loop close without lingering."""
    assert whole_request(request_bytes) is whole


def test_the_probe_port_answers_at_once_while_the_main_port_accepts_at_a_pace(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """HARE_PROBE_PORT: while the server refuses, HARE_PORT accepts a new connection every 2 s here (the pace's
    floor), so a probe waits behind the clients that came before it (a liveness probe timed out); the probe
    port answers it at once, and refuses work sent there."""
    probes = free_port()
    env = {"HARE_REFUSAL_INTERVAL_MS": "2000", "HARE_REFUSALS_PER_ANSWER": "0", "HARE_PROBE_PORT": str(probes)}
    heavier = {"inputs": ["word " * 120] * 1600}  # no gap between two of them for the pace to accept in
    with busy_server(tiny_bundle("feature-extraction"), tmp_path, env, heavier) as url:
        body = json.dumps({"inputs": "queued"}).encode()
        with ThreadPoolExecutor(4) as pool:
            queued = [pool.submit(raw_post, url, body) for _ in range(3)]
            time.sleep(0.3)  # connected, in the listen backlog, before the probe behind them
            behind = pool.submit(httpx.get, f"{url}/health", timeout=TIMEOUT_S)
            time.sleep(0.3)
            probe = httpx.get(f"http://127.0.0.1:{probes}/health", timeout=TIMEOUT_S)
            assert probe.status_code == 200
            assert not behind.done()  # still waiting its turn on HARE_PORT
            assert behind.result().status_code == 200
            assert all(q.result()[0] in (200, 429) for q in queued)
        wrong = httpx.post(f"http://127.0.0.1:{probes}/predict", json={"inputs": "x"}, timeout=TIMEOUT_S)
        assert wrong.status_code == 404 and "HARE_PROBE_PORT" in wrong.json()["error"], wrong.text


def test_a_worker_refusing_at_a_slow_pace_accepts_again_as_soon_as_the_queue_drains(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """A refusing worker waits its pace's interval between accepts, but looks meanwhile whether admission
    opened: it slept the interval whole, so with HARE_REFUSAL_INTERVAL_MS=60000 the port accepted nothing for a
    minute after the queue had drained (and with 1e300, a valid value, never again: every probe timed out)."""
    env = {"HARE_QUEUE_SIZE": "1", "HARE_REFUSAL_INTERVAL_MS": "60000", "HARE_REFUSALS_PER_ANSWER": "0"}
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "server.log", env=env) as (url, _):
        stop = threading.Event()

        def busy() -> None:
            with httpx.Client(timeout=TIMEOUT_S) as client:
                while not stop.is_set():
                    client.post(f"{url}/predict", json=HEAVY)

        thread = threading.Thread(target=busy)
        thread.start()
        try:  # one connection refused from the accept loop: the next waits a minute for its slot
            deadline = time.monotonic() + TIMEOUT_S
            while raw_post(url, json.dumps({"inputs": "probe"}).encode())[0] != 429:
                assert time.monotonic() < deadline, "the busy client never filled the server"
        finally:
            stop.set()
            thread.join(TIMEOUT_S)
        started = time.monotonic()  # the busy client is gone, its last request answered: nothing is queued
        with contextlib.suppress(httpx.TimeoutException):
            assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert time.monotonic() - started < 5, "the port accepted nothing after the queue had drained"


def test_every_refusal_has_its_line_in_the_access_log(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """HARE_ACCESS_LOG logs every request line: the 429s answered from the accept loop, which uvicorn never
    sees, too. Without them the log showed 89 of the 406 429s that 64 greedy clients got in 6 s (the metrics
    counted all of them)."""
    env = {"HARE_ACCESS_LOG": "1"}
    log = tmp_path / "server.log"
    refusal = re.compile(r'127\.0\.0\.1:\d+ - "POST /predict HTTP/1\.1" 429')
    with busy_server(tiny_bundle("feature-extraction"), tmp_path, env) as url:
        before = len(refusal.findall(log.read_text()))
        body = json.dumps({"inputs": "refused"}).encode()
        with ThreadPoolExecutor(8) as pool:
            statuses = [status for status, _, _ in pool.map(lambda _: raw_post(url, body), range(BURST))]
        logged = len(refusal.findall(log.read_text())) - before
    assert set(statuses) <= {200, 429} and statuses.count(429) >= BURST // 2, statuses
    assert logged == statuses.count(429), (logged, statuses.count(429))
