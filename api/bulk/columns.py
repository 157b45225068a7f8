"""A task's /predict answer, one request's worth, as Arrow columns: one row per input, in input order.

    vectors (numpy, 1-D)       fixed_size_list<float32 | int8 | uint8, width>   embeddings, dense_vecs
    token vectors (2-D)        list<fixed_size_list<..., width>>                 token_embeddings, colbert_vecs
    base64 vectors             string
    lists of objects           list<struct<...>> (numbers: float32, int64)       labels, entities, sparse entries
    {token id: weight}         map<string, float32>                              bge-m3's lexical_weights
    numbers                    float32                                           ranking's score

A dict answer per input (a pair's ranked entry, bge-m3's outputs) gives one column per key; any other answer
one column named after the task's first KServe output (embeddings, labels, entities, sparse). `truncated`
(the input was cut at the model's maximum) is a column of its own, so no answer carries it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from tasks.base import TaskSpec


@dataclass(frozen=True, slots=True)
class Answers:
    """One chunk's answered rows, in input order: their ids (of `id_type`), answer items (per_input) and
    whether each was cut at the model's maximum; `name` names a non-dict item's column."""

    ids: list[Any]
    id_type: pa.DataType
    items: list[Any]
    truncated: list[bool]
    name: str

    def table(self) -> pa.Table:
        """The rows as an Arrow table: id, the output columns, truncated."""
        columns = {"id": pa.array(self.ids, self.id_type), **output_columns(self.items, self.name)}
        columns["truncated"] = pa.array(self.truncated, pa.bool_())
        return pa.table(columns)

    def lines(self) -> Iterator[bytes]:
        """The rows as JSON lines, numbers as /predict writes them (float32 vectors at float32 precision)."""
        for row_id, item, cut in zip(self.ids, self.items, self.truncated, strict=True):
            fields = item if isinstance(item, dict) else {self.name: item}
            row = {"id": row_id, **fields, "truncated": cut}
            yield orjson.dumps(row, default=json_id, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def json_id(value: Any) -> str:
    """An id orjson has no form for, as text: a Parquet binary id as its UTF-8 (bytes that are not, escaped),
    a decimal as its digits."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def per_input(body: Any, task: TaskSpec, n: int) -> list[Any]:
    """One request's answer (for `n` inputs, sent as a list) as one item per input, in input order."""
    if task.pairs:  # ranked best first: back to the documents' order, by index
        items: list[Any] = [None] * n
        for entry in body:
            items[entry["index"]] = {k: v for k, v in entry.items() if k not in ("index", "truncated")}
        return items
    if isinstance(body, dict):  # bge-m3: each asked output, a list over the inputs (null when not asked)
        asked = {k: v for k, v in body.items() if v is not None}
        return [dict(zip(asked, each, strict=True)) for each in zip(*asked.values(), strict=True)]
    return [_untruncated(item) for item in body]


def _untruncated(item: Any) -> Any:
    """An answer item without the `truncated` marks (the job writes that as a column)."""
    if isinstance(item, list) and item and isinstance(item[0], dict):
        return [{k: v for k, v in entry.items() if k != "truncated"} for entry in item]
    return item


def item_name(task: TaskSpec) -> str:
    """The column of an answer item that is not a dict: the task's first KServe output's name."""
    name: str = task.tensors.outputs[0]["name"]
    return name


def output_columns(items: Sequence[Any], name: str) -> dict[str, pa.Array]:
    """The items of per_input (in row order) as named columns (none for no items)."""
    if not items:
        return {}
    if isinstance(items[0], dict):
        return {key: column([item[key] for item in items]) for key in items[0]}
    return {name: column(items)}


def column(values: Sequence[Any]) -> pa.Array:
    """One output column (see the module's table)."""
    first = values[0] if values else None
    if isinstance(first, np.ndarray):
        return vectors(values) if first.ndim == 1 else token_vectors(values)
    if isinstance(first, float):
        return pa.array(values, pa.float32())
    if isinstance(first, dict):
        return pa.array([list(v.items()) for v in values], pa.map_(pa.string(), pa.float32()))
    array = pa.array(values)
    return array.cast(single(array.type))


def single(kind: pa.DataType) -> pa.DataType:
    """`kind` with its float64s as float32, at any depth: the scores and weights of a list of objects are the
    model's float32 values, which Arrow's inference from Python floats wrote at twice their size (a SPLADE
    corpus's entries: 16 bytes each where 12 hold them exactly)."""
    if pa.types.is_float64(kind):
        return pa.float32()
    if pa.types.is_list(kind):
        return pa.list_(pa.field(kind.value_field.name, single(kind.value_type)))
    if pa.types.is_struct(kind):
        return pa.struct([pa.field(f.name, single(f.type), f.nullable) for f in kind])
    return kind


def vectors(values: Sequence[np.ndarray]) -> pa.Array:
    """Equal-width vectors as fixed-size lists of their own dtype (float32, int8, uint8), copied once."""
    matrix = np.stack(values)
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])


def token_vectors(values: Sequence[np.ndarray]) -> pa.Array:
    """[tokens, width] matrices as lists of fixed-size lists."""
    flat = np.concatenate(values)
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), flat.shape[1])
    return pa.ListArray.from_arrays(pa.array(offsets), inner)
