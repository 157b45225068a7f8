"""The ONNX Runtime backend: load a graph once, feed it only the inputs it declares, return one output."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from tasks.errors import HareError, InputError

# ONNX Runtime is imported where a session is made: a worker serving an OpenVINO bundle never loads it (9 MB
# of a served worker's RSS, 19 imported alone), though it shares this module's errors and helpers.
if TYPE_CHECKING:
    import onnxruntime as ort


class InferenceFailed(HareError):
    """The runtime failed on a well-formed input (a broken bundle or a bug); the trace goes to the log."""


PROVIDERS = {
    "cpu": ["CPUExecutionProvider"],
    "gpu": ["CUDAExecutionProvider", "CPUExecutionProvider"],
}
# The CUDA provider runs fp32 MatMuls as TF32 by default on Ampere and later (10-bit mantissas): an fp32
# bundle then answers up to 1e-3 away from PyTorch's fp32 and fails its own gate (measured on an H200:
# all-MiniLM-L6-v2 geometry, max|diff| 9.7e-4 against the 1e-4 bound), leaving no fallback where fp16 fails.
# fp32 on a GPU means fp32; the fast GPU path is the fp16 variant, which TF32 does not touch.
PROVIDER_OPTIONS: dict[str, dict[str, str]] = {"CUDAExecutionProvider": {"use_tf32": "0"}}


# ONNX Runtime's CPU kernel for SkipLayerNormalization runs 6-7x slower than the Add and LayerNormalization it
# replaces (ORT 1.32, one thread, 128 x 768: 493 against 68 us; 128 x 384: 263 against 40 us, on an AVX-512
# VNNI EPYC), and ORT fuses that pair at load. Its loop is plain C++ with a float sum and a division per
# element, which compilers do not vectorize, so no ISA escapes it (contrib_ops/cpu/skip_layer_norm.cc). On
# CPU the pair stays apart: the DistilBERT-base int8 graph ran 37.3 ms instead of 40.0 at 128 tokens. The
# optimizer's fused graphs leave it unfused on CPU too (container/optimize/fuse.py). CUDA's fused kernel is
# the fast one there, so GPU sessions keep the fusion.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion",)


def session_options(threads: int, arena: bool = True, target: str = "cpu") -> ort.SessionOptions:
    """Options for one session: `threads` intra-op threads (0 lets ORT use every core), no inter-op pool;
    `arena` False gives freed buffers back instead of keeping ORT's CPU arena (see docs/serving.md, Memory);
    `target` "cpu" leaves out the load-time fusions that are slower on CPU (CPU_DISABLED_OPTIMIZERS)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if target == "cpu":
        options.add_session_config_entry("optimization.disable_specified_optimizers", ",".join(CPU_DISABLED_OPTIMIZERS))
    # A wide call holds every core its threads run on (api/engine/cores.py): they spin between the graph's operators
    # rather than sleep and wake for each one, and stop spinning when the run returns, so the cores it gives
    # back are idle. Measured on all-MiniLM-L6-v2 fp32 with 2 threads: 13.4 ms at 128 tokens and 2.2 ms at 16,
    # against 15.1 and 3.1 ms sleeping; 0.1 ms of CPU in the 20 ms after a run, against 17 ms spinning on.
    spin = threads != 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.add_session_config_entry("session.force_spinning_stop", "1" if spin else "0")
    options.enable_cpu_mem_arena = arena
    if arena:
        shared_cpu_arena()
        options.add_session_config_entry("session.use_env_allocators", "1")
    options.log_severity_level = 3
    return options


@functools.cache
def shared_cpu_arena() -> None:
    """One CPU arena for every session of this process that asks for it (`session.use_env_allocators`),
    growing by what is asked rather than to the next power of two. A worker's narrow and wide sessions
    (api/engine/backend.py) then keep one arena, not one each: measured on the DistilBERT-base int8 bundle
    after a 512-token and a 8 x 128-token run, 269 MB RSS against 344 MB, at the same speed."""
    import onnxruntime as ort

    config = ort.OrtArenaCfg({"arena_extend_strategy": 1})  # 1: kSameAsRequested
    cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(cpu, config)


@functools.cache
def _shrink() -> ort.RunOptions:
    """Run options that give the CPU arena's unused chunks back after the run."""
    import onnxruntime as ort

    options = ort.RunOptions()
    options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    return options


