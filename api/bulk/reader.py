"""A corpus as chunks of exactly `chunk_rows` rows, streamed: JSONL (one object a line), CSV (a header line) or
Parquet, a file or a folder of files of one format (Spark's, Hugging Face datasets' shards). Chunk k is always
the same rows of the same files, so a restarted job can skip the chunks an earlier run finished
(api/bulk/checkpoint.py).

Each row is checked here: an empty, non-text, over-long or undecodable value makes the row a Reject with its
reason, and the job goes on. A bad file (not Parquet, a column that is not there, not text) raises InputError
at once, with one sentence naming the file and what to fix.

Positions: `row` is a row's 0-based place among the corpus's rows, a folder's files one after the other (a JSONL
line that is not JSON counts as a row; blank lines do not); the ids are the id column's values, or these
positions when the files have no id column.
"""

from __future__ import annotations

import codecs
import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tasks.errors import InputError
from tasks.params import kind

FORMATS = ("jsonl", "csv", "parquet")
# Bytes Arrow's CSV reader parses at a time. A row must fit in one: at 1 MiB a 2 MB text stopped the job where
# it belonged in the rejects (the default --max-chars, a million characters, is up to 4 MB of UTF-8).
CSV_BLOCK = 16 << 20
SUFFIXES = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}
# JSONL objects whose fields name the file's fields (the text, pair and id fields looked for among them): a
# corpus whose first rows are bad still runs, each of them a reject.
HEAD_OBJECTS = 100
TEXT_TYPES = (pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(), pa.binary_view())


@dataclass(frozen=True)
class Columns:
    """The input's column names. `id` None: "id" if the file has one, else row positions. `text_pair`: a
    classifier's pairs (inference, paraphrase): each text's second text (None: single texts)."""

    text: str = "text"
    query: str = "query"
    document: str = "document"
    id: str | None = None
    text_pair: str | None = None

    def values(self, pairs: bool) -> tuple[str, ...]:
        """The columns the task reads: (query, document) for ranking, (text, text_pair) for a classifier's
        pairs, (text,) otherwise."""
        if pairs:
            return self.query, self.document
        return (self.text,) if self.text_pair is None else (self.text, self.text_pair)

    def options(self, pairs: bool) -> str:
        """The flags that name the columns `values` reads, as a sentence names them."""
        if pairs:
            return "--query-column and --document-column"
        return "--text-column" if self.text_pair is None else "--text-column and --text-pair-column"


@dataclass(frozen=True, slots=True)
class Reject:
    """A row the job could not run, and why."""

    row: int
    id: Any
    reason: str


@dataclass(frozen=True, slots=True)
class Bad:
    """A row that could not even be read (a JSONL line that is not JSON); it becomes a Reject."""

    reason: str


