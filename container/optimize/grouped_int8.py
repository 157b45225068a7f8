"""`int8-grouped`: int8 weights, with the activations quantized at run time in groups of channels, by
OpenVINO's CPU plugin.

Every MatMul whose second input is a 2-D weight is written as that weight in uint8 (a scale and a zero point
per output channel, over the channel's own range) behind a DequantizeLinear. OpenVINO reads the pair as a
compressed weight and quantizes each call's activations to int8 per token in groups of input channels just
before the product, which then runs on the CPU's int8 units (VNNI, or AMX tiles where the CPU has them). A
group has its own scale, so a channel carrying a massive activation coarsens only its own group, where
int8-mixed's per-token scale spans all of a row's channels. Nothing is fitted to the calibration samples
but the group size: wider groups run faster and round coarser, so the build takes the widest of GROUPS that
leaves mixed.MARGIN of each gate's room on them (judged by the real gates, OpenVINO running each try), else
refuses the variant with its closest figures; the word embedding goes into int8 rows with it where that
passes too, as int8-mixed stores it. The graph carries its group in its metadata (GROUP_KEY), which
container/openvino_runtime.py hands to the plugin.

Measured on all-MiniLM-L6-v2 (AMD EPYC, AVX-512 VNNI and AVX512_BF16, one thread, random ids): groups of
64 channels ran 1.79 / 12.73 / 416 ms at 1 x 16 / 1 x 128 / 32 x 128 tokens, 128 channels 1.90 / 12.06 /
399, against int8-mixed's 1.80 / 13.69 / 510 on ONNX Runtime (docs/history/2026-11-optimizer.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from container.optimize import graphs, int8
from container.optimize.mixed import MARGIN, Refused
from container.optimize.simulator import used
from container.optimize.validate import Parity, show_figures, validate

NAME = "int8-grouped"
# The group sizes tried, widest (fastest) first; the graph names its own in its metadata under GROUP_KEY.
GROUPS = (128, 64, 32)
GROUP_KEY = "hare.dynamic_quantization_group_size"
# The int8 paths (container/machine.py) with int8 dot-product units, which the run-time quantization needs to
# pay off: on AVX2's kernels OpenVINO widens the weights and multiplies in fp32, slower than the fp32 graph
# (all-MiniLM-L6-v2, 16 tokens: 5.93 against 4.75 ms), so a build there leaves the variant out unless named.
RUNS_ON = ("amx", "avx512-vnni", "avx-vnni")


def build(fp32: Path, out: Path, fit: Parity) -> dict[str, Any]:
    """Write `fp32` with its MatMul weights in int8 to `out`, with the widest activation group of GROUPS that
    meets the gates on the calibration samples `fit` with MARGIN to spare, and return what it chose (for the
    manifest); Refused, with the closest figures, when none does. At each group the lookup tables (the word
    embedding) are tried as int8 rows first (int8.int8_tables, as int8-mixed stores them: a quarter of the
    bytes, in the file and in each copy OpenVINO compiles), then in fp32. A graph OpenVINO cannot take raises
    here and fails this variant alone."""
    start = time.perf_counter()
    plain = onnx.load(str(fp32))
    weights = weights_to_int8(plain.graph)
    names = int8.tables(plain)
    tabled = None
    if names:
        tabled = onnx.ModelProto()
        tabled.CopyFrom(plain)
        int8.int8_tables(tabled, names)
    ideal = validate(fp32, "fp32", "fp32", fit).figures
    closest: tuple[float, str] = (float("inf"), "")
    tries = [(group, model) for group in GROUPS for model in (tabled, plain) if model is not None]
    for tried, (group, model) in enumerate(tries, 1):
        set_group(model, group)
        graphs.save(model, out)
        report = validate(out, NAME, "int8", fit)
        harm = max((used(g, report.gates[g.metric], ideal) for g in fit.task.gates), default=0.0)
        stored = names if model is tabled else []
        if report.passed and harm <= 1 - MARGIN:
            return {
                "group": group,
                "weights": weights,
                "tables": stored,
                "calibration": len(fit.encodings),
                "figures": report.figures,
                "passes": tried,
                "seconds": round(time.perf_counter() - start, 1),
            }
        tables_said = ", lookup tables in int8 rows" if stored else ""
        closest = min(closest, (harm, f"groups of {group}{tables_said}: {show_figures(report.figures)}"))
    raise Refused(
        f"no activation group left {MARGIN:.0%} of each gate's room on the calibration samples; closest "
        f"{closest[1]} (fp32: {show_figures(ideal)})"
    )


def set_group(model: onnx.ModelProto, group: int) -> None:
    """Name the activations' group size in `model`'s metadata (OpenVINO shows it to the runtime)."""
    for prop in model.metadata_props:
        if prop.key == GROUP_KEY:
            prop.value = str(group)
            return
    model.metadata_props.add(key=GROUP_KEY, value=str(group))


def weights_to_int8(graph: onnx.GraphProto) -> int:
    """Replace each float 2-D initializer that a MatMul multiplies by (its second input) with uint8 values, a
    scale and a zero point per output channel and the DequantizeLinear that gives the weight back under its
    own name (so every reader of it still finds it); returns how many."""
    matmul_weights = {node.input[1] for node in graph.node if node.op_type == "MatMul" and len(node.input) == 2}
    kept, dequantize, count = [], [], 0
    for init in graph.initializer:
        if init.name not in matmul_weights or init.data_type != onnx.TensorProto.FLOAT or len(init.dims) != 2:
            kept.append(init)
            continue
        values, scale, zero = _per_channel_uint8(numpy_helper.to_array(init))
        names = (f"{init.name}_uint8", f"{init.name}_scale", f"{init.name}_zero")
        kept += [numpy_helper.from_array(a, n) for a, n in zip((values, scale, zero), names, strict=True)]
        dequantize.append(helper.make_node("DequantizeLinear", list(names), [init.name], axis=1))
        count += 1
    graphs.swap_weights(graph, kept, dequantize)
    return count


def _per_channel_uint8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Asymmetric uint8 per output channel (the weight's columns): the channel's range, zero included, in 255
    steps."""
    low = np.minimum(weight.min(axis=0), 0.0)
    high = np.maximum(weight.max(axis=0), 0.0)
    scale = (np.maximum(high - low, 1e-12) / 255.0).astype(np.float32)
    zero = np.clip(np.round(-low / scale), 0, 255).astype(np.uint8)
    values = np.clip(np.round(weight / scale) + zero, 0, 255).astype(np.uint8)
    return values, scale, zero
