"""The int8 arithmetic int8-mixed writes (container/optimize/mixed.py): a MatMul on per-channel int8 weights
with one activation scale per call (the operators ONNX Runtime's dynamic quantizer writes, which it fuses into
one kernel) or one per token (written here: the quantizer has no such mode), and the simulation graph in
which each MatMul switches between fp32 and either, so that the CPU's own int8 kernel judges every choice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from container.machine import FULL_LEVELS

# The simulation's input: one switch per MatMul.
SWITCHES = "hare_int8_switches"
# A switch's values: the MatMul in fp32 (0), int8 with one activation scale per call, or one per token.
TENSOR, TOKEN = 1, 2
# What the per-token arithmetic reads: 127 levels a side, the least row maximum, a unit scale, the zero point.
TOKEN_CONSTANTS = ("hare_int8_levels", "hare_int8_least", "hare_int8_one", "hare_int8_middle")


def quantized_weight(
    weight: NDArray[np.float32], levels: int = FULL_LEVELS
) -> tuple[NDArray[np.int8], NDArray[np.float32]]:
    """`weight` [K, N] as per-channel dynamic int8 stores it: symmetric int8 values in [-levels, levels] and one
    scale per output column (max |w| / levels, computed in float64 and stored in float32, as the quantizer does;
    64 levels is its `reduce_range`)."""
    absmax = np.abs(weight).max(axis=0).astype(np.float64)
    scale = (2 * absmax / (2 * levels)).astype(np.float32)
    scale[scale == 0] = 1.0
    return np.clip(np.rint(weight / scale), -levels, levels).astype(np.int8), scale


def arithmetic(x: str, y: str, w: str, p: str, scales: str, name: str = "") -> list[onnx.NodeProto]:
    """The int8 arithmetic of one MatMul from `x` to `y` (intermediate tensors named `p`...), on its int8
    weight `{w}_w` with per-column scales `{w}_ws` and zero points `{w}_wz` (int8_weights). "tensor": the
    dynamic quantizer's own operators (one activation scale per call, u8 with a zero point; ONNX Runtime fuses
    them into DynamicQuantizeMatMul). "token": one scale per row, max |x_row| / 127, u8 around the zero point
    128 (TOKEN_CONSTANTS). `name` names the MatMulInteger."""
    if scales == "tensor":
        return [
            helper.make_node("DynamicQuantizeLinear", [x], [f"{p}_q", f"{p}_s", f"{p}_z"]),
            helper.make_node("MatMulInteger", [f"{p}_q", f"{w}_w", f"{p}_z", f"{w}_wz"], [f"{p}_acc"], name=name),
            helper.make_node("Cast", [f"{p}_acc"], [f"{p}_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"{p}_s", f"{w}_ws"], [f"{p}_scale"]),
            helper.make_node("Mul", [f"{p}_f", f"{p}_scale"], [y]),
        ]
    levels, least, one, middle = TOKEN_CONSTANTS
    return [
        helper.make_node("Abs", [x], [f"{p}_abs"]),
        helper.make_node("ReduceMax", [f"{p}_abs"], [f"{p}_max"], axes=[-1], keepdims=1),
        helper.make_node("Max", [f"{p}_max", least], [f"{p}_live"]),  # a row of zeros stays zeros
        helper.make_node("Div", [f"{p}_live", levels], [f"{p}_s"]),
        helper.make_node("Div", [x, f"{p}_s"], [f"{p}_x"]),
        helper.make_node("QuantizeLinear", [f"{p}_x", one, middle], [f"{p}_q"]),
        helper.make_node("MatMulInteger", [f"{p}_q", f"{w}_w", middle, f"{w}_wz"], [f"{p}_acc"], name=name),
        helper.make_node("Cast", [f"{p}_acc"], [f"{p}_f"], to=TensorProto.FLOAT),
        # The weights' scales first: ONNX Runtime fuses MatMulInteger, Cast and a Mul by Mul(a_scale, b_scale)
        # into MatMulIntegerToFloat, which takes a_scale for one number (all-MiniLM-L6-v2 with its 6 query
        # MatMuls per token: cosine 0.69 so fused, 1.000 with the fusions off); in this order nothing fuses.
        helper.make_node("Mul", [f"{p}_f", f"{w}_ws"], [f"{p}_fw"]),
        helper.make_node("Mul", [f"{p}_fw", f"{p}_s"], [y]),
    ]


def token_constants() -> list[onnx.TensorProto]:
    """The initializers the per-token arithmetic reads (TOKEN_CONSTANTS)."""
    levels, least, one, middle = TOKEN_CONSTANTS
    return [
        numpy_helper.from_array(np.array(127, np.float32), levels),
        numpy_helper.from_array(np.array(1e-30, np.float32), least),
        numpy_helper.from_array(np.array(1, np.float32), one),
        numpy_helper.from_array(np.array(128, np.uint8), middle),
    ]


def int8_weights(weight: NDArray[np.float32], p: str, levels: int = FULL_LEVELS) -> list[onnx.TensorProto]:
    q, scale = quantized_weight(weight, levels)
    return [
        numpy_helper.from_array(q, f"{p}_w"),
        numpy_helper.from_array(scale, f"{p}_ws"),
        numpy_helper.from_array(np.zeros(q.shape[1], np.int8), f"{p}_wz"),
    ]


def simulation(model: onnx.ModelProto, names: Sequence[str], levels: int = FULL_LEVELS) -> onnx.ModelProto:
    """`model` (consumed) with the MatMuls `names` switchable by the int64 input SWITCHES (one entry per
    name, in order): 0 fp32, TENSOR int8 with one activation scale per call, TOKEN int8 with one per token;
    weights of `levels` a side."""
    inits = {t.name: t for t in model.graph.initializer}
    index = {name: i for i, name in enumerate(names)}
    model.graph.initializer.extend(token_constants())
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.name not in index:
            nodes.append(node)
            continue
        i, p = index[node.name], f"hare_sim{index[node.name]}"
        x, w, y = node.input[0], node.input[1], node.output[0]
        model.graph.initializer.extend(int8_weights(numpy_helper.to_array(inits[w]), p, levels))
        model.graph.initializer.append(numpy_helper.from_array(np.array(i, np.int64), f"{p}_i"))
        model.graph.initializer.append(numpy_helper.from_array(np.array(TOKEN, np.int64), f"{p}_tokencode"))
        branches = {  # the operators the build writes, so the CPU's own int8 kernel runs them
            scales: helper.make_graph(
                arithmetic(x, f"{p}_{scales}_y", p, f"{p}_{scales}", scales),
                f"{p}_{scales}",
                [],
                [helper.make_tensor_value_info(f"{p}_{scales}_y", TensorProto.FLOAT, None)],
            )
            for scales in ("tensor", "token")
        }
        int8 = helper.make_graph(
            [
                helper.make_node("Equal", [f"{p}_g", f"{p}_tokencode"], [f"{p}_bytoken"]),
                helper.make_node(
                    "If", [f"{p}_bytoken"], [f"{p}_y8"], then_branch=branches["token"], else_branch=branches["tensor"]
                ),
            ],
            f"{p}_int8",
            [],
            [helper.make_tensor_value_info(f"{p}_y8", TensorProto.FLOAT, None)],
        )
        fp32 = helper.make_graph(
            [helper.make_node("MatMul", [x, w], [f"{p}_y32"])],
            f"{p}_fp32",
            [],
            [helper.make_tensor_value_info(f"{p}_y32", TensorProto.FLOAT, None)],
        )
        nodes += [
            helper.make_node("Gather", [SWITCHES, f"{p}_i"], [f"{p}_g"], axis=0),
            helper.make_node("Cast", [f"{p}_g"], [f"{p}_on"], to=TensorProto.BOOL),
            helper.make_node("If", [f"{p}_on"], [y], name=node.name, then_branch=int8, else_branch=fp32),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.input.append(helper.make_tensor_value_info(SWITCHES, TensorProto.INT64, [len(names)]))
    return model


def per_token(model: onnx.ModelProto, names: Sequence[str], levels: int = FULL_LEVELS) -> onnx.ModelProto:
    """`model` (consumed) with the MatMuls `names` in int8 with one activation scale per token: the
    simulation's arithmetic (weights of `levels` a side), each MatMulInteger named `{name}_quant` as the
    dynamic quantizer names its own. Weights no other node reads are dropped."""
    inits = {t.name: t for t in model.graph.initializer}
    chosen = set(names)
    model.graph.initializer.extend(token_constants())
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    for node in model.graph.node:
        if node.name not in chosen:
            nodes.append(node)
            continue
        x, w, y = node.input[0], node.input[1], node.output[0]
        if w not in replaced:  # a weight two MatMuls read (ALBERT's shared layers) is stored once
            model.graph.initializer.extend(int8_weights(numpy_helper.to_array(inits[w]), w, levels))
            replaced.add(w)
        nodes += arithmetic(x, y, w, f"{node.name}_quant", "token", name=f"{node.name}_quant")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    unread = replaced - {name for node in nodes for name in node.input}
    kept = [t for t in model.graph.initializer if t.name not in unread]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model
