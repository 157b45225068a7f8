"""One slot of the rounds: a candidate at one thread count and batch, warmed up, then timed call by call."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from bench.peers.candidates.base import Encoder, Vectors
from bench.peers.options import PeersOptions


@dataclass
class Slot:
    """What one candidate did at one thread count and batch, over every round."""

    latencies_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # the process's CPU time per call, every thread's
    cpu_s: float = 0.0
    wall_s: float = 0.0


def time_slot(
    encoder: Encoder, calls: list[list[str]], options: PeersOptions, stop: threading.Event | None, into: Slot
) -> None:
    """Warm-up calls, then calls for `options.seconds` (at least `min_calls`), each timed in wall and CPU time."""
    encoder.enter()
    for i in range(options.warmup_calls):
        encoder.encode(calls[i % len(calls)])
    deadline = time.perf_counter() + options.seconds
    cpu0, wall0 = time.process_time(), time.perf_counter()
    done = 0
    while done < options.min_calls or time.perf_counter() < deadline:
        if stop is not None and stop.is_set():
            break
        c0, t0 = time.process_time(), time.perf_counter()
        encoder.encode(calls[done % len(calls)])
        into.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
        into.cpu_ms.append((time.process_time() - c0) * 1000.0)
        done += 1
    into.cpu_s += time.process_time() - cpu0
    into.wall_s += time.perf_counter() - wall0


def encode_all(encoder: Encoder, texts: list[str], batch: int) -> Vectors:
    """Every text's vector, `batch` texts a call (the fidelity set)."""
    encoder.enter()
    return np.concatenate([encoder.encode(texts[i : i + batch]) for i in range(0, len(texts), batch)])
