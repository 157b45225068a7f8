"""What `hare optimize` takes: the options every stage reads its settings from."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.base import TaskSpec


@dataclass(frozen=True)
class OptimizeOptions:
    """What `hare optimize` takes. thresholds: gate overrides by metric name (see tasks' gates)."""

    model_dir: Path
    task: TaskSpec
    out: Path
    target: str = "cpu"
    force: bool = False
    allow_pickle: bool = False
    validation_file: Path | None = None
    thresholds: Mapping[str, float] | None = None
    only: Sequence[str] | None = None
    trust_remote_code: bool = False
    tune_lengths: Sequence[int] = (16, 128, 384)
    tune_batches: Sequence[int] = (1, 8)
    tune_threads: int = 1
    tune_seconds: float = 0.2
    tune_streams: int = 0  # model calls at once while measuring the batch budget (0: one per physical core)
    tune_budgets: Sequence[int] | None = None  # padded tokens per call tried for it (None: autotune.BUDGETS)
    adapter: str | None = None  # the task adapter (LoRA) baked into the weights, for a folder that has several
    int8_levels: int | None = None  # dynamic int8 weights' levels a side (None: what this CPU adds exactly)