@dataclass(slots=True)
class Chunk:
    """Rows [first, first + rows) of the input. ids/positions/values: the good rows' ids, places in the input
    and values (one list per column the task reads); rejects: the others. end: where the input stands after
    it (bytes for JSONL and CSV, rows for Parquet), for progress; skipped: an earlier run finished it, so it
    was not checked."""

    index: int
    first: int
    rows: int
    end: int
    ids: list[Any] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    values: list[list[str]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    skipped: bool = False


@dataclass(slots=True)
class _Piece:
    """Some consecutive rows as a format read them: the id column (None: none) and the value columns."""

    ids: list[Any] | None
    values: list[list[Any]]
    end: int


class Corpus:
    """An open input, a file or a folder of files of one format read in name order as one corpus (row positions
    run on from file to file): its format, its size for progress, the type of its ids, and its chunks. Every
    file's head is checked when the corpus opens, so a bad file stops the job before any row runs."""

    def __init__(self, path: Path, columns: Columns, pairs: bool, fmt: str | None = None, named: bool = False) -> None:
        """`named`: a file's rejects name it, as a folder's files' do (a Ray read task reads one file of many)."""
        self.path = path
        self.files = corpus_files(path, fmt)  # a folder is listed once: its files, and from them its format
        self.format = fmt or (_one_format(path, self.files) if path.is_dir() else input_format(path))
        self.names = columns.values(pairs)
        folder = path if path.is_dir() else path.parent if named else None
        self._files = [_File(f, self.format, columns, pairs, folder) for f in self.files]
        first = self._files[0]
        for other in self._files[1:]:
            if (other.id, other.id_type) != (first.id, first.id_type):
                raise InputError(
                    f"{other.path} has {_ids(other)} but {first.path} {_ids(first)}; a folder's files take their ids "
                    "alike (--id-column names the column)"
                )
        self.id_type = first.id_type
        # Progress runs over bytes for text files (their row count is unknown until read), rows for Parquet.
        self.size = sum(f.size for f in self._files)

    @property
    def id_column(self) -> str | None:
        """The column the ids come from (None: row positions)."""
        return self._files[0].id

    def _pieces(self) -> Iterator[_Piece]:
        """Every file's pieces in turn, each piece's end counted from the corpus's start."""
        before = 0
        for file in self._files:
            for piece in file.pieces:
                yield _Piece(piece.ids, piece.values, before + piece.end)
            before += file.size

    def chunks(self, chunk_rows: int, max_chars: int, done: set[int] | frozenset[int] = frozenset()) -> Iterator[Chunk]:
        """The corpus in chunks of `chunk_rows` rows (the last may be shorter); chunks in `done` come unchecked."""
        first = index = end = 0
        ids: list[Any] = []
        values: list[list[Any]] = [[] for _ in self.names]
        for piece in self._pieces():
            at, n = 0, len(piece.values[0])
            while at < n:
                take = min(chunk_rows - len(ids), n - at)
                start = first + len(ids)
                ids.extend(piece.ids[at : at + take] if piece.ids is not None else range(start, start + take))
                for mine, theirs in zip(values, piece.values, strict=True):
                    mine.extend(theirs[at : at + take])
                at += take
                if len(ids) == chunk_rows:
                    # Where the input stands, for progress: a piece says where it ends alone, so a chunk that
                    # ends inside one is placed by its share of the piece's rows (a JSONL piece is 4,096 rows:
                    # the bar read 100% at 400 rows of 1,500 in chunks of 50).
                    position = end + (piece.end - end) * at // n
                    yield self._chunk(index, first, ids, values, position, max_chars, index in done)
                    first, index = first + chunk_rows, index + 1
                    ids, values = [], [[] for _ in self.names]
            end = piece.end
        if ids:
            yield self._chunk(index, first, ids, values, end, max_chars, index in done)

    def _chunk(
        self, index: int, first: int, ids: list[Any], values: list[list[Any]], end: int, max_chars: int, skip: bool
    ) -> Chunk:
        if skip:
            return Chunk(index, first, len(values[0]), end, skipped=True)
        return checked_chunk(
            index, first, ids, dict(zip(self.names, values, strict=True)), max_chars, self.id_column, end
        )


def _ids(file: _File) -> str:
    return f"ids from its {file.id} column ({file.id_type})" if file.id else "no id column"


class _File:
    """One input file, its head checked when opened (the columns there, of text): its id column and type, its
    size for progress (bytes, or Parquet's rows), and `pieces`, its rows as read (the file opened only then).
    `folder`: the folder it was found in, for the names of its lines in rejects."""

    def __init__(self, path: Path, fmt: str, columns: Columns, pairs: bool, folder: Path | None) -> None:
        self.path = path
        self.names = columns.values(pairs)
        self.columns = columns
        self.pairs = pairs
        self.where = f" of {path.relative_to(folder)}" if folder is not None else ""
        self._rows = 0  # Parquet's row count, from its footer
        self.id_type: pa.DataType = pa.int64()  # row positions, unless the file has an id column
        self._id: str | None = None
        if fmt != "parquet":
            _refuse_unreadable(path)
        opened = {"jsonl": self._open_jsonl, "csv": self._open_csv, "parquet": self._open_parquet}[fmt]
        self.pieces: Iterator[_Piece] = opened()
        self.size = self._rows if fmt == "parquet" else path.stat().st_size

    @property
    def id(self) -> str | None:
        """The file's id column (None: row positions)."""
        return self._id

    # ---- the formats -------------------------------------------------------------------------------------

    # Each _open_* checks the file's head and returns a generator, which opens the file when first read (so a
    # job refused before reading leaves no file open).

    def _open_jsonl(self) -> Iterator[_Piece]:
        with self.path.open("rb") as file:
            _skip_bom(file)
            fields = self._head_fields(file)
        self._id = self._id_column(fields)
        if self._id is not None:
            self.id_type = pa.string()
        missing = [name for name in self.names if name not in fields]
        if missing:
            raise InputError(self._missing(missing, fields, "field"))
        return self._jsonl()

    def _head_fields(self, file: io.BufferedReader, objects: int = HEAD_OBJECTS) -> list[str]:
        """The fields of the file's first `objects` JSON objects, in the order first seen: the file's fields. One
        object alone named them, so a first row without the text stopped the whole job, and one without its id
        numbered every row."""
        fields: dict[str, None] = {}
        seen = 0
        for line in file:
            if not seen and (line.strip() == b"[" or line.lstrip().startswith(b"[{")):
                # A JSON array, pretty-printed or on one line: read as lines, all but its last object were
                # rejects of bad JSON (or the whole file one bad line), exit 0.
                raise InputError(
                    f"{self.path} holds a JSON array; hare run reads JSON Lines, one object per line: convert it "
                    f"(jq -c '.[]' {self.path.name} > lines.jsonl)"
                )
            try:
                value = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(value, dict):
                fields.update(dict.fromkeys(value))
                seen += 1
                if seen == objects:
                    break
        if not seen:
            raise InputError(f"{self.path} holds no JSON object on any line; JSONL input is one object per line")
        return list(fields)

    def _jsonl(self, rows: int = 4096) -> Iterator[_Piece]:
        with self.path.open("rb") as file:
            ids: list[Any] = []
            values: list[list[Any]] = [[] for _ in self.names]
            read = _skip_bom(file)
            for number, line in enumerate(file, 1):
                read += len(line)
                if not line.strip():
                    continue
                row = json_row(line)
                if isinstance(row, Bad):
                    # Its line, and its file in a folder: a row position does not find it (blank lines are not
                    # rows, and a folder's positions run on from file to file), nor an id it may not have.
                    row = Bad(f"line {number}{self.where}: {row.reason}")
                    ids.append(self._salvaged_id(line))
                    for column in values:
                        column.append(row)
                else:
                    ids.append(text_id(row.get(self._id)) if self._id is not None else None)
                    # A row without its id field is said so, as one without a text field is (not "its id is
                    # empty (null)", which reads as an id written as null).
                    absent = json_field(row, self._id) if self._id is not None else None
                    for name, column in zip(self.names, values, strict=True):
                        column.append(absent if isinstance(absent, Bad) else json_field(row, name))
                if len(ids) == rows:
                    yield _Piece(ids if self._id is not None else None, values, read)
                    ids, values = [], [[] for _ in self.names]
            if ids:
                yield _Piece(ids if self._id is not None else None, values, read)

    def _salvaged_id(self, line: bytes) -> Any:
        """The id of a line rejected for bytes that are not UTF-8, read with those bytes replaced, so that its
        reject names the row (its id was null); None where the line is no JSON object even so."""
        if self._id is None:
            return None
        row = json_row(line.decode("utf-8", "replace"))
        return None if isinstance(row, Bad) else text_id(row.get(self._id))

    def _open_csv(self) -> Iterator[_Piece]:
        # utf-8-sig: the header without a byte order mark, as Arrow's reader (below) reads it.
        with self.path.open(newline="", encoding="utf-8-sig", errors="replace") as f:
            header = next(csv.reader(f), None)
        if not header:
            raise InputError(f"{self.path} is empty; CSV input needs a header line naming its columns")
        missing = [name for name in self.names if name not in header]
        if missing and len(header) == 1 and (other := next((d for d in ";\t|" if d in header[0]), None)):
            raise InputError(
                f"{self.path} has one column, {header[0]!r}: its fields seem separated by {other!r}; hare run "
                "reads comma-separated CSV (save it with commas, or as JSONL or Parquet)"
            )
        if missing:
            raise InputError(self._missing(missing, header, "column"))
        self._id = self._id_column(header)
        # A name the job reads, twice in the header: Arrow read the first, silently.
        for name in dict.fromkeys([*self.names, *([self._id] if self._id else [])]):
            if header.count(name) > 1:
                where = ", ".join(str(i + 1) for i, h in enumerate(header) if h == name)
                raise InputError(
                    f"{self.path} has {header.count(name)} columns named {name!r} (columns {where}); which to read "
                    "is unclear: rename all but one"
                )
        if self._id is not None:
            self.id_type = pa.string()
        if (row := _quote_left_open(self.path, header[-1])) is not None:
            raise InputError(
                f"{self.path}: row {row} (the header is row 1) opens a quote that never closes, so the rest of the "
                "file reads as one value and the rows in it would be lost; close the quote (a quote inside a "
                'quoted value is written twice, "")'
            )
        return self._csv()

    def _csv(self) -> Iterator[_Piece]:
        # Text columns as bytes, decoded per row, so that one undecodable value rejects its row, not the file.
        types = {name: pa.binary() for name in self.names} | ({self._id: pa.string()} if self._id else {})
        pending: list[tuple[int | None, Bad]] = []  # (its row of the file, the header's 1, if known; the row)
        seen = 0  # rows of the file before the next batch, skipped ones included

        def bad_line(row: Any) -> str:
            fields = f"{row.actual_columns} fields, the header {row.expected_columns}"
            # Arrow numbers records, not lines (a quoted value may span lines): said as a row, as a spreadsheet would.
            pending.append((row.number, Bad(f"row {row.number}{self.where} (the header is row 1) has {fields}")))
            return "skip"

        with self.path.open("rb") as file:
            try:
                reader = pacsv.open_csv(
                    file,
                    read_options=pacsv.ReadOptions(use_threads=False, block_size=CSV_BLOCK),
                    parse_options=pacsv.ParseOptions(invalid_row_handler=bad_line, newlines_in_values=True),
                    convert_options=pacsv.ConvertOptions(
                        column_types=types, include_columns=[*self.names, *([self._id] if self._id else [])]
                    ),
                )
            except pa.ArrowInvalid as exc:
                if "Empty CSV" in str(exc):  # a header without a line end after it: no rows, as with one
                    return
                raise InputError(f"{self.path} is not a CSV file this job can read: {_first_line(exc)}") from None
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    break
                except pa.ArrowInvalid as exc:
                    if "straddling" in str(exc):  # one row longer than a block: Arrow cannot read past it
                        raise InputError(
                            f"{self.path} has a row longer than {CSV_BLOCK >> 20} MiB near byte {file.tell():,}, "
                            "which the CSV reader cannot hold (its text is over any --max-chars); remove it, or "
                            "convert the file to JSONL or Parquet, whose long rows go to the rejects"
                        ) from None
                    raise InputError(f"{self.path} stops being readable CSV: {_first_line(exc)}") from None
                bad, pending[:] = list(pending), []
                # An empty id is no id, rejected as a JSONL null id is (it was written as "").
                ids = [i or None for i in batch.column(self._id).to_pylist()] if self._id else None
                values = [batch.column(name).to_pylist() for name in self.names]
                if bad:  # lines the parser skipped: rows of their own, where they stand among the batch's
                    at = _places([number for number, _ in bad], seen, batch.num_rows + len(bad))
                    ids = _among(ids, at, [None] * len(bad)) if ids is not None else None
                    values = [_among(column, at, [row for _, row in bad]) for column in values]
                seen += batch.num_rows + len(bad)
                yield _Piece(ids, values, file.tell())

    def _open_parquet(self) -> Iterator[_Piece]:
        try:
            with pq.ParquetFile(self.path) as parquet:
                schema, self._rows = parquet.schema_arrow, parquet.metadata.num_rows
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"{self.path} is not a Parquet file ({_first_line(exc)})") from None
        missing = [name for name in self.names if name not in schema.names]
        if missing:
            raise InputError(self._missing(missing, schema.names, "column"))
        for name in self.names:
            kind_ = schema.field(name).type
            if pa.types.is_dictionary(kind_):
                kind_ = kind_.value_type
            if kind_ not in TEXT_TYPES:
                raise InputError(f"column {name} of {self.path} holds {kind_}, not text; name a text column")
        self._id = self._id_column(schema.names)
        if self._id is not None:
            self.id_type = schema.field(self._id).type
        return self._parquet()

    def _parquet(self) -> Iterator[_Piece]:
        read = 0
        columns = [*self.names, *([self._id] if self._id else [])]
        with pq.ParquetFile(self.path) as parquet:
            for batch in parquet.iter_batches(batch_size=4096, columns=columns):
                read += batch.num_rows
                ids = self._parquet_ids(batch.column(self._id)) if self._id else None
                yield _Piece(ids, [_texts(batch.column(name)) for name in self.names], read)

    def _parquet_ids(self, column: pa.Array) -> list[Any]:
        try:
            return column.to_pylist()
        except UnicodeDecodeError as exc:  # Arrow does not check a string column's UTF-8 when it reads it
            raise InputError(
                f"column {self._id} of {self.path} holds an id that is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); fix the file's ids, or name another id column (--id-column)"
            ) from None

    def _id_column(self, names: list[str]) -> str | None:
        if self.columns.id is None:
            return "id" if "id" in names else None
        if self.columns.id not in names:
            raise InputError(self._missing([self.columns.id], names, "column", option="--id-column"))
        return self.columns.id

    def _missing(self, missing: list[str], found: list[str], what: str, option: str | None = None) -> str:
        shown = ", ".join(found[:12]) + (", ..." if len(found) > 12 else "")
        options = option or self.columns.options(self.pairs)
        return f"{self.path} has no {what} {', '.join(missing)} (it has: {shown}); name it with {options}"


