"""A bundle's graph opened by the runtime its variant needs: one place for every caller (the server's
backend, the optimizer's gates and timings, the benches, the bulk job)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from container.openvino_runtime import VARIANTS, OpenVinoModel, read_graph
from container.runtime import OnnxModel
from tasks.errors import HareError, InputError

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
    # Whether each thread that may call the model at once costs a copy of it (opened for `callers`): a server
    # worker then runs no more calls at once than it opened for (api/engine/batching.py, `spread`).
    copy_per_caller: bool

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
    with _loading(path):
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
    with _loading(path):
        graph = read_graph(path) if variant in OPENVINO_VARIANTS else None
        return {
            threads: OpenVinoModel(graph, threads, output, n)
            if graph is not None
            else open_model(path, variant, target, threads, output, arena, n)
            for threads, n in callers.items()
        }


@contextmanager
def _loading(path: Path) -> Iterator[None]:
    """The runtime's own failure to read the graph at `path` (a damaged file) as one sentence naming it, not a
    traceback from inside the runtime; hare's errors (a provider this machine lacks) pass as they are."""
    try:
        yield
    except (HareError, MemoryError):
        raise
    except Exception as exc:
        # The last line: OpenVINO's first ones name its own source files.
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        said = lines[-1] if lines else type(exc).__name__
        raise InputError(f"{path} is not a graph the runtime can load ({said}); rebuild the bundle") from exc
