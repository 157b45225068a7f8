"""A bundle's graph opened by the runtime its variant needs: one place for every caller (the server's
backend, the optimizer's gates and timings, the benches, the bulk job)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from container.openvino_runtime import VARIANTS, OpenVinoModel, read_graph
from container.runtime import OnnxModel

# ONNX Runtime runs every variant but these: bf16, which its CPU provider has no kernels for, int8-static,
# whose QDQ graph OpenVINO runs on its int8 kernels, and int8-grouped, whose activations it quantizes at run
# time (container/openvino_runtime.py).
OPENVINO_VARIANTS = VARIANTS


class Model(Protocol):
    input_names: list[str]
    output: str
    providers: list[str]
    # The multiple of tokens a call's padded length is rounded up to (api/engine/backend.py).
    length_multiple: int
    # A call above this many padded tokens leaves memory that the worker's idle trim gives back (`trim`).
    trim_above: int

    @property
    def output_width(self) -> int | None: ...

    def run(self, feeds: Mapping[str, NDArray[np.int64]], shrink: bool = False) -> NDArray[np.float32]: ...

    def trim(self) -> bool:
        """Give back the memory bigger calls left behind (for an idle caller); False if a call was running."""
        ...


def open_model(
    path: Path,
    variant: str = "fp32",
    target: str = "cpu",
    threads: int = 0,
    output: str | None = None,
    arena: bool = True,
    callers: int = 1,
) -> Model:
    """The graph at `path` ready to run as `variant` (its name) on `target` with `threads` per call (0: every
    core); `arena` as OnnxModel takes it; `callers`: how many threads may call it at once (an ONNX Runtime
    session takes any number; OpenVINO gets a stream for each)."""
    if variant in OPENVINO_VARIANTS:
        return OpenVinoModel(path, threads, output, callers)
    return OnnxModel(path, target, threads, output, arena=arena)


def open_models(
    path: Path,
    variant: str,
    target: str,
    callers: Mapping[int, int],
    output: str | None = None,
    arena: bool = True,
) -> dict[int, Model]:
    """One model per thread count of `callers` (threads per call -> the threads that may call it at once), as
    `open_model` opens each, the graph read once for all of them where the runtime can share it (OpenVINO:
    `read_graph`)."""
    graph = read_graph(path) if variant in OPENVINO_VARIANTS else None
    return {
        threads: OpenVinoModel(graph, threads, output, n)
        if graph is not None
        else open_model(path, variant, target, threads, output, arena, n)
        for threads, n in callers.items()
    }
