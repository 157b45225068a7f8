"""One packing rule (tasks/ops.py next_call): the server's length queue takes its batches by it, and
length_batches applies it to sequences that arrive together (the optimizer's gate, the peers bench, the bulk
job), so a batch the bench or the gate forms is the batch the server would."""

from __future__ import annotations

import asyncio
import random

import pytest

from api.engine.lengthqueue import Job, LengthQueue, Result
from tasks.ops import length_batches


class Seq:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def _queued(lengths: list[int], loop: asyncio.AbstractEventLoop) -> tuple[LengthQueue[Seq], list[Job]]:
    queue: LengthQueue[Seq] = LengthQueue()
    jobs = []
    for n in lengths:  # one request a sequence, in arrival order
        future: asyncio.Future[Result] = loop.create_future()
        jobs.append(Job(future, 1))
        queue.put(jobs[-1], [Seq(n)])
    return queue, jobs


@pytest.mark.parametrize("seed", range(6))
def test_the_server_queue_and_length_batches_form_the_same_calls(seed: int) -> None:
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(3, 20), rng.randint(20, 140), rng.randint(200, 512)]) for _ in range(90)]
    max_batch_size, max_batch_tokens = rng.choice([4, 8, 32]), rng.choice([128, 512, 2048])
    loop = asyncio.new_event_loop()
    try:
        queue, jobs = _queued(lengths, loop)
        served = []
        while batch := queue.take(max_batch_size, max_batch_tokens):
            served.append([jobs.index(entry.job) for entry in batch])
    finally:
        loop.close()
    calls = length_batches(lengths, max_batch_size, max_batch_tokens)
    assert served == calls
    assert sorted(i for call in calls for i in call) == list(range(len(lengths)))  # every sequence, once
    done: set[int] = set()
    for call in calls:  # each from the oldest left, within both limits (one sequence always fits)
        assert call[0] == min(set(range(len(lengths))) - done)
        assert len(call) <= max_batch_size
        assert len(call) == 1 or max(lengths[i] for i in call) * len(call) <= max_batch_tokens
        done |= set(call)


def test_a_call_fills_with_the_nearest_lengths_first_and_passes_over_one_too_long() -> None:
    # The oldest is 40 tokens: 44 (its bucket) first, then 20 and 60 (a bucket away, the shorter first), then
    # 300 would make 5 x 300 > 512, so it waits for a call of its own.
    assert length_batches([40, 300, 60, 20, 44], 32, 512) == [[0, 4, 3, 2], [1]]


def test_withdrawn_sequences_are_dropped_not_batched() -> None:
    loop = asyncio.new_event_loop()
    try:
        queue, jobs = _queued([10, 11, 12, 13], loop)
        jobs[1].future.cancel()
        jobs[2].future.cancel()
        batch = queue.take(32, 512)
    finally:
        loop.close()
    assert [jobs.index(entry.job) for entry in batch] == [0, 3]
    assert queue.pending == 0 and queue.tokens == 0
