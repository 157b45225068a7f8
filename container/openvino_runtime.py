"""OpenVINO's CPU plugin as the runtime of the variants in VARIANTS, behind OnnxModel's interface.

ONNX Runtime's CPU provider has no bfloat16 MatMul or Gemm kernel (1.32: NOT_IMPLEMENTED on a one-node graph), so a
bf16 variant is the export, its MatMul weights stored in bf16 (container/optimize/bf16.py), compiled by OpenVINO
with bf16 as its inference precision: on a CPU with AMX or AVX512_BF16 the MatMuls run on bf16 units (an 8-bit
exponent: massive activations survive, where int8's levels do not), elsewhere OpenVINO would silently compute in
fp32, so the optimizer only offers the variant where the plugin reports BF16 (`bf16_capable`). int8-static's graph
has its MatMuls between QuantizeLinear / DequantizeLinear pairs, which the plugin runs on its int8 kernels, the
rest in bf16 where it can (container/optimize/static_int8.py). int8-grouped's graph has int8 weights, whose MatMuls
the plugin runs on its int8 kernels after quantizing each call's activations in groups of channels, the group size
named in the graph's metadata (container/optimize/grouped_int8.py). The package is optional (`hare[openvino]`, in
the CPU image); a bundle that needs it says so when it is missing.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from container.runtime import InferenceFailed
from tasks.errors import InputError

PROVIDER = "OpenVINO CPU"  # what /info and the logs name as the bundle's provider
# What the plugin keeps per input shape it has run, at most (its default, 5,000, let a process grow without
# bound in practice: every batch size x padded length is a shape). One compiled MiniLM (int8-grouped), 1,500
# calls of random shapes (1-8 x 3-200 tokens), RSS above the process before it: +833 MB and growing with the
# default, +344 MB flat with 256 entries, at most 8% more CPU on those all-new shapes (AMD EPYC).
RUNTIME_CACHE = 256
# The multiple of tokens a call's padded length is rounded up to, served or bulk. The plugin compiles kernels for
# each input shape (a new one cost 5-10 ms more than its next call, MiniLM bf16 on AMX) and oneDNN keeps them for
# up to 1,024 primitives: a mix of lengths (scripts/mixed-lengths.py, MiniLM bf16 on an Intel Xeon with AMX,
# 2026-11-29) left a worker at 602-626 MB RSS and answered 516-542 req/s at 16 connections; rounded to 8, 423-448
# MB and 618-630 req/s (int8-grouped, an earlier form of the script: 448-460 against 277-289 MB, 401-434 against
# 462-514 req/s). A bulk job's calls at multiples of 8 cost less per token too (int8-grouped, AMD EPYC:
# 15.98-16.55 CPU s per 1,000 rows against 16.76-17.25 unrounded); 32 lost it again. A lone short text pays for
# the padding: 9 tokens as 16 cost 2-8% more on AMX (bf16, int8-grouped), 1.35-1.63 against 1.72-2.04 ms on that
# EPYC (int8-grouped; its mix of lengths not measured).
LENGTH_MULTIPLE = 8
# The variants OpenVINO runs (container/models.py opens them here).
VARIANTS = ("bf16", "int8-static", "int8-grouped")
# A graph's own plugin setting, in its metadata: int8-grouped's activation group (container/optimize/grouped_int8.py).
SETTINGS_IN_GRAPH = {"hare.dynamic_quantization_group_size": "DYNAMIC_QUANTIZATION_GROUP_SIZE"}
# The runtime information key of a decompression Convert: ov::Decompression's type name and version.
DECOMPRESSION = "decompression_0"
# The name ending of a weight the bf16 variant stores in bf16 (container/optimize/bf16.py), which read_graph hands
# to the plugin as it is.
STORED_BF16 = ".hare_bf16"


def _openvino() -> Any:
    # `import openvino` imports its converter, which sends a Google Analytics event and writes a client id
    # under $HOME/intel unless a consent file there says no (openvino-telemetry assumes yes without one).
    # An appliance must not call out on every worker's start: with the telemetry module unimportable, OpenVINO
    # falls back to its own stub. setdefault, so that a process that imported it on purpose keeps it.
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    try:
        import openvino
    except ImportError as exc:
        raise InputError(
            "this bundle's variant runs on OpenVINO, which is not installed: pip install 'hare[openvino]' "
            "(the hare:cpu image has it), or rebuild the bundle without it (hare optimize --variants ...)"
        ) from exc
    return openvino


def available() -> bool:
    """Whether OpenVINO is installed (the optional `hare[openvino]`)."""
    return importlib.util.find_spec("openvino") is not None


@cache
def bf16_capable() -> bool:
    """Whether OpenVINO is installed and its CPU plugin computes bf16 on this CPU (AMX or AVX512_BF16)."""
    if not available():
        return False
    return "BF16" in _openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def read_graph(path: Path) -> Any:
    """The graph at `path` as OpenVINO reads it: its weights file mapped, and kept mapped by every model compiled
    from it (constants it runs as they are, such as the word embedding's table). Each read maps the file again:
    a worker's one-thread and two-thread models read apart held the default MiniLM's 86 MB twice in its RSS.

    The Cast of each weight the bf16 variant stores in bf16 (named with STORED_BF16) is marked as a
    decompression, as OpenVINO's own IR files mark theirs: the plugin then feeds the stored weights to its
    kernels, where it otherwise folds the Cast into an fp32 constant and converts that again, a copy more in
    every compiled model (97 MB a copy of MiniLM, against 35-37 marked and 56-58 for the fp32 export; AMX,
    2026-12-01). Only those, so that a graph is served as it was gated: marked, stored weights can change an
    answer's last bits (a tiny Gemma 4's, within its gates), and a bundle built before, or an export's own Cast,
    is left as the plugin took it then. The mark is the runtime information key OpenVINO gives it
    (`ov::mark_as_decompression`), which its Python API does not expose."""
    model = _openvino().Core().read_model(str(path))
    for node in model.get_ordered_ops():
        if node.get_type_name() == "Convert":
            source = node.input_value(0).get_node()
            if source.get_type_name() == "Constant" and source.get_friendly_name().endswith(STORED_BF16):
                node.get_rt_info()[DECOMPRESSION] = ""
    return model


class OpenVinoModel:
    """A graph compiled for OpenVINO's CPU plugin, bf16 its precision where the CPU has it, with the settings the
    graph names (SETTINGS_IN_GRAPH), called like OnnxModel.

    `threads` per call (0: every core this process may use). `callers`: the threads that may call it at once.
    Each gets its own copy compiled as one stream of `threads` threads, and its own infer request (a request is
    not thread-safe): with one thread the plugin runs a call on the calling thread, so the optimizer's timings
    measure it by that thread's CPU time (container/optimize/autotune.py) and a served call runs on the core
    the model thread holds (api/engine/cores.py), with no hand-off to the plugin's own threads. One compile of
    `callers` streams ran each call on a stream's thread: served at two users and 16 tokens (MiniLM, AMD EPYC),
    int8-grouped answered 491-532 req/s where int8-mixed on ONNX Runtime answered 640-721; with a copy a
    thread, level with it. A copy costs 28 MB (int8-grouped MiniLM) to 56 MB (its fp32 graph in bf16).
    Pinning is left off: hare's core pool decides who runs when."""

    length_multiple = LENGTH_MULTIPLE
    # A call above this many padded tokens marks the worker for an idle trim. Allocating the buffers again costs
    # the next call 7-21% (MiniLM bf16 on AMX, one thread: 1 x 128 tokens +0.9 ms on 9.6, 1 x 512 +10.8 on 49.9,
    # 32 x 128 +21 on 282): worth paying after a batch bigger than any one request (4 x 512 tokens), not after
    # every long text of a quiet hour.
    trim_above = 2048
    copy_per_caller = True  # 28-56 MB each (above)

    def __init__(self, path: Path | Any, threads: int = 0, output: str | None = None, callers: int = 1) -> None:
        """`path`: the graph's file, or the graph `read_graph` read (shared by a process's models of one graph)."""
        ov = _openvino()
        threads = threads or len(os.sched_getaffinity(0))
        config = {
            "INFERENCE_PRECISION_HINT": "bf16",
            "NUM_STREAMS": 1,
            "INFERENCE_NUM_THREADS": threads,
            "ENABLE_CPU_PINNING": False,
            "CPU_RUNTIME_CACHE_CAPACITY": RUNTIME_CACHE,
        }
        core = ov.Core()
        model = read_graph(path) if isinstance(path, Path) else path
        # ONNX metadata reaches OpenVINO's model as its "framework" information.
        for key, setting in SETTINGS_IN_GRAPH.items():
            if model.has_rt_info(["framework", key]):
                config[setting] = int(model.get_rt_info(["framework", key]).astype(str))
        self._copies = [core.compile_model(model, "CPU", config) for _ in range(max(1, callers))]
        first = self._copies[0]
        # A port's names can gather those of tensors merged into it (a Cast of the mask): the Parameter's own
        # name is the ONNX input's.
        self.input_names: list[str] = [port.get_node().get_friendly_name() for port in first.inputs]
        self.output = output or first.outputs[0].get_any_name()
        self._port = first.output(self.output)
        self.providers: list[str] = [PROVIDER]
        self._local = threading.local()
        self._callers = 0  # threads seen so far: the next one takes the next copy
        self._lock = threading.Lock()

    @property
    def output_width(self) -> int | None:
        last = self._port.get_partial_shape()[-1]
        return int(last.get_length()) if last.is_static else None

    def run(self, feeds: Mapping[str, NDArray[np.int64]], shrink: bool = False) -> NDArray[np.float32]:
        """The output for `feeds` (a copy: the request's output buffer is reused by its next call); `shrink`
        has no meaning here (OpenVINO keeps its buffers per shape)."""
        request = getattr(self._local, "request", None)
        if request is None:
            with self._lock:
                copy = self._copies[self._callers % len(self._copies)]
                self._callers += 1
            request = self._local.request = copy.create_infer_request()
        try:
            # Inputs shared, not copied into the request's own tensors, and the results not copied into a dict
            # of arrays: only the output asked for is copied, below. Copying cost 0.18-0.21 ms a call at one
            # 8-token text and 0.4-0.5 at one of 128 (MiniLM bf16 on AMX, thread CPU, 2026-11-29). Every call
            # shares: a copying call after a shared one resizes the shared tensor in place, and fails there.
            request.infer({name: feeds[name] for name in self.input_names}, share_inputs=True, share_outputs=True)
        except KeyError as exc:
            raise InferenceFailed(f"the graph needs input {exc} that the caller did not build") from exc
        except Exception as exc:  # OpenVINO raises RuntimeError with the plugin's message
            raise InferenceFailed(f"inference failed: {exc}") from exc
        return np.array(request.get_tensor(self.output).data, dtype=np.float32)

    def trim(self) -> bool:
        """Free each copy's intermediate buffers, which the plugin otherwise keeps at the biggest shape it has run
        (what stays is the kernels compiled per shape). Served MiniLM bf16 on AMX with 4,096-token batches, two
        workers: 450 / 477 MB RSS after a burst of 32 x 128-token requests, 387 / 414 MB a second later, where they
        had stayed at the burst's size. The next call allocates again. The plugin refuses while a call runs
        on the copy: False, and the next idle spell tries again."""
        released = True
        for copy in self._copies:
            try:
                copy.release_memory()
            except RuntimeError:  # "a compiled model in a busy state"
                released = False
        return released
