"""The int8 arithmetic int8-mixed writes (container/optimize/mixed.py): a MatMul on per-channel int8 weights
with one activation scale per call (the operators ONNX Runtime's dynamic quantizer writes, which it fuses into
one kernel) or one per token (written here: the quantizer has no such mode), either one split (its few input
channels where the outliers flow in fp32 beside the int8 product of the rest, whose activations are quantized
without them: LLM.int8()'s decomposition, Dettmers et al. 2022), and the simulation graph in which each
MatMul switches between fp32 and any of them, so that the CPU's own int8 kernel judges every choice. Also
lookup tables (a word embedding) stored as int8 rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from container.machine import FULL_LEVELS

# The simulation's input: one switch per MatMul.
SWITCHES = "hare_int8_switches"
# A switch's values: the MatMul in fp32 (0), int8 with one activation scale per call, or one per token; plus
# SPLIT, the same split (TENSOR + SPLIT, TOKEN + SPLIT).
TENSOR, TOKEN, SPLIT = 1, 2, 2
# The share of a split MatMul's input channels (rows of its weight) computed in fp32. On all-MiniLM-L6-v2
# smoothed at alpha 0.6, its six feed-forward output MatMuls (1536 rows) split with 32 rows each (1/48):
# cosine p1 0.9943 against 0.9909 all int8 and 0.9958 with them fp32; one thread at 128 tokens on the AVX2
# kernel, 21.6 ms against 21.3 all int8 and 32.9 fp32 (docs/optimizer.md).
SPLIT_SHARE = 1 / 48
# More rows where more than that many carry outliers: every row whose figure is at least OUTLIER times the median
# row's (a hidden size of 32 with 4 massive channels: 1 row by the share alone), up to MAX_SPLIT_SHARE of them.
OUTLIER = 4.0
MAX_SPLIT_SHARE = 1 / 8
# What the per-token arithmetic reads: 127 levels a side, the least row maximum, a unit scale, the zero point.
TOKEN_CONSTANTS = ("hare_int8_levels", "hare_int8_least", "hare_int8_one", "hare_int8_middle")
# Lookup tables smaller than this stay fp32 as they are: int8 rows are for the word embedding, most of an
# int8-mixed graph's bytes (all-MiniLM-L6-v2: 47 of 56 MB), not for position or token-type tables.
TABLE_BYTES = 2**20
MICROSOFT = "com.microsoft"


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
    128 (TOKEN_CONSTANTS). `name` names the integer product (MatMulInteger; per token MatMulIntegerToFloat)."""
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
        # The product and the weights' scales in one kernel (ONNX Runtime's MatMulIntegerToFloat: the int32
        # sums times a_scale times each column's b_scale), a_scale one, since it takes a single number; the
        # rows' scales after. The same answers to the bit as MatMulInteger, Cast and Mul by the weights'
        # scales, one full pass over the output fewer each: 1-5% off all-MiniLM-L6-v2's int8-mixed calls
        # on an AVX-512 VNNI EPYC, 3-6% on its AVX2 kernels, at batches from (1, 128) to (32, 64). (ONNX
        # Runtime's own fusion of MatMulInteger, Cast and Mul(a_scale, b_scale) took the rows' scales for
        # one number: cosine 0.69 on MiniLM's query MatMuls; it has nothing to fuse here.)
        helper.make_node(
            "MatMulIntegerToFloat",
            [f"{p}_q", f"{w}_w", one, f"{w}_ws", middle, f"{w}_wz"],
            [f"{p}_fw"],
            name=name,
            domain=MICROSOFT,
        ),
        helper.make_node("Mul", [f"{p}_fw", f"{p}_s"], [y]),
    ]


def split_rows(weight: NDArray[np.float32], carried: NDArray[np.float32] | None = None) -> NDArray[np.int64]:
    """The rows of `weight` [K, N] a split computes in fp32, in order: those of the largest figures `carried` (one
    per row: smoothing.split_channels ranks where the outliers flow), or without it of the largest max |w|.
    SPLIT_SHARE of them (at least one), or as many as are OUTLIER times the median row's, up to
    MAX_SPLIT_SHARE."""
    carried = np.abs(weight).max(axis=1) if carried is None else carried
    outliers = int((carried >= OUTLIER * np.median(carried)).sum())
    share = max(1, math.ceil(weight.shape[0] * SPLIT_SHARE))
    count = max(share, min(outliers, math.ceil(weight.shape[0] * MAX_SPLIT_SHARE)))
    return np.sort(np.argsort(-carried, kind="stable")[:count]).astype(np.int64)


