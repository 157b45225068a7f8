"""How one worker batches and admits, as one value: built from the settings once per worker, handed to the
batcher (api/engine/batching.py) whole, so the batcher's constructor takes the policy and its collaborators
rather than a flag per knob."""

from __future__ import annotations

from dataclasses import dataclass

from api.config import Settings
from tasks.ops import BUCKET


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """max_items, max_batch_tokens: a batch's sequences and padded tokens (longest x count) at most; one sequence
    always fits. max_wait: seconds the last free model thread waits for requests still being read or
    tokenized. capacity: requests a worker holds. max_queue: the longest expected wait (seconds) at which a
    request is admitted, and the age at which a waiting one is shed (0: no time bound). streams: model
    threads (under load). spread: model threads while the machine is quiet (a request of several calls alone on
    it runs them side by side; at least `streams`). idle_priority: they run at SCHED_IDLE. inline_seconds: the
    longest call a worker alone on its connection runs on its event loop (0: never). idle_after: seconds without
    a batch before the idle hook. bucket: the length queue's bucket, in tokens. workers: the server's worker
    processes, sharing the cores."""

    max_items: int
    max_batch_tokens: int
    max_wait: float = 0.0
    capacity: int = 256
    max_queue: float = 0.0
    streams: int = 1
    spread: int = 1
    idle_priority: bool = False
    inline_seconds: float = 0.0
    idle_after: float = 1.0
    bucket: int = BUCKET
    workers: int = 1

    @classmethod
    def from_settings(cls, settings: Settings) -> BatchPolicy:
        """The policy of `settings` (the HARE_* batching, queue and stream variables; api/config.py), read
        after `Settings.for_bundle` has resolved max_batch_tokens."""
        return cls(
            max_items=settings.max_batch_size,
            max_batch_tokens=settings.max_batch_tokens,
            max_wait=settings.max_wait_ms / 1000,
            capacity=settings.queue_size,
            max_queue=settings.max_queue_ms / 1000,
            streams=settings.streams,
            spread=settings.spread,
            idle_priority=settings.idle_priority,
            inline_seconds=settings.inline_ms / 1000,
            workers=settings.workers,
        )