def _glibc() -> ctypes.CDLL | None:
    """glibc, for the malloc settings below; None off glibc (musl, macOS), where they are no-ops."""
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def bound_malloc(threshold: int = 1 << 20) -> None:
    """Serve allocations from `threshold` bytes up with their own mappings, returned to the system when freed
    (glibc raises this threshold on its own up to 32 MB, after which a burst's buffers stay in the heap)."""
    m_mmap_threshold = -3
    if (libc := _glibc()) is not None:
        libc.mallopt(m_mmap_threshold, threshold)


def trim_malloc() -> None:
    """Hand the free pages inside malloc's heaps back to the system (glibc's `malloc_trim`). Compiling and
    warming a model frees much of what it allocated in the middle of the heaps, where glibc's own trimming (the
    top of a heap only) never reaches it."""
    if (libc := _glibc()) is not None:
        libc.malloc_trim(0)


def available_targets() -> list[str]:
    import onnxruntime as ort

    have = set(ort.get_available_providers())
    return [t for t, providers in PROVIDERS.items() if providers[0] in have]


def check_target(target: str) -> None:
    """Refuse a target this onnxruntime cannot run (a GPU bundle where no CUDA provider is installed)."""
    import onnxruntime as ort

    if target not in available_targets():
        raise InputError(
            f"target {target!r} needs {PROVIDERS[target][0]}, but this onnxruntime offers "
            f"{', '.join(ort.get_available_providers())}"
        )


class OnnxModel:
    """A loaded graph. `run` takes a superset of feeds and passes on only the declared inputs."""

    length_multiple = 1  # ONNX Runtime's kernels run any length alike (an int8-mixed bulk job: level at 8)
    # A call above this many padded tokens leaves the arena grown past what small requests need: the idle trim
    # gives it back (the warm-up's longest sequence included).
    trim_above = 256
    copy_per_caller = False  # a session takes any number of callers at once

    def __init__(
        self,
        path: Path,
        target: str = "cpu",
        threads: int = 0,
        output: str | None = None,
        arena: bool = True,
        cuda_graph: bool = False,
    ) -> None:
        """`cuda_graph`: a GPU session that can capture CUDA graphs (container/cudagraphs.py); ORT refuses it
        when a node would run on the CPU, so it gets the CUDA provider alone."""
        import onnxruntime as ort

        check_target(target)
        providers = [(name, PROVIDER_OPTIONS.get(name, {})) for name in PROVIDERS[target]]
        if cuda_graph:
            name, options = providers[0]
            providers = [(name, options | {"enable_cuda_graph": "1"})]
        self.session = ort.InferenceSession(str(path), session_options(threads, arena, target), providers=providers)
        self.input_names: list[str] = [i.name for i in self.session.get_inputs()]
        self.output = output or self.session.get_outputs()[0].name
        self.providers: list[str] = self.session.get_providers()

    @property
    def output_width(self) -> int | None:
        """The size of the output's last axis (a vector's size, for embeddings) when the graph fixes it."""
        for output in self.session.get_outputs():
            if output.name == self.output and output.shape and isinstance(output.shape[-1], int):
                return int(output.shape[-1])
        return None

    def run(self, feeds: Mapping[str, NDArray[np.int64]], shrink: bool = False) -> NDArray[np.float32]:
        """The output for `feeds`; `shrink` gives the CPU arena's unused chunks back after this run (a big
        batch would otherwise keep its peak allocated for the life of the process)."""
        options = _shrink() if shrink else None
        try:
            (result,) = self.session.run([self.output], {name: feeds[name] for name in self.input_names}, options)
        except KeyError as exc:
            raise InferenceFailed(f"the graph needs input {exc} that the caller did not build") from exc
        except Exception as exc:  # ORT raises its own untyped errors; keep the message for the operator.
            raise InferenceFailed(f"inference failed: {exc}") from exc
        return np.asarray(result, dtype=np.float32)

    def trim(self) -> bool:
        """Give the CPU arena's unused chunks back: a one-token run with the shrink option (the arena shrinks
        after a run; a worker's sessions share one arena, so any of them trims it)."""
        one_token = {name: np.full((1, 1), int(name != "token_type_ids"), np.int64) for name in self.input_names}
        self.run(one_token, shrink=True)
        return True
