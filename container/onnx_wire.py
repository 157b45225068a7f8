"""The shapes of an ONNX graph's outputs, and its hidden size, read from the file's protobuf wire format without
the onnx package (not installed at serve time) and without loading the weights: the master checks a bundle with
it before any worker starts (container/bundle.py, checked_bundle), where a session would load the whole model.

The wire format is a sequence of (key, value) fields; a length-delimited value (a message, bytes) is skipped in
one step, so reading a graph's outputs passes over its weights and nodes without parsing them. The path read,
by field numbers of onnx.proto: ModelProto.graph (7) -> GraphProto.output (12, a ValueInfoProto each) ->
name (1), type (2) -> TypeProto.tensor_type (1) -> shape (2) -> TensorShapeProto.dim (1, one a dimension)."""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

LENGTH_DELIMITED = 2
FIXED = {1: 8, 5: 4}  # wire type -> the bytes of its fixed-width value (a double, a float)


def output_shapes(path: Path) -> dict[str, tuple[int | None, ...] | None]:
    """Each graph output's name and shape, a dimension's size or None where it is named (a batch, a length);
    None where the graph gives no shape. ValueError if the file is not an ONNX model's protobuf."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        found: dict[str, tuple[int | None, ...] | None] = {}
        for graph in _messages(data, 0, len(data), 7):
            for start, end in _messages(data, *graph, 12):
                name = b"".join(data[s:e] for s, e in _messages(data, start, end, 1)).decode()
                shapes = [
                    shape
                    for kind in _messages(data, start, end, 2)
                    for tensor in _messages(data, *kind, 1)
                    for shape in _messages(data, *tensor, 2)
                ]
                found[name] = (
                    tuple(next(_ints(data, *dim, 1), None) for shape in shapes for dim in _messages(data, *shape, 1))
                    if shapes
                    else None
                )
        return found


def hidden_width(path: Path) -> int | None:
    """The model's hidden size as its weights say it: the longest of their matrices' shorter sides (an embedding
    table is vocabulary x hidden, a layer's weights hidden x hidden or hidden x its feed-forward width); None
    where the graph has no matrix. Read from each initializer's dims (TensorProto field 1), its data skipped:
    `hare tune` sizes a batch budget's memory by it before it makes a session (container/optimize/autotune.py,
    fitting_tokens); a bundle carries no config.json to read it from."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        sides = [
            min(dims)
            for graph in _messages(data, 0, len(data), 7)
            for tensor in _messages(data, *graph, 5)
            if len(dims := list(_ints(data, *tensor, 1))) == 2
        ]
        return max(sides, default=None)


def _ints(data: mmap.mmap, start: int, end: int, number: int) -> Iterator[int]:
    """The values of the repeated integer field `number` in data[start:end], packed or one field each."""
    for field, wire, at, value in _fields(data, start, end):
        if field != number:
            continue
        if wire == 0:
            yield value
        elif wire == LENGTH_DELIMITED:  # packed: the values one after another
            while at < value:
                one, at = _varint(data, at)
                yield one


def _messages(data: mmap.mmap, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
    """The (start, end) of each length-delimited field `number` among the fields in data[start:end]."""
    for field, wire, at, value in _fields(data, start, end):
        if field == number and wire == LENGTH_DELIMITED:
            yield at, value


def _fields(data: mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field in data[start:end] as (number, wire type, a, b): a length-delimited value's start and end, a
    varint's end and value; a fixed-width value is skipped. ValueError where the bytes are no protobuf."""
    at = start
    while at < end:
        key, at = _varint(data, at)
        field, wire = key >> 3, key & 7
        if wire == LENGTH_DELIMITED:
            length, at = _varint(data, at)
            if at + length > end:
                raise ValueError(f"a field runs past its message at byte {at}")
            yield field, wire, at, at + length
            at += length
        elif wire == 0:
            value, at = _varint(data, at)
            yield field, wire, at, value
        elif wire in FIXED:
            at += FIXED[wire]
        else:
            raise ValueError(f"wire type {wire} at byte {at}: not an ONNX model")


def _varint(data: mmap.mmap, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError(f"a number runs past the end at byte {at}")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