def checked_chunk(
    index: int,
    first: int,
    ids: list[Any],
    values: dict[str, list[Any]],
    max_chars: int,
    id_column: str | None = None,
    end: int = 0,
) -> Chunk:
    """Rows [first, first + len(ids)) as a chunk: each row's values (by column) checked, the bad rows rejected
    with their reason (a row with an id column and no id too)."""
    names = list(values)
    chunk = Chunk(index, first, len(ids), end, values=[[] for _ in names])
    for i, row in enumerate(zip(*values.values(), strict=True)):
        reason = next((r for name, v in zip(names, row, strict=True) if (r := check(v, name, max_chars))), None)
        if reason is None and id_column is not None and (ids[i] is None or ids[i] != ids[i]):
            # NaN (a float id column's missing value) is no id either: JSONL output wrote it as null.
            reason = f"its {id_column} is empty ({'null' if ids[i] is None else 'NaN'})"
        if reason is not None:
            chunk.rejects.append(Reject(first + i, ids[i], reason))
            continue
        chunk.ids.append(ids[i])
        chunk.positions.append(first + i)
        for column, v in zip(chunk.values, row, strict=True):
            column.append(v if isinstance(v, str) else v.decode())
    return chunk


def check(value: Any, name: str, max_chars: int) -> str | None:
    """Why a row's value cannot be run (None: it can)."""
    if isinstance(value, Bad):
        return value.reason
    if value is None:
        return f"its {name} is empty (null)"
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError as exc:
            return f"its {name} is not valid UTF-8 (byte {exc.start})"
    if not isinstance(value, str):
        return f"its {name} is {kind(value)}, not text"
    if not value:
        return f"its {name} is an empty string"
    if len(value) > max_chars:
        return f"its {name} is {len(value)} characters long, over the limit of {max_chars} (--max-chars)"
    return None


