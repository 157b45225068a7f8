"""The dynamic batcher on its own, with fake model calls: limits, grouping, waiting, failures, cancellation,
admission by count and by expected wait."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from api.config import Settings
from api.engine.batching import BUSY_SECONDS, Batcher, BatchStats, Result
from api.engine.cores import CorePool
from api.engine.errors import NotReady, Overloaded
from api.engine.policy import BatchPolicy
from container.runtime import InferenceFailed
from tasks.errors import InputError

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = [pytest.mark.anyio, pytest.mark.serial]

Calls = list[list[str]]
Rows = list[NDArray[np.float32]]


def echo(calls: Calls) -> Callable[[list[str], int, str | None], Rows]:
    """A model that records each batch and answers each sequence with [its length]."""

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        calls.append(list(batch))
        return [np.array([len(s)], dtype=np.float32) for s in batch]

    return run


def policy(**limits: Any) -> BatchPolicy:
    """The tests' policy: 8 sequences, no token budget to speak of, no waiting, 64 places, one stream."""
    return BatchPolicy(**{"max_items": 8, "max_batch_tokens": 10_000, "capacity": 64} | limits)


def make(run: Callable[[list[str], int, str | None], Rows], **limits: Any) -> Batcher[str]:
    batcher: Batcher[str] = Batcher(run, policy(**limits))
    batcher.start()
    return batcher


def test_the_policy_is_the_settings_batching_knobs_in_seconds() -> None:
    env = {"HARE_MAX_BATCH_SIZE": "4", "HARE_MAX_BATCH_TOKENS": "512", "HARE_MAX_WAIT_MS": "2", "HARE_QUEUE_SIZE": "9"}
    settings = Settings.from_env(env | {"HARE_MAX_QUEUE_MS": "1500", "HARE_STREAMS": "3", "HARE_INLINE_MS": "20"})
    got = BatchPolicy.from_settings(settings)
    assert (got.max_items, got.max_batch_tokens, got.max_wait, got.capacity) == (4, 512, 0.002, 9)
    assert (got.max_queue, got.streams, got.inline_seconds, got.idle_priority) == (1.5, 3, 0.02, False)


async def ask(batcher: Batcher[str], items: list[str]) -> Result:
    with batcher.admit() as ticket:
        return await ticket.run(items)


async def test_a_client_batch_larger_than_max_items_is_split_and_answered_in_order() -> None:
    calls: Calls = []
    batcher = make(echo(calls), max_items=4)
    items = ["x" * n for n in range(1, 11)]
    result = await ask(batcher, items)
    assert [int(row[0]) for row in result.outputs] == list(range(1, 11))
    assert sorted(len(c) for c in calls) == [2, 4, 4]
    await batcher.close()


async def test_a_request_of_no_sequences_is_answered_at_once_without_a_model_call() -> None:
    """A request whose texts all need no model call (none left to run) gets its empty answer, not a wait on a
    batch that never comes; the requests after it run as before."""
    calls: Calls = []
    batcher = make(echo(calls))
    assert (await asyncio.wait_for(ask(batcher, []), 5)).outputs == [] and calls == []
    assert [int(row[0]) for row in (await asyncio.wait_for(ask(batcher, ["ab"]), 5)).outputs] == [2]
    assert batcher.held == 0
    await batcher.close()


async def test_a_batch_closes_on_the_padded_token_budget_but_one_sequence_always_fits() -> None:
    calls: Calls = []
    batcher = make(echo(calls), max_batch_tokens=250)
    await ask(batcher, ["x" * 100] * 5)
    assert [len(c) for c in calls] == [2, 2, 1]  # 3 x 100 padded tokens would exceed 250
    calls.clear()
    await ask(batcher, ["x" * 400])  # longer than the budget on its own: runs alone
    assert [len(c) for c in calls] == [1]
    await batcher.close()


