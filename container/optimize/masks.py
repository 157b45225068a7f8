"""Stage 1b, masks: an attention mask applied by selection becomes one added to the scores.

An attention written as `scores.masked_fill(mask, torch.finfo(dtype).min)` (DistilBERT's) exports as

    Where(Cast(Expand(mask, Shape(scores))), min, scores) -> Softmax

and ONNX Runtime runs both the full-size Expand and the broadcasting Where on one thread: on DistilBERT-base
at 128 tokens, 1.5 ms of a 22 ms int8 call, and the same 1.5 ms when the call has two threads. The rewrite

    Add(scores, Where(Cast(mask), min, 0)) -> Softmax

selects on the small mask (one row per sequence) and adds it with a broadcast. It is exact in fp32 (for any
|x| < 1e31, x + min rounds to min), and once a graph is in fp16 (min is then -65504) the Softmax reads the
same: a masked score is still tens of thousands below every unmasked one, so its exp is 0 either way.
A rewrite is made only where that holds: the fill is at most MAX_FILL and the Where feeds Softmax alone.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from container.optimize import graphs

MAX_FILL = -1e30  # a fill this low is absorbing in fp32: x + fill == fill for every score a model makes


def additive_masks(model: Path, out: Path) -> int:
    """Write `model` with its selected attention masks made additive to `out` (in the same folder: the
    weights are not loaded, and a graph with external data keeps pointing at its files); returns how many."""
    if out.parent.resolve() != model.parent.resolve():
        raise ValueError(f"{out} must be in {model.parent}, next to the weights {model.name} may point at")
    graph_model = onnx.load(str(model), load_external_data=False)
    count = rewrite(graph_model.graph)
    if count or out != model:
        onnx.save(graph_model, str(out))
    return count


def rewrite(graph: onnx.GraphProto) -> int:
    """Rewrite every `Where(Cast?(Expand(mask, Shape(x))), fill, x) -> Softmax` of `graph` in place."""
    producer = {name: node for node in graph.node for name in node.output}
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)
    outputs = {o.name for o in graph.output}
    bypassed: list[onnx.NodeProto] = []  # the full-size mask's nodes, dropped once nothing reads them
    count = 0
    for where in [n for n in graph.node if n.op_type == "Where"]:
        cond, fill, scores = where.input
        node = producer.get(cond)
        cast = node if node is not None and node.op_type == "Cast" else None
        expand = producer.get(cast.input[0]) if cast is not None else node
        if expand is None or expand.op_type != "Expand":
            continue
        shape = producer.get(expand.input[1])
        if shape is None or shape.op_type != "Shape" or shape.input[0] != scores:
            continue  # an Expand to another shape could make the Where's output larger than `scores`
        value = graphs.constant(graph, producer, fill)
        if value is None or value.size != 1 or not float(value.reshape(())) <= MAX_FILL:
            continue
        users = consumers[where.output[0]]
        if where.output[0] in outputs or not users or any(u.op_type != "Softmax" for u in users):
            continue
        graph.node.remove(where)
        bypassed.extend(n for n in (cast, expand, shape) if n is not None)
        small = expand.input[0]
        new: list[onnx.NodeProto] = []
        if cast is not None:
            new.append(helper.make_node("Cast", [small], [where.name + "/mask"], where.name + "/mask"))
            new[-1].attribute.extend(cast.attribute)
            small = new[-1].output[0]
        zero = numpy_helper.from_array(np.zeros((), dtype=value.dtype), where.name + "/zero")
        graph.initializer.append(zero)
        new.append(helper.make_node("Where", [small, fill, zero.name], [where.name + "/added"], where.name + "/added"))
        new.append(helper.make_node("Add", [scores, new[-1].output[0]], list(where.output), where.name + "/add"))
        # Just before the Softmax: what they read comes before the Where they replace (topological order).
        at = list(graph.node).index(users[0])
        for offset, node in enumerate(new):
            graph.node.insert(at + offset, node)
        count += 1
    if bypassed:
        _drop_unread(graph, bypassed)
    return count


def _drop_unread(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> None:
    """Remove those of `nodes` whose outputs nothing reads any more, the reads of subgraphs (If, Loop)
    included: a node something else still reads stays."""
    while True:
        read = {o.name for o in graph.output} | graphs.reads(graph)
        unread = [n for n in nodes if n in graph.node and not any(o in read for o in n.output)]
        if not unread:
            return
        for node in unread:  # a Cast gone leaves its Expand unread, and that its Shape: hence the loop
            graph.node.remove(node)
