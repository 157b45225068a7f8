"""Admission at the door, before a request's body is read: a request gets in only while the machine can
answer it in time; otherwise it is refused at once (Overloaded, with the seconds to wait: the HTTP face
answers 429 with Retry-After), never left to time out in a queue.

- Time bound: the expected wait is the padded tokens every worker of the machine still has to run (the
  shared page of api/engine/cores.py: queued, on the model, and requests admitted but not yet tokenized, at
  the average request's size) over the measured token rate (tokens per second per core x cores). Above
  `max_queue` seconds, Overloaded with retry_after = the seconds until the excess has drained (at least 1).
  Where each worker's model threads have cores of their own (workers x streams within the cores: the
  default, one stream a worker), a worker's queue drains only on its own: its work over those cores is its
  wait. Judged by the machine's queue, an idle worker refused while the other's queue was full, so under a
  flood every connection stayed on the busy worker and the idle one's core did nothing (open-3x goodput
  0.62, 1.3 of 2 cores busy).
- Count bound: a worker holds at most `capacity` requests (memory: each holds its body and encodings).
- The rate starts from warm-up's batches (api/web/app.py) and follows every batch (a moving average), so it
  tracks the model, the sequence lengths being served and how busy the machine is.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence, Sized
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from api.engine.cores import CorePool
from api.engine.errors import Overloaded
from api.engine.lengthqueue import Job, Result

T = TypeVar("T", bound=Sized)
SMOOTHING = 0.2  # weight of the newest batch in the token rate


class Door(Protocol):
    """What a ticket needs of the batcher (api/engine/batching.py): a way in for its sequences, and a way out."""

    def enqueue(self, items: Sequence[Any], pooling: str | None = None) -> Job: ...

    def leave(self, job: Job | None) -> None: ...


class Ticket(Generic[T]):
    """One admitted request's place in the worker. Use as a context manager: leaving it frees the place and,
    if the request is still waiting (its caller went away), withdraws its sequences."""

    __slots__ = ("_door", "_job")

    def __init__(self, door: Door) -> None:
        self._door = door
        self._job: Job | None = None

    def __enter__(self) -> Ticket[T]:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._door.leave(self._job)

    def submit(self, items: Sequence[T], pooling: str | None = None) -> asyncio.Future[Result]:
        """Queue `items` (sequences); the future gets the model's row for each. Cancelling it withdraws them.
        `pooling`: a pooling the request's rows may get where the model runs (a vector per sequence, not its
        token states; the shared engine applies it, api/process/engine.py)."""
        if self._job is not None:
            raise RuntimeError("a ticket submits once")
        self._job = self._door.enqueue(items, pooling)
        return self._job.future

    async def run(self, items: Sequence[T]) -> Result:
        """Queue `items` and wait for their rows."""
        return await self.submit(items)


class Admission:
    """The door's rules: `capacity` requests per worker, and an expected wait under `max_queue` seconds
    (0: no time bound) on a machine of `cores` cores."""

    def __init__(
        self, capacity: int, max_queue: float, cores: int, pool: CorePool | None = None, owned: int = 0
    ) -> None:
        self.capacity = capacity
        self.max_queue = max_queue
        self.cores = max(1, cores)
        self._pool = pool
        # The cores this worker's model threads have to themselves (0: they share the machine's with every
        # worker's). Fewer than the machine's: its queue drains that fast, whatever the others queued.
        self._owned = owned if 0 < owned < self.cores else 0
        self.rate = 0.0  # padded tokens per second per core; 0 until a batch was measured

    def observe(self, padded_tokens: int, seconds: float, width: int) -> None:
        """Fold one batch into the token rate."""
        if seconds <= 0 or padded_tokens <= 0:
            return
        rate = padded_tokens / (seconds * max(width, 1))
        self.rate = rate if self.rate == 0 else (1 - SMOOTHING) * self.rate + SMOOTHING * rate

    def expected_wait(self, local_tokens: float) -> float:
        """Seconds until the machine's queued tokens are done (this worker's alone without a shared pool, or when
        its model threads have cores of their own: then at the speed of those)."""
        if self.rate <= 0:
            return 0.0
        if self._owned:
            return local_tokens / (self.rate * self._owned)
        queued = self._pool.queued() if self._pool is not None else local_tokens
        return queued / (self.rate * self.cores)

    def check(self, held: int, local_tokens: float) -> None:
        """Raise Overloaded (with the seconds to wait) when one more request must not come in."""
        if held >= self.capacity:
            wait = self.expected_wait(local_tokens)
            raise Overloaded(
                f"the server is at capacity ({self.capacity} requests per worker); retry shortly",
                retry_after=max(1, math.ceil(wait)),
            )
        if self.max_queue > 0:
            wait = self.expected_wait(local_tokens)
            if wait > self.max_queue:
                raise Overloaded(
                    f"the server's queue would take {_seconds(wait)} s (more than its bound of {self.max_queue:g} s); "
                    "retry after the time in Retry-After",
                    retry_after=max(1, math.ceil(wait - self.max_queue)),
                )


def _seconds(wait: float) -> str:
    """A wait as a refusal states it: tenths, or two figures under a tenth (a bound of 1 ms read "0.0 s")."""
    return f"{wait:.1f}" if wait >= 0.1 else f"{wait:.2g}"
