"""The worker's queue of sequences waiting for the model, bucketed by length so that a batch gathers sequences
of similar length (little padding).

- A batch starts from the oldest waiting sequence and fills with its nearest-length neighbours (buckets of
  `bucket` tokens, nearest first), up to a count and max_batch_tokens padded tokens (longest x count); one
  sequence always fits. The rule is tasks/ops.py's next_call, which the optimizer's gate and the benches
  apply to sequences that arrive together (length_batches).
- Sequences of a request that went away (its future is done) are dropped when their turn comes.
- `tokens` is the padded work waiting (each sequence rounded up to its bucket): admission's estimate of the
  wait divides it by the measured token rate.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from tasks.ops import BUCKET, next_call

T = TypeVar("T", bound=Sized)
Array = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Result:
    """A request's rows, in the order it sent its sequences, and where its time went.

    queue_seconds: from submission to the start of its first batch.
    inference_seconds: wall time of the batches that carried its sequences.
    """

    outputs: list[Array]
    queue_seconds: float
    inference_seconds: float


class Job:
    """One request's sequences on their way through the model."""

    __slots__ = ("future", "inference", "outputs", "pooling", "remaining", "started", "submitted")

    def __init__(self, future: asyncio.Future[Result], count: int, pooling: str | None = None) -> None:
        self.future = future
        self.pooling = pooling  # the pooling its rows may get where the model runs (None: token rows wanted)
        self.outputs: list[Array | None] = [None] * count
        self.remaining = count
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self.inference = 0.0


def common_pooling(poolings: Iterable[str | None]) -> str | None:
    """The pooling one model call may apply where it runs: the one every request in it takes, else None (token
    rows for all, each pooled where it is answered)."""
    distinct = set(poolings)
    return distinct.pop() if len(distinct) == 1 else None


class Entry(Generic[T]):
    __slots__ = ("index", "item", "job", "length", "order")

    def __init__(self, job: Job, index: int, item: T, length: int, order: int) -> None:
        self.job, self.index, self.item, self.length, self.order = job, index, item, length, order


def _length(entry: Entry[T]) -> int:
    return entry.length


class LengthQueue(Generic[T]):
    def __init__(self, bucket: int = BUCKET) -> None:
        self._bucket = bucket
        self._buckets: dict[int, deque[Entry[T]]] = {}
        self._order = 0
        self.pending = 0  # sequences queued (some may belong to cancelled requests)
        self.tokens = 0  # their padded tokens

    def put(self, job: Job, items: Sequence[T]) -> None:
        for index, item in enumerate(items):
            length = len(item)
            self._order += 1
            key = length // self._bucket
            queue = self._buckets.get(key)
            if queue is None:
                queue = self._buckets[key] = deque()
            queue.append(Entry(job, index, item, length, self._order))
            self.tokens += self._padded(length)
        self.pending += len(items)

    def prune(self) -> int | None:
        """Drop the withdrawn sequences at the buckets' heads; the bucket of the oldest live one (None: empty)."""
        first, oldest = None, None
        for key in list(self._buckets):
            queue = self._drop_cancelled(key)
            if queue and (oldest is None or queue[0].order < oldest):
                first, oldest = key, queue[0].order
        return first

    def oldest(self) -> Job | None:
        """The request of the oldest live sequence (None: nothing waits)."""
        first = self.prune()
        return None if first is None else self._buckets[first][0].job

    def take(self, limit: int, max_batch_tokens: int) -> list[Entry[T]]:
        """The next batch, by the packing rule (tasks/ops.py next_call) over the live sequences."""
        first = self.prune()
        if first is None:
            return []
        live = {key: (e for e in queue if not e.job.future.done()) for key, queue in self._buckets.items()}
        batch = next_call(live, first, _length, limit, max_batch_tokens)
        for entry in batch:  # each bucket's live heads, with the withdrawn ones among them
            key = entry.length // self._bucket
            queue = self._buckets[key]
            while queue[0] is not entry:
                self._pop(queue)
            self._pop(queue)
            if not queue:
                del self._buckets[key]
        return batch

    def drain(self) -> list[Entry[T]]:
        """Everything queued, removed (to fail it)."""
        entries = [entry for queue in self._buckets.values() for entry in queue]
        self._buckets.clear()
        self.pending = self.tokens = 0
        return entries

    def _pop(self, queue: deque[Entry[T]]) -> None:
        entry = queue.popleft()
        self.pending -= 1
        self.tokens -= self._padded(entry.length)

    def _padded(self, length: int) -> int:
        return -(-max(length, 1) // self._bucket) * self._bucket

    def _drop_cancelled(self, key: int) -> deque[Entry[T]] | None:
        queue = self._buckets[key]
        while queue and queue[0].job.future.done():
            self._pop(queue)
        if not queue:
            del self._buckets[key]
            return None
        return queue
