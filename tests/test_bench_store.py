"""The result store: the API the console builds on."""

from __future__ import annotations

import dataclasses
import math
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from bench.store import Point, Store, default_db_path
from hare.cli import main as hare
from tasks.errors import InputError


def point(
    run_id: int, idx: int, target: str, seq: int, req_s: float, p50: float, workers: int = 2, inputs: str = "exact"
) -> Point:
    return Point(
        run_id=run_id, idx=idx, target=target, load="closed", workers=workers, threads=1, seq_len=seq, batch=1,
        concurrency=2, rate=0.0, duration_s=5.0, requests=10, ok=9, errors={"429": 1}, req_s=req_s,
        seq_s=req_s, tokens_s=req_s * seq, lat_min=p50 / 2, lat_avg=p50, lat_p50=p50, lat_p90=p50 * 1.1,
        lat_p95=p50 * 1.2, lat_p99=p50 * 1.3, lat_max=p50 * 2, server={"compute_p50": p50 / 2},
        client_cpu=0.1, server_cpu=None, extra={"inputs": inputs},
    )  # fmt: skip


def test_runs_points_compare_ratios(tmp_path: Path) -> None:
    store = Store(tmp_path / "sub" / "bench.db")
    a = store.create_run("run", task="text-classification", target="b", machine={"cpu": "x"}, settings={"k": 1})
    store.add_point(point(a, 1, "hare", 8, 200.0, 5.0))
    store.add_point(point(a, 2, "vanilla", 8, 40.0, 25.0, workers=1))
    store.finish_run(a, "done")
    b = store.create_run("run", task="text-classification")
    store.add_point(point(b, 1, "hare", 8, 300.0, 4.0))
    store.add_point(point(b, 2, "hare", 16, 100.0, 9.0))

    assert [r.id for r in store.runs()] == [b, a]
    run = store.run(a)
    assert run.status == "done" and run.finished_at and run.machine == {"cpu": "x"} and run.settings == {"k": 1}
    assert store.run(b).status == "running"
    points = store.points(a)
    assert [p.target for p in points] == ["hare", "vanilla"]
    assert points[0].errors == {"429": 1} and points[0].server == {"compute_p50": 2.5} and points[0].id

    (ratio,) = store.ratios(a)
    assert ratio.baseline == "vanilla" and ratio.req_s_ratio == pytest.approx(5.0) and ratio.p50_ratio == 5.0

    rows = {(c.target, c.key["seq_len"]): c for c in store.compare(a, b)}
    assert rows["hare", 8].req_s_ratio == pytest.approx(1.5)
    assert rows["hare", 8].p50_ratio == pytest.approx(0.8)
    assert rows["hare", 16].a is None and rows["hare", 16].req_s_ratio is None
    assert rows["vanilla", 8].b is None

    store.update_run(a, summary={"goals": [{"goal": "g", "met": True}]})
    assert store.run(a).summary["goals"][0]["met"] is True
    with pytest.raises(KeyError):
        store.run(999)
    with pytest.raises(ValueError, match="unknown run columns"):
        store.update_run(a, bogus=1)
    store.delete_run(b)
    assert store.points(b) == [] and [r.id for r in store.runs()] == [a]


def test_a_mix_of_lengths_is_not_matched_with_an_exact_length_of_its_mean(tmp_path: Path) -> None:
    """A mix's point is stored at its mean length: hare's mix ~33 is compared with vanilla's mix ~33 and with
    the other run's mix, never with 33 tokens exactly."""
    from bench.tables import compare_table, ratios_table

    store = Store(tmp_path / "bench.db")
    a = store.create_run("run", task="feature-extraction")
    store.add_point(point(a, 1, "hare", 33, 300.0, 4.0, inputs="mix"))
    store.add_point(point(a, 2, "vanilla", 33, 30.0, 40.0, workers=1))
    store.add_point(point(a, 3, "vanilla", 33, 60.0, 20.0, workers=1, inputs="mix"))
    b = store.create_run("run", task="feature-extraction")
    store.add_point(point(b, 1, "hare", 33, 200.0, 5.0))

    (ratio,) = store.ratios(a)
    assert ratio.req_s_ratio == pytest.approx(5.0) and ratio.key["inputs"] == "mix"
    rows = {(c.target, c.key["inputs"]): c for c in store.compare(a, b)}
    assert rows["hare", "mix"].b is None and rows["hare", "exact"].a is None  # not paired with each other
    assert "mix ~33" in _text(ratios_table(store.ratios(a)))
    assert "mix ~33" in _text(compare_table(store.compare(a, b), a, b))


