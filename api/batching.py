"""Dynamic batching in one worker: the sequences of concurrent requests share model calls.

    request ── admit() ──> Ticket ── run(sequences) ──> queue (buckets by length) ──> loop ──> model threads
      429 here if the worker                              │ batches close on max_items, on the
      already holds `capacity`                            │ padded-token budget, or after max_wait
                                                          └─ every request's future: its rows or the error

- Admission control at the door: a worker holds at most `capacity` requests; one more is refused at once
  with Overloaded (HTTP 429 + Retry-After), never left to time out.
- A batch starts from the oldest waiting sequence and fills up with sequences of similar length (buckets of
  `bucket` tokens, nearest first), up to `max_items` and `max_tokens` padded tokens (longest x count); one
  sequence always fits. A request with more sequences than `max_items` simply spans several batches.
- Streams: `streams` model threads call the model at once (one shared ONNX Runtime session, whose run() is
  thread-safe and releases the GIL), each with its own intra-op threads. A batch leaves as soon as a thread
  is free, so with as many users as streams every request runs at once on its own core, and with more users
  batches fill while every thread is busy. Streams matter because keep-alive connections stick to the
  worker process that accepted them, and the kernel often hands several to one worker: with one stream, two
  clients on one worker ran at half the speed of the machine (measured: 2 workers, 2 users).
- Waiting: the loop waits (at most `max_wait` seconds) only when its last free thread is about to take a
  batch and other admitted requests are still being read or tokenized, i.e. when waiting can actually fill
  the batch; a lone request never waits, and neither does one that another free thread could take.
- A request that finds a free thread and no reason to wait goes straight to it from `submit`; the loop task
  starts only what must wait (for a thread, or for company), so the common case costs no task switch.
- The model runs off the event loop. Every request's future gets its rows or the error; a failing batch
  fails only its requests, and the loop goes on. Requests whose caller went away (cancelled) are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from queue import SimpleQueue
from types import TracebackType
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from tasks.errors import HareError, InferenceFailed, NotReady, Overloaded

log = logging.getLogger("hare.batching")

T = TypeVar("T", bound=Sized)
Array = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class BatchStats:
    """One model call: sequences, padded tokens (longest x sequences), real tokens, and seconds."""

    size: int
    padded_tokens: int
    tokens: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Result:
    """A request's rows, in the order it sent its sequences, and where its time went.

    queue_seconds: from submission to the start of its first batch.
    inference_seconds: wall time of the batches that carried its sequences.
    """

    outputs: list[Array]
    queue_seconds: float
    inference_seconds: float


# Called on the event loop with a model call's rows, or with the error it raised.
Done = Callable[[Array | None, BaseException | None], None]


class ModelThreads(Generic[T]):
    """The threads that call the model, off the event loop, all taking jobs from one queue. Leaner than a
    ThreadPoolExecutor on the hot path: one queue put there, one call_soon_threadsafe back, no
    concurrent.futures chaining."""

    def __init__(self, run: Callable[[list[T]], Array], count: int) -> None:
        self._run = run
        self._jobs: SimpleQueue[tuple[list[T], asyncio.AbstractEventLoop, Done] | None] = SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"hare-model-{i}", daemon=True) for i in range(count)
        ]
        for thread in self._threads:
            thread.start()

    def call(self, items: list[T], done: Done) -> None:
        """Run the model on `items` on the next free thread; `done(rows, error)` then runs on this event loop."""
        self._jobs.put((items, asyncio.get_running_loop(), done))

    def submit(self, items: list[T]) -> asyncio.Future[Array]:
        future: asyncio.Future[Array] = asyncio.get_running_loop().create_future()
        self.call(items, functools.partial(_settle, future))
        return future

    def stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            items, loop, done = job
            result: Array | None = None
            error: BaseException | None = None
            try:
                result = self._run(items)
            except BaseException as exc:  # handed to the event loop, which decides
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (shutdown): nobody waits
                loop.call_soon_threadsafe(done, result, error)


def _settle(future: asyncio.Future[Array], result: Array | None, exc: BaseException | None) -> None:
    if future.done():  # the waiter was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)  # type: ignore[arg-type]


class _Job:
    __slots__ = ("future", "inference", "outputs", "remaining", "started", "submitted")

    def __init__(self, future: asyncio.Future[Result], count: int) -> None:
        self.future = future
        self.outputs: list[Array | None] = [None] * count
        self.remaining = count
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self.inference = 0.0


class _Entry(Generic[T]):
    __slots__ = ("index", "item", "job", "length", "order")

    def __init__(self, job: _Job, index: int, item: T, length: int, order: int) -> None:
        self.job, self.index, self.item, self.length, self.order = job, index, item, length, order


class Ticket(Generic[T]):
    """One admitted request's place in the worker. Use as a context manager: leaving it frees the place and,
    if the request is still waiting (its caller went away), withdraws its sequences."""

    __slots__ = ("_batcher", "_job")

    def __init__(self, batcher: Batcher[T]) -> None:
        self._batcher = batcher
        self._job: _Job | None = None

    def __enter__(self) -> Ticket[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._batcher._leave(self._job)

    def submit(self, items: Sequence[T]) -> asyncio.Future[Result]:
        """Queue `items` (sequences); the future gets the model's row for each. Cancelling it withdraws them."""
        if self._job is not None:
            raise RuntimeError("a ticket submits once")
        self._job = self._batcher._submit(items)
        return self._job.future

    async def run(self, items: Sequence[T]) -> Result:
        """Queue `items` and wait for their rows."""
        return await self.submit(items)