def json_row(line: bytes | str) -> dict[str, Any] | Bad:
    """A JSONL line as its row, or why it is none."""
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if isinstance(line, bytes):  # orjson says "surrogates not allowed" of any byte that is not UTF-8
            try:
                line.decode()
            except UnicodeDecodeError as bad:
                return Bad(f"the line is not UTF-8: its byte {bad.start + 1} is 0x{line[bad.start]:02x}")
        return Bad(f"the line is not valid JSON (UTF-8): {exc}")
    return row if isinstance(row, dict) else Bad(f"the line is {kind(row)}, not a JSON object")


def json_field(row: dict[str, Any], name: str) -> Any:
    """A JSONL row's field `name`, or Bad when it has none."""
    return row.get(name, Bad(f'the row has no "{name}" field'))


def text_id(value: Any) -> str | None:
    """A JSONL id as text (ids of a text format are written as strings: 7 becomes "7")."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def corpus_files(path: Path, fmt: str | None = None) -> list[Path]:
    """The files of the input `path`: itself, or a folder's files (its subfolders' too) whose suffix names a
    format (`fmt`, where given), in name order, hidden ones, those whose name starts with "_" (Spark's
    _SUCCESS) and empty ones (Spark's empty partitions) left out."""
    if path.is_file():
        return [path]
    if path.exists() and not path.is_dir():  # a pipe (`-i /dev/stdin`, `<(...)`), a device: read once, no resume
        raise InputError(
            f"the input {path} is not a file but a pipe or device; hare run reads a file (a killed job resumes from "
            "its place in it): save the rows to a JSONL, CSV or Parquet file first"
        )
    if not path.is_dir():
        raise InputError(f"the input {path} does not exist; give a JSONL, CSV or Parquet file, or a folder of them")
    files = sorted(
        f
        for f in path.rglob("*")
        if SUFFIXES.get(f.suffix.lower()) in ((fmt,) if fmt else FORMATS)
        and not any(part.startswith((".", "_")) for part in f.relative_to(path).parts)
        and f.is_file()
    )
    if not files:
        names = ", ".join(f"*{s}" for s, named in SUFFIXES.items() if fmt in (None, named))
        raise InputError(f"the folder {path} holds no file named {names}")
    if not (full := [f for f in files if f.stat().st_size > 0]):
        raise InputError(f"every file of the folder {path} is empty: there are no rows to run")
    return full


def input_format(path: Path) -> str:
    """The format the suffix of a file (or of every file of a folder) names (InputError when it names none, or a
    folder's name several)."""
    if path.is_dir():
        return _one_format(path, corpus_files(path))
    fmt = SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        _refuse_unreadable(path)
        raise InputError(f"cannot tell the format of {path} from its suffix; pass --input-format {'|'.join(FORMATS)}")
    return fmt


def _one_format(folder: Path, files: list[Path]) -> str:
    """The one format the suffixes of a folder's `files` name (InputError where they name several)."""
    found = sorted({SUFFIXES[f.suffix.lower()] for f in files})
    if len(found) > 1:
        raise InputError(
            f"the folder {folder} holds files of {' and '.join(found)}; pass --input-format to read one kind"
        )
    return found[0]


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _skip_bom(file: io.BufferedReader) -> int:
    """Move `file` past a UTF-8 byte order mark at its start (Excel's "CSV UTF-8" and Windows editors write
    one, Arrow's readers skip it, orjson refuses a line that starts with it); returns the bytes skipped."""
    if file.read(len(codecs.BOM_UTF8)) == codecs.BOM_UTF8:
        return len(codecs.BOM_UTF8)
    file.seek(0)
    return 0


# The first bytes of the compressed files a corpus may come as (a .jsonl.gz read as JSONL was "no JSON object").
MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"PK\x03\x04": "zip"}
# The byte order marks of the wide encodings a spreadsheet saves "Unicode text" in (UTF-32's first: its
# little-endian mark begins with UTF-16's). A UTF-16 CSV's header was read as "\ufffd\ufffdi d ,  t e x t".
WIDE = {
    codecs.BOM_UTF32_LE: "UTF-32",
    codecs.BOM_UTF32_BE: "UTF-32",
    codecs.BOM_UTF16_LE: "UTF-16",
    codecs.BOM_UTF16_BE: "UTF-16",
}


