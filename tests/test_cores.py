"""The machine-wide core pool: calls never hold more cores than the pool has, across threads and processes;
a lone call gets every core, a contended one gets one; a killed process leaks none."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from api.engine.cores import CorePool, Seat, forget, slots_for
from api.engine.scheduler import ModelThreads

# Decided by this machine's clock (a race, a pace, a deadline): scripts/check runs these alone, after the rest.
pytestmark = pytest.mark.serial

ROOT = Path(__file__).resolve().parents[1]


def test_a_quiet_machine_grants_every_core_and_a_contended_one_grants_one(tmp_path: Path) -> None:
    pool = CorePool(2, tmp_path)
    wide, other = pool.seat(0), pool.seat(1)
    assert pool.quiet()
    assert wide.acquire(2) == 2
    waited = threading.Event()

    def blocked() -> None:
        assert other.acquire(2) == 1  # no core free: it waits for one, and the machine counts as busy
        waited.set()
        other.release()

    thread = threading.Thread(target=blocked)
    thread.start()
    assert not waited.wait(0.2)  # both cores are held: nothing more runs
    wide.release()
    thread.join(5)
    assert waited.is_set() and not pool.quiet()
    for seat in (wide, other):
        seat.close()
    pool.close()


def test_overlapping_calls_keep_the_machine_busy_so_no_wide_call_stalls_the_other_user(tmp_path: Path) -> None:
    """Two users on two cores: each call gets its own core at once, and the overlap alone marks the machine
    busy, so neither asks for both cores (and makes the other's next request wait for it); alone, a call
    leaves the machine quiet."""
    pool, other = CorePool(2, tmp_path, quiet=60.0), CorePool(2, tmp_path, quiet=60.0)  # two workers' views
    first, second = pool.seat(0), other.seat(1)
    assert first.acquire(1) == 1 and pool.quiet()  # alone: nothing else runs
    first.release()
    assert first.acquire(1) == 1
    assert second.acquire(1) == 1  # granted at once, but another call is running
    assert not pool.quiet() and not other.quiet()
    for seat in (first, second):
        seat.release()
        seat.close()
    pool.close()
    other.close()


def test_a_workers_own_calls_side_by_side_leave_the_machine_quiet(tmp_path: Path) -> None:
    """One worker running one request's calls on both cores at once (api/engine/batching.py, spread) is not
    another user: the machine stays quiet, so its next round spreads again; another worker's call still
    marks it busy."""
    pool = CorePool(2, tmp_path, quiet=60.0)
    first, second = pool.seat(0), pool.seat(1)
    assert first.acquire(1) == 1 and second.acquire(1) == 1
    assert pool.quiet() and pool.held_here() == 2
    second.release()
    other = CorePool(2, tmp_path, quiet=60.0)
    elsewhere = other.seat(1)
    assert elsewhere.acquire(1) == 1  # another worker's call beside this worker's
    assert not pool.quiet()
    for seat in (first, elsewhere):
        seat.release()
    assert pool.held_here() == 0
    for seat in (first, second, elsewhere):
        seat.close()
    pool.close()
    other.close()


def test_a_call_runs_on_the_cpus_of_the_cores_it_holds(tmp_path: Path) -> None:
    """Where cores and CPUs are one to one, a call's thread is pinned to its cores' CPUs: two narrow calls
    never share a CPU while another stands idle."""
    allowed = sorted(os.sched_getaffinity(0))
    pool = CorePool(len(allowed), tmp_path)
    assert pool.cpus == allowed
    seen: list[set[int]] = []

    def call(home: int, want: int) -> None:
        seat = pool.seat(home)
        granted = seat.acquire(want)
        seen.append(os.sched_getaffinity(0))
        assert len(seen[-1]) == granted
        seat.release()
        seat.close()

    for home, want in ((0, 1), (len(allowed) - 1, 1), (0, len(allowed))):
        thread = threading.Thread(target=call, args=(home, want))
        thread.start()
        thread.join(5)
    assert seen[0] != seen[1] or len(allowed) == 1
    assert seen[2] == set(allowed)
    assert os.sched_getaffinity(0) == set(allowed)  # the caller's own thread is untouched
    pool.close()
    more = CorePool(len(allowed) + 1)  # more cores than CPUs (hyper-threads counted apart): the kernel places
    assert more.cpus is None
    more.close()


def test_a_call_whose_cpu_was_taken_from_the_process_runs_where_the_kernel_places_it(tmp_path: Path) -> None:
    """The pool reads the process's CPUs once, at start; a cpuset shrunk under the running server (a CPU
    manager, a hot-unplug) made pinning a call fail (EINVAL), which killed its model thread and left every
    request it held waiting for ever. Now that call runs unpinned."""
    allowed = sorted(os.sched_getaffinity(0))
    pool = CorePool(len(allowed), tmp_path)
    assert pool.cpus is not None
    pool.cpus = [*allowed[:-1], 4095]  # the last core's CPU: no longer one this process may run on
    seen: list[tuple[int, set[int]]] = []

    def call() -> None:
        seat = pool.seat(len(allowed) - 1)
        seen.append((seat.acquire(1), os.sched_getaffinity(0)))
        seat.release()
        seat.close()

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(5)
    assert seen == [(1, set(allowed))]
    pool.close()


def test_a_model_thread_answers_every_call_whatever_fails_before_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batcher's promise (every request's future completed): a call whose cores could not be taken gets
    its error back, and the thread takes the next call."""
    fails = iter([True, False])

    def acquire(self: Seat, want: int, wait: bool = True) -> int:
        if next(fails):
            raise OSError("no core")
        return 1

    monkeypatch.setattr(Seat, "acquire", acquire)
    pool = CorePool(1, tmp_path)

    async def two_calls() -> list[tuple[object, object]]:
        threads: ModelThreads[int] = ModelThreads(lambda items, width, pooling: [np.full(1, i) for i in items], 1, pool)
        answers: list[tuple[object, object]] = []
        answered = asyncio.Event()

        def done(rows: object, error: object, width: int, s: float) -> None:
            answers.append((rows, error))
            answered.set()

        for items in ([1], [2]):
            answered.clear()
            threads.call(items, 1, done)
            await asyncio.wait_for(answered.wait(), 5)
        threads.stop()
        return answers

    (first_rows, first_error), second = asyncio.run(two_calls())
    assert first_rows is None and isinstance(first_error, OSError)
    assert second[1] is None and [r.tolist() for r in second[0]] == [[2]]  # type: ignore[attr-defined]
    pool.close()


