"""Where a graph's weights live. Stages that save a graph ask `too_big` (protobuf's 2 GiB limit: decoders
from 0.5B parameters in fp32 must keep their weights in a data file); the bundle stage ships every graph with
its weights in `model.onnx.data` at page-aligned offsets, which ONNX Runtime maps instead of copying:

    model.onnx       the graph, with small tensors (biases, norms, shapes) inline
    model.onnx.data  each tensor from MAP_BYTES up at an offset that is a multiple of ALIGN

A mapped weight is the page cache's, not the process's: the worker's narrow and wide sessions (api/engine/backend.py)
and every worker of the machine share one copy of what the kernels do not repack (embedding tables, above
all), and the copy ORT makes while loading a file-embedded graph is gone. Measured on the 87 MB fp32
all-MiniLM-L6-v2 graph, one process with a 1- and a 2-thread session after a batch of 8 x 128: 303 MB RSS
embedded, 192 MB mapped, at the same speed.

Also what the graph-rewriting stages (masks.py, rows.py) read of a graph: a constant's value, and the names
its nodes and their subgraphs read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

# A serialized ModelProto must stay under 2 GiB; leave room for the graph itself.
LIMIT_BYTES = 1_800_000_000
# ORT maps an external tensor when its offset is a multiple of the allocation granularity: 4 KiB pages on
# Linux, 64 KiB on Windows. 64 KiB suits both, and the padding (under 64 KiB per large tensor) is noise.
ALIGN = 65536
# Tensors below this stay inline: mapping them saves nothing and would pad the file.
MAP_BYTES = 65536
_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data")


def too_big(model: onnx.ModelProto) -> bool:
    """Whether `model` (its weights loaded) holds more weight bytes than fit inline."""
    return sum(len(t.raw_data) or t.ByteSize() for t in model.graph.initializer) > LIMIT_BYTES


def constant(graph: onnx.GraphProto, producer: dict[str, onnx.NodeProto], name: str) -> np.ndarray | None:
    """The value of an initializer or a Constant node's output (None for anything computed); `producer` maps
    each output name to its node."""
    for init in graph.initializer:
        if init.name == name:
            return numpy_helper.to_array(init)
    node = producer.get(name)
    if node is not None and node.op_type == "Constant":
        for attr in node.attribute:
            if attr.name == "value":
                return numpy_helper.to_array(attr.t)
    return None


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs `node` holds (If's branches, Loop's and Scan's bodies)."""
    return [g for attr in node.attribute for g in ([attr.g, *attr.graphs] if attr.HasField("g") else attr.graphs)]


def reads(graph: onnx.GraphProto) -> set[str]:
    """Every name a node of `graph` or of its subgraphs reads."""
    names: set[str] = set()
    for node in graph.node:
        names.update(node.input)
        for sub in subgraphs(node):
            names |= reads(sub)
    return names


def swap_weights(graph: onnx.GraphProto, initializers: list[onnx.TensorProto], nodes: list[onnx.NodeProto]) -> None:
    """Give `graph` these initializers, and `nodes` (what computes weights from them under the names their
    readers know) ahead of its own: a graph's nodes stay in topological order."""
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    ordered = [*nodes, *graph.node]
    del graph.node[:]
    graph.node.extend(ordered)


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write `model` to `path`: inline, or past protobuf's limit with its weights in `path`.data. That file is
    replaced, not appended to as onnx would (a graph rewritten at one path, int8-mixed's simulation once per
    smoothing alpha, carried every earlier copy: 17 GB on the Qwen3-Embedding-0.6B geometry). Moves a big
    model's weights out of `model`."""
    if not too_big(model):
        onnx.save(model, str(path))
        return
    data = path.with_name(path.name + ".data")
    data.unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location=data.name)


def ship(src: Path, dst: Path) -> None:
    """Write graph `src` (weights inline or in any number of files) as `dst` plus `dst.data`, each tensor of
    MAP_BYTES or more at an ALIGN-aligned offset of the data file (no data file when no tensor is that big)."""
    model = onnx.load(str(src))
    data_name = dst.name + ".data"
    with open(dst.parent / data_name, "wb") as data:
        for tensor in model.graph.initializer:
            if tensor.data_type == onnx.TensorProto.STRING:
                continue
            raw = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
            if len(raw) < MAP_BYTES:
                continue
            data.write(b"\0" * (-data.tell() % ALIGN))
            offset = data.tell()
            data.write(raw)
            for name in _DATA_FIELDS:
                tensor.ClearField(name)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
        mapped = data.tell() > 0
    if not mapped:  # a tiny graph (the tests' models) keeps every tensor inline
        (dst.parent / data_name).unlink()
    # Every big tensor now points into the data file and has no raw bytes, so onnx.save writes the graph only.
    onnx.save(model, str(dst))
