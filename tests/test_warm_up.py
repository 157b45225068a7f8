"""A worker's warm-up runs what its first served requests will run, whatever the other workers do meanwhile."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from tokenizers import Encoding

from api.engine.backend import Array, Backend
from api.engine.cores import CorePool
from tests.api_helpers import serve
from tests.conftest import ModelFactory

pytestmark = pytest.mark.anyio


async def test_a_worker_warmed_up_beside_a_busy_core_has_run_its_lone_requests_session_on_its_event_loop(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone request runs on the worker's event loop with every core (the fast lane). Two workers warm up at
    once, so one's warm-up requests find a core held by the other's and run on one: its every-core session,
    and its event loop's own calls, first ran on a served request (OpenVINO: the first lone request after
    start 37-42 ms against 5 after it, the default MiniLM, AMD EPYC). Warm-up runs them once on the loop."""
    calls: list[tuple[int, int]] = []
    run = Backend.run

    def recorded(self: Backend, batch: list[Encoding], width: int = 1, pooling: str | None = None) -> list[Array]:
        calls.append((threading.get_ident(), width))
        return run(self, batch, width, pooling)

    monkeypatch.setattr(Backend, "run", recorded)
    other = CorePool(2, tmp_path)  # the other worker's view of the same two cores
    held, leave = threading.Event(), threading.Event()

    def hold_a_core() -> None:  # the other worker's model call, for as long as this one warms up
        seat = other.seat(1)
        seat.acquire(1)
        held.set()
        leave.wait()
        seat.release()
        seat.close()

    holder = threading.Thread(target=hold_a_core)
    holder.start()
    held.wait()
    try:
        env = {"HARE_STREAMS": "1", "HARE_CORES": "2", "HARE_CORE_POOL": str(tmp_path)}
        async with serve(tiny_bundle("feature-extraction"), **env) as client:
            warmed = set(calls)
            leave.set()
            res = client.resources
            assert res.pool is not None and res.backend.widths == (1, 2)
            res.batcher.solo = lambda: True  # one connection, as the worker tells its batcher once it accepts
            while not res.pool.quiet():  # the warm-up's calls found the held core: one core a call for a second
                await asyncio.sleep(0.05)
            calls.clear()
            answer = await client.post("/predict", json={"inputs": "a lone request"})
            assert answer.status_code == 200, answer.text
            assert calls == [(threading.get_ident(), 2)]  # on the event loop, every core
            assert calls[0] in warmed
    finally:
        leave.set()
        holder.join()
        other.close()