def split_weights(
    weight: NDArray[np.float32], p: str, levels: int = FULL_LEVELS, rows: NDArray[np.int64] | None = None
) -> list[onnx.TensorProto]:
    """What split_arithmetic reads: the int8 weight of `weight` with its split rows (`rows`, default
    split_rows) zeroed (`{p}_rest`, as int8_weights: the other rows get the columns' levels), the rows' indices
    `{p}_rows`, their fp32 values `{p}_rowweights` and `{p}_keep`, 0 on those input channels and 1 elsewhere."""
    rows = split_rows(weight) if rows is None else rows
    rest = weight.copy()
    rest[rows] = 0
    keep = np.ones(weight.shape[0], np.float32)
    keep[rows] = 0
    return [
        *int8_weights(rest, f"{p}_rest", levels),
        numpy_helper.from_array(rows, f"{p}_rows"),
        numpy_helper.from_array(weight[rows], f"{p}_rowweights"),
        numpy_helper.from_array(keep, f"{p}_keep"),
    ]


def split_arithmetic(x: str, y: str, w: str, p: str, scales: str, name: str = "") -> list[onnx.NodeProto]:
    """One split MatMul from `x` to `y`: the int8 arithmetic of `scales` on `x` without its split channels (zeroed,
    so that an outlier there leaves the others their levels: a massive channel would otherwise set every
    token's or the call's scale) and the weight without their rows, plus those channels of `x` (a Gather) times
    their rows in fp32 (split_weights, prefix `w`)."""
    return [
        helper.make_node("Mul", [x, f"{w}_keep"], [f"{p}_xrest"]),
        *arithmetic(f"{p}_xrest", f"{p}_int8", f"{w}_rest", p, scales, name),
        helper.make_node("Gather", [x, f"{w}_rows"], [f"{p}_xrows"], name=f"{p}_rows", axis=-1),
        # Unnamed, as smoothing.targets leaves a MatMul: the fp32 rows are not a candidate for int8.
        helper.make_node("MatMul", [f"{p}_xrows", f"{w}_rowweights"], [f"{p}_yrows"]),
        helper.make_node("Add", [f"{p}_int8", f"{p}_yrows"], [y]),
    ]


def add_token_constants(model: onnx.ModelProto) -> None:
    """Give `model` the initializers the per-token arithmetic reads (TOKEN_CONSTANTS), once: the rewrites
    that write that arithmetic may run one after the other on a graph."""
    if not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))  # MatMulIntegerToFloat's
    if any(t.name == TOKEN_CONSTANTS[0] for t in model.graph.initializer):
        return
    levels, least, one, middle = TOKEN_CONSTANTS
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(127, np.float32), levels),
            numpy_helper.from_array(np.array(1e-30, np.float32), least),
            numpy_helper.from_array(np.array(1, np.float32), one),
            numpy_helper.from_array(np.array(128, np.uint8), middle),
        ]
    )


def int8_weights(weight: NDArray[np.float32], p: str, levels: int = FULL_LEVELS) -> list[onnx.TensorProto]:
    q, scale = quantized_weight(weight, levels)
    return [
        numpy_helper.from_array(q, f"{p}_w"),
        numpy_helper.from_array(scale, f"{p}_ws"),
        numpy_helper.from_array(np.zeros(q.shape[1], np.int8), f"{p}_wz"),
    ]


def simulation(
    model: onnx.ModelProto,
    names: Sequence[str],
    levels: int = FULL_LEVELS,
    rows: Mapping[str, NDArray[np.int64]] | None = None,
) -> onnx.ModelProto:
    """`model` (consumed) with the MatMuls `names` switchable by the int64 input SWITCHES (one entry per
    name, in order): 0 fp32, TENSOR int8 with one activation scale per call, TOKEN int8 with one per token,
    either + SPLIT split (its fp32 rows `rows[name]`, default split_rows); weights of `levels` a side."""
    rows = rows or {}
    inits = {t.name: t for t in model.graph.initializer}
    index = {name: i for i, name in enumerate(names)}
    add_token_constants(model)
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.name not in index:
            nodes.append(node)
            continue
        i, p = index[node.name], f"hare_sim{index[node.name]}"
        weight = numpy_helper.to_array(inits[node.input[1]])
        split_part = split_weights(weight, p, levels, rows.get(node.name))
        model.graph.initializer.extend([*int8_weights(weight, p, levels), *split_part])
        codes = {"i": i, "token": TOKEN, "tokensplit": TOKEN + SPLIT}
        model.graph.initializer.extend(
            numpy_helper.from_array(np.array(v, np.int64), f"{p}_{k}") for k, v in codes.items()
        )
        nodes += _switched(node, p)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.input.append(helper.make_tensor_value_info(SWITCHES, TensorProto.INT64, [len(names)]))
    return model


