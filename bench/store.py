"""The benchmark result store: one SQLite file, one row per run and one per measured point.

This module is a contract shared with the console (`admin_ui/`), which reads results through it and starts
`hare bench run` as a subprocess. It imports only the standard library. The records it stores (Run, Point,
Comparison, Ratio) are bench/records.py's, importable from here.

Python API
----------
    from bench.store import Store, default_db_path

    store = Store()                      # default_db_path(); Store(Path("x.db")) for another file
    for run in store.runs():             # newest first: list[Run]
        print(run.id, run.status, run.kind, run.task, run.created_at)
    run = store.run(run_id)              # Run; KeyError if there is no such run
    points = store.points(run_id)        # list[Point], in measurement order (run in rounds: plan order)
    rows = store.compare(a, b)           # list[Comparison]: points of run a and b matched on their settings
    store.ratios(run_id)                 # list[Ratio]: hare vs each baseline within one run

`default_db_path()` is `$HARE_BENCH_DB` if set, else `$XDG_DATA_HOME/hare/bench.db` (XDG_DATA_HOME defaults to
`~/.local/share`). Every `hare bench` subcommand takes `--db PATH` to use another file.

A `Run` is one invocation of `hare bench run` or `hare bench headline`: what was measured (task, target URL
or bundle, the bundle's manifest hash), where (machine: CPU model, cores, instruction-set flags), with what
(versions) and how (settings), plus its status: "running" while it goes, then "done", "failed" or
"cancelled". A `Point` is one measured configuration of one target ("hare", "vanilla", "comet" or
"model-only"): load model, concurrency or arrival rate, sequence length, batch size, workers and threads,
with its throughput, client latency percentiles (milliseconds), errors by status, the server's own timing
(from `x-compute-time` and `server-timing`) and the CPU the load generator used. Latencies are in
milliseconds, CPU in cores (1.0 = one core busy for the whole point). A run in rounds (`--rounds N`) stores
each point once, its median round, with every round's figures in `extra["rounds"]`; its progress events count
every round's points (`n` is the plan's points times N).

Progress on stdout: `hare bench run|headline --progress jsonl`
--------------------------------------------------------------
One JSON object per line, flushed at once; the `event` field says which. Stop the run with SIGINT or SIGTERM:
the current point is cut short, servers the bench started are stopped, the run is marked "cancelled", and
a final `done` line is still printed (exit status 130).

    {"event": "start", "run_id": 7, "n": 14, "db": "/root/.local/share/hare/bench.db"}
    {"event": "server", "target": "vanilla", "state": "starting" | "ready" | "stopped", "url": "http://..."}
    {"event": "point_start", "k": 3, "n": 14, "target": "hare", "settings": {...PointSettings...}}
    {"event": "tick", "k": 3, "n": 14, "elapsed_s": 4.0, "duration_s": 10.0, "requests": 812,
     "errors": 0, "req_s": 203.1, "p50_ms": 9.7, "p99_ms": 14.2}            (about once a second)
    {"event": "point", "k": 3, "n": 14, "point": {...Point as a dict...}}   (the point as stored)
    {"event": "log", "message": "..."}                                          (anything else worth showing)
    {"event": "done", "run_id": 7, "status": "done" | "failed" | "cancelled", "message": "..."}

`k` counts from 1. `n` is the number of points planned, baselines and model-only figures included. The
`done` line is always last; its `run_id` can be passed to `Store.run` (it is null, with status "failed", when
the run could not start: a bad target or option). `hare bench headline` measures two runs (classification,
then embeddings) under one `start` and one `done`: `k`/`n` count across both and `run_id` is the first; its
summary lists both (`Run.summary["runs"]`) and the goals (`Run.summary["goals"]`).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any

from bench.records import BASELINES, MATCH_KEYS, Comparison, Point, Ratio, Run, ratios
from tasks.errors import InputError

__all__ = ["BASELINES", "MATCH_KEYS", "Comparison", "Point", "Ratio", "Run", "Store", "default_db_path", "ratios"]

SCHEMA_VERSION = 1  # a change to SCHEMA bumps it: a store at this version is opened without writing

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    target TEXT NOT NULL DEFAULT '',
    manifest_hash TEXT NOT NULL DEFAULT '',
    machine TEXT NOT NULL DEFAULT '{}',
    versions TEXT NOT NULL DEFAULT '{}',
    settings TEXT NOT NULL DEFAULT '{}',
    summary TEXT NOT NULL DEFAULT '{}',
    message TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS points (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    target TEXT NOT NULL,
    load TEXT NOT NULL,
    workers INTEGER NOT NULL,
    threads INTEGER NOT NULL,
    seq_len INTEGER NOT NULL,
    batch INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,
    rate REAL NOT NULL,
    duration_s REAL NOT NULL,
    requests INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    errors TEXT NOT NULL,
    req_s REAL,
    seq_s REAL,
    tokens_s REAL,
    lat_min REAL,
    lat_avg REAL,
    lat_p50 REAL,
    lat_p90 REAL,
    lat_p95 REAL,
    lat_p99 REAL,
    lat_max REAL,
    server TEXT NOT NULL,
    client_cpu REAL,
    server_cpu REAL,
    extra TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS points_run ON points(run_id, idx);
"""


