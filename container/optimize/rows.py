"""Stage 1c, pooled row: the end of the last layer runs on the one row the head reads.

A classifier that pools the first token (BERT, DistilBERT, RoBERTa, ELECTRA, DeBERTa heads: `hidden[:, 0]`)
exports as Gather(hidden, 0, axis=1) -> head, yet the last layer's attention output projection, residual,
norms and feed-forward run on every token. They are row-wise (each token's row depends on that row alone),
so the rewrite slices the first row where that row-wise tail begins and the tail runs on one row:

    ... attention context ── Slice(row 0) ─┐
    ... layer input ──────── Slice(row 0) ─┴─ out projection, residual, norm, FFN, norm ── Gather(0) ── head

The math is the same; the work is not: on DistilBERT-base at 128 tokens the last layer's projection and
feed-forward are 12% of the model's multiply-adds. A rewritten graph is run against the original on a padded
batch before it replaces it, and kept only when the two agree (MAX_DIFF), so a graph this reading gets wrong
is left as it was. Attention itself (the query's rows) is left alone: reaching it would mean following the
token axis through Reshape and Transpose.

The export stage applies it to the unfused variants; the fused ones apply it to the fused graph
(variants.fused), where the tail reads the fused Attention's output: cut before the fusion, the slice broke
ORT's attention pattern for the last layer.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from container.optimize import graphs

# BiasGelu and FastGelu (ORT's fused Gelu of x + bias) add a feature-wise bias: row-wise as Add is.
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "BiasGelu", "FastGelu"}
UNARY = {"Relu", "Gelu", "FastGelu", "Erf", "Tanh", "Sigmoid", "Cast", "Sqrt", "Neg", "Identity", "Softplus"}
# SkipLayerNormalization (the GPU fusion's residual Add + LayerNorm) normalizes the last axis, like the others.
NORMS = {
    "LayerNormalization",
    "SimplifiedLayerNormalization",
    "RMSNormalization",
    "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization",
}
MAX_DIFF = 1e-5  # the rewritten graph's largest |difference| from the original, per unit of the outputs' scale


def pooled_row(model: Path, out: Path) -> int:
    """Write `model` with its last layer's row-wise tail on the pooled row to `out` (in the same folder, as
    masks.additive_masks); returns the MatMuls moved onto that row (0: nothing matched, or the check failed,
    and `out` is the graph as it was)."""
    if out.parent.resolve() != model.parent.resolve():
        raise ValueError(f"{out} must be in {model.parent}, next to the weights {model.name} may point at")
    graph_model = onnx.load(str(model), load_external_data=False)
    moved = rewrite(graph_model.graph)
    candidate = out.with_name(f".{out.name}.pooled-row")
    if moved:
        onnx.save(graph_model, str(candidate))
        if not _agrees(model, candidate):
            moved = 0
    if moved:
        candidate.replace(out)
    else:
        candidate.unlink(missing_ok=True)
        if out != model:
            onnx.save(onnx.load(str(model), load_external_data=False), str(out))
    return moved


def rewrite(graph: onnx.GraphProto) -> int:
    """Slice row 0 into the row-wise tail before a first-token Gather, in place; the MatMuls it moved."""
    ranks = _constant_ranks(graph)
    nodes = list(graph.node)
    producer = {name: node for node in nodes for name in node.output}
    # The last such Gather: the head reads the last layer's output.
    head = next((i for i in reversed(range(len(nodes))) if _first_row(nodes[i], graph, producer, ranks)), None)
    if head is None:
        return 0
    consumers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for name in node.input:
            consumers[name].append(i)
    # Read whole elsewhere: the graph's outputs and what subgraphs (If, Loop) read.
    whole = {o.name for o in graph.output} | {
        n for node in nodes for sub in graphs.subgraphs(node) for n in graphs.reads(sub)
    }
    tail: set[int] = set()
    reached = {nodes[head].input[0]}
    for i in reversed(range(len(nodes))):  # topological order reversed: a tensor's consumers come first
        node = nodes[i]
        if not any(o in reached for o in node.output) or not _row_wise(node, ranks):
            continue
        made_here = [o for o in node.output if o]  # an optional output left unnamed is not made
        if all(o not in whole and consumers[o] and set(consumers[o]) <= tail | {head} for o in made_here):
            tail.add(i)
            reached.update(name for name in node.input if name and name not in ranks)
    moved = sum(nodes[i].op_type == "MatMul" for i in tail)
    if not moved:
        return 0
    made = {o for i in tail for o in nodes[i].output}
    axes = numpy_helper.from_array(np.array([1], np.int64), "hare_row_axes")
    starts = numpy_helper.from_array(np.array([0], np.int64), "hare_row_starts")
    ends = numpy_helper.from_array(np.array([1], np.int64), "hare_row_ends")
    graph.initializer.extend([axes, starts, ends])
    sliced: dict[str, str] = {}
    rewritten: list[onnx.NodeProto] = []
    for i, node in enumerate(nodes):
        if i in tail:
            for k, name in enumerate(node.input):
                if not name or name in made or name in ranks:
                    continue
                if name not in sliced:  # the row, sliced where the tail first reads it
                    sliced[name] = f"{name}/hare_row"
                    rewritten.append(
                        helper.make_node(
                            "Slice", [name, starts.name, ends.name, axes.name], [sliced[name]], name=sliced[name]
                        )
                    )
                node.input[k] = sliced[name]
        rewritten.append(node)
    del graph.node[:]
    graph.node.extend(rewritten)
    return moved


def _constant_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """The rank of every constant tensor: initializers and Constant nodes' values."""
    ranks = {t.name: len(t.dims) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            ranks[node.output[0]] = len(node.attribute[0].t.dims)
    return ranks


def _first_row(
    node: onnx.NodeProto, graph: onnx.GraphProto, producer: dict[str, onnx.NodeProto], ranks: dict[str, int]
) -> bool:
    """A Gather of index 0 (a scalar) along axis 1: `hidden[:, 0]`."""
    if node.op_type != "Gather" or len(node.input) != 2 or ranks.get(node.input[1]) != 0:
        return False
    index = graphs.constant(graph, producer, node.input[1])
    return _attribute(node, "axis", 0) == 1 and index is not None and int(index) == 0


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def _row_wise(node: onnx.NodeProto, ranks: dict[str, int]) -> bool:
    """Each row of the output along the token axis depends on that row of the inputs alone (constants of rank
    at most one broadcast along the features)."""
    if node.op_type == "MatMul":
        return ranks.get(node.input[1]) == 2 and node.input[0] not in ranks
    if node.op_type in NORMS:
        return _attribute(node, "axis", -1) == -1 and all(ranks.get(i, 1) <= 1 for i in node.input[1:])
    if node.op_type in ELEMENTWISE:
        return all(ranks.get(i, 0) <= 1 for i in node.input)
    return node.op_type in UNARY


def _agrees(original: Path, rewritten: Path) -> bool:
    """Both graphs on one padded batch of two (lengths 9 and 5): the same outputs, within MAX_DIFF."""
    import onnxruntime as ort

    from container.runtime import PROVIDERS, session_options

    sessions = []
    for path in (original, rewritten):
        try:
            sessions.append(ort.InferenceSession(str(path), session_options(1), providers=PROVIDERS["cpu"]))
        except Exception:  # a graph ORT refuses is a rewrite to drop, not a build to stop
            return False
    ids = np.array([[2, 5, 6, 7, 8, 9, 10, 11, 3], [2, 5, 6, 7, 3, 0, 0, 0, 0]], np.int64)
    mask = (np.arange(9) < np.array([[9], [5]])).astype(np.int64)
    made = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    names = [i.name for i in sessions[0].get_inputs()]
    if any(name not in made for name in names):
        return False
    feeds = {name: made[name] for name in names}
    try:
        before, after = (s.run(None, feeds) for s in sessions)
    except Exception:
        return False
    for a, b in zip(before, after, strict=True):
        if a.shape != b.shape or np.abs(a - b).max() > MAX_DIFF * max(1.0, float(np.abs(a).max())):
            return False
    return True