def _switched(node: onnx.NodeProto, p: str) -> list[onnx.NodeProto]:
    """The MatMul `node` behind its switch (simulation): Ifs over the fp32 MatMul and the int8 arithmetic the
    build writes, so that the CPU's own int8 kernel runs each choice."""
    x, w, y = node.input[0], node.input[1], node.output[0]

    def by_scales(split: bool) -> onnx.GraphProto:
        tag = "split" if split else "whole"
        write = split_arithmetic if split else arithmetic
        kinds = {
            scales: _branch(f"{p}_{scales}_{tag}", write(x, f"{p}_{scales}_{tag}_y", p, f"{p}_{scales}_{tag}", scales))
            for scales in ("tensor", "token")
        }
        choose = helper.make_node(
            "If", [f"{p}_bytoken"], [f"{p}_{tag}_y"], then_branch=kinds["token"], else_branch=kinds["tensor"]
        )
        return _branch(f"{p}_{tag}", [choose])

    int8 = _branch(
        f"{p}_int8",
        [
            helper.make_node("Equal", [f"{p}_g", f"{p}_token"], [f"{p}_istoken"]),
            helper.make_node("Equal", [f"{p}_g", f"{p}_tokensplit"], [f"{p}_istokensplit"]),
            helper.make_node("Or", [f"{p}_istoken", f"{p}_istokensplit"], [f"{p}_bytoken"]),
            helper.make_node("Greater", [f"{p}_g", f"{p}_token"], [f"{p}_issplit"]),  # 3 and 4: split
            helper.make_node(
                "If", [f"{p}_issplit"], [f"{p}_y8"], then_branch=by_scales(True), else_branch=by_scales(False)
            ),
        ],
    )
    fp32 = _branch(f"{p}_fp32", [helper.make_node("MatMul", [x, w], [f"{p}_y32"])])
    return [
        helper.make_node("Gather", [SWITCHES, f"{p}_i"], [f"{p}_g"], axis=0),
        helper.make_node("Cast", [f"{p}_g"], [f"{p}_on"], to=TensorProto.BOOL),
        helper.make_node("If", [f"{p}_on"], [y], name=node.name, then_branch=int8, else_branch=fp32),
    ]


def _branch(name: str, body: list[onnx.NodeProto]) -> onnx.GraphProto:
    """An If branch that answers its last node's output."""
    out = body[-1].output[0]
    return helper.make_graph(body, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])


def per_token(model: onnx.ModelProto, names: Sequence[str], levels: int = FULL_LEVELS) -> onnx.ModelProto:
    """`model` (consumed) with the MatMuls `names` in int8 with one activation scale per token: the
    simulation's arithmetic (weights of `levels` a side), each MatMulInteger named `{name}_quant` as the
    dynamic quantizer names its own. Weights no other node reads are dropped."""
    add_token_constants(model)
    return _rewrite(model, names, lambda x, y, w, p: arithmetic(x, y, w, p, "token", p), int8_weights, levels)


def split(
    model: onnx.ModelProto,
    names: Sequence[str],
    scales: str,
    levels: int = FULL_LEVELS,
    rows: Mapping[str, Sequence[int]] | None = None,
) -> onnx.ModelProto:
    """`model` (consumed) with the fp32 MatMuls `names` split (split_arithmetic, activation scales `scales`,
    fp32 rows `rows[name]`, default split_rows): the simulation's arithmetic, each MatMulInteger named
    `{name}_quant`. Weights no other node reads are dropped."""
    if scales == "token":
        add_token_constants(model)
    chosen = rows or {}
    by_weight = {n.input[1]: np.asarray(chosen[n.name], np.int64) for n in model.graph.node if n.name in chosen}
    return _rewrite(
        model,
        names,
        lambda x, y, w, p: split_arithmetic(x, y, w, p, scales, p),
        lambda weight, w, levels: split_weights(weight, w, levels, by_weight.get(w)),
        levels,
    )