def _refuse_unreadable(path: Path) -> None:
    """InputError if `path` is a compressed file (by its first bytes, MAGIC) or text in a wide encoding (WIDE)."""
    with path.open("rb") as f:
        head = f.read(6)
    packed = next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)
    if packed:
        raise InputError(
            f"{path} is {packed}-compressed; decompress it first: hare run reads JSONL and CSV as plain text "
            "(and Parquet, which compresses inside)"
        )
    wide = next((name for mark, name in WIDE.items() if head.startswith(mark)), None)
    if wide:
        raise InputError(f"{path} is {wide} text (its byte order mark says so); save it as UTF-8, which hare run reads")


def _quote_left_open(path: Path, last: str) -> int | None:
    """The row (the header's 1) of a CSV file's last record where it opens a quote the file never closes: Arrow's
    reader takes the rest of the file as that value, silently (one stray quote took 994 rows with it). Read
    once, before the job, through the header's `last` column alone (the value a record's last field runs on
    in), at Arrow's speed; None where every quote closes."""
    value: bytes | None = None  # the last well-formed record's value of `last`
    text: str | None = None  # the last malformed record's text (one the open quote left a field short)
    records = 0

    def malformed(row: Any) -> str:
        nonlocal text, records
        text, records = row.text, records + 1
        return "skip"

    with path.open("rb") as file:
        try:
            reader = pacsv.open_csv(
                file,
                read_options=pacsv.ReadOptions(use_threads=False, block_size=CSV_BLOCK),
                parse_options=pacsv.ParseOptions(invalid_row_handler=malformed, newlines_in_values=True),
                convert_options=pacsv.ConvertOptions(column_types={last: pa.binary()}, include_columns=[last]),
            )
            for batch in reader:
                if batch.num_rows:
                    records += batch.num_rows
                    value = batch.column(0)[batch.num_rows - 1].as_py()
        except pa.ArrowInvalid:
            return None  # the job's own reading says what is wrong, and where
        # Either may be the file's last record; only that one can end the file with a line end inside it.
        size = path.stat().st_size
        longest = max(len(value or b""), len((text or "").encode()))
        file.seek(max(0, size - longest - 2))
        end = file.read()
    # A value the file ends with, line ends inside: no closing quote came after it (a closed one is followed
    # by its quote, and an unquoted value cannot hold a line end).
    if value and (b"\n" in value or b"\r" in value) and end.endswith(value):
        return 1 + records
    if text and ("\n" in text or "\r" in text):
        raw = text.encode()
        if end.rstrip(b"\r\n").endswith(raw.rstrip(b"\r\n")):
            try:
                list(csv.reader(io.StringIO(text), strict=True))
            except csv.Error as exc:  # strict csv runs out of the file inside a quote
                return 1 + records if "unexpected end of data" in str(exc) else None
    return None


