"""A worker's warm-up runs what its first served requests will run, whatever the other workers do meanwhile."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Encoding

from api.engine import scheduler
from api.engine.backend import Array, Backend
from api.engine.cores import CorePool
from tests.api_helpers import serve
from tests.conftest import ModelFactory

pytestmark = pytest.mark.anyio


class OtherWorker:
    """Another worker's model call on one of the two cores, held from the start until `leave` is set."""

    def __init__(self, folder: Path) -> None:
        self._pool = CorePool(2, folder)  # the other worker's view of the same two cores
        self._held, self.leave = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold)
        self._thread.start()
        self._held.wait()

    def _hold(self) -> None:
        seat = self._pool.seat(1)
        seat.acquire(1)
        self._held.set()
        self.leave.wait()
        seat.release()
        seat.close()

    def close(self) -> None:
        self.leave.set()
        self._thread.join()
        self._pool.close()


def record_calls(
    monkeypatch: pytest.MonkeyPatch, on_call: Callable[[int, int], None] = lambda t, w: None
) -> list[tuple[int, int]]:
    """Every model call's (thread, width), as the backend is asked for it."""
    calls: list[tuple[int, int]] = []
    run = Backend.run

    def recorded(self: Backend, batch: list[Encoding], width: int = 1, pooling: str | None = None) -> list[Array]:
        calls.append((threading.get_ident(), width))
        on_call(threading.get_ident(), width)
        return run(self, batch, width, pooling)

    monkeypatch.setattr(Backend, "run", recorded)
    return calls


ENV = {"HARE_STREAMS": "1", "HARE_CORES": "2"}


async def test_a_worker_warmed_up_beside_a_busy_core_has_run_its_lone_requests_session_on_its_event_loop(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone request runs on the worker's event loop with every core (the fast lane). Two workers warm up at
    once, so one's warm-up requests find a core held by the other's and run on one: its every-core session
    first ran on a served request, on a thread that had never called it (OpenVINO: the first lone request after
    start 37-42 ms against 5 after it, the default MiniLM, AMD EPYC). Warm-up runs it once on the loop,
    waiting for the cores to be free together (here: the other worker's call ends with this one's first)."""
    other = OtherWorker(tmp_path)
    loop = threading.get_ident()
    calls = record_calls(monkeypatch, lambda thread, width: other.leave.set())
    try:
        async with serve(tiny_bundle("feature-extraction"), **ENV, HARE_CORE_POOL=str(tmp_path)) as client:
            warmed = set(calls)
            res = client.resources
            assert res.pool is not None and res.backend.widths == (1, 2)
            res.batcher.solo = lambda: True  # one connection, as the worker tells its batcher once it accepts
            while not res.pool.quiet():  # the warm-up's calls found the held core: one core a call for a second
                await asyncio.sleep(0.05)
            calls.clear()
            answer = await client.post("/predict", json={"inputs": "a lone request"})
            assert answer.status_code == 200, answer.text
            assert calls == [(loop, 2)]  # on the event loop, every core
            assert calls[0] in warmed
    finally:
        other.close()


async def test_a_worker_warming_up_beside_a_serving_worker_takes_no_core_it_holds(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that replaces another while the rest serve waits a bounded time for every core on its event
    loop's warm-up call, then leaves that call to its first lone request: its warm-up never runs more threads
    than the cores the others leave it, and it still gets ready."""
    monkeypatch.setattr(scheduler, "WARM_WAIT_S", 0.2)
    other = OtherWorker(tmp_path)
    calls = record_calls(monkeypatch)
    try:
        async with serve(tiny_bundle("feature-extraction"), **ENV, HARE_CORE_POOL=str(tmp_path)) as client:
            assert client.resources.ready
            assert calls and all(width == 1 for _, width in calls)
            assert "left to the first lone request" in caplog.text
    finally:
        other.close()