async def test_sequences_of_similar_length_share_batches() -> None:
    calls: Calls = []
    gate = threading.Event()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)  # hold the first batch so that everything else queues up behind it
        return echo(calls)(batch, width, pooling)

    batcher = make(run, max_items=3)
    first = asyncio.ensure_future(ask(batcher, ["warm"]))
    await asyncio.sleep(0.05)
    lengths = [5, 100, 6, 101, 7, 102]
    others = [asyncio.ensure_future(ask(batcher, ["x" * n])) for n in lengths]
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(first, *others)
    grouped = sorted(sorted(len(s) for s in c) for c in calls[1:])
    assert grouped == [[5, 6, 7], [100, 101, 102]]
    await batcher.close()


async def test_a_lone_request_never_waits_for_company() -> None:
    batcher = make(echo([]), max_wait=2.0)
    start = time.perf_counter()
    await ask(batcher, ["alone"])
    assert time.perf_counter() - start < 1.0
    await batcher.close()


async def test_the_batch_waits_for_requests_still_being_tokenized() -> None:
    async def two_requests(max_wait: float) -> Calls:
        calls: Calls = []
        batcher = make(echo(calls), max_wait=max_wait)
        early, late = batcher.admit(), batcher.admit()  # both admitted: one queues now, one "tokenizes" a bit

        async def slow() -> Result:
            with late:
                await asyncio.sleep(0.005)
                return await late.run(["b"])

        with early:
            results = await asyncio.gather(early.run(["a"]), slow())
        assert [r.outputs[0][0] for r in results] == [1.0, 1.0]
        await batcher.close()
        return calls

    assert [len(c) for c in await two_requests(max_wait=0.5)] == [2]
    assert [len(c) for c in await two_requests(max_wait=0.0)] == [1, 1]


async def test_with_two_streams_two_requests_run_side_by_side_not_as_one_batch() -> None:
    calls: Calls = []
    both = threading.Barrier(2, timeout=5)

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        both.wait()  # passes only when two model calls are in flight at once
        return echo(calls)(batch, width, pooling)

    batcher = make(run, streams=2, max_wait=0.5)
    start = time.perf_counter()
    results = await asyncio.gather(ask(batcher, ["a"]), ask(batcher, ["bb"]))
    assert [r.outputs[0][0] for r in results] == [1.0, 2.0]
    assert sorted(len(c) for c in calls) == [1, 1] and time.perf_counter() - start < 2.0
    await batcher.close()


async def test_free_streams_share_the_waiting_sequences() -> None:
    calls: Calls = []
    batcher = make(echo(calls), streams=2, max_items=8)
    result = await ask(batcher, ["x" * n for n in range(1, 9)])
    assert [int(row[0]) for row in result.outputs] == list(range(1, 9))
    assert sorted(len(c) for c in calls) == [4, 4]
    await batcher.close()


async def test_a_failing_batch_fails_its_callers_only_and_the_loop_goes_on() -> None:
    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        if "boom" in batch:
            raise RuntimeError("kernel exploded")
        return echo([])(batch, width, pooling)

    batcher = make(run, max_items=2)
    results = await asyncio.gather(
        ask(batcher, ["boom"]), ask(batcher, ["fine", "boom"]), ask(batcher, ["ok"]), return_exceptions=True
    )
    assert isinstance(results[0], InferenceFailed) and "kernel exploded" in results[0].message
    assert isinstance(results[1], InferenceFailed)
    assert batcher.healthy
    assert (await ask(batcher, ["later"])).outputs[0][0] == 5.0
    await batcher.close()


async def test_a_batching_bug_fails_the_waiting_requests_instead_of_hanging_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batcher = make(echo([]))
    take = batcher._take
    monkeypatch.setattr(batcher, "_take", lambda: (_ for _ in ()).throw(RuntimeError("bug")))
    with pytest.raises(InferenceFailed, match="could not batch"):
        await asyncio.wait_for(ask(batcher, ["x"]), 5)
    monkeypatch.setattr(batcher, "_take", take)
    assert batcher.healthy and batcher.backlog == 0
    assert (await asyncio.wait_for(ask(batcher, ["later"]), 5)).outputs[0][0] == 5.0
    await batcher.close()