def test_points_run_in_rounds_are_compared_round_by_round(tmp_path: Path) -> None:
    """A slow spell in one round slows hare and the baseline of that round alike: the ratio is the median of
    the rounds' ratios, not the ratio of each side's median round, and the table shows the rounds' range."""
    from bench.tables import ratios_table

    store = Store(tmp_path / "bench.db")
    a = store.create_run("run", task="text-classification")
    hare, base = point(a, 1, "hare", 8, 300.0, 4.0), point(a, 2, "vanilla", 8, 40.0, 25.0, workers=1)
    # Round 2 was a slow spell for both; each stored point is its median round (300 and 40 req/s).
    hare.extra["rounds"] = {"req_s": [400.0, 200.0, 300.0], "lat_p50": [3.0, 6.0, 4.0], "lat_p99": [5.0, 9.0, 6.0]}
    base.extra["rounds"] = {"req_s": [50.0, 25.0, 40.0], "lat_p50": [20.0, 40.0, 25.0], "lat_p99": [30.0] * 3}
    store.add_point(hare)
    store.add_point(base)

    (ratio,) = store.ratios(a)
    assert ratio.rounds == 3 and ratio.req_s_ratio == pytest.approx(8.0)  # 8.0, 8.0, 7.5: the median
    assert ratio.low == pytest.approx(7.5) and ratio.high == pytest.approx(8.0)
    assert ratio.p50_ratio == pytest.approx(20 / 3)  # 6.67, 6.67, 6.25: the median (the median rounds': 6.25)
    assert ratio.hare_req_s == 300.0 and ratio.baseline_req_s == 40.0  # the median rounds, as the points table
    assert "8.00 (7.50-8.00)" in _text(ratios_table([ratio]))
    # Rounds that do not pair up (another count, or a round without answers) fall back to the stored points.
    base.extra["rounds"] = {"req_s": [50.0, 40.0], "lat_p50": [20.0, 25.0], "lat_p99": [30.0, 30.0]}
    b = store.create_run("run", task="text-classification")
    store.add_point(dataclasses.replace(hare, run_id=b))
    store.add_point(dataclasses.replace(base, run_id=b))
    (ratio,) = store.ratios(b)
    assert ratio.rounds == 1 and ratio.req_s_ratio == pytest.approx(7.5) and ratio.low is None


def _text(table: object) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


def test_nan_survives_the_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "bench.db")
    run = store.create_run("run")
    p = point(run, 1, "hare", 8, 0.0, math.nan)
    store.add_point(p)
    assert math.isnan(store.points(run)[0].lat_p50)


def test_default_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HARE_BENCH_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == tmp_path / "hare" / "bench.db"
    monkeypatch.setenv("HARE_BENCH_DB", str(tmp_path / "x.db"))
    assert default_db_path() == tmp_path / "x.db"
    assert Store().path == tmp_path / "x.db"


@pytest.mark.parametrize("what", ["not sqlite", "a folder"])
def test_a_db_that_is_not_a_store_is_refused_with_a_sentence(tmp_path: Path, what: str) -> None:
    # sqlite3's own traceback came out of `hare bench list --db FILE`.
    db = tmp_path / "x.db"
    if what == "a folder":
        db.mkdir()
    else:
        db.write_text("not sqlite")
    with pytest.raises(InputError, match=r"x\.db is not a result store this user can open \(.+\); give another --db"):
        Store(db)


