"""A bundle's graph opened by the runtime its precision needs: one place for every caller (the server's
backend, the optimizer's gates and timings, the benches, the bulk job)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from container.openvino_runtime import OpenVinoModel
from container.runtime import OnnxModel

# ONNX Runtime runs every precision but bf16, which its CPU provider has no kernels for
# (container/openvino_runtime.py).
OPENVINO_PRECISIONS = ("bf16",)


class Model(Protocol):
    input_names: list[str]
    output: str
    providers: list[str]

    @property
    def output_width(self) -> int | None: ...

    def run(self, feeds: Mapping[str, NDArray[np.int64]], shrink: bool = False) -> NDArray[np.float32]: ...


def open_model(
    path: Path,
    precision: str = "fp32",
    target: str = "cpu",
    threads: int = 0,
    output: str | None = None,
    arena: bool = True,
    callers: int = 1,
) -> Model:
    """The graph at `path` ready to run a variant of `precision` on `target` with `threads` per call (0: every
    core); `arena` as OnnxModel takes it; `callers`: how many threads may call it at once (an ONNX Runtime
    session takes any number; OpenVINO gets a stream for each)."""
    if precision in OPENVINO_PRECISIONS:
        return OpenVinoModel(path, threads, output, callers)
    return OnnxModel(path, target, threads, output, arena=arena)