async def test_hare_errors_from_the_model_keep_their_type() -> None:
    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        raise InputError("bad feeds")

    batcher = make(run)
    with pytest.raises(InputError, match="bad feeds"):
        await ask(batcher, ["x"])
    await batcher.close()


async def test_a_model_returning_the_wrong_number_of_rows_is_an_inference_failure() -> None:
    batcher = make(lambda batch, width, pooling: [np.zeros(1, dtype=np.float32)] * (len(batch) + 1))
    with pytest.raises(InferenceFailed, match="rows"):
        await ask(batcher, ["x"])
    await batcher.close()


async def test_requests_whose_caller_left_are_skipped() -> None:
    calls: Calls = []
    gate = threading.Event()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)
        return echo(calls)(batch, width, pooling)

    batcher = make(run, max_items=1)
    first = asyncio.ensure_future(ask(batcher, ["first"]))
    await asyncio.sleep(0.05)
    gone = asyncio.ensure_future(ask(batcher, ["gone"]))
    kept = asyncio.ensure_future(ask(batcher, ["kept"]))
    await asyncio.sleep(0.01)
    gone.cancel()
    gate.set()
    await asyncio.gather(first, kept)
    assert calls == [["first"], ["kept"]]
    assert batcher.held == 0 and batcher.backlog == 0
    await batcher.close()


async def test_a_request_whose_caller_left_leaves_no_work_on_the_machines_page(tmp_path: Path) -> None:
    # Its sequences left the queue when their turn came, unpublished: the page kept them as work, so admission
    # (which reads the page) refused every later request, and nothing that could publish ever ran again.
    gate = threading.Event()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)
        return echo([])(batch, width, pooling)

    pool = CorePool(1, tmp_path)
    batcher: Batcher[str] = Batcher(run, policy(max_items=1), pool=pool)
    batcher.start()
    first = asyncio.ensure_future(ask(batcher, ["first"]))
    await asyncio.sleep(0.05)
    gone = asyncio.ensure_future(ask(batcher, ["gone " * 200] * 4))
    await asyncio.sleep(0.01)
    assert pool.queued() >= 4 * 1000  # its four sequences wait behind the first
    gone.cancel()
    gate.set()
    await first
    await asyncio.sleep(0.05)
    assert pool.queued() == 0 and batcher.backlog == 0
    assert batcher.refusal() is None
    await batcher.close()
    pool.close()


async def test_admission_refuses_beyond_capacity_at_once() -> None:
    batcher = make(echo([]), capacity=2)
    with batcher.admit(), batcher.admit():
        with pytest.raises(Overloaded) as refused:
            batcher.admit()
        assert refused.value.details["retry_after"] == 1
    with batcher.admit():  # places are given back on leaving
        pass
    await batcher.close()


@pytest.mark.parametrize("streams", [1, 2])
async def test_closing_fails_waiting_requests_and_refuses_new_ones(streams: int) -> None:
    gate = threading.Event()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)
        return echo([])(batch, width, pooling)

    batcher = make(run, max_items=1, streams=streams)
    running = [asyncio.ensure_future(ask(batcher, [f"running {i}"])) for i in range(streams)]
    await asyncio.sleep(0.05)
    waiting = asyncio.ensure_future(ask(batcher, ["waiting"]))
    await asyncio.sleep(0.01)
    await batcher.close()
    gate.set()
    for caller in (*running, waiting):  # the running batches' requests too: nobody is left waiting
        with pytest.raises(NotReady):
            await caller
    with pytest.raises(NotReady):
        batcher.admit()


async def test_batch_statistics_are_reported() -> None:
    seen: list[BatchStats] = []
    batcher: Batcher[str] = Batcher(echo([]), policy(max_batch_tokens=1000, capacity=8), on_batch=seen.append)
    batcher.start()
    await ask(batcher, ["ab", "abcd"])
    await asyncio.sleep(0)  # statistics are reported after the answers
    assert [(s.size, s.padded_tokens, s.tokens) for s in seen] == [(2, 8, 6)]
    await batcher.close()