def test_a_killed_worker_leaks_no_core_and_its_queue_and_connections_are_forgotten(tmp_path: Path) -> None:
    holder = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from api.engine.cores import CorePool
        pool = CorePool(1, Path({str(tmp_path)!r}))
        pool.set_queued(100)
        print("loading", flush=True)
        sys.stdin.readline()
        pool.set_connections(3)
        seat = pool.seat(0)
        seat.acquire(1)
        print("held", flush=True)
        time.sleep(60)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", holder], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().strip() == "loading"
        pool = CorePool(1, tmp_path)
        pool.set_connections(5)
        # A worker that has not begun accepting (loading its model) takes no connection: none to leave it.
        assert pool.fewest_connections_elsewhere() is None
        process.stdin.write("accepting\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "held"
        pool.set_queued(28)
        assert pool.queued() == 128  # every worker's queue, read from the shared page
        assert pool.fewest_connections_elsewhere() == 3  # the other worker's, not this one's own
        seat = pool.seat(0)
        got = threading.Event()

        def take() -> None:
            seat.acquire(1)
            got.set()

        thread = threading.Thread(target=take)
        thread.start()
        assert not got.wait(0.2)  # the other process holds the only core
        process.kill()  # kill -9: no chance to release
        thread.join(5)
        assert got.is_set()
        forget(tmp_path, process.pid)  # what the gunicorn master does when it reaps a worker
        assert pool.queued() == 28
        assert pool.fewest_connections_elsewhere() is None  # alone now
        seat.release()
        seat.close()
        pool.close()
    finally:
        process.kill()
        process.communicate()  # closes both pipes
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def test_every_worker_of_a_big_server_and_of_its_reload_gets_a_slot(tmp_path: Path) -> None:
    """The page held 64 workers: on a machine of 65 physical cores or more (the default, a worker per core), or
    at a SIGHUP of 33 workers and more (the new ones start beside the old), the next worker's start failed, and
    gunicorn stopped the whole server. 40 workers and their reload's 40: 80 processes, a slot each."""
    workers = 40
    report_r, report_w = os.pipe()  # each child says its slot here, then waits on `release`
    release = os.pipe()
    children = []
    for _ in range(2 * workers):
        pid = os.fork()
        if pid == 0:  # a worker: claims a slot as its app's lifespan does, says which, and holds it
            code = 0
            try:
                pool = CorePool(1, tmp_path, slots=slots_for(workers))
                os.write(report_w, pool._slot.to_bytes(2, "little"))
                os.read(release[0], 1)
            except BaseException:
                os.write(report_w, (65535).to_bytes(2, "little"))
                code = 1
            os._exit(code)
        children.append(pid)
    try:
        slots = [int.from_bytes(os.read(report_r, 2), "little") for _ in children]
    finally:
        os.write(release[1], b"x" * len(children))
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
        for fd in (*release, report_r, report_w):
            os.close(fd)
    assert 65535 not in slots and len(set(slots)) == len(children) and codes == [0] * len(children)