def _rewrite(
    model: onnx.ModelProto,
    names: Sequence[str],
    write: Callable[[str, str, str, str], list[onnx.NodeProto]],
    weights: Callable[[NDArray[np.float32], str, int], list[onnx.TensorProto]],
    levels: int,
) -> onnx.ModelProto:
    """`model` with each MatMul of `names` replaced by `write(x, y, weight prefix, p)`, p `{node name}_quant` (the
    dynamic quantizer's name for its MatMulInteger: names the new nodes' outputs and MatMulInteger), its weight
    stored once as `weights(weight, its name, levels)` (a weight two MatMuls read, ALBERT's shared layers,
    is stored once); weights nothing reads any more are dropped."""
    inits = {t.name: t for t in model.graph.initializer}
    chosen = set(names)
    nodes: list[onnx.NodeProto] = []
    replaced: set[str] = set()
    for node in model.graph.node:
        if node.name not in chosen:
            nodes.append(node)
            continue
        x, w, y = node.input[0], node.input[1], node.output[0]
        if w not in replaced:
            model.graph.initializer.extend(weights(numpy_helper.to_array(inits[w]), w, levels))
            replaced.add(w)
        nodes += write(x, y, w, f"{node.name}_quant")
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    unread = replaced - {name for node in nodes for name in node.input}
    kept = [t for t in model.graph.initializer if t.name not in unread]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def tables(model: onnx.ModelProto) -> list[str]:
    """The lookup tables of `model` that int8_tables may store as int8 rows: 2-D float initializers of at least
    TABLE_BYTES that only Gathers on their first axis read (a table a MatMul also reads, an output head tied
    to the embedding, stays fp32)."""
    found = {
        t.name
        for t in model.graph.initializer
        if t.data_type == TensorProto.FLOAT and len(t.dims) == 2 and t.dims[0] * t.dims[1] * 4 >= TABLE_BYTES
    }
    found -= {v.name for v in (*model.graph.input, *model.graph.output)}  # an overridable input, or an answer
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            if name in found and not (node.op_type == "Gather" and i == 0 and _axis(node) == 0):
                found.discard(name)
        found -= _read_inside(node)
    return sorted(found)


def _read_inside(node: onnx.NodeProto) -> set[str]:
    """What the subgraphs of `node` (an If's branches, a Loop's body) read, at any depth."""
    graphs = [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]
    return {name for g in graphs for n in g.node for name in [*n.input, *_read_inside(n)]}


def _axis(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def int8_tables(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """`model` (consumed) with each table of `names` (tables) stored as int8 rows, each row with its own scale
    (max |row| / 127): its Gathers read the rows and their scales by the same ids and multiply. Each looked-up
    vector keeps 127 levels of its own range; a quarter of the bytes."""
    chosen = set(names)
    if not chosen:
        return model
    inits = model.graph.initializer
    for i in reversed(range(len(inits))):  # in place: re-adding the other initializers would copy them all
        if inits[i].name in chosen:
            # A row is a column of the transpose: the weights' own per-column quantization, 127 levels a side.
            q, scale = quantized_weight(numpy_helper.to_array(inits[i]).astype(np.float32).T)
            inits.extend(
                [
                    numpy_helper.from_array(np.ascontiguousarray(q.T), f"{inits[i].name}_int8"),
                    numpy_helper.from_array(scale[:, None], f"{inits[i].name}_rowscale"),
                ]
            )
            del inits[i]
    nodes: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.op_type != "Gather" or node.input[0] not in chosen:
            nodes.append(node)
            continue
        table, ids, y, p = node.input[0], node.input[1], node.output[0], f"{node.output[0]}_hare_int8"
        nodes += [
            helper.make_node("Gather", [f"{table}_int8", ids], [f"{p}_q"], name=node.name, axis=0),
            helper.make_node("Cast", [f"{p}_q"], [f"{p}_f"], to=TensorProto.FLOAT),
            helper.make_node("Gather", [f"{table}_rowscale", ids], [f"{p}_s"], axis=0),
            helper.make_node("Mul", [f"{p}_f", f"{p}_s"], [y]),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model
