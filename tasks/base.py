"""What every task declares: how the optimizer exports and checks it, and how the server answers it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float32]


@dataclass(frozen=True)
class Gate:
    """A parity threshold a candidate variant must meet before it may ship."""

    metric: str
    threshold: float
    higher_is_better: bool
    help: str

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.higher_is_better else value <= self.threshold


@dataclass(frozen=True)
class ParityInput:
    """Reference (PyTorch) and candidate (ONNX) outputs for the validation set, one array per example.

    Token-level outputs are trimmed to the example's real tokens, so padding never counts.
    `groups` gives each example's query for ranking (all zeros otherwise).
    """

    reference: Sequence[Array]
    candidate: Sequence[Array]
    groups: Sequence[int]
    pooling: str


@dataclass(frozen=True)
class TaskSpec:
    """One task's contract with the optimizer (export and parity).

    head: the transformers Auto class the optimizer instantiates.
    architectures: suffixes a checkpoint's `architectures` must end with; empty means any checkpoint.
    output: the graph output the server reads.
    pairs: inputs are (query, document) pairs rather than single texts.
    parity: task metrics from reference vs candidate outputs.
    gates: the default thresholds (overridable from the CLI by metric name).
    default_pooling: pooling when the model folder declares none (embeddings only).
    """

    name: str
    head: str
    architectures: tuple[str, ...]
    output: str
    pairs: bool
    parity: Callable[[ParityInput], dict[str, float]]
    gates: tuple[Gate, ...]
    default_pooling: str | None = None
