"""`int8-grouped`: int8 weights, with the activations quantized at run time in groups of 32 channels, by
OpenVINO's CPU plugin.

Every MatMul whose second input is a 2-D weight is written as that weight in uint8 (a scale and a zero point
per output channel, over the channel's own range) behind a DequantizeLinear. OpenVINO reads the pair as a
compressed weight and, with DYNAMIC_QUANTIZATION_GROUP_SIZE set (container/openvino_runtime.py), quantizes
each call's activations to int8 per token in groups of 32 input channels just before the product, which then
runs on the CPU's int8 units (VNNI, or AMX tiles where the CPU has them). A group has its own scale, so a
channel carrying a massive activation coarsens only its own group of 32, where int8-mixed's per-token scale
spans all of a row's channels. Nothing is calibrated: the scales come from the weights and from each call.

Measured on all-MiniLM-L6-v2 (AMD EPYC, AVX-512 VNNI and AVX512_BF16, one thread, random ids): 14.4 ms at 128
tokens against int8-mixed's 13.7 and bf16's 16.2, 469 ms at 32 x 128 against 509 and 499, with cosine to fp32
0.995-0.999 where int8-mixed's fell to 0.88 on the same random ids (docs/history/2026-11-optimizer.md).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from container.optimize import graphs

NAME = "int8-grouped"
# The int8 paths (container/machine.py) with int8 dot-product units, which the run-time quantization needs to
# pay off: on AVX2's kernels OpenVINO widens the weights and multiplies in fp32, slower than the fp32 graph
# (all-MiniLM-L6-v2, 16 tokens: 5.93 against 4.75 ms), so a build there leaves the variant out unless named.
RUNS_ON = ("amx", "avx512-vnni", "avx-vnni")


def build(fp32: Path, out: Path) -> str:
    """Write `fp32` with its MatMul weights in int8 to `out`, compile and run it once with OpenVINO (a graph the
    plugin cannot take fails this variant alone), and say how many weights it wrote."""
    from container.openvino_runtime import OpenVinoModel  # the optimizer imports this module without OpenVINO

    model = onnx.load(str(fp32))
    count = weights_to_int8(model.graph)
    graphs.save(model, out)
    compiled = OpenVinoModel(out, threads=1, variant=NAME)
    compiled.run({name: np.ones((1, 4), np.int64) for name in compiled.input_names})
    return f"{count} MatMul weights in int8, compiled by OpenVINO"


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
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = [*dequantize, *graph.node]  # the weights first: a graph's nodes stay in topological order
    del graph.node[:]
    graph.node.extend(nodes)
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
