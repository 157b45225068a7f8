"""Dynamic batching in one worker: the sequences of concurrent requests share model calls.

    request ── admit() ──> Ticket ── run(sequences) ──> LengthQueue ──> dispatch ──> ModelThreads ──> cores
      429 here when the machine's    (api/engine/lengthqueue.py)   │ batches close on max_items, on the
      queue would take too long                                    │ padded-token budget, or after max_wait
      (api/engine/admission.py)                                    └─ every request's future: its rows or the error

- Streams: `streams` model threads per worker (api/engine/scheduler.py), each holding machine-wide cores for
  its call (api/engine/cores.py), so all workers together never run more ORT threads than there are cores. A
  call asks for every core while the machine is quiet (a lone request) and for one under load.
- A batch leaves as soon as a model thread is free; with several free, the waiting sequences are shared
  among them: two requests that arrive together run side by side, not as a batch of two on one core.
- Waiting: the last free thread waits (at most `max_wait` seconds) only while other admitted requests are
  still being read or tokenized, i.e. when waiting can fill the batch; a lone request never waits.
- A request that finds a free thread and no reason to wait goes straight to it from `enqueue`; the loop task
  starts only what must wait (for a thread, or for company), so the common case costs no task switch.
- Every request's future gets its rows or the error; a failing batch fails only its requests, and the loop
  goes on. Requests whose caller went away (cancelled) are skipped.
- Alone on a connection: a worker that serves one connection runs a short call (expected under
  `inline_seconds` at the measured token rate) on the event loop itself. Nothing else can reach this worker
  while it runs (its only client waits for this answer; new connections go to other workers), and the answer
  leaves without the two thread hand-offs, each a wake-up that waits for a core while the other user's call
  runs (p99 at users = cores and 8 tokens: 7.3-9.8 ms through the threads, 5.3-5.7 ms here). When no core
  is free, the call goes to a model thread as usual: the loop never waits for another worker's call. A lone
  request that finds nothing queued or running takes the fast lane: its one call runs from `enqueue`, past
  the queue (`_alone`).
- Many connections, a quick model on this process's CPU cores: a call expected under BUSY_SECONDS (what is
  queued, at the measured rate) runs on the event loop too, with every request read in the same turn of the
  loop (`enqueue` leaves such a dispatch to the loop task, which runs after them). For a model of microseconds
  the hand-offs to a model thread and back cost more than the call (tiny classifier, 64 connections, 2 cores
  of an AMX Xeon: 7,200-7,400 req/s through the threads, 11,500 here); a real model's call is longer and keeps
  the threads, so the loop reads and tokenizes the next requests while it runs.
- Shedding by age: a request still waiting for its first batch after the admission bound (`max_queue`) is
  refused (429 with Retry-After) when its turn comes rather than run: admission's estimate was wrong (the
  machine slowed down), and its answer would come later than the bound promised. Waiting costs no core, so
  the model stays busy with the requests behind it.

Over 400 lines, and one module on purpose: the queue, the batches on the model and the work published to the
machine's page are one state that every method of `Batcher` reads and changes, and its promises (every future
completed, the published work equal to what is queued, arriving and running) hold only if they change together.
The parts that stand alone are their own modules (lengthqueue.py, scheduler.py, admission.py, policy.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

from api.engine.admission import Admission, Ticket
from api.engine.cores import CorePool
from api.engine.errors import NotReady, Overloaded
from api.engine.lengthqueue import Entry, Job, LengthQueue, Result, common_pooling
from api.engine.policy import BatchPolicy
from api.engine.scheduler import ModelThreads, Rows, Run
from container.runtime import InferenceFailed
from tasks.errors import HareError

__all__ = ["BatchStats", "Batcher", "Result", "Ticket"]

log = logging.getLogger("hare.batching")
# Queued work (beyond the batch at hand) that a worker alone on its connection still runs on its event loop, in
# seconds at the measured rate: below it, two thread hand-offs cost more than running side by side saves (4
# three-word texts a request on a tiny classifier, one client, AMX Xeon: 1,106-1,116 req/s through the model
# threads, 1,339-1,413 on the loop; DistilBERT at 8 tokens: 274-293 through the threads, 119-123 on the loop).
SPLIT_SECONDS = 0.0005
# The longest call a worker with several connections runs on its event loop (above, see the module's docstring):
# its answers and the requests behind it wait that long at most, about what two thread hand-offs cost under load.
BUSY_SECONDS = 0.001

T = TypeVar("T", bound=Sized)


@dataclass(frozen=True, slots=True)
class BatchStats:
    """One model call: sequences, padded tokens (longest x sequences), real tokens, seconds on its cores (the
    wait for them not counted), cores used."""

    size: int
    padded_tokens: int
    tokens: int
    seconds: float
    width: int = 1


class Batcher(Generic[T]):
    """Batches sequences (anything with a length in tokens) for `run(batch, width)`, which returns one row
    (array) per sequence, computed on `width` cores, within `policy` (its limits, streams and bounds).

    widths: the core counts `run` offers (the backend's session widths); the widest is asked for while the
    machine is quiet. pool: the machine's cores shared with other workers (None: no core accounting).
    on_batch, on_depth: told each batch's statistics and the queue's depth (metrics).
    on_idle: called in a thread once no batch has run for `policy.idle_after` seconds (the backend trims its
    memory). remote: `run` sends the call to another process (the shared engine, api/engine/remote.py) and waits
    for its answer: a worker with several connections then keeps its calls off the event loop, as on a GPU."""

    def __init__(
        self,
        run: Run[T],
        policy: BatchPolicy,
        *,
        pool: CorePool | None = None,
        widths: Sequence[int] = (1,),
        on_batch: Callable[[BatchStats], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        on_idle: Callable[[], None] | None = None,
        remote: bool = False,
    ) -> None:
        self.policy = policy
        self._remote = remote
        # The knobs read on every request, as attributes of their own.
        self._max_items = policy.max_items
        self._max_batch_tokens = policy.max_batch_tokens
        self._max_wait = policy.max_wait
        self._on_batch = on_batch
        self._on_depth = on_depth
        self._on_idle = on_idle
        self._idle_after = policy.idle_after
        self._idle_timer: asyncio.TimerHandle | None = None
        self._last_finish = 0.0  # when the last batch came back (the idle timer re-arms until idle_after since)
        self._queue: LengthQueue[T] = LengthQueue(policy.bucket)
        self._pool = pool
        self._narrow, self._wide = min(widths), max(widths)
        cores = pool.cores if pool else policy.streams * self._narrow
        # Threads with cores of their own (every worker's threads together within the cores) drain this worker's
        # queue alone: its own work is its wait (api/engine/admission.py).
        reach = policy.streams * self._narrow
        owned = reach if policy.workers * reach <= cores else 0
        self.admission = Admission(policy.capacity, policy.max_queue, cores, pool, owned)
        self._held = 0  # requests admitted and not yet left
        self._arriving = 0  # admitted requests that have not queued their sequences yet
        self._reported = 0  # the depth last reported (reports only on change: each is a metrics write)
        self._streams = policy.streams
        # A worker alone on a quiet machine runs a request of several calls side by side on every core (the
        # shared engine and a GPU keep their streams: neither holds this machine's cores).
        self._spread = max(policy.spread, policy.streams) if pool is not None and not remote else policy.streams
        self._model = ModelThreads(run, self._spread, pool, policy.idle_priority)
        self._queued_wide = self._wide > self._narrow and self._spread * self._narrow < cores
        self._inline_seconds = policy.inline_seconds
        # Whether this worker serves exactly one connection now (set by the server that knows; None: never).
        self.solo: Callable[[], bool] | None = None
        self._running: dict[int, list[Job]] = {}  # the requests of each batch on the model threads, by number
        self._running_tokens = 0  # padded tokens of the batches on the model threads
        self._request_tokens = 0.0  # padded tokens per request, a moving average (for requests still arriving)
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
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for jobs in self._running.values():  # mid-batch: their requests must not wait for a model that stops
            for job in jobs:
                _fail(job, NotReady("the server is shutting down; retry on another instance"))
        self._running.clear()
        self._fail_pending(NotReady("the server is shutting down; retry on another instance"))
        self._model.stop()

    async def warm_here(self, items: Sequence[T], pooling: str | None = None) -> bool:
        """Run `items` on the event loop's own thread on every core, as the fast lane runs a lone request
        (warm-up only: ModelThreads.warm_here); False if the cores never came free together. The loop's
        one-core calls are left to serving: warmed here as well, 8-token requests at two users answered 7%
        fewer (503 req/s against 542 without any, 15 pairs of runs, 12 of them lower; AMD EPYC; cause not
        found); with the wide call alone, 487 against 480 (5 pairs)."""
        if self._wide == self._narrow:
            return True
        return await self._model.warm_here(list(items), self._wide, pooling)

    @property
    def healthy(self) -> bool:
        """Accepting work: neither closed (draining) nor broken."""
        return not self._closed and not self._broken

    @property
    def _idle(self) -> int:
        """Model threads free to take a batch: of the worker's streams, or of its `spread` while no other
        process's call overlapped one of the machine's lately (api/engine/cores.py, CorePool.quiet)."""
        reach = self._spread if self._spread > self._streams and self._pool and self._pool.quiet() else self._streams
        return max(0, reach - len(self._running))

    @property
    def broken(self) -> bool:
        """The batching loop died: this worker can never answer again and should be replaced."""
        return self._broken

    @property
    def loop_model_cpu(self) -> float:
        """CPU seconds the event loop's thread has spent in model calls it ran itself (the fast lane, quick calls)."""
        return self._model.loop_model_cpu

    @property
    def backlog(self) -> int:
        """Sequences queued for the model (a request that finds more than max_items ahead will wait)."""
        return self._queue.pending

    @property
    def max_items(self) -> int:
        return self._max_items

    @property
    def held(self) -> int:
        """Requests this worker holds now (admitted, not yet answered)."""
        return self._held

    # ---- admission -------------------------------------------------------------------------------------

    def admit(self, checked: bool = True) -> Ticket[T]:
        """A place for one request, or Overloaded (429 + Retry-After) when the worker holds `capacity`
        requests or the machine's queue is expected to take longer than `max_queue`. `checked=False` skips
        those bounds, for the worker's own warm-up: a worker that boots (or replaces a dead one) while the
        machine is overloaded must still come up; refusing its warm-up would fail the boot and make gunicorn
        stop the whole server."""
        if not self.healthy:
            raise NotReady("the server is shutting down or its model loop stopped; retry shortly")
        if checked:
            self.admission.check(self._held, self._work())
        self._held += 1
        self._arriving += 1
        self._publish()
        return Ticket(self)

    def refusal(self) -> Overloaded | None:
        """The refusal admit() would raise now, without admitting (the early check before routing)."""
        try:
            self.admission.check(self._held, self._work())
        except Overloaded as exc:
            return exc
        return None

    def answers_per_second(self) -> float:
        """The machine's measured capacity: requests a second at the measured token rate and the average
        request's padded tokens (0 until a batch was measured)."""
        if self.admission.rate <= 0 or self._request_tokens <= 0:
            return 0.0
        return self.admission.rate * self.admission.cores / self._request_tokens

    def enqueue(self, items: Sequence[T], pooling: str | None = None) -> Job:
        """Queue an admitted request's sequences (its ticket's way in: Ticket.submit calls this, once)."""
        self._arriving -= 1
        job = Job(asyncio.get_running_loop().create_future(), len(items), pooling)
        if not items:
            job.started = job.submitted
            job.future.set_result(Result([], 0.0, 0.0))
            return job
        if not self._running and not self._queue.pending and self._alone(job, items):
            return job
        before = self._queue.tokens
        self._queue.put(job, items)
        self._sized(self._queue.tokens - before)
        self._publish()
        if self._idle and not self._worth_waiting() and not self._loop_runs_queue():
            self._dispatch()  # straight to a free model thread, without a hop through the loop task
        if self._queue.pending:
            self._wake.set()
        return job

    def _alone(self, job: Job, items: Sequence[T]) -> bool:
        """The fast lane of a worker alone on its connection: a request that finds nothing queued or running and
        makes one short call runs it here, on the event loop, past the queue (no entries, no batch to take, one
        write of the shared page each way), and its future is done on return. False, having run nothing, when
        the request does not qualify (`_inline`'s rules) or no core is free: the queue then takes it."""
        if self.solo is None or not self.solo():
            return False
        longest = max(map(len, items))
        padded = longest * len(items)
        if len(items) > self._max_items or (len(items) > 1 and padded > self._max_batch_tokens):
            return False
        want = self._width()
        if not self._inline(padded, want):
            return False
        self._running_tokens += padded
        self._publish()
        job.started = time.perf_counter()
        ran = self._model.run_here(list(items), want, job.pooling)
        if ran is None:
            self._running_tokens -= padded
            return False
        self._sized(padded)
        self._batches += 1
        rows, error, width, seconds = ran
        self._finished(padded)
        error = error or _rows_error(rows, len(items))
        if error is not None:
            _failed([job], len(items), error)
            return True
        assert rows is not None
        job.inference = time.perf_counter() - job.started
        job.future.set_result(Result(list(rows), job.started - job.submitted, job.inference))
        self._measured(len(items), longest, sum(map(len, items)), seconds, width)
        return True

    def _sized(self, tokens: float) -> None:
        """One more request's padded tokens into the moving average (the size of requests still arriving)."""
        self._request_tokens = tokens if self._request_tokens == 0 else 0.8 * self._request_tokens + 0.2 * tokens

    def leave(self, job: Job | None) -> None:
        """Free an admitted request's place (its ticket's way out); a request still waiting is withdrawn."""
        self._held -= 1
        if job is None:
            self._arriving -= 1
            self._publish()
        elif not job.future.done():
            job.future.cancel()  # its sequences are skipped when their turn comes

    # ---- the loop --------------------------------------------------------------------------------------

    async def _loop(self) -> None:
        """Starts what `enqueue` could not: batches waiting for a free model thread, and the last free thread's
        batch after it gave late arrivals a moment."""
        while True:
            if not self._queue.pending or not self._idle:
                self._report_depth()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._worth_waiting():
                await self._gather()
            self._dispatch()

    def _worth_waiting(self) -> bool:
        """Whether the last free model thread should give requests still being read or tokenized a moment."""
        return self._max_wait > 0 and self._idle == 1 and self._arriving > 0 and self._queue.pending < self._max_items

    def _dispatch(self) -> None:
        """Start the next batch on a free model thread, if one is free (`enqueue` may have taken the last one
        while the loop was gathering)."""
        if not self._idle:
            return
        try:
            batch = self._take()
        except Exception:  # a bug here must not stop serving, nor spin: the waiting requests fail, later ones go on
            log.exception("batching error")
            self._fail_pending(InferenceFailed("the server could not batch this request; see the server log"))
            return
        # Published even when empty: taking drops the sequences of requests whose callers left, and the page
        # must lose them too, or admission (which reads it) refuses every request while nothing runs to publish.
        self._publish()
        self._report_depth()
        if not batch:
            return
        jobs = list(dict.fromkeys(e.job for e in batch))
        start = time.perf_counter()
        for job in jobs:
            if job.started is None:
                job.started = start
        want = self._width()
        self._batches += 1
        self._running[self._batches] = jobs
        padded = max(e.length for e in batch) * len(batch)
        self._running_tokens += padded
        self._publish()
        done = functools.partial(self._finish, self._batches, batch, jobs, start, padded)
        items = [e.item for e in batch]
        pooling = common_pooling(job.pooling for job in jobs)
        ran = self._model.run_here(items, want, pooling) if self._inline(padded, want) else None
        if ran is not None:
            # Delivered at once: the request that queued this batch finds its future done and goes on without
            # giving up the loop, where delivering on the next turn cost two turns of the loop a request.
            done(*ran)
        else:
            self._model.call(items, want, done, pooling)

    def _width(self) -> int:
        """The cores to ask for: every core for a lone batch on a quiet machine; under load, one per stream. A
        worker whose threads cannot cover the cores (a model copy per calling thread: OpenVINO's, whose spread
        stays its streams) runs a request's queued calls wide as well, one after the other: narrow, they left
        every other core idle."""
        if self._running or self._arriving or not (self._pool is None or self._pool.quiet()):
            return self._narrow
        return self._wide if self._queued_wide or not self._queue.pending else self._narrow

    def _inline(self, padded: int, width: int) -> bool:
        """Whether to run this batch on the event loop: the only batch of a worker alone on its connection, and
        short at the measured rate (a long one would hold up the worker's health and metrics answers). Not while
        more than SPLIT_SECONDS of the queue waits (a request of several calls): on the loop its calls would run
        one after the other, where the model threads run them side by side (MiniLM, 32 texts of 128 tokens a
        request, 2 cores of an AMX Xeon: one core busy, 79 sentences/s)."""
        rate = self.admission.rate * width
        if self.solo is None or len(self._running) > 1 or rate <= 0 or self._inline_seconds <= 0:
            return False
        if not self.solo():
            return self._loop_runs_queue() and (padded + self._queue.tokens) / rate <= BUSY_SECONDS
        return self._queue.tokens <= self.admission.rate * SPLIT_SECONDS and padded / rate <= self._inline_seconds

    def _loop_runs_queue(self) -> bool:
        """Whether a worker with several connections runs what is queued as one call on its event loop (it is
        expected under BUSY_SECONDS): `enqueue` then leaves the dispatch to the loop task, so that the requests
        read in this turn of the loop join the call first."""
        rate = self.admission.rate * self._narrow
        return (
            self.solo is not None
            # This process's CPU cores. A GPU's calls keep the threads, and so do the shared engine's: on the loop
            # a call blocks it for the engine's round trip, while other connections' requests wait unread (tiny
            # classifier, 64 connections, engine on the same 2 cores of an AMD EPYC: 4,463-5,341 req/s with its
            # calls on the loop, 7,487-9,764 through the threads).
            and self._pool is not None
            and not self._remote
            and self._inline_seconds > 0
            and rate > 0
            and self._queue.tokens / rate <= BUSY_SECONDS
            and not self.solo()
        )

    def _take(self) -> list[Entry[T]]:
        """The next batch. With several model threads free, the waiting sequences are shared among them, unless
        the event loop runs them (`_loop_runs_queue`): then in one call."""
        self._shed_late()
        share = 1 if self._loop_runs_queue() else max(self._idle, 1)
        limit = min(self._max_items, -(-self._queue.pending // share))
        return self._queue.take(limit, self._max_batch_tokens)

    def _shed_late(self) -> None:
        """Refuse the requests that have waited longer than the admission bound and not started."""
        bound = self.admission.max_queue
        if bound <= 0:
            return
        now = time.perf_counter()
        while (job := self._queue.oldest()) is not None and job.started is None and now - job.submitted > bound:
            waited = now - job.submitted
            wait = self.admission.expected_wait(self._work())
            # Its sequences leave the queue with it: the queue drops those of a finished future.
            job.future.set_exception(
                Overloaded(
                    f"the request waited {waited:.1f} s for the model (more than the server's bound of {bound:g} s); "
                    "retry after the time in Retry-After",
                    retry_after=max(1, math.ceil(wait - bound)),
                )
            )

    def _finish(
        self,
        number: int,
        batch: list[Entry[T]],
        jobs: list[Job],
        start: float,
        padded: int,
        rows: Rows | None,
        error: BaseException | None,
        width: int,
        ran: float,
    ) -> None:
        """On the event loop when a model thread is done (`ran`: its seconds on the cores it held): every
        request in the batch gets its rows or an error."""
        self._running.pop(number, None)
        self._finished(padded)
        if error is None:
            try:
                self._deliver(batch, jobs, start, rows, width, ran)
                return
            except Exception as exc:
                error = exc
        _failed(jobs, len(batch), error)

    def _finished(self, padded: int) -> None:
        """A batch of `padded` tokens left the model: the shared page, the loop, the idle timer."""
        self._running_tokens -= padded
        self._publish()
        if self._queue.pending:
            self._wake.set()
        elif not self._running and self._on_idle is not None and self._idle_timer is None:
            # One timer per quiet spell, not one made and cancelled per batch: it checks the time when it fires.
            self._idle_timer = asyncio.get_running_loop().call_later(self._idle_after, self._went_idle)
        self._last_finish = time.perf_counter()

    def _measured(self, size: int, longest: int, tokens: int, ran: float, width: int) -> None:
        """A batch's figures into the token rate and, after the answers' wake-ups, the metrics. The model's own
        time, not the batch's since dispatch: that includes waiting for a core, and under load (more model
        threads than cores) measured the rate at about half, so admission refused early and the refusal pace
        ran at half its setting."""
        stats = BatchStats(size, longest * size, tokens, ran, width)
        self.admission.observe(stats.padded_tokens, ran, width)
        if self._on_batch is not None:  # after the waiting requests' wake-ups, so metrics never delay an answer
            asyncio.get_running_loop().call_soon(self._on_batch, stats)

    def _went_idle(self) -> None:
        """No batch for `idle_after` seconds: `on_idle` (the backend trims its memory) off the event loop."""
        self._idle_timer = None
        if self._on_idle is None or self._running or self._queue.pending or self._closed:
            return  # busy: the batch that finishes next arms the timer again
        quiet = time.perf_counter() - self._last_finish
        if quiet < self._idle_after:  # batches came back since the timer was armed
            self._idle_timer = asyncio.get_running_loop().call_later(self._idle_after - quiet, self._went_idle)
        else:
            done = asyncio.get_running_loop().run_in_executor(None, self._on_idle)
            done.add_done_callback(_log_idle_failure)

    async def _gather(self) -> None:
        """Give requests still being read or tokenized a moment to join; perf_counter, not the loop's clock,
        whose resolution (1 ms under uvloop) is coarser than the wait."""
        deadline = time.perf_counter() + self._max_wait
        while self._arriving and self._queue.pending < self._max_items and time.perf_counter() < deadline:
            await asyncio.sleep(0)

    def _deliver(
        self, batch: list[Entry[T]], jobs: list[Job], start: float, rows: Rows | None, width: int, ran: float
    ) -> None:
        if (wrong := _rows_error(rows, len(batch))) is not None:
            raise wrong
        assert rows is not None
        seconds = time.perf_counter() - start
        for row, entry in zip(rows, batch, strict=True):
            job = entry.job
            if not job.future.done():
                job.outputs[entry.index] = row
                job.remaining -= 1
        for job in jobs:
            job.inference += seconds
            if job.remaining == 0 and not job.future.done():
                assert job.started is not None
                job.future.set_result(Result(job.outputs, job.started - job.submitted, job.inference))  # type: ignore[arg-type]
        self._measured(len(batch), max(e.length for e in batch), sum(e.length for e in batch), ran, width)

    def _work(self) -> float:
        """Padded tokens this worker still has to run: queued, on the model, and the requests admitted but
        not yet tokenized (at the average request's size: a burst of arrivals counts before it is read)."""
        return self._queue.tokens + self._running_tokens + self._arriving * self._request_tokens

    def _publish(self) -> None:
        """This worker's remaining work into the machine's shared page (admission in every worker reads it)."""
        if self._pool is not None:
            self._pool.set_queued(self._work())

    def _report_depth(self) -> None:
        pending = self._queue.pending
        if self._on_depth is not None and pending != self._reported:
            self._reported = pending
            self._on_depth(pending)

    def _fail_pending(self, exc: HareError) -> None:
        for entry in self._queue.drain():
            _fail(entry.job, exc)
        self._publish()

    def _stopped(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        # The loop must never end while serving; if it does, nothing would answer: fail loudly instead.
        self._broken = True
        error = task.exception() if not task.cancelled() else None
        log.critical("the batching loop stopped: %r", error)
        self._fail_pending(InferenceFailed("the server's batching loop stopped; see the server log"))


def _rows_error(rows: Rows | None, size: int) -> InferenceFailed | None:
    """The failure of a model call that did not return one row per sequence of its batch of `size`."""
    if rows is not None and len(rows) == size:
        return None
    found = "no" if rows is None else len(rows)
    return InferenceFailed(f"the model returned {found} rows for {size} sequences")


def _failed(jobs: Sequence[Job], size: int, error: BaseException) -> None:
    """A batch of `size` sequences failed: logged once, and every request in it gets the error."""
    log.error("a batch of %d sequences failed: %s", size, error, exc_info=error)
    for job in jobs:
        _fail(job, error)


def _fail(job: Job, exc: BaseException) -> None:
    if job.future.done():
        return
    if isinstance(exc, HareError):
        error: HareError = type(exc)(exc.message, **exc.details)
    else:
        error = InferenceFailed(f"inference failed: {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    job.future.set_exception(error)


def _log_idle_failure(done: asyncio.Future[None]) -> None:
    if not done.cancelled() and done.exception() is not None:
        log.error("the idle hook failed", exc_info=done.exception())
