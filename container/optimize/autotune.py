"""Stage 5, autotune: time the variants that passed validation on this machine and pick the fastest (the more
accurate of a near-tie).

Which variant wins depends on the CPU and the sequence length (plain and fused int8 trade places on
Zen 4), so we measure rather than assume: a low percentile (PERCENTILE) of the per-call time at each
(length, batch) point, scored by their geometric mean so that no single point dominates.

The measurement is built so that other work on the machine cannot flip the pick (a build often shares its
cores: a CI runner, an engineer's laptop, a two-core VM):

- The variants run in rounds, all their sessions open at once: each round gives every variant a short slice
  at every point, and the samples accumulate over the rounds. A busy second then falls on every variant
  rather than on whichever was being timed alone in its window.
- With one thread (`--tune-threads 1`, the serving default) ONNX Runtime runs the graph on the calling thread,
  so the statistic is that thread's CPU time per call: time spent waiting for a core that another process
  holds is not counted at all (checked on a two-core EPYC VM: per-call thread and process CPU time agree
  within 0.1% at one thread, so no other thread does the work; at two threads the calling thread's CPU time
  is about half the process's). Several threads, or a GPU, are timed by the wall clock.
- A slice lasts until the statistic's own clock has counted its share of `--tune-seconds` in the calls, so a
  slice holds as many calls under load as on a quiet machine (by the wall clock, a slice that met a busy
  moment held a handful of calls, too few for a low percentile, and its variant lost).
- A low percentile, not the median: load only ever adds time to a call, so the fastest calls are the ones
  that measure the variant and not its neighbours.
- In the first round a variant whose score over the points timed so far is more than HOPELESS behind the
  fastest's stops being timed (the pick's `dropped`), where calls are timed by their thread's CPU time: load
  moved that by at most 18% in the builds measured, so no later point or round brings it back, and the slow
  variants' calls are a build's longest (fp32 at 384 tokens x 8 on the Qwen3-Embedding-0.6B geometry: 35 s a
  call; ten variants timed at every point in three rounds took 34 minutes). A variant is dropped only if it is
  still that far behind after every variant has been timed at that point once more: a burst of load during
  one slice (on two vCPUs that are one core's hyper-threads, another process's work slows this thread's own
  cycles too) once dropped a copy of the fastest graph in the test suite.
- Rounds go on until the fastest variant leads the next by more than MARGIN in two rounds in a row, or by
  under half of it in two rounds in a row (a settled tie), or MAX_ROUNDS are spent. A lead that never clears
  is a tie, and a tie goes to the more accurate variant
  (the caller's order: fp32 before int8, then the task's gate metric): a few percent the noise could give
  either way buys no accuracy. The decision is recorded in the manifest (`pick`).

The chosen variant's batch budget is measured too, in rounds and by each stream's CPU time in the same way:
its token rate at each batch size with every core running a model call, as under overload. A larger batch is
often no faster per token on a CPU (DistilBERT-base int8 on two Xeon cores: 13,700 tokens/s at 256 padded
tokens per call, 9,200-9,600 at 8,192, once its activations outgrow the cache), and the server's default
budget is then a loss of throughput exactly when it is needed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from container.machine import available_bytes, describe, usable_cpus
from container.models import Model, open_model
from container.optimize.textset import SENTENCES
from container.runtime import InferenceFailed
from tasks.errors import InputError
from tasks.ops import pad_batch

# The percentile of the per-call times that stands for a point: load only adds time, so a low one.
PERCENTILE = 10
# A lead smaller than this (the runner-up's score over the fastest's, less 1) is a tie.
MARGIN = 0.03
# Rounds: at least MIN_ROUNDS (each gives a point a MIN_ROUNDS-th of --tune-seconds), at most MAX_ROUNDS.
MIN_ROUNDS = 3
MAX_ROUNDS = 10
# After MIN_ROUNDS, a variant more than this behind the fastest is out of the race: its figures stand as they
# are and the rounds left go to the variants still in it.
OUT_OF_RACE = 0.15
# In the first round, a variant more than this behind the fastest over the points timed so far is timed no more.
HOPELESS = 0.5
# The statistic of calls timed by their thread's CPU time (`clock`), which load moves little enough to drop on.
THREAD_CPU = f"p{PERCENTILE} of thread CPU time"
# Calls per slice however short --tune-seconds is.
LEAST_CALLS = 2


# The timed texts: the start of these words, 8,640 of them (every word is a token or more).
WORDS = " ".join(SENTENCES * 20).split()


def _feeds(tokenizer: Tokenizer, length: int, batch: int, names: Sequence[str]) -> dict[str, np.ndarray]:
    """`batch` copies of a `length`-token text (or the model's maximum, where shorter). Only the words that
    make `length` tokens are tokenized: the whole text took 55 ms a call, a quarter to a third of a tiny
    model's build."""
    enc = tokenizer.encode(" ".join(WORDS[:length]))  # truncated at the model's maximum by the bundle tokenizer
    enc.truncate(min(length, len(enc.ids)))
    return pad_batch([enc] * batch, names)


@dataclass(frozen=True)
class Pick:
    """Autotune's decision, as the manifest records it (`pick`).

    winner: the variant that ships. fastest, runner_up: the two lowest scores after the last round (runner_up
    None when one variant passed); margin: runner_up's score over fastest's, less 1. tie: the fastest's lead
    was not over `clear_margin` in the last two rounds, so `winner` is the most accurate of `tied` (the
    variants within the lead, or within `clear_margin`, of the fastest). rounds: rounds run; statistic: what
    was timed; dropped: the variants timed no more in the first round, more than HOPELESS behind (not scored).
    """

    winner: str
    fastest: str
    runner_up: str | None
    margin: float | None
    tie: bool
    tied: list[str] = field(default_factory=list)
    rounds: int = 0
    statistic: str = ""
    clear_margin: float = MARGIN
    dropped: list[str] = field(default_factory=list)


def clock(threads: int, target: str = "cpu") -> tuple[str, Callable[[], int]]:
    """What a call is timed by, and its name: the calling thread's CPU time where the runtime runs the graph on
    that thread (one thread, CPU: ORT, and OpenVINO with one stream), the wall clock otherwise (other threads,
    a GPU, do the work)."""
    if threads == 1 and target == "cpu":
        return THREAD_CPU, time.thread_time_ns
    return f"p{PERCENTILE} of wall time", time.perf_counter_ns


def tune(
    variants: Mapping[str, Path],
    tokenizer: Tokenizer,
    lengths: Sequence[int],
    batches: Sequence[int],
    threads: int,
    target: str = "cpu",
    min_seconds: float = 0.2,
    prefer: Sequence[str] = (),
    step: Callable[[str], None] | None = None,
) -> tuple[dict[str, dict[str, float]], Pick]:
    """Time `variants` (name: graph) against each other in rounds and pick one. `prefer`: their names, most
    accurate first (who takes a tie; unnamed ones come last). Every point gets at least `min_seconds` of
    calls in all. Returns each variant's milliseconds per call at each point (keyed "s{length}xb{batch}")
    and the pick."""
    statistic, now = clock(threads, target)
    models = {name: open_model(path, name, target, threads) for name, path in variants.items()}
    points = [(length, batch) for length in lengths for batch in batches]
    keys = [f"s{length}xb{batch}" for length, batch in points]
    feeds = {name: [_feeds(tokenizer, *point, model.input_names) for point in points] for name, model in models.items()}
    for name, model in models.items():
        for feed in feeds[name]:
            model.run(feed)  # first run allocates buffers and picks kernels
    samples: dict[str, list[list[float]]] = {name: [[] for _ in points] for name in models}
    racing = list(models)
    dropped: list[str] = []
    history: list[dict[str, float]] = []
    while len(history) < MAX_ROUNDS:
        turn = len(history) % len(racing)
        order = racing[turn:] + racing[:turn]  # who goes first moves round by round
        for i in range(len(points)):
            for name in order:
                samples[name][i] += _slice(models[name], feeds[name][i], now, min_seconds / MIN_ROUNDS)
            if not history and statistic == THREAD_CPU:  # the wall clock counts others' load: no drop
                behind = hopeless({name: score(_figures(keys, samples[name])) for name in order})
                if behind:  # confirmed on a second slice of every variant, so one busy slice drops nothing
                    for name in order:
                        samples[name][i] += _slice(models[name], feeds[name][i], now, min_seconds / MIN_ROUNDS)
                    behind = hopeless({name: score(_figures(keys, samples[name])) for name in order})
                dropped += behind
                order = [name for name in order if name not in behind]
        racing = [name for name in racing if name not in dropped]
        history.append({name: score(_figures(keys, samples[name])) for name in models if name not in dropped})
        fastest, _, margin = _lead(history[-1])
        if step:
            step(f"round {len(history)}: {fastest}" + (f" by {margin:.1%}" if margin is not None else ""))
        if len(history) >= MIN_ROUNDS:
            if clear(history[-2:]) or settled_tie(history[-2:]):
                break
            best = history[-1][fastest]
            racing = [name for name in racing if history[-1][name] <= (1 + OUT_OF_RACE) * best]
    timings = {name: {k: round(v, 3) for k, v in _figures(keys, samples[name]).items()} for name in models}
    return timings, replace(decide(history, prefer, statistic), dropped=dropped)


def hopeless(scores: Mapping[str, float]) -> list[str]:
    """The variants more than HOPELESS behind the fastest of `scores` (their scores over the same points)."""
    best = min(scores.values())
    return [name for name, value in scores.items() if value > (1 + HOPELESS) * best]


def _slice(model: Model, feeds: dict[str, np.ndarray], now: Callable[[], int], seconds: float) -> list[float]:
    """Milliseconds per call by `now`, of calls made until `now` has counted `seconds` in them (LEAST_CALLS at
    least). By the statistic's own clock, so a slice has as many calls under load as on a quiet machine."""
    taken: list[float] = []
    spent = 0
    while len(taken) < LEAST_CALLS or spent < seconds * 1e9:
        start = now()
        model.run(feeds)
        took = now() - start
        spent += took
        taken.append(took / 1e6)
    return taken


def _figures(keys: Sequence[str], samples: Sequence[Sequence[float]]) -> dict[str, float]:
    """Each point's statistic, at the points timed so far."""
    return {key: float(np.percentile(s, PERCENTILE)) for key, s in zip(keys, samples, strict=True) if s}


def score(timings: dict[str, float]) -> float:
    """Geometric mean of the point latencies: lower is faster."""
    return float(np.exp(np.mean(np.log(list(timings.values())))))


def _lead(scores: Mapping[str, float]) -> tuple[str, str | None, float | None]:
    """The fastest, the runner-up and the runner-up's score over the fastest's, less 1."""
    ranked = sorted(scores, key=lambda name: scores[name])
    if len(ranked) == 1:
        return ranked[0], None, None
    return ranked[0], ranked[1], scores[ranked[1]] / scores[ranked[0]] - 1


def clear(rounds: Sequence[Mapping[str, float]]) -> bool:
    """One variant led in every one of these rounds' scores by more than MARGIN (or was the only one)."""
    leads = [_lead(scores) for scores in rounds]
    return len({lead[0] for lead in leads}) == 1 and all(m is None or m > MARGIN for _, _, m in leads)


def settled_tie(rounds: Sequence[Mapping[str, float]]) -> bool:
    """The fastest led the next by under half of MARGIN in every one of these rounds: samples only accumulate,
    so more rounds would not carry that lead past MARGIN (a DistilBERT-base build spent 10 rounds, 18 minutes
    on a loaded two-core machine, on int8 against int8-per-channel 0.1% apart)."""
    return all(m is not None and m < MARGIN / 2 for _, _, m in (_lead(scores) for scores in rounds))


def decide(history: Sequence[Mapping[str, float]], prefer: Sequence[str], statistic: str = "") -> Pick:
    """The pick after these rounds' scores: the fastest when its lead was clear in the last two rounds, else a
    tie, which the first of `prefer` among the tied takes."""
    scores = history[-1]
    fastest, runner_up, margin = _lead(scores)
    if margin is None or (len(history) >= 2 and clear(history[-2:])):
        return Pick(fastest, fastest, runner_up, _rounded(margin), False, [], len(history), statistic, MARGIN)
    within = (1 + max(MARGIN, margin)) * scores[fastest]
    tied = [name for name in sorted(scores, key=lambda name: scores[name]) if scores[name] <= within]
    rank = {name: i for i, name in enumerate(prefer)}
    winner = min(tied, key=lambda name: rank.get(name, len(rank)))  # min keeps the faster among the unranked
    return Pick(winner, fastest, runner_up, _rounded(margin), True, tied, len(history), statistic, MARGIN)


def _rounded(margin: float | None) -> float | None:
    return None if margin is None else round(margin, 4)


# Padded tokens per model call tried for the batch budget: from one 128-token sequence to the server's default.
BUDGETS = (128, 256, 512, 1024, 2048, 4096, 8192)
# The sequence length the budget is timed at: a budget is filled with sequences of this many tokens.
BUDGET_LENGTH = 128
# The budgets' rule and default as both command lines' help says them.
BUDGETS_HELP = f"each at least {BUDGET_LENGTH} (default {BUDGETS[0]},{BUDGETS[1]},...,{BUDGETS[-1]})"
# The climb stops after two budgets in a row below this share of the best rate so far: past its peak a CPU's
# rate does not come back, and on a large model one call of 8,192 tokens takes minutes.
PAST_PEAK = 0.9
# The share of the available memory the next budget's growth may take.
MEMORY_SHARE = 0.8


def token_rates(
    graph: Path,
    tokenizer: Tokenizer,
    streams: int,
    target: str = "cpu",
    budgets: Sequence[int] = BUDGETS,
    length: int = BUDGET_LENGTH,
    min_seconds: float = 0.2,
    step: Callable[[str], None] | None = None,
    variant: str = "fp32",
) -> dict[int, float]:
    """Tokens a second at each batch budget, smallest first, until the rate is past its peak: batches of
    `length`-token sequences filling it, run by `streams` one-thread sessions at once, as the throughput
    profile's model threads run under overload.

    Measured like the variants (module docstring), so that a build beside other work picks the budget a
    quiet one does: every stream times its calls by its own thread's CPU time, and a budget's rate is
    `streams` x its padded tokens / the PERCENTILE of those per-call times. The first round climbs until
    the rate is past its peak; later rounds revisit the budgets near the best (`contenders`), in turn,
    each adding a slice to every one's samples, until the chosen budget (`batch_budget`) is the same after
    two rounds in a row (MIN_ROUNDS at least, MAX_ROUNDS at most). By the wall clock, each budget met the
    load of its own moment: a MiniLM build picked 128 quiet and anything from 256 to 4,096 beside two busy
    processes."""
    _, now = clock(1, target)
    models = [open_model(graph, variant, target, threads=1) for _ in range(streams)]
    names = models[0].input_names
    length = _feeds(tokenizer, length, 1, names)["input_ids"].shape[1]  # shorter where the model's maximum is
    feeds: dict[int, dict[str, np.ndarray]] = {}
    samples: dict[int, list[float]] = {}
    share = min_seconds / MIN_ROUNDS
    with ThreadPoolExecutor(streams) as pool:

        def measure(budget: int) -> None:
            taken = pool.map(_slice, models, [feeds[budget]] * streams, [now] * streams, [share] * streams)
            samples.setdefault(budget, []).extend(t for stream in taken for t in stream)

        for budget in budgets:  # the first round climbs
            if step:
                step(f"{budget} tokens")
            feeds[budget] = _feeds(tokenizer, length, max(1, budget // length), names)
            before = resident_bytes()
            try:
                list(pool.map(lambda m, f: m.run(f), models, [feeds[budget]] * streams))  # first runs allocate
                measure(budget)
            except (InferenceFailed, MemoryError):
                if not samples:
                    raise
                del feeds[budget]
                break  # a batch this machine cannot hold (a large model, little memory) is no budget
            if past_peak(rates_of(samples, feeds, streams)) or not fits_next(
                resident_bytes() - before, available_bytes()
            ):
                break
        chosen = [batch_budget(rates_of(samples, feeds, streams))]
        while len(chosen) < MAX_ROUNDS and not settled(chosen):
            rates = rates_of(samples, feeds, streams)
            for budget in contenders(rates):
                measure(budget)
            chosen.append(batch_budget(rates_of(samples, feeds, streams)))
            if step:
                step(f"round {len(chosen)}: {chosen[-1]} tokens")
    return rates_of(samples, feeds, streams)


def checked_budgets(budgets: Sequence[int], fitting: int | None = None) -> tuple[int, ...]:
    """The budgets a user named (`hare optimize --tune-budgets`, `hare tune --budgets`), smallest first, once
    each: the climb goes up from the smallest. One under a sequence of BUDGET_LENGTH tokens would be timed as
    that sequence, and so named for a batch it never ran: refused. One over `fitting` padded tokens (None: no
    limit known) cannot fit in this machine's memory (fitting_tokens): refused before the kernel kills the
    build for it (a budget of 100,000,000 grew to 22 GB before it was killed)."""
    small = [b for b in budgets if b < BUDGET_LENGTH]
    if not budgets or small:
        raise InputError(
            f"batch budgets are padded tokens per call, each at least {BUDGET_LENGTH} (one {BUDGET_LENGTH}-token "
            f"sequence), e.g. 128,256,512; got {','.join(map(str, budgets)) or 'none'}"
        )
    if fitting is not None and max(budgets) > fitting:
        raise InputError(
            f"a batch budget of {max(budgets):,} padded tokens does not fit in this machine's memory with every "
            f"stream running one: name budgets of {BUDGET_LENGTH} to {fitting:,} (fewer streams fit larger ones)"
            if fitting >= BUDGET_LENGTH
            else f"not even a batch budget of {BUDGET_LENGTH} padded tokens fits in this machine's memory with "
            "every stream running one: run fewer streams"
        )
    return tuple(sorted(set(budgets)))


# Bytes of a model call's activations a padded token takes at the least: its hidden state, one float32 per
# hidden unit. Every layer's output is one; the call holds more (attention scores, the feed-forward's wider
# states, the inputs), so a call over what this allows cannot fit, and one under it may still not (the climb's
# fits_next and ONNX Runtime's allocation errors stop those).
HIDDEN_BYTES = 4


def fitting_tokens(hidden: int, calls: int, available: int | None = None) -> int | None:
    """The most padded tokens one of `calls` model calls at once may hold and still fit in MEMORY_SHARE of the
    `available` memory (None: this machine's, available_bytes), as fits_next allows a budget's growth, with each
    token taking `hidden` floats (HIDDEN_BYTES each). None where either is unknown (0): no limit."""
    available = available_bytes() if available is None else available
    if not available or not hidden:
        return None
    return int(MEMORY_SHARE * available) // (max(1, calls) * hidden * HIDDEN_BYTES)


def check_tune_points(lengths: Sequence[int], batches: Sequence[int], max_length: int, fitting: int | None) -> None:
    """Refuse `--tune-batches` x `--tune-lengths` whose largest call (lengths cut at the model's `max_length`, as
    the timed texts are) is over `fitting` padded tokens (fitting_tokens; None: no limit): ONNX Runtime's "Failed
    to allocate memory" came out of autotune, after the export and every variant's build."""
    length = min(max(lengths), max_length)
    if fitting is None or max(batches) * length <= fitting:
        return
    most = fitting // length
    fits = f"name batches up to {most:,}" if most else "name shorter lengths"
    raise InputError(
        f"--tune-batches {max(batches):,} of {length}-token sequences (the longest of --tune-lengths the model "
        f"reads) is a call of {max(batches) * length:,} padded tokens, which does not fit in this machine's "
        f"memory: {fits} at that length"
    )


# Why a timing flag may not pass the CPUs (`check_cores`), by flag's meaning.
OVER_CORES = {
    "streams": "each stream's rate is its tokens per its thread's CPU time, which does not count the time it waits "
    "for a CPU (500 streams on 2 cores recorded 173,620,680 tokens/s)",
    "threads": "a call's threads past the CPUs only wait for each other, so its time is no serving's",
}


def check_cores(flag: str, value: int, kind: str) -> None:
    """Refuse `value` model calls (`kind` "streams") or ONNX Runtime threads ("threads") at once beyond the
    logical CPUs this process may run on (usable_cpus: hyper-threads count, so that two streams on a 2-vCPU
    machine of one core and its sibling are measured as before): what more would measure is no machine's."""
    cpus = usable_cpus()
    if value > cpus:
        raise InputError(
            f"{flag} {value} is more than the {cpus} CPUs this process may use: {OVER_CORES[kind]}; give at most {cpus}"
        )


def rates_of(
    samples: Mapping[int, Sequence[float]], feeds: Mapping[int, Mapping[str, np.ndarray]], streams: int
) -> dict[int, float]:
    """Tokens a second by budget: `streams` calls of the budget's padded tokens each per PERCENTILE of the
    per-call milliseconds."""
    return {
        budget: round(streams * feeds[budget]["input_ids"].size / float(np.percentile(s, PERCENTILE)) * 1e3, 1)
        for budget, s in samples.items()
    }


def resident_bytes() -> int:
    """This process's resident memory now (0 where /proc is not there: no limit then). Not the lifetime peak,
    which an earlier stage (the PyTorch reference) may hold above anything the budgets need; ONNX Runtime's
    arena keeps a budget's buffers after its calls, so this counts them."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def fits_next(grew: int, available: int) -> bool:
    """Whether the next budget (twice the tokens) should fit in memory, given that this one took `grew` bytes
    more: its activations grow about twice as much. The climb stops otherwise, since a build the
    kernel kills for memory loses all its work, and ONNX Runtime's allocation errors, which end the climb
    too, come only while the machine can still give it memory (Mistral 4's experts exported with batched_mm,
    which gathered each token's expert weights: about 13 GB more a doubling on two streams). `available` 0:
    unknown, no limit."""
    return available == 0 or 2 * grew < MEMORY_SHARE * available


def contenders(rates: Mapping[int, float]) -> list[int]:
    """The budgets a later round revisits: those within PAST_PEAK of the best rate (the climb's figures for the
    others stand; on DistilBERT-base an 8,192-token call takes seconds, and it is never the pick)."""
    best = max(rates.values())
    return [budget for budget, rate in rates.items() if rate >= PAST_PEAK * best]


def settled(chosen: Sequence[int]) -> bool:
    """The budget chosen after each round so far: MIN_ROUNDS run and the last two agree."""
    return len(chosen) >= MIN_ROUNDS and chosen[-1] == chosen[-2]


def past_peak(rates: dict[int, float]) -> bool:
    """The last two budgets measured both ran under PAST_PEAK of the best rate so far."""
    best = max(rates.values())
    return len(rates) > 2 and all(rate < PAST_PEAK * best for rate in list(rates.values())[-2:])


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