def default_db_path(env: Mapping[str, str] | None = None) -> Path:
    """`$HARE_BENCH_DB`, else `$XDG_DATA_HOME/hare/bench.db` (XDG_DATA_HOME defaults to ~/.local/share).

    The one place the bench's store location is read from the environment (`env`, default os.environ): the
    bench's command line and the console's settings (admin_ui/settings.py) both ask here."""
    env = os.environ if env is None else env
    explicit = env.get("HARE_BENCH_DB")
    if explicit:
        return Path(explicit).expanduser()
    data_home = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "hare" / "bench.db"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


POINT_JSON = {"errors", "server", "extra"}
FLOAT_FIGURES = ("req_s", "seq_s", "tokens_s", "lat_min", "lat_avg", "lat_p50", "lat_p90", "lat_p95", "lat_p99",
                 "lat_max", "client_cpu")  # fmt: skip
RUN_JSON = {"machine", "versions", "settings", "summary"}


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _columns(db: sqlite3.Connection) -> dict[str, set[str]]:
    """Each table of `db` (SQLite's own left out) with its columns."""
    names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return {n: {c[1] for c in db.execute(f"PRAGMA table_info('{n}')")} for n in names if not n.startswith("sqlite_")}


def _refuse_foreign(db: sqlite3.Connection, path: Path) -> None:
    """InputError for an SQLite file that holds tables other than a store's, or a store's tables without their
    columns: another program's database, which the schema was then added to (or a traceback came from)."""
    with closing(sqlite3.connect(":memory:")) as ours:
        ours.executescript(SCHEMA)
        wanted = _columns(ours)
    found = _columns(db)
    alien = sorted(t for t, columns in found.items() if t not in wanted or not wanted[t] <= columns)
    if alien:
        raise InputError(
            f"{path} is another program's SQLite database (its tables {', '.join(alien)} are no result store's), "
            "left as it is; give another --db (or HARE_BENCH_DB)"
        )


