"""The threads that call the model, off the event loop, each holding machine cores (api/engine/cores.py) for the
length of its call.

    event loop ── call(items, want, done) ──> job queue ──> model thread: take cores (want, or one; waits
                                                              while none is free) ── run(items, width)
               <── done(rows, error, width, seconds) ──────────  ── release the cores

Leaner than a ThreadPoolExecutor on the hot path: one queue put there, one call_soon_threadsafe back, no
concurrent.futures chaining. `run_here` runs a call on the event loop's own thread instead, for a worker
that serves a single connection (api/engine/batching.py says when): no hand-off at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import time
from collections.abc import Callable, Sequence
from queue import SimpleQueue
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from api.engine.cores import CorePool, Seat

T = TypeVar("T")
Array = NDArray[np.float32]
Rows = Sequence[Array]
# The model call: a batch, the cores granted (its width) and the pooling every item's request allows where the
# model runs (None: token rows) -> one row per item.
Run = Callable[[list[T], int, str | None], Rows]
# Called on the event loop with a call's rows or the error it raised, the width it ran with and its seconds
# on those cores (not counting the wait for them: what the model costs, for the token rate).
Done = Callable[[Rows | None, BaseException | None, int, float], None]
# A warm-up call on the event loop waits this long, looking this often, for its cores to be free together.
WARM_WAIT_S = 2.0
WARM_STEP_S = 0.005


class ModelThreads(Generic[T]):
    """`count` threads taking model calls; with a `pool`, each call first holds its cores. A call goes to the
    free thread of lowest index: a worker that runs one call at a time (under load) always runs it on its first
    thread, whose home core differs from the other workers' first threads', so their calls do not chase each
    other's cores (with one queue for all, a worker's two threads took turns and half its calls started on
    another worker's core: MiniLM at 8 tokens and 16 users, 2 cores of an AMD EPYC, 585 against 656-703 req/s).
    `idle`: the threads run in Linux's SCHED_IDLE class, so the event loop (and anything else of normal
    priority) takes a core from a model call the moment it wakes, instead of waiting for the kernel's next
    time slice (up to 3 ms; HARE_IDLE_PRIORITY, docs/serving.md, The tail)."""

    def __init__(self, run: Run[T], count: int, pool: CorePool | None = None, idle: bool = False) -> None:
        self._run = run
        self._pool = pool
        self._idle = idle and hasattr(os, "sched_setscheduler")
        self._jobs: list[SimpleQueue[tuple[list[T], int, str | None, asyncio.AbstractEventLoop, Done] | None]] = [
            SimpleQueue() for _ in range(count)
        ]
        self._busy = [False] * count  # read and written on the event loop only (call, and the done it wraps)
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"hare-model-{i}", daemon=True) for i in range(count)
        ]
        self._loop_seat: Seat | None = None  # the event loop thread's seat, made at its first run_here
        # CPU seconds the event loop's thread spent inside the model calls it ran (run_here), so that its own
        # work can be told from them (api/web/metrics.py).
        self.loop_model_cpu = 0.0
        for thread in self._threads:
            thread.start()

    def call(self, items: list[T], want: int, done: Done, pooling: str | None = None) -> None:
        """Run the model on `items` on the next free thread with up to `want` cores; `done` then runs on this
        event loop."""
        if self._loop_seat is not None:
            self._loop_seat.unpin()  # no longer alone: the event loop runs anywhere again (see run_here)
        # The batcher never has more calls out than threads; were it to, the extra call waits behind the last.
        i = self._busy.index(False) if False in self._busy else len(self._busy) - 1
        self._busy[i] = True
        self._jobs[i].put((items, want, pooling, asyncio.get_running_loop(), functools.partial(self._back, i, done)))

    def _back(self, i: int, done: Done, rows: Rows | None, error: BaseException | None, width: int, s: float) -> None:
        """A call's answer, on the event loop: its thread is free again, then its `done`."""
        self._busy[i] = False
        done(rows, error, width, s)

    def run_here(
        self, items: list[T], want: int, pooling: str | None = None
    ) -> tuple[Rows | None, BaseException | None, int, float] | None:
        """Run the model on `items` on the calling thread (the event loop's, which waits for it), holding up to
        `want` cores as a model thread would: (rows or None, the error or None, width, seconds on the cores).
        None, without running, when no core is free: the event loop must not wait for another worker's call.

        The event loop's thread stays on the CPUs of its last call until the worker hands a call to the model
        threads again (`call`): a worker alone on its connection runs every call here, on the same core each
        time (its seat tries its home core first), so re-pinning costs nothing, where unpinning after each call
        cost two sched_setaffinity calls a request, each a migration: 34% of the event loop's samples at two
        users on a tiny model (py-spy, AMD EPYC, 2 cores)."""
        seat = self._here()
        width = seat.acquire(want, wait=False) if seat is not None else want
        if not width:
            return None
        return self._run_held(seat, items, width, pooling)

    def _run_held(
        self, seat: Seat | None, items: list[T], width: int, pooling: str | None
    ) -> tuple[Rows | None, BaseException | None, int, float]:
        """`run_here`'s call on the `width` cores `seat` holds (released after), its CPU counted as the loop's
        model time."""
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            return self._run(items, width, pooling), None, width, time.perf_counter() - began
        except Exception as exc:  # handed to the caller's done, as a model thread's error would be
            return None, exc, width, time.perf_counter() - began
        finally:
            self.loop_model_cpu += time.thread_time() - cpu
            if seat is not None:
                seat.release()

    async def warm_here(self, items: list[T], width: int, pooling: str | None = None) -> bool:
        """Run `items` once on the calling thread (the event loop's, at warm-up) on `width` cores, held as
        `run_here` holds them, so that its served calls are not the first of their session on this thread:
        OpenVINO makes a thread's infer request on a compiled copy at its first call there (12 ms), and a
        copy's first call costs 30-40 ms more (MiniLM int8-grouped, AMD EPYC). Waits up to WARM_WAIT_S for that
        many cores (another worker warming up holds one now and then); False, having run nothing, if they never
        came free together (the other worker is serving): its calls are not slowed for a warm-up."""
        seat = self._here()
        deadline = time.monotonic() + WARM_WAIT_S
        while seat is not None and (held := seat.acquire(width, wait=False)) < width:
            if held:
                seat.release()
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(WARM_STEP_S)
        error = self._run_held(seat, items, width, pooling)[1]
        if error is not None:
            raise error
        return True

    def _here(self) -> Seat | None:
        """The event loop thread's seat (None without a pool), made at its first use."""
        if self._loop_seat is None and self._pool is not None:
            self._loop_seat = self._pool.seat(len(self._threads))
        return self._loop_seat

    def stop(self) -> None:
        for jobs in self._jobs:
            jobs.put(None)
        if self._loop_seat is not None:
            self._loop_seat.unpin()
            self._loop_seat.close()
            self._loop_seat = None

    def _serve(self, index: int) -> None:
        if self._idle:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread
        seat = self._pool.seat(index) if self._pool is not None else None
        try:
            while (job := self._jobs[index].get()) is not None:
                items, want, pooling, loop, done = job
                result: Rows | None = None
                error: BaseException | None = None
                width, began = want, time.perf_counter()
                try:  # whatever fails, the call's `done` is called: its requests must not wait for ever
                    if seat is not None:
                        width, began = seat.acquire(want), time.perf_counter()
                    result = self._run(items, width, pooling)
                except BaseException as exc:  # handed to the event loop, which decides
                    error = exc
                finally:
                    if seat is not None:
                        seat.release()
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown): nobody waits
                    loop.call_soon_threadsafe(done, result, error, width, time.perf_counter() - began)
        finally:
            if seat is not None:
                seat.close()