async def test_admission_refuses_when_the_queue_would_take_longer_than_its_bound() -> None:
    gate = threading.Event()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)
        time.sleep(0.05)  # 16 padded tokens in 50 ms: a measured rate of about 320 tokens a second
        return echo([])(batch, width, pooling)

    batcher = make(run, max_items=1)
    gate.set()
    await ask(batcher, ["x" * 10])  # one batch measures the rate
    gate.clear()
    waiting = [asyncio.ensure_future(ask(batcher, ["x" * 10])) for _ in range(12)]
    await asyncio.sleep(0.05)
    batcher.admission.max_queue = 0.25
    # 11 sequences of 16 padded tokens queued: at least 0.55 s of work (the rate is at most 320/s), over 0.25 s
    with pytest.raises(Overloaded, match="queue would take") as refused:
        batcher.admit()
    assert int(str(refused.value.details["retry_after"])) >= 1
    batcher.admission.max_queue = 0  # (with the bound, the queue's late requests would be shed: the next test)
    gate.set()
    await asyncio.gather(*waiting)
    with batcher.admit():  # drained: admitted again
        pass
    await batcher.close()


async def test_a_worker_whose_threads_have_cores_of_their_own_is_judged_by_its_own_queue(
    tmp_path: Path,
) -> None:
    """With one model thread a worker on two cores (`--streams 1`, two workers), a worker's queue drains on the
    one core its thread holds, whatever the other worker queued: an idle worker admits while the other's queue
    is far past the bound (judged by the machine's queue it refused too, and under a flood every connection
    stayed on the busy worker while the idle one's core did nothing), and a busy one refuses by its own queue.
    Where the workers' threads share the cores (more threads than cores), the machine's queue decides, as before."""
    gate = threading.Event()
    gate.set()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)
        time.sleep(0.05)  # 16 padded tokens in 50 ms: about 320 tokens a second
        return echo([])(batch, width, pooling)

    other = subprocess.Popen(  # another worker of the machine, with a queue of a million tokens
        [sys.executable, "-c", OTHER_WORKER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "queued"
        pool = CorePool(2, tmp_path)
        alone: Batcher[str] = Batcher(run, policy(streams=1, workers=2, max_items=1, max_queue=0.25), pool=pool)
        alone.start()
        await ask(alone, ["x" * 10])  # one batch measures the rate
        assert pool.queued() >= 1e6  # the machine's queue: hours of work at that rate
        with alone.admit():  # but this worker's thread and its core are free
            pass
        gate.clear()
        alone.admission.max_queue = 0  # (with the bound, the queue's late requests would be refused or shed)
        waiting = [asyncio.ensure_future(ask(alone, ["x" * 10])) for _ in range(12)]
        await asyncio.sleep(0.05)
        alone.admission.max_queue = 0.25
        with pytest.raises(Overloaded, match="queue would take"):  # 11 x 16 tokens: at least 0.55 s of this
            alone.admit()  # worker's own work, past the 0.25 s bound
        alone.admission.max_queue = 0
        gate.set()
        await asyncio.gather(*waiting)
        await alone.close()
        for streams, workers in ((2, 2), (1, 3)):  # threads sharing the cores: judged by the machine's queue
            shared: Batcher[str] = Batcher(
                run, policy(streams=streams, workers=workers, max_items=1, max_queue=0.25), pool=pool
            )
            shared.start()
            await ask(shared, ["x" * 10])
            with pytest.raises(Overloaded, match="queue would take"):
                shared.admit()
            await shared.close()
        pool.close()
    finally:
        other.kill()
        other.communicate()  # reaps it and closes its pipe


# A second worker process holding a slot of the core pool in the folder argv[1], a million tokens queued.
OTHER_WORKER = """
import sys, time
from pathlib import Path
from api.engine.cores import CorePool
pool = CorePool(2, Path(sys.argv[1]))
pool.set_queued(1e6)
print("queued", flush=True)
time.sleep(60)
"""


async def test_the_measured_capacity_follows_the_model_speed_and_the_request_size() -> None:
    """What paces refusals (api/process/worker.py): answers a second the machine gives, unknown (0) before a batch ran,
    then the token rate over the average request's padded tokens."""

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        time.sleep(0.02 * len(batch))  # 16 padded tokens per sequence in 20 ms each: 50 answers a second
        return echo([])(batch, width, pooling)

    batcher = make(run, max_items=1)
    assert batcher.answers_per_second() == 0
    for _ in range(5):
        await ask(batcher, ["x" * 16])
    assert 35 < batcher.answers_per_second() <= 50
    await batcher.close()


async def four_calls_on_two_cores(
    run: Callable[[list[str], int, str | None], Rows], spread: int, quiet: bool, folder: Path
) -> None:
    """One request of four calls through a worker of one stream (and `spread`) on a two-core pool, quiet or
    marked busy (another worker's call overlapped one); each call's answer checked."""
    pool = CorePool(2, folder, quiet=60.0)
    if not quiet:
        pool.contended()
    batcher: Batcher[str] = Batcher(run, policy(max_items=1, streams=1, spread=spread), pool=pool, widths=(1, 2))
    batcher.start()
    result = await ask(batcher, ["x" * n for n in range(1, 5)])
    assert [int(row[0]) for row in result.outputs] == [1, 2, 3, 4]
    await batcher.close()
    pool.close()


@pytest.mark.parametrize("quiet", [True, False])
async def test_a_request_of_several_calls_alone_on_the_machine_runs_them_on_every_core(
    tmp_path: Path, quiet: bool
) -> None:
    """One client's request of four calls, a worker of one stream on two cores: on a quiet machine its calls
    run two at a time (before, one at a time: half the machine idle while one client waited); once another
    worker's call overlapped one (the machine is busy), one at a time again, as under load."""
    running, most = 0, 0
    lock = threading.Lock()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return echo([])(batch, width, pooling)

    await four_calls_on_two_cores(run, spread=2, quiet=quiet, folder=tmp_path)
    assert most == (2 if quiet else 1)


@pytest.mark.parametrize("quiet", [True, False])
async def test_a_worker_that_cannot_spread_runs_a_requests_calls_on_every_core_one_after_the_other(
    tmp_path: Path, quiet: bool
) -> None:
    """OpenVINO's workers keep their one stream (a model copy per calling thread, api/web/app.py): a request of
    four calls alone on a quiet machine asks every core for each call (before, each ran on one core and the other
    stayed idle); on a busy machine, one core each."""
    widths: list[int] = []

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        widths.append(width)
        return echo([])(batch, width, pooling)

    await four_calls_on_two_cores(run, spread=1, quiet=quiet, folder=tmp_path)
    assert widths == [2 if quiet else 1] * 4


async def test_waiting_for_a_core_does_not_count_as_model_time(tmp_path: Path) -> None:
    """Two streams sharing one core: each call waits for the other's, but the measured capacity (admission's
    token rate, the refusal pace) is what the core does, not half of it."""

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        time.sleep(0.02)  # one sequence of 16 padded tokens in 20 ms: 50 answers a second on the one core
        return echo([])(batch, width, pooling)

    pool = CorePool(1, tmp_path)
    batcher: Batcher[str] = Batcher(run, policy(max_items=1, streams=2), pool=pool)
    batcher.start()
    await asyncio.gather(*(ask(batcher, ["x" * 16]) for _ in range(12)))
    assert 35 < batcher.answers_per_second() <= 50  # 25 if the wait for the core were counted
    await batcher.close()
    pool.close()


async def test_a_request_that_waited_past_the_bound_is_refused_not_run() -> None:
    """Admission's estimate can be wrong (the machine slowed down): a request still waiting for the model
    after the bound gets its 429 when its turn comes, and the model's time goes to the ones behind it."""
    gate = threading.Event()
    calls: Calls = []

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        gate.wait(5)
        return echo(calls)(batch, width, pooling)

    batcher = make(run, max_items=1, max_queue=0.2)
    first = asyncio.ensure_future(ask(batcher, ["first"]))  # on the model, held there by the gate
    late = [asyncio.ensure_future(ask(batcher, [f"late {i}"])) for i in range(3)]
    await asyncio.sleep(0.4)  # they wait past the bound
    fresh = asyncio.ensure_future(ask(batcher, ["fresh"]))
    await asyncio.sleep(0)
    gate.set()
    assert (await first).outputs and (await fresh).outputs
    for refused in late:
        with pytest.raises(Overloaded, match="waited") as exc:
            await refused
        assert int(str(exc.value.details["retry_after"])) >= 1
    assert calls == [["first"], ["fresh"]]  # the late ones never reached the model
    await batcher.close()


async def test_the_idle_hook_runs_once_after_a_quiet_spell_not_while_busy() -> None:
    """The backend gives a burst's memory back when the worker has had no batch for `idle_after` seconds."""
    idle = threading.Event()
    calls: Calls = []
    batcher: Batcher[str] = Batcher(
        echo(calls), policy(max_batch_tokens=1000, capacity=8, idle_after=0.5), on_idle=idle.set
    )
    batcher.start()
    for _ in range(5):  # busy: requests 50 ms apart keep putting the hook off
        await ask(batcher, ["abc"])
        await asyncio.sleep(0.05)
    assert not idle.is_set()
    await asyncio.to_thread(idle.wait, 5)
    assert idle.is_set()
    idle.clear()
    await asyncio.sleep(1.0)
    assert not idle.is_set()  # once per quiet spell
    await batcher.close()


async def test_a_worker_alone_on_one_connection_runs_short_calls_on_its_event_loop(tmp_path: Path) -> None:
    """Its one client waits for this answer anyway: a short call runs on the loop's own thread, with no hand-off
    to a model thread and back. Not before the rate is measured, not for a call expected to run long (the
    worker's health and metrics answers would wait), not while another call holds every core, and while the
    worker has other connections only a call expected under BUSY_SECONDS (the test of several connections).
    The loop's thread stays on the CPU of the core its call held while it runs calls itself, and runs on every
    CPU again once a call goes to a model thread (or the batcher closes)."""
    threads: list[int] = []

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        threads.append(threading.get_ident())
        time.sleep(0.002)  # 16 padded tokens in 2 ms: a 1000-token sequence is expected to take 125 ms
        if batch[0] == "fail":
            raise InputError("the model refused this")
        return echo([])(batch, width, pooling)

    cpus = os.sched_getaffinity(0)
    try:
        await _alone_on_one_connection(run, threads, cpus, tmp_path)
    finally:
        os.sched_setaffinity(0, cpus)  # this thread runs the rest of the suite, whatever happened


async def _alone_on_one_connection(
    run: Callable[[list[str], int, str | None], Rows], threads: list[int], cpus: set[int], tmp_path: Path
) -> None:
    pool = CorePool(len(cpus), tmp_path)  # cores = CPUs: calls are pinned to the cores they hold
    batcher: Batcher[str] = Batcher(run, policy(streams=2, inline_seconds=0.05), pool=pool)
    batcher.start()
    alone = True
    batcher.solo = lambda: alone
    loop = threading.get_ident()

    await ask(batcher, ["x" * 16])  # no rate measured yet
    assert threads[-1] != loop
    result = await ask(batcher, ["y" * 15])
    assert threads[-1] == loop and [float(r[0]) for r in result.outputs] == [15.0]
    pinned = os.sched_getaffinity(0)
    assert len(pinned) == 1 or len(cpus) == 1, pinned  # the CPU of the one core it held
    with pytest.raises(InputError, match="refused"):
        await ask(batcher, ["fail"])
    assert threads[-1] == loop
    assert os.sched_getaffinity(0) == pinned  # the same core again: no affinity call
    await ask(batcher, ["x" * 1000])  # expected 125 ms at the measured rate
    assert threads[-1] != loop
    assert os.sched_getaffinity(0) == cpus
    other = pool.seat(9)  # another worker's call holds every core: the loop must not wait for it
    other.acquire(len(cpus))
    waiting = asyncio.ensure_future(ask(batcher, ["x" * 16]))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # a model thread waits for a core, the loop goes on
    other.release()
    await waiting
    assert threads[-1] != loop
    other.close()
    alone = False  # with other connections, only a call expected under BUSY_SECONDS runs on the loop
    await ask(batcher, ["x" * math.ceil(batcher.admission.rate * BUSY_SECONDS * 2)])
    assert threads[-1] != loop
    await batcher.close()
    assert os.sched_getaffinity(0) == cpus
    pool.close()


async def test_a_call_on_the_event_loop_is_published_and_measured_like_any_batch(tmp_path: Path) -> None:
    """A worker alone on its connection runs a lone request's call on its event loop, past the queue; the machine
    still sees it: other workers' admission reads its padded tokens on the shared page while it runs (and none
    after), and its batch reaches the token rate and the metrics."""
    seen: list[float] = []
    threads: list[int] = []
    stats: list[BatchStats] = []
    pool = CorePool(1, tmp_path)

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        seen.append(pool.queued())
        threads.append(threading.get_ident())
        return echo([])(batch, width, pooling)

    batcher: Batcher[str] = Batcher(run, policy(inline_seconds=10.0), pool=pool, on_batch=stats.append)
    batcher.start()
    batcher.solo = lambda: True
    await ask(batcher, ["x" * 16])  # no rate measured yet: a model thread
    rate = batcher.admission.rate
    result = await ask(batcher, ["y" * 12, "z" * 7])
    assert threads[-1] == threading.get_ident()  # on the loop
    assert [float(r[0]) for r in result.outputs] == [12.0, 7.0]
    assert seen[-1] == 24  # its padded tokens (2 x 12), on the page while it ran
    assert pool.queued() == 0 and batcher.held == 0 and batcher.backlog == 0
    await asyncio.sleep(0)  # the metrics come after the answers' wake-ups
    assert (stats[-1].size, stats[-1].padded_tokens, stats[-1].tokens) == (2, 24, 19)
    assert batcher.admission.rate != rate
    await batcher.close()
    pool.close()


async def test_a_request_of_several_calls_runs_them_side_by_side_even_alone_on_its_connection() -> None:
    """Alone on its connection, a worker runs a one-call request on its event loop; a request of several calls
    (more texts than the batch budget holds) goes to the model threads, which run its calls at once. On the loop
    they ran one after the other: 32 texts of 128 tokens took one of two cores. Where the whole request is
    expected to take well under a millisecond, the hand-offs would cost more: it stays on the loop."""
    threads: list[int] = []
    running, most = 0, 0
    lock = threading.Lock()
    pause = 0.0

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        threads.append(threading.get_ident())
        if pause:
            time.sleep(pause)
        with lock:
            running -= 1
        return echo([])(batch, width, pooling)

    batcher: Batcher[str] = Batcher(run, policy(streams=2, inline_seconds=10.0, max_batch_tokens=16))
    batcher.start()
    batcher.solo = lambda: True
    loop = threading.get_ident()
    for _ in range(10):
        await ask(batcher, ["x" * 16])  # a model of microseconds: the measured rate
    threads.clear()
    await ask(batcher, ["x" * 16, "y" * 15, "z" * 14, "w" * 13])
    assert threads == [loop] * 4  # four calls expected to take microseconds in all: on the loop
    pause = 0.02  # 16 tokens in 20 ms from now on
    for _ in range(40):  # the rate's moving average forgets the fast calls (0.8 ** 40: 1e-4 of their weight)
        await ask(batcher, ["x" * 16])
    assert threads[-1] == loop  # one call: on the loop
    threads.clear()
    result = await ask(batcher, ["x" * 16, "y" * 15, "z" * 14, "w" * 13])
    assert [float(r[0]) for r in result.outputs] == [16.0, 15.0, 14.0, 13.0]
    assert len(threads) == 4 and loop not in threads and most == 2
    await batcher.close()


async def test_with_several_connections_a_short_call_runs_on_the_loop_with_the_requests_of_its_turn(
    tmp_path: Path,
) -> None:
    """A worker with many connections and a model of microseconds (a tiny classifier) runs each call on its event
    loop too, where the two thread hand-offs cost more than the call; the requests read in the same turn of the
    loop join it first. A call expected to take longer than BUSY_SECONDS (a real model's) goes to a model
    thread, so the loop reads and tokenizes the next requests meanwhile; HARE_INLINE_MS=0, a GPU (no core pool)
    or the shared engine keeps every call off the loop."""
    threads: list[int] = []
    calls: Calls = []
    pause = 0.0

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        threads.append(threading.get_ident())
        if pause:
            time.sleep(pause)
        return echo(calls)(batch, width, pooling)

    async def turn(batcher: Batcher[str]) -> list[Result]:
        return list(await asyncio.gather(*(ask(batcher, [c * 8]) for c in "abcd")))

    loop = threading.get_ident()
    cpus = os.sched_getaffinity(0)
    pool = CorePool(1, tmp_path)
    batcher: Batcher[str] = Batcher(run, policy(streams=2, inline_seconds=0.05), pool=pool)
    batcher.start()
    batcher.solo = lambda: False
    await ask(batcher, ["x" * 16])  # no rate measured yet: a model thread
    assert threads == [threads[0]] and threads[0] != loop
    for _ in range(5):  # the first call's time includes the thread's start: a few more measure the model
        await ask(batcher, ["x" * 16])
    calls.clear()
    results = await turn(batcher)
    assert calls == [["a" * 8, "b" * 8, "c" * 8, "d" * 8]] and threads[-1] == loop
    assert [float(r.outputs[0][0]) for r in results] == [8.0] * 4
    pause = 0.01  # 8 tokens in 10 ms from now on
    for _ in range(40):  # the rate's moving average forgets the fast calls
        await ask(batcher, ["x" * 8])
    threads.clear()
    await turn(batcher)
    assert threads and loop not in threads
    await batcher.close()

    pause = 0.0
    threads.clear()
    # HARE_INLINE_MS=0; no core pool (a GPU); the shared engine's calls (the loop would wait on its socket)
    for pooled, inline, remote in ((pool, 0.0, False), (None, 0.05, False), (pool, 0.05, True)):
        threads.clear()
        off: Batcher[str] = Batcher(run, policy(streams=2, inline_seconds=inline), pool=pooled, remote=remote)
        off.start()
        off.solo = lambda: False
        for _ in range(3):
            await turn(off)
        assert threads and loop not in threads
        await off.close()
    pool.close()
    os.sched_setaffinity(0, cpus)  # on a one-CPU machine the loop's calls were pinned to it


async def test_a_call_pools_as_its_requests_allow_only_when_they_all_allow_the_same() -> None:
    """The shared engine sends a vector per sequence only for a call whose requests all pool alike: one that
    wants token states (or another pooling) makes the whole call token states, pooled later by each request."""
    seen: list[tuple[list[str], str | None]] = []
    gate = threading.Event()

    def run(batch: list[str], width: int = 1, pooling: str | None = None) -> Rows:
        seen.append((list(batch), pooling))
        gate.wait(10)  # the model busy: what arrives meanwhile queues into one call
        return echo([])(batch, width, pooling)

    batcher = make(run, max_items=8)

    async def send(item: str, pool: str | None) -> Result:
        with batcher.admit() as ticket:
            return await ticket.submit([item], pool)

    for pools in (["mean", "mean"], ["mean", None], ["max", "cls"]):
        gate.clear()
        first = asyncio.ensure_future(send("lead", pools[0]))
        while not seen or seen[-1][0] != ["lead"]:
            await asyncio.sleep(0.005)
        rest = [asyncio.ensure_future(send(f"x{i}", p)) for i, p in enumerate(pools)]
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(first, *rest)
        assert seen[-2] == (["lead"], pools[0])  # alone, as its request asks
        assert seen[-1] == (["x0", "x1"], pools[0] if pools[0] == pools[1] else None)
    await batcher.close()