# A string column's bytes, as the binary type of the same layout.
AS_BYTES = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary(), pa.string_view(): pa.binary_view()}


def _texts(column: pa.Array) -> list[Any]:
    """A text column's values; where some are not UTF-8 (Arrow reads a Parquet string column unchecked), all
    as bytes, so that `check` rejects those rows by name (one stopped the job with a traceback)."""
    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        if pa.types.is_dictionary(column.type):
            column = column.dictionary_decode()
        return column.view(AS_BYTES[column.type]).to_pylist()


def _places(numbers: list[int | None], seen: int, rows: int) -> list[int]:
    """Where the parser's skipped lines stand among the `rows` of their batch, from their rows of the file (the
    header is row 1; `seen` rows came before the batch); all ahead of it where the parser did not say (so a row
    numbered by its place gets the place it had in the file, and the good rows around it theirs)."""
    places = [n - 2 - seen if n is not None else -1 for n in numbers]
    if sorted(places) != places or places[0] < 0 or places[-1] >= rows or len(set(places)) < len(places):
        return list(range(len(numbers)))
    return places


def _among(good: list[Any], places: list[int], bad: list[Any]) -> list[Any]:
    """`good` with `bad[i]` put at index `places[i]` of the result (places ascending)."""
    out, rest = [], iter(good)
    marks = dict(zip(places, bad, strict=True))
    for i in range(len(good) + len(bad)):
        out.append(marks[i] if i in marks else next(rest))
    return out