class Store:
    """The SQLite file. Each call opens its own short connection, so readers never block a running bench."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # /proc/x/bench.db: a bare "[Errno 2] No such file or directory: '/proc/x'"
            raise InputError(
                f"{self.path}: the folder {self.path.parent} cannot be made ({exc.strerror}); give another --db "
                "(or HARE_BENCH_DB)"
            ) from None
        try:
            with self._db() as db:
                # A store already made is only read here: one on a read-only mount can still be browsed.
                if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                    _refuse_foreign(db, self.path)
                    db.executescript(SCHEMA)
                    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:  # not SQLite, a folder, an unwritable place: sqlite3's own trace
            raise InputError(
                f"{self.path} is not a result store this user can open ({exc}); give another --db (or HARE_BENCH_DB)"
            ) from None

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30)) as db:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA foreign_keys = ON")
            try:
                with db:  # commit on success, roll back on error
                    yield db
            except sqlite3.OperationalError as exc:
                if "readonly" not in str(exc):
                    raise
                raise InputError(
                    f"{self.path} can be read but not written here ({exc}); give another --db (or HARE_BENCH_DB) to "
                    "measure"
                ) from None

    # -- writing (the bench) --------------------------------------------------------------------------------

    def create_run(
        self,
        kind: str,
        *,
        name: str = "",
        task: str = "",
        target: str = "",
        manifest_hash: str = "",
        machine: Mapping[str, Any] | None = None,
        versions: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> int:
        """Insert a run in status "running" and return its id."""
        with self._db() as db:
            cur = db.execute(
                "INSERT INTO runs (created_at, status, kind, name, task, target, manifest_hash, machine, versions,"
                " settings) VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    _now(),
                    kind,
                    name,
                    task,
                    target,
                    manifest_hash,
                    json.dumps(dict(machine or {})),
                    json.dumps(dict(versions or {})),
                    json.dumps(dict(settings or {})),
                ),
            )
            assert cur.lastrowid is not None
            return int(cur.lastrowid)

    def update_run(self, run_id: int, **values: Any) -> None:
        """Change some columns of a run (task, target, manifest_hash, settings, summary, ...)."""
        allowed = {f.name for f in fields(Run)} - {"id", "created_at"}
        unknown = set(values) - allowed
        if unknown:
            raise ValueError(f"unknown run columns {sorted(unknown)}")
        cols = {k: json.dumps(v) if k in RUN_JSON else v for k, v in values.items()}
        with self._db() as db:
            db.execute(
                f"UPDATE runs SET {', '.join(f'{k} = ?' for k in cols)} WHERE id = ?",
                (*cols.values(), run_id),
            )

    def finish_run(self, run_id: int, status: str, message: str = "") -> None:
        """Mark a run done, failed or cancelled."""
        self.update_run(run_id, status=status, message=message, finished_at=_now())

    def add_point(self, point: Point) -> int:
        """Store a measured point and return its row id."""
        row = {f.name: getattr(point, f.name) for f in fields(Point) if f.name != "id"}
        row = {k: json.dumps(v) if k in POINT_JSON else v for k, v in row.items()}
        with self._db() as db:
            cur = db.execute(
                f"INSERT INTO points ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
                tuple(row.values()),
            )
            assert cur.lastrowid is not None
            point.id = int(cur.lastrowid)
            return point.id

    def delete_run(self, run_id: int) -> None:
        with self._db() as db:
            db.execute("DELETE FROM points WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM runs WHERE id = ?", (run_id,))

    # -- reading (the bench CLI and the console) ------------------------------------------------------------

    def runs(self, limit: int | None = None) -> list[Run]:
        """Every run, newest first."""
        sql = "SELECT * FROM runs ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        with self._db() as db:
            return [_run(r) for r in db.execute(sql)]

    def run(self, run_id: int) -> Run:
        """One run; KeyError if there is none with that id."""
        with self._db() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no benchmark run {run_id} in {self.path}")
        return _run(row)

    def points(self, run_id: int) -> list[Point]:
        """A run's points in the order they were measured."""
        with self._db() as db:
            return [_point(r) for r in db.execute("SELECT * FROM points WHERE run_id = ? ORDER BY idx", (run_id,))]

    def compare(self, a: int, b: int) -> list[Comparison]:
        """Points of run `a` and run `b` matched by target and settings; ratios are b over a."""
        pa = {(p.target, p.key()): p for p in self.points(a)}
        pb = {(p.target, p.key()): p for p in self.points(b)}
        out = []
        for target, key in sorted(set(pa) | set(pb), key=lambda tk: (tk[0], [str(x) for x in tk[1]])):
            x, y = pa.get((target, key)), pb.get((target, key))
            out.append(
                Comparison(
                    target=target,
                    key=dict(zip(MATCH_KEYS, key, strict=True)),
                    a=x,
                    b=y,
                    req_s_ratio=_ratio(y.req_s, x.req_s) if x and y else None,
                    p50_ratio=_ratio(y.lat_p50, x.lat_p50) if x and y else None,
                )
            )
        return out

    def ratios(self, run_id: int) -> list[Ratio]:
        """hare/baseline per point of one run (throughput up is good; p50 ratio baseline/hare, up is good)."""
        return ratios(self.points(run_id))


def _run(row: sqlite3.Row) -> Run:
    data = dict(row)
    for k in RUN_JSON:
        data[k] = json.loads(data[k] or "{}")
    return Run(**data)


def _point(row: sqlite3.Row) -> Point:
    data = dict(row)
    for k in POINT_JSON:
        data[k] = json.loads(data[k] or "{}")
    for k in FLOAT_FIGURES:
        if data[k] is None:  # SQLite stores NaN (no answers to summarise) as NULL
            data[k] = math.nan
    return Point(**data)
