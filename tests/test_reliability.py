"""Reliability of the process model, for real (`hare serve`, 2 workers, loopback): a worker killed with
SIGKILL under load costs only its own in-flight requests and is replaced; an overloaded server refuses with
429 + Retry-After and closes the refused connection, and never answers 5xx."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.api_helpers import serve
from tests.conftest import ModelFactory
from tests.live_server import ROOT, hare_serve

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = pytest.mark.serial

Server = tuple[str, subprocess.Popen[bytes], Path]


@pytest.fixture(scope="module")
def server(tiny_bundle: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("reliability") / "server.log"
    # A small door (HARE_QUEUE_SIZE), so that a handful of clients overloads it.
    with hare_serve(tiny_bundle("feature-extraction"), log, workers=2, env={"HARE_QUEUE_SIZE": "2"}) as (url, process):
        yield url, process, log


def worker_pids(url: str, tries: int = 40) -> set[int]:
    """The workers that answer, as /info names them (each request on a fresh connection)."""
    return {int(httpx.get(f"{url}/info", timeout=5).json()["pid"]) for _ in range(tries)}


def test_overload_answers_429_with_retry_after_and_never_5xx(server: Server) -> None:
    url, _, _ = server
    heavy = {"inputs": ["word " * 60] * 300}

    def post(_: int) -> httpx.Response:
        return httpx.post(f"{url}/predict", json=heavy, timeout=120)

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(post, range(32)))
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {200, 429} and 429 in statuses and 200 in statuses, statuses
    for refused in (a for a in answers if a.status_code == 429):
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.headers["connection"] == "close"  # a hammering client must reconnect
        assert refused.json()["type"] == "Overloaded"


def test_a_worker_killed_under_load_costs_only_its_requests_and_is_replaced(server: Server) -> None:
    url, process, log = server
    before = worker_pids(url)
    assert len(before) == 2, before
    statuses: list[int] = []
    broken = 0
    stop = threading.Event()

    def client() -> None:
        nonlocal broken
        while not stop.is_set():
            try:
                statuses.append(
                    httpx.post(f"{url}/predict", json={"inputs": ["word " * 30] * 8}, timeout=30).status_code
                )
            except httpx.TransportError:  # the killed worker's in-flight requests
                broken += 1

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not (worker_pids(url, 20) - before):  # a replacement answers
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert process.poll() is None
    assert statuses and set(statuses) <= {200, 429}, statuses  # never a 5xx
    assert broken <= 4  # at most each client's one request in flight on the killed worker
    assert victim not in worker_pids(url)


def test_a_refusing_worker_paces_its_refusals_and_lets_the_rest_wait(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """Greedy clients against a full worker: rather than accept and refuse every connection they make (each
    refusal costs the cores the model needs), it refuses one per HARE_REFUSAL_INTERVAL_MS and leaves the
    others waiting in the listen backlog, to be answered when the queue has room."""
    env = {"HARE_QUEUE_SIZE": "1", "HARE_REFUSAL_INTERVAL_MS": "1000", "HARE_REFUSALS_PER_ANSWER": "0"}
    clients, seconds = 8, 6.0
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "server.log", env=env) as (url, _):
        heavy = {"inputs": ["word " * 60] * 100}

        def greedy(_: int) -> list[int]:
            statuses, deadline = [], time.monotonic() + seconds
            while time.monotonic() < deadline:
                statuses.append(httpx.post(f"{url}/predict", json=heavy, timeout=120).status_code)
                if statuses[-1] == 429:
                    time.sleep(0.01)
            return statuses

        with ThreadPoolExecutor(clients) as pool:
            statuses = [s for one in pool.map(greedy, range(clients)) for s in one]
    assert set(statuses) <= {200, 429}, statuses
    # Connections accepted before the queue filled may each be refused once; after that, one per second.
    # (Without pacing these clients are refused hundreds of times.)
    assert statuses.count(429) <= 2 * (clients + seconds), statuses
    assert statuses.count(200) >= clients, statuses


BUSY_WORKER = """
import sys
from pathlib import Path
from api.engine.cores import CorePool
pool = CorePool(2, Path(sys.argv[1]))
pool.set_queued(1e12)  # hours of queued work
print("busy", flush=True)
sys.stdin.readline()
pool.set_queued(0)
print("idle", flush=True)
sys.stdin.readline()
"""


@pytest.mark.anyio
async def test_a_worker_boots_while_the_machine_is_overloaded(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """A worker that starts (or replaces a dead one) under a flood must come up: its warm-up is not a client
    request to refuse. (Refused, it failed to boot, and gunicorn stopped the whole server.)"""
    argv = [sys.executable, "-c", BUSY_WORKER, str(tmp_path)]  # another worker of the machine, deep in work
    with subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as other:
        assert other.stdin is not None and other.stdout is not None
        assert other.stdout.readline().strip() == "busy"
        async with serve(tiny_bundle("feature-extraction"), HARE_CORE_POOL=str(tmp_path)) as client:
            assert (await client.get("/ready")).status_code == 200
            refused = await client.post("/predict", json={"inputs": "hello"})
            assert refused.status_code == 429, refused.text  # clients are refused while the flood lasts
            other.stdin.write("\n")
            other.stdin.flush()
            assert other.stdout.readline().strip() == "idle"
            assert (await client.post("/predict", json={"inputs": "hello"})).status_code == 200
        other.stdin.write("\n")
        other.stdin.flush()
