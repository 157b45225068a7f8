"""`bf16`: the export with its MatMul weights stored in bfloat16, compiled by OpenVINO's CPU plugin with bf16 as
its inference precision (container/openvino_runtime.py).

The plugin rounds every MatMul weight to bf16 anyway (round to nearest even); storing them so leaves the answers as
they were (to the bit on MiniLM, AMX; the same gate figures on 32 of the test suite's 33 tiny families) or nearly
(the tiny Gemma 4 within its gates: cosine p1 0.9957 against 0.9945), and takes a third off what each compiled copy
holds. Given fp32 weights, a copy kept a converted bf16 constant and the kernels' repacked one: 56-58 MB of
anonymous memory a copy of the default MiniLM (AMX, 2026-12-01), and a served worker keeps two (a one-thread and a
two-thread copy). Given bf16 weights behind a Cast that the runtime marks as a decompression
(`openvino_runtime.read_graph`), a copy holds only the repacked one, 35-37 MB, the stored weights staying in the
mapped file that every copy and worker shares; the file is 21 MB smaller. The lookup tables (the word embedding)
stay fp32: a Gather reads them as they are, from the mapped file, without a copy.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from container import openvino_runtime
from container.optimize import graphs


def build(fp32: Path, out: Path) -> str:
    """Write `fp32` with its MatMul weights in bf16 to `out`, then compile and run it once, so that a graph
    OpenVINO cannot read or run fails this variant's build (reported with its error) and not the whole build."""
    model = onnx.load(str(fp32))
    count = weights_to_bf16(model.graph)
    graphs.save(model, out)
    compiled = openvino_runtime.OpenVinoModel(out, threads=1)
    compiled.run({name: np.ones((1, 4), np.int64) for name in compiled.input_names})
    return f"{count} MatMul weights in bf16, compiled by OpenVINO"


def weights_to_bf16(graph: onnx.GraphProto) -> int:
    """Replace each float 2-D initializer that only MatMuls read, as their second input, with its bf16 values
    (named with openvino_runtime.STORED_BF16, which the runtime hands to the plugin as they are) and the Cast that
    gives the weight back in fp32 under its own name; returns how many. A weight anything else reads as well
    stays fp32, where the plugin may run that reader in fp32: four of a tiny DeBERTa-v2 ranker's weights, read
    through an Identity too, moved its scores when rounded."""
    readers = Counter(name for node in graph.node for name in node.input)
    as_weight = Counter(node.input[1] for node in graph.node if node.op_type == "MatMul" and len(node.input) == 2)
    # Read by a subgraph (an If's branch, a Loop's body) or a graph output: more than a MatMul's weight.
    elsewhere = {name for node in graph.node for sub in graphs.subgraphs(node) for name in graphs.reads(sub)}
    elsewhere |= {o.name for o in graph.output}
    kept, casts = [], []
    for init in graph.initializer:
        only_weight = readers[init.name] == as_weight[init.name] > 0 and init.name not in elsewhere
        if not only_weight or init.data_type != onnx.TensorProto.FLOAT or len(init.dims) != 2:
            kept.append(init)
            continue
        stored = init.name + openvino_runtime.STORED_BF16
        bits = bf16_bits(numpy_helper.to_array(init))
        kept.append(
            onnx.TensorProto(
                name=stored, data_type=onnx.TensorProto.BFLOAT16, dims=list(init.dims), raw_data=bits.tobytes()
            )
        )
        casts.append(helper.make_node("Cast", [stored], [init.name], to=onnx.TensorProto.FLOAT))
    graphs.swap_weights(graph, kept, casts)
    return len(casts)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """`values` rounded to bfloat16 (to nearest, ties to even, as the plugin rounds), as their uint16 bit patterns
    in native byte order (ONNX's raw data is little-endian, as is every CPU hare runs on)."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
