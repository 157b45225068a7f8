"""Stage 5, autotune: time each variant that passed validation on this machine and pick the fastest.

Which variant wins depends on the CPU and the sequence length (plain and fused int8 trade places on
Zen 4), so we measure rather than assume: the median latency at each (length, batch) point, scored by
their geometric mean so that no single point dominates.

The chosen variant's batch budget is measured too: its token rate at each batch size with every core running
a model call, as under overload. A larger batch is often no faster per token on a CPU (DistilBERT-base int8 on
two Xeon cores: 13,700 tokens/s at 256 padded tokens per call, 9,200-9,600 at 8,192, once its activations
outgrow the cache), and the server's default budget is then a loss of throughput exactly when it is needed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from container.machine import describe
from container.optimize.textset import SENTENCES
from container.runtime import InferenceFailed, OnnxModel
from tasks.ops import pad_batch


def _feeds(tokenizer: Tokenizer, length: int, batch: int, names: Sequence[str]) -> dict[str, np.ndarray]:
    text = " ".join(SENTENCES * 20)
    enc = tokenizer.encode(text)  # truncated at the model's maximum by the bundle tokenizer
    enc.truncate(min(length, len(enc.ids)))
    return pad_batch([enc] * batch, names)


def time_variant(
    variant: Path,
    tokenizer: Tokenizer,
    lengths: Sequence[int],
    batches: Sequence[int],
    threads: int,
    target: str = "cpu",
    min_seconds: float = 0.2,
) -> dict[str, float]:
    """Median milliseconds per call at each point, keyed "s{length}xb{batch}"."""
    model = OnnxModel(variant, target=target, threads=threads)
    timings: dict[str, float] = {}
    for length in lengths:
        for batch in batches:
            feeds = _feeds(tokenizer, length, batch, model.input_names)
            model.run(feeds)  # first run allocates buffers and picks kernels
            samples: list[float] = []
            deadline = time.perf_counter() + min_seconds
            while len(samples) < 5 or time.perf_counter() < deadline:
                start = time.perf_counter()
                model.run(feeds)
                samples.append((time.perf_counter() - start) * 1e3)
            timings[f"s{length}xb{batch}"] = round(float(np.median(samples)), 3)
    return timings


def score(timings: dict[str, float]) -> float:
    """Geometric mean of the point latencies: lower is faster."""
    return float(np.exp(np.mean(np.log(list(timings.values())))))


# Padded tokens per model call tried for the batch budget: from one 128-token sequence to the server's default.
BUDGETS = (128, 256, 512, 1024, 2048, 4096, 8192)
# The climb stops after two budgets in a row below this share of the best rate so far: past its peak a CPU's
# rate does not come back, and on a large model one call of 8,192 tokens takes minutes.
PAST_PEAK = 0.9


def token_rates(
    variant: Path,
    tokenizer: Tokenizer,
    streams: int,
    target: str = "cpu",
    budgets: Sequence[int] = BUDGETS,
    length: int = 128,
    min_seconds: float = 0.2,
) -> dict[int, float]:
    """Tokens a second at each batch budget, smallest first, until the rate is past its peak: batches of
    `length`-token sequences filling it, run by `streams` one-thread sessions at once, as the throughput
    profile's model threads run under overload."""
    models = [OnnxModel(variant, target=target, threads=1) for _ in range(streams)]
    rates: dict[int, float] = {}
    names = models[0].input_names
    length = _feeds(tokenizer, length, 1, names)["input_ids"].shape[1]  # shorter where the model's maximum is
    with ThreadPoolExecutor(streams) as pool:
        for budget in budgets:
            feeds = _feeds(tokenizer, length, max(1, budget // length), names)
            many = [feeds] * streams
            try:
                list(pool.map(_calls, models, many, [0.0] * streams))  # first runs allocate this size's buffers
                start = time.perf_counter()
                calls = sum(pool.map(_calls, models, many, [start + min_seconds] * streams))
            except (InferenceFailed, MemoryError):
                if not rates:
                    raise
                break  # a batch this machine cannot hold (a large model, little memory) is no budget
            rates[budget] = round(calls * feeds["input_ids"].size / (time.perf_counter() - start), 1)
            if past_peak(rates):
                break
    return rates


def past_peak(rates: dict[int, float]) -> bool:
    """The last two budgets measured both ran under PAST_PEAK of the best rate so far."""
    best = max(rates.values())
    return len(rates) > 2 and all(rate < PAST_PEAK * best for rate in list(rates.values())[-2:])


def _calls(model: OnnxModel, feeds: dict[str, np.ndarray], deadline: float) -> int:
    """Run until `deadline`, at least once, and count the calls."""
    calls = 0
    while calls < 1 or time.perf_counter() < deadline:
        model.run(feeds)
        calls += 1
    return calls


def batch_budget(rates: dict[int, float], within: float = 0.95) -> int:
    """The smallest budget whose rate is within `within` of the best: a larger batch that is not faster only
    makes every request in it, and every one queued behind it, wait longer."""
    best = max(rates.values())
    return min(budget for budget, rate in rates.items() if rate >= within * best)


def budget_fields(rates: dict[int, float], streams: int) -> dict[str, Any]:
    """The manifest's record of a budget measurement (`hare optimize`'s last stage, `hare tune`): the budget,
    the rates it was picked from, and the machine and streams they were measured with."""
    return {
        "max_batch_tokens": batch_budget(rates),
        "token_rates": {str(budget): rate for budget, rate in rates.items()},
        "budget_machine": describe() | {"streams": streams},
    }