@pytest.mark.parametrize("tables", ["customers(name)", "runs(x)"])
def test_another_programs_database_is_refused_and_left_as_it_is(
    tmp_path: Path, tables: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `hare bench list --db app.db` added the store's tables to another program's database; a table named
    # runs of its own gave sqlite3's "no such column: id" traceback.
    db = tmp_path / "app.db"
    with closing(sqlite3.connect(db)) as app, app:
        app.execute(f"CREATE TABLE {tables}")
    before = db.read_bytes()
    assert hare(["bench", "list", "--db", str(db)]) == 2
    table = tables.split("(")[0]
    said = f"{db} is another program's SQLite database (its tables {table} are no result store's), left as it is"
    assert said in capsys.readouterr().err
    assert db.read_bytes() == before


@pytest.mark.parametrize("command", [["list"], ["show", "1"], ["compare", "1", "2"], ["export", "1"], ["report"]])
def test_reading_a_store_that_is_not_there_says_so_and_makes_nothing(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # `hare bench list --db /new/dir/x.db` made the folder and an empty store, and listed nothing.
    db = tmp_path / "new" / "x.db"
    assert hare(["bench", *command, "--db", str(db)]) == 2
    assert f"there is no result store at {db}: nothing has been measured there yet" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_a_store_already_made_is_opened_without_writing(tmp_path: Path) -> None:
    # Every open ran the schema and set its version: a store on a read-only mount could not even be browsed.
    db = tmp_path / "x.db"
    Store(db).create_run("run")
    before = (db.read_bytes(), db.stat().st_mtime_ns)
    time.sleep(0.01)
    assert [r.id for r in Store(db).runs()] == [1]
    assert (db.read_bytes(), db.stat().st_mtime_ns) == before


def test_export_writes_where_asked_and_says_a_folder_is_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --out in a folder not made yet failed with Errno 2 (report's --out made it); a folder gave Errno 21.
    db = tmp_path / "x.db"
    Store(db).create_run("run")
    out = tmp_path / "new" / "run.csv"
    assert hare(["bench", "export", "1", "--db", str(db), "--out", str(out)]) == 0
    assert out.is_file() and out.read_text()
    assert hare(["bench", "export", "1", "--db", str(db), "--out", str(tmp_path)]) == 2
    assert "is a folder; name the file to write" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["a file", "a folder of other files"])
def test_bench_model_never_replaces_what_is_not_its_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    # A folder without the model's files was deleted whole before the model was written there; a file left the
    # whole model beside it in NAME.partial.
    target = tmp_path / "target"
    if what == "a file":
        target.write_text("mine")
    else:
        target.mkdir()
        (target / "notes.txt").write_text("mine")
    assert hare(["bench", "model", "tiny-classifier", str(target)]) == 2
    assert f"{target} is {what}, not a tiny-classifier model folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]
    assert "mine" in (target.read_text() if target.is_file() else (target / "notes.txt").read_text())


def unanswered(run_id: int, idx: int, target: str, seq: int) -> Point:
    """A point none of whose requests was answered: no latency to summarise (NaN), no rate."""
    nan = math.nan
    return dataclasses.replace(
        point(run_id, idx, target, seq, 0.0, nan), ok=0, errors={"501": 10}, seq_s=0.0, tokens_s=0.0, lat_min=nan,
        lat_p90=nan, lat_p95=nan, lat_p99=nan, lat_max=nan, server={},
    )  # fmt: skip


@pytest.mark.parametrize("fmt", ["html", "md"])
@pytest.mark.parametrize("others", ["model-only", "vanilla unanswered too"])
def test_a_report_of_points_without_answers_is_written_with_what_was_measured(
    tmp_path: Path, fmt: str, others: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A run whose every request to hare failed: the report died in matplotlib ("Data cannot be log-scaled because
    # all values are <= 0"), a traceback and no report.
    store = Store(tmp_path / "bench.db")
    run = store.create_run("run", task="feature-extraction", target="http://127.0.0.1:8000")
    for idx, seq in enumerate((8, 16), 1):
        store.add_point(unanswered(run, idx, "hare", seq))
        if others == "model-only":
            store.add_point(dataclasses.replace(point(run, idx + 2, "model-only", seq, 900.0, 1.0), load="in-process"))
        else:
            store.add_point(unanswered(run, idx + 2, "vanilla", seq))
    store.finish_run(run, "failed", "hare: every request failed (20 answered 501)")
    out = tmp_path / f"r.{fmt}"
    assert hare(["bench", "report", str(run), "--format", fmt, "--db", str(store.path), "--out", str(out)]) == 0
    text = out.read_text()
    assert "every request failed" in text and text.count("501") >= 2
    assert "Plots" not in text  # no figure to draw: hare's points have none, the model alone has one target


def test_a_store_whose_folder_cannot_be_made_is_refused_in_one_sentence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `--db /proc/x/bench.db` (here: under a file) printed a bare "[Errno 2] No such file or directory: '/proc/x'".
    (tmp_path / "a-file").write_text("")
    db = tmp_path / "a-file" / "bench.db"
    flags = ["--task", "feature-extraction", "--seq", "comet", "--progress", "none", "--db", str(db)]
    assert hare(["bench", "run", "http://127.0.0.1:9", *flags]) == 2
    assert capsys.readouterr().err == (
        f"hare bench: error: {db}: the folder {db.parent} cannot be made (File exists); give another --db (or "
        "HARE_BENCH_DB)\n"
    )