class Batcher(Generic[T]):
    """Batches sequences (anything with a length in tokens) for `run`, which maps a list of them to one array
    whose first axis follows the list: [n, labels] or [n, padded_length, dim] (rows are then trimmed back)."""

    def __init__(
        self,
        run: Callable[[list[T]], Array],
        *,
        max_items: int,
        max_tokens: int,
        max_wait: float,
        capacity: int,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        bucket: int = 16,
        streams: int = 1,
    ) -> None:
        self._max_items = max_items
        self._max_tokens = max_tokens
        self._max_wait = max_wait
        self._capacity = capacity
        self._on_batch = on_batch
        self._on_depth = on_depth
        self._bucket = bucket
        self._buckets: dict[int, deque[_Entry[T]]] = {}
        self._pending = 0  # sequences queued (some may belong to cancelled requests)
        self._held = 0  # requests admitted and not yet left
        self._arriving = 0  # admitted requests that have not queued their sequences yet
        self._order = 0
        self._reported = 0  # the depth last reported (reports only on change: each is a metrics write)
        self._model = ModelThreads(run, streams)
        self._streams = streams
        self._running: dict[int, list[_Job]] = {}  # the requests of each batch on the model threads, by number
        self._batches = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._broken = False

    # ---- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="hare-batcher")
        self._task.add_done_callback(self._stopped)

    async def close(self) -> None:
        """Refuse new requests, stop the loop, and fail whatever still waits (NotReady)."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for jobs in self._running.values():  # mid-batch: their requests must not wait for a model that stops
            for job in jobs:
                _fail(job, NotReady("the server is shutting down; retry on another instance"))
        self._running.clear()
        self._fail_pending(NotReady("the server is shutting down; retry on another instance"))
        self._model.stop()

    @property
    def healthy(self) -> bool:
        """Accepting work: neither closed (draining) nor broken."""
        return not self._closed and not self._broken

    @property
    def _idle(self) -> int:
        """Model threads free to take a batch."""
        return self._streams - len(self._running)

    @property
    def broken(self) -> bool:
        """The batching loop died: this worker can never answer again and should be replaced."""
        return self._broken

    @property
    def backlog(self) -> int:
        """Sequences queued for the model (a request that finds more than max_items ahead will wait)."""
        return self._pending

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def held(self) -> int:
        """Requests this worker holds now (admitted, not yet answered)."""
        return self._held

    async def run_direct(self, items: list[T]) -> Array:
        """Run the model on a model thread, bypassing the queue (warm-up, before serving)."""
        return await self._model.submit(items)

    # ---- admission -------------------------------------------------------------------------------------

    def admit(self) -> Ticket[T]:
        """A place for one request, or Overloaded when the worker already holds `capacity` requests."""
        if not self.healthy:
            raise NotReady("the server is shutting down or its model loop stopped; retry shortly")
        if self._held >= self._capacity:
            raise Overloaded(
                f"the server is at capacity ({self._capacity} requests per worker); retry shortly",
                retry_after=1,
            )
        self._held += 1
        self._arriving += 1
        return Ticket(self)

    def _submit(self, items: Sequence[T]) -> _Job:
        self._arriving -= 1
        job = _Job(asyncio.get_running_loop().create_future(), len(items))
        if not items:
            job.started = job.submitted
            job.future.set_result(Result([], 0.0, 0.0))
            return job
        for index, item in enumerate(items):
            length = len(item)
            self._order += 1
            entry = _Entry(job, index, item, length, self._order)
            key = length // self._bucket
            queue = self._buckets.get(key)
            if queue is None:
                queue = self._buckets[key] = deque()
            queue.append(entry)
        self._pending += len(items)
        if self._idle and not self._worth_waiting():
            self._dispatch()  # straight to a free model thread, without a hop through the loop task
        if self._pending:
            self._wake.set()
        return job

    def _leave(self, job: _Job | None) -> None:
        self._held -= 1
        if job is None:
            self._arriving -= 1
        elif not job.future.done():
            job.future.cancel()  # its sequences are skipped when their turn comes

    # ---- the loop --------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Starts what `_submit` could not: batches waiting for a free model thread, and the last free thread's
        batch after it gave late arrivals a moment."""
        while True:
            if not self._pending or not self._idle:
                self._report_depth()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._worth_waiting():
                await self._gather()
            self._dispatch()

    def _worth_waiting(self) -> bool:
        """Whether the last free model thread should give requests still being read or tokenized a moment."""
        return self._max_wait > 0 and self._idle == 1 and self._arriving > 0 and self._pending < self._max_items

    def _dispatch(self) -> None:
        """Start the next batch on a free model thread, if one is free (`_submit` may have taken the last one
        while the loop was gathering)."""
        if not self._idle:
            return
        try:
            batch = self._take()
        except Exception:  # a bug here must not stop serving, nor spin: the waiting requests fail, later ones go on
            log.exception("batching error")
            self._fail_pending(InferenceFailed("the server could not batch this request; see the server log"))
            return
        if not batch:
            return
        self._report_depth()
        jobs = list(dict.fromkeys(e.job for e in batch))
        start = time.perf_counter()
        for job in jobs:
            if job.started is None:
                job.started = start
        self._batches += 1
        self._running[self._batches] = jobs
        done = functools.partial(self._finish, self._batches, batch, jobs, start)
        self._model.call([e.item for e in batch], done)

    def _finish(
        self,
        number: int,
        batch: list[_Entry[T]],
        jobs: list[_Job],
        start: float,
        out: Array | None,
        error: BaseException | None,
    ) -> None:
        """On the event loop when a model thread is done: every request in the batch gets its rows or an error."""
        self._running.pop(number, None)
        if self._pending:
            self._wake.set()
        if error is None:
            try:
                self._deliver(batch, jobs, start, out)
                return
            except Exception as exc:
                error = exc
        log.error("a batch of %d sequences failed: %s", len(batch), error, exc_info=error)
        for job in jobs:
            _fail(job, error)

    async def _gather(self) -> None:
        """Give requests still being read or tokenized a moment to join; perf_counter, not the loop's clock,
        whose resolution (1 ms under uvloop) is coarser than the wait."""
        deadline = time.perf_counter() + self._max_wait
        while self._arriving and self._pending < self._max_items and time.perf_counter() < deadline:
            await asyncio.sleep(0)

    def _take(self) -> list[_Entry[T]]:
        """The next batch: the oldest live sequence, then its nearest-length neighbours within the limits.

        With several model threads free, the waiting sequences are shared among them rather than packed into
        one batch: two requests that arrive together run side by side on two cores, not as a batch of two on
        one while the other idles."""
        first, oldest = None, None
        for key in list(self._buckets):
            queue = self._drop_cancelled(key)
            if queue and (oldest is None or queue[0].order < oldest):
                first, oldest = key, queue[0].order
        if first is None:
            return []
        limit = min(self._max_items, -(-self._pending // max(self._idle, 1)))
        batch: list[_Entry[T]] = []
        longest = 0
        for key in sorted(self._buckets, key=lambda k: (abs(k - first), k)):
            queue = self._buckets[key]
            while queue and len(batch) < limit:
                entry = queue[0]
                if entry.job.future.done():
                    queue.popleft()
                    self._pending -= 1
                    continue
                top = max(longest, entry.length)
                if batch and top * (len(batch) + 1) > self._max_tokens:
                    break
                queue.popleft()
                self._pending -= 1
                batch.append(entry)
                longest = top
            if not queue:
                del self._buckets[key]
            if len(batch) >= limit:
                break
        return batch

    def _drop_cancelled(self, key: int) -> deque[_Entry[T]] | None:
        queue = self._buckets[key]
        while queue and queue[0].job.future.done():
            queue.popleft()
            self._pending -= 1
        if not queue:
            del self._buckets[key]
            return None
        return queue

    def _deliver(self, batch: list[_Entry[T]], jobs: list[_Job], start: float, out: Array | None) -> None:
        if out is None or len(out) != len(batch):
            rows = "no" if out is None else len(out)
            raise InferenceFailed(f"the model returned {rows} rows for {len(batch)} sequences")
        seconds = time.perf_counter() - start
        token_level = out.ndim > 2
        for row, entry in enumerate(batch):
            job = entry.job
            if not job.future.done():
                job.outputs[entry.index] = out[row, : entry.length] if token_level else out[row]
                job.remaining -= 1
        for job in jobs:
            job.inference += seconds
            if job.remaining == 0 and not job.future.done():
                assert job.started is not None
                job.future.set_result(Result(job.outputs, job.started - job.submitted, job.inference))  # type: ignore[arg-type]
        if self._on_batch is not None:
            longest = max(e.length for e in batch)
            stats = BatchStats(len(batch), longest * len(batch), sum(e.length for e in batch), seconds)
            # After the waiting requests' wake-ups, so metrics never delay an answer.
            asyncio.get_running_loop().call_soon(self._on_batch, stats)

    def _report_depth(self) -> None:
        if self._on_depth is not None and self._pending != self._reported:
            self._reported = self._pending
            self._on_depth(self._pending)

    def _fail_pending(self, exc: HareError) -> None:
        for queue in self._buckets.values():
            for entry in queue:
                _fail(entry.job, exc)
        self._buckets.clear()
        self._pending = 0

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        # The loop must never end while serving; if it does, nothing would answer: fail loudly instead.
        self._broken = True
        error = task.exception() if not task.cancelled() else None
        log.critical("the batching loop stopped: %r", error)
        self._fail_pending(InferenceFailed("the server's batching loop stopped; see the server log"))


def _fail(job: _Job, exc: BaseException) -> None:
    if job.future.done():
        return
    if isinstance(exc, HareError):
        error: HareError = type(exc)(exc.message, **exc.details)
    else:
        error = InferenceFailed(f"inference failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    job.future.set_exception(error)
