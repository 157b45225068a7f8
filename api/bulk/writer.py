"""Part files, one per input chunk, each committed whole (written beside, then renamed over its name), and the
merge of all parts into the one output file at the end.

    <work>/rejects-000012.jsonl   the chunk's rejected rows, {"row", "id", "reason"} (only if any); first
    <work>/part-000012.parquet    the chunk's answers (or .jsonl); its presence is what marks chunk 12 done

A process killed at any point leaves whole parts and maybe a temporary file, never half a part: a restart
skips the chunks whose part is there and writes the others again.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from api.bulk.columns import Answers, json_id
from api.bulk.reader import Reject
from tasks.errors import InputError

OUTPUT_FORMATS = ("parquet", "jsonl")
TMP = ".tmp"


def output_format(path: Path, asked: str | None) -> str:
    """The output's format: as asked, else JSONL for a .jsonl/.ndjson/.json name, else Parquet."""
    if asked:
        return asked
    if path.suffix.lower() in (".csv", ".tsv"):
        raise InputError(f"{path}: hare run writes Parquet or JSONL, not CSV; name the output .parquet or .jsonl")
    return "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson", ".json") else "parquet"


class Parts:
    """The part files of one job in `folder`."""

    def __init__(self, folder: Path, fmt: str) -> None:
        self.folder = folder
        self.format = fmt
        self.suffix = ".parquet" if fmt == "parquet" else ".jsonl"

    def part(self, index: int) -> Path:
        return self.folder / f"part-{index:06d}{self.suffix}"

    def rejects(self, index: int) -> Path:
        return self.folder / f"rejects-{index:06d}.jsonl"

    def done(self) -> set[int]:
        """The chunks whose part is committed; temporary files of an interrupted run are removed."""
        for stale in self.folder.glob(f"*{TMP}"):
            stale.unlink()
        return {int(p.name[5:11]) for p in self.folder.glob(f"part-*{self.suffix}")}

    def write(self, index: int, answers: Answers, rejects: list[Reject]) -> int:
        """Commit chunk `index`: its rejects, then its part (the mark that it is done). Returns the part's bytes."""
        if rejects:
            _commit(self.rejects(index), lambda f: f.writelines(_reject_line(r) for r in rejects))
        if self.format == "parquet":
            _commit(self.part(index), lambda f: pq.write_table(answers.table(), f, compression="zstd"))
        else:
            _commit(self.part(index), lambda f: f.writelines(answers.lines()))
        return self.part(index).stat().st_size

    def merge(self, chunks: int, output: Path, rejects: Path, schema: pa.Schema) -> int:
        """Parts 0..chunks-1 into `output` and their rejects into `rejects` (removed if none), each written
        beside and renamed over; returns the rejected rows. Parquet parts are streamed a row group at a time,
        their schemas unified with `schema`, the output's as the model answers (a chunk whose outputs were all
        empty lists has null-typed lists, one whose rows were all rejected no answer column): an input without
        a row to answer gives a file with the columns a reader expects."""
        parts = [self.part(i) for i in range(chunks)]
        if self.format == "parquet":
            schemas = [schema, *(pq.read_schema(p) for p in parts)]
            unified = pa.unify_schemas(schemas, promote_options="permissive")
            _commit(output, lambda f: _merge_parquet(parts, unified, f))
        else:
            _commit(output, lambda f: _concatenate(parts, f))
        found = [self.rejects(i) for i in range(chunks) if self.rejects(i).is_file()]
        count = 0
        for path in found:
            with path.open("rb") as f:
                count += sum(1 for _ in f)
        if found:
            _commit(rejects, lambda f: _concatenate(found, f))
        elif rejects.is_file():
            rejects.unlink()  # from an earlier job writing the same output
        return count


def _commit(path: Path, write: Any) -> None:
    """Write `path` whole or not at all: into a temporary file beside it, synced, then renamed over it."""
    tmp = path.with_name(path.name + TMP)
    with tmp.open("wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _merge_parquet(parts: list[Path], schema: pa.Schema, out: Any) -> None:
    with pq.ParquetWriter(out, schema, compression="zstd") as writer:
        for path in parts:
            part = pq.ParquetFile(path)
            for i in range(part.num_row_groups):
                writer.write_table(conform(part.read_row_group(i), schema))


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` in `schema`: its columns cast, columns it lacks (a chunk of only rejected rows) as nulls."""
    if table.schema == schema:
        return table
    columns = [
        table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
        for f in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def _concatenate(parts: list[Path], out: Any) -> None:
    for path in parts:
        with path.open("rb") as f:
            shutil.copyfileobj(f, out, 1 << 20)


def _reject_line(reject: Reject) -> bytes:
    line = {"row": reject.row, "id": reject.id, "reason": reject.reason}
    return orjson.dumps(line, default=json_id) + b"\n"
