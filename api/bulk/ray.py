"""A bundle as a Ray Data stage, for corpora one machine cannot carry: `HareStage`, a callable class for
`Dataset.map_batches` (one actor per core, each one model thread), and `run_on_ray`, what `hare run --ray
ADDRESS` does with it (the corpus read as on one machine, and Ray Data's Parquet writer, around the stage).

    import ray
    from api.bulk.ray import HareStage

    ds = ray.data.read_parquet("s3://bucket/corpus/").repartition(target_num_rows_per_block=1024)
    ds = ds.map_batches(HareStage, fn_constructor_kwargs={"bundle": "/bundles/all-MiniLM-L6-v2"},
                        batch_format="pyarrow", batch_size=1024, num_cpus=1,
                        compute=ray.data.ActorPoolStrategy(min_size=1, max_size=8))
    ds.write_parquet("s3://bucket/embeddings/")

Each batch is checked, tokenized, run in length-sorted calls at the bundle's batch budget and post-processed
exactly as `hare run` does it (api/bulk/model.py). A rejected row is kept, with its reason in `error` and no
output, so no row goes missing. Ray restarts an actor whose process dies and runs its batch again on another
(docs/bulk.md, on a Ray cluster); every input row comes out once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import shutil
import socket
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from api.bulk.job import check_apart
from api.bulk.model import BulkModel
from api.bulk.reader import Bad, Columns, Corpus, checked_chunk
from api.bulk.writer import conform
from api.config import Settings
from container.locking import holding
from tasks.errors import InputError


class HareStage:
    """`map_batches` stage: a pyarrow batch with an id column and the task's text columns in, the same rows out
    as `hare run` writes them (id, outputs, truncated) plus `error` (null, or why the row was rejected).

    bundle: the bundle folder, on every node's disk (or a shared volume). parameters: the task's /predict
    parameters. columns: the input's column names (its id column must exist: Ray has no row numbers to give).
    long_input, truncation_direction, max_chars: as `hare run`'s options. streams: model threads in this actor
    (1: one actor per core).
    """

    def __init__(
        self,
        bundle: str,
        parameters: dict[str, Any] | None = None,
        columns: Columns | None = None,
        long_input: str | None = None,
        max_chars: int | None = None,
        truncation_direction: str = "right",
        streams: int = 1,
    ) -> None:
        try:
            settings = dataclasses.replace(Settings.from_env(), bundle=Path(bundle), cores=streams)
            self.model = BulkModel(settings, parameters or {}, long_input, truncation_direction)
        except InputError as exc:  # on one node of many, say which
            where = "" if Path(bundle).is_dir() else "; every node reads the bundle at the same path (a shared volume)"
            raise InputError(f"on the Ray node {socket.gethostname()}: {exc.message}{where}") from None
        self.columns = columns or Columns(id="id")
        self.model.check(self.columns)
        self.names = self.columns.values(self.model.task.pairs)
        self.max_chars = max_chars or settings.max_input_chars
        self._schemas: dict[pa.DataType, pa.Schema] = {}

    def __call__(self, batch: pa.Table) -> pa.Table:
        id_column = self.columns.id or "id"
        missing = [name for name in (*self.names, id_column) if name not in batch.column_names]
        if missing:
            raise InputError(
                f"the dataset has no column {', '.join(missing)} (it has: {', '.join(batch.column_names)})"
            )
        ids = batch.column(id_column).to_pylist()
        values = {name: batch.column(name).to_pylist() for name in self.names}
        if REASON in batch.column_names:  # JSONL or CSV read by file_rows: its bad rows, with their reason
            reasons = batch.column(REASON).to_pylist()
            values = {
                n: [v if r is None else Bad(r) for v, r in zip(c, reasons, strict=True)] for n, c in values.items()
            }
        chunk = checked_chunk(0, 0, ids, values, self.max_chars, id_column)
        work = self.model.encode(chunk)
        for call in self.model.batches(work):
            self.model.run(work, call)
        id_type = batch.schema.field(id_column).type
        answered = self.model.answer(work, id_type).table()
        answered = answered.append_column("error", pa.nulls(len(answered), pa.string()))
        rejected = pa.table(
            {
                "id": pa.array([r.id for r in chunk.rejects], id_type),
                "error": pa.array([r.reason for r in chunk.rejects], pa.string()),
            }
        )
        # Every batch in the one schema, the answer's columns null on rejected rows: a batch of only rejected rows
        # lacked them, and a reader that takes the schema of the output's first file (pyarrow's dataset, so
        # pandas.read_parquet on the folder) dropped the answers of every other file when that one came first.
        table = pa.concat_tables([answered, rejected], promote_options="default") if chunk.rejects else answered
        return conform(table, self._schema(id_type))

    def _schema(self, id_type: pa.DataType) -> pa.Schema:
        if id_type not in self._schemas:
            self._schemas[id_type] = self.model.probe(id_type).append(pa.field("error", pa.string()))
        return self._schemas[id_type]


REASON = "_hare_reason"  # file_rows' column: why a row cannot be run (null: it can)


def file_rows(files: pa.Table, fmt: str, columns: Columns, pairs: bool, chunk_rows: int) -> Iterator[pa.Table]:
    """JSONL or CSV files (a row a path) as the rows `hare run` reads from them, by its own reader (reader.Corpus,
    streamed): every column as text, and a line that is not JSON, a CSV row with more or fewer fields than the
    header, a value that is not UTF-8 or not text, a reject with the reason `hare run` gives, naming its file and
    line or row where it has no id. Ray Data's readers guessed one Arrow type a column (CSV ids 007 and 1e3 came
    out as the numbers 7.0 and 1000.0) and failed the whole job on any such row."""
    for path in files.column("path").to_pylist():
        corpus = Corpus(Path(path), columns, pairs, fmt, named=True)
        id_column = corpus.id_column or "id"
        for chunk in corpus.chunks(chunk_rows, sys.maxsize):  # the stage checks the length, with its --max-chars
            bad = chunk.rejects
            yield pa.table(
                {
                    id_column: pa.array([*chunk.ids, *(r.id for r in bad)], pa.string()),
                    **{
                        name: pa.array([*texts, *([None] * len(bad))], pa.string())
                        for name, texts in zip(corpus.names, chunk.values, strict=True)
                    },
                    REASON: pa.array([*([None] * len(chunk.ids)), *(r.reason for r in bad)], pa.string()),
                }
            )


def run_on_ray(
    address: str,
    bundle: Path,
    files: list[Path],
    output: Path,
    stage: dict[str, Any],
    batch_rows: int,
    quiet: bool = False,
) -> int:
    """The corpus `files` (Parquet, JSONL or CSV: reader.corpus_files lists a folder's, as on one machine)
    through HareStage on the Ray cluster at `address` into Parquet files in the folder `output`, one actor per
    CPU of the cluster but one (left to Ray Data's read and write tasks); returns the rows written. The files
    are written to a folder beside `output` and moved there whole at the end: a job killed on the way leaves
    `output` as it was, and the same command runs it again from the start (a rerun wrote every row a second
    time beside the first run's). The caller checked `output` (check_output). HARE_* settings go to the
    actors, which read their own environment. `quiet` (`hare run -q`): without Ray Data's progress bars and its
    log of the plan."""
    import ray

    _reachable(address)
    work = output.parent / f".{output.name}.ray-partial"
    busy = f"another hare run --ray is writing {output} now; wait for it, or give this job another output"
    with holding(output.parent / f".{output.name}.ray-lock", busy):
        try:
            dataset = _dataset(address, bundle, files, stage, batch_rows, quiet)
            shutil.rmtree(work, ignore_errors=True)  # a killed job's, never moved to the output
            with _quiet_data(quiet), warnings.catch_warnings():
                # Planned from the input's files, before the repartition splits them: "the operator only received 1
                # input(s)" and won't use its actors, said of a file that in fact runs on every actor.
                warnings.filterwarnings("ignore", "The minimum number of concurrent actors", UserWarning)
                dataset.write_parquet(str(work.resolve()))
                rows = int(ray.data.read_parquet(str(work.resolve())).count())
            _replace(output, work)
        except KeyboardInterrupt:
            shutil.rmtree(work, ignore_errors=True)  # the caller says so
            raise
        except Exception as exc:
            shutil.rmtree(work, ignore_errors=True)
            said = _said(exc)
            if said is None:
                raise
            raise said from None
        return rows


def _dataset(address: str, bundle: Path, files: list[Path], stage: dict[str, Any], batch_rows: int, quiet: bool) -> Any:
    """The job's Ray dataset: the corpus read as on one machine, in blocks of at most `batch_rows` rows (a file
    is one block to Ray Data's reader: one actor ran a one-file corpus while the others idled), through
    HareStage. `quiet`: without Ray's "Connected to Ray cluster" line."""
    import ray

    hare_env = {k: v for k, v in os.environ.items() if k.startswith("HARE_")}
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level=logging.WARNING if quiet else logging.INFO,
            ignore_reinit_error=True,
            runtime_env={"env_vars": hare_env} if hare_env else None,
        )
    except ConnectionError as exc:
        if address == "auto" or "://" in address:  # no cluster running on this machine; a port not looked at
            raise InputError(f"no Ray cluster at --ray {address} ({exc}); start one with `ray start --head`") from None
        raise InputError(_joining(address, str(exc), ray.__version__)) from None
    except (ImportError, RuntimeError) as exc:
        if "ray[client]" not in str(exc):
            raise
        raise InputError(  # a 32-line traceback said so
            f"--ray {address} is a Ray Client address, which needs `pip install 'ray[client]'`; or run the job on "
            "a node of the cluster with --ray auto"
        ) from None
    cpus = int(ray.cluster_resources().get("CPU", 0))  # type: ignore[no-untyped-call]
    if cpus < 2:  # its one actor took the only CPU and the reads waited for ever
        raise InputError(
            f"the Ray cluster at {address} has {cpus} CPU: the stage takes one an actor and Ray Data's reads "
            "another; give it at least 2"
        )
    stage = dict(stage)
    fmt, pairs = stage.pop("format"), stage.pop("pairs")
    paths = [str(f.resolve()) for f in files]
    if fmt in ("jsonl", "csv"):
        parse = functools.partial(file_rows, fmt=fmt, columns=stage["columns"], pairs=pairs, chunk_rows=batch_rows)
        # A file a task, streamed by hare's reader: the rows and rejects a job on one machine reads
        dataset = ray.data.from_items([{"path": p} for p in paths]).map_batches(
            parse, batch_format="pyarrow", batch_size=1
        )
    else:
        dataset = ray.data.read_parquet(paths)
    return dataset.repartition(target_num_rows_per_block=batch_rows).map_batches(
        HareStage,
        fn_constructor_kwargs={"bundle": str(bundle.resolve()), **stage},
        batch_format="pyarrow",
        batch_size=batch_rows,
        num_cpus=1,
        compute=ray.data.ActorPoolStrategy(size=cpus - 1),
    )


def _joining(address: str, error: str, version: str) -> str:
    """Why a driver could not join a cluster whose head's port answered (_reachable): most often the cluster's
    token, which this driver lacks (Ray turns token authentication on where a token file exists, and by default
    from 2.61); Ray said only "Failed to connect", after 20 s of "Authentication token is missing" lines."""
    return (
        f"the Ray head at --ray {address} answers, but this driver could not join its cluster ({error}): if the "
        "cluster uses token authentication, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to its token (`ray "
        "get-auth-token` on the head prints it); else check that the address is the head's GCS port (6379 by "
        f"default) and that the cluster runs this Ray ({version})"
    )


def _replace(output: Path, work: Path) -> None:
    """`work` moved into place as `output`, which it replaces."""
    if output.exists():
        aside = output.parent / f".{output.name}.ray-replaced"
        shutil.rmtree(aside, ignore_errors=True)  # one a job killed between the two renames left
        os.replace(output, aside)
        os.replace(work, output)
        shutil.rmtree(aside)
    else:
        os.replace(work, output)


def _said(exc: BaseException) -> InputError | None:
    """What a failed Ray job's error says, in one sentence (None: a failure of another kind, raised as it is).
    A stage's InputError (a node without the bundle, say) reaches the driver as the text of Ray's error alone
    (its cause is not carried over), its last line naming it."""
    said = re.findall(rf"^{re.escape(InputError.__module__)}\.\w+: (.+)$", str(exc), re.M)
    return InputError(said[-1]) if said else None


@contextlib.contextmanager
def _quiet_data(quiet: bool) -> Iterator[None]:
    """Ray Data without its progress bars and its INFO log (the plan it runs, each dataset's start), when
    `quiet`; as it was afterwards (the settings are the process's)."""
    if not quiet:
        yield
        return
    import ray

    context = ray.data.DataContext.get_current()
    # ray.data's INFO, and its progress module's warning that the bars it was told to turn off are off
    loggers = {logging.getLogger("ray.data"): logging.WARNING, logging.getLogger(PROGRESS_LOGGER): logging.ERROR}
    saved = context.enable_progress_bars, context.print_on_execution_start, {k: k.level for k in loggers}
    context.enable_progress_bars = context.print_on_execution_start = False
    for logger, level in loggers.items():
        logger.setLevel(level)
    try:
        yield
    finally:
        context.enable_progress_bars, context.print_on_execution_start = saved[:2]
        for logger, level in saved[2].items():
            logger.setLevel(level)


PROGRESS_LOGGER = "ray.data._internal.progress"


def check_output(source: Path, output: Path, overwrite: bool) -> None:
    """Refuse, before the cluster does any work, an output the Ray path must not write: the input or inside it,
    a file (it writes a folder), an existing folder without --overwrite, or with it a folder holding anything but
    Parquet files (a folder of the user's)."""
    check_apart(source, output)
    if output.is_file():
        raise InputError(f"the output {output} is a file; on Ray it is a folder of Parquet files: name a folder")
    if output.is_dir():
        if not overwrite:
            raise InputError(f"the output {output} exists; pass --overwrite to replace it")
        others = [p.name for p in output.iterdir() if p.suffix != ".parquet"]
        if others:
            raise InputError(
                f"the output {output} holds files that are not Parquet ({', '.join(sorted(others)[:3])}); "
                "--overwrite replaces a Ray job's output only: give another folder"
            )


def _reachable(address: str) -> None:
    """Refuse at once an address nothing answers at: Ray tried for 14 minutes before it said so."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--ray takes the head's HOST:PORT (or auto), got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as exc:
        raise InputError(
            f"nothing answers at --ray {address} ({exc.strerror or exc}); start the head (`ray start --head`) "
            "or check the address"
        ) from None


CONNECT_S = 5.0  # how long the head's port has to answer
