"""Benchmarks: store rows into tables and charts, the background job, and the page with a stand-in bench."""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import benchpoints, benchprogress, benchruns, charts, percentiles
from admin_ui.benchjob import BenchConfig, BenchJob, bundle_for, parse_ints, parse_seq_lens
from bench.store import Store
from container.machine import physical_cores
from tests.test_console_support import benchmarks_page, fake_appliance, fake_bench_argv, fill_store, info, make_point

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_job_left() -> Iterator[None]:
    """The page keeps one job for the whole process: start each test without one, end it after."""
    from admin_ui.views import benchmarks

    benchmarks._slot.clear()
    yield
    job = benchmarks._slot()["job"]
    if job is not None:
        job.cancel(grace_s=5)
    benchmarks._slot.clear()


def test_point_rows_have_every_percentile_and_throughput() -> None:
    rows = benchpoints.point_rows([make_point(1, 0, seq_len=64, concurrency=4, errors={"503": 2})])
    row = rows[0]
    for col in ("min ms", "avg ms", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "max ms", "req/s", "tokens/s"):
        assert col in row
    assert row["p50 ms"] == 6.0 and row["p99 ms"] == 12.0 and row["errors"] == 2
    assert "rate/s" not in row
    assert "rate/s" in benchpoints.point_rows([make_point(1, 0, load="open", rate=50.0)])[0]
    assert benchpoints.point_rows([make_point(1, 0, lat_p99=float("nan"))])[0]["p99 ms"] is None


def test_point_table_prints_text_and_marks_percentiles_of_too_few_answers() -> None:
    points = [
        make_point(1, 0, seq_len=16, concurrency=1),
        make_point(1, 1, "vanilla", seq_len=16, concurrency=1, requests=3, ok=3, lat_p99=845.678),
        make_point(1, 2, "model-only", seq_len=16, concurrency=2, load="in-process", server={}),
    ]
    t = benchpoints.point_table(points)
    hare, vanilla, model = t.rows
    assert all(isinstance(v, str) and v != "None" for r in t.rows for v in r.values())
    assert list(hare)[:4] == ["target", "seq len", "concurrency", "answers"]
    assert "errors" not in hare and "seq/s" not in hare  # nothing failed, one sequence per request
    assert t.shared == {"load": "closed loop", "batch": 1, "workers": 1, "threads": 1}
    assert (hare["p50"], hare["p99"], hare["req/s"]) == ("3.00", "6.00", "333")
    # Three answers: the p50 is one, the p90/p95/p99 are not, and say so.
    assert (vanilla["p50"], vanilla["p90"], vanilla["p99"]) == ("6.00", "~7.80", "~846")
    assert model["server p50"] == "–"
    assert {"p50", "p99", "req/s", "answers"} <= set(t.numeric) and "target" not in t.numeric
    assert t.notes[0].startswith("~ marks a percentile from fewer answers than it needs (p90: 10, p95: 20")
    assert "vanilla at 16 tokens and 1 user (3)" in t.notes[0]
    assert "model-only: the bundle's model called inside the bench's own process" in t.notes[1]
    assert [percentiles.needed_answers(q) for q in ("p50", "p90", "p95", "p99")] == [2, 10, 20, 100]
    h = benchpoints.headline([make_point(1, 0, ok=42, requests=42)])
    assert h is not None and h.latency("p50") == "3.00 ms" and h.latency("p99") == "~6.00 ms"


def test_table_cells_read_as_text() -> None:
    from admin_ui.tables import cell, numeric_columns, text_rows

    assert [cell(v) for v in (None, "", True, 14096, 0.79, 33.41, 14095.5, 7e-09, float("nan"), 0.0)] == [
        "–", "–", "yes", "14,096", "0.79", "33.4", "14,096", "7e-09", "–", "0",
    ]  # fmt: skip
    rows: list[dict[str, Any]] = [{"a": 1, "b": None, "c": "x"}, {"a": 2.5, "b": 3, "c": None}]
    assert text_rows(rows) == [{"a": "1", "b": "–", "c": "x"}, {"a": "2.50", "b": "3", "c": "–"}]
    assert numeric_columns(rows) == ["a", "b"]


def test_csv_has_a_header_and_one_line_per_point() -> None:
    rows = benchpoints.point_rows([make_point(1, 0), make_point(1, 1, seq_len=64)])
    parsed = list(csv.DictReader(io.StringIO(benchpoints.to_csv(rows))))
    assert len(parsed) == 2 and parsed[1]["seq len"] == "64" and parsed[0]["p95 ms"] == "4.5"


def test_constant_settings_leave_the_table() -> None:
    rows = benchpoints.point_rows([make_point(1, 0), make_point(1, 1, seq_len=64, workers=2)])
    shared = benchpoints.constant_settings(rows, ("load", "batch", "workers", "threads"))
    assert shared == {"load": "closed", "batch": 1, "threads": 1}
    compact = benchpoints.drop_constant(rows, ("load", "batch", "workers", "threads"))
    assert "load" not in compact[0] and compact[1]["workers"] == 2 and "p99 ms" in compact[0]
    points = [make_point(1, 0, concurrency=4), make_point(1, 1), make_point(1, 2, load="in-process", concurrency=9)]
    assert benchpoints.values(points, "concurrency") == [1, 4]


def test_headline_picks_the_lightest_point_and_the_peak() -> None:
    points = [
        make_point(1, 0, seq_len=64, concurrency=1),
        make_point(1, 1, seq_len=16, concurrency=4),
        make_point(1, 2, seq_len=16, concurrency=1),
        make_point(1, 3, "vanilla", seq_len=8, concurrency=1),
        make_point(1, 4, "model-only", seq_len=8, load="in-process"),
    ]
    h = benchpoints.headline(points)
    assert h is not None and h.point is points[2] and (h.p50, h.p95, h.p99) == (3.0, 4.5, 6.0)
    assert h.peak_at is points[1] and h.peak_req_s == points[1].req_s
    assert benchpoints.headline(points[3:]) is None


def test_chart_rows_and_specs() -> None:
    points = [
        make_point(1, i, t, s, c) for i, (t, s, c) in enumerate([("hare", 16, 1), ("vanilla", 16, 1), ("hare", 64, 4)])
    ]
    latency = benchpoints.latency_rows(points)
    assert len(latency) == 12 and {r["percentile"] for r in latency} == {"p50", "p90", "p95", "p99"}
    throughput = benchpoints.throughput_rows(points)
    assert [r["target"] for r in throughput] == ["hare", "vanilla", "hare"]
    # Every series its own colour, named in one legend drawn as strokes (not black dots); formatted axes.
    spec = charts.latency_lines(latency).to_dict()
    enc = spec["encoding"]
    names = enc["color"]["scale"]["domain"]
    assert names[:2] == ["hare p50", "hare p90"] and "vanilla p99" in names and len(names) == 8
    assert len(set(enc["color"]["scale"]["range"])) == 8
    assert enc["strokeDash"]["field"] == "series" and enc["color"]["legend"]["symbolType"] == "stroke"
    assert enc["x"]["axis"]["values"] == [16, 64] and enc["x"]["axis"]["format"] == ",d"
    assert enc["y"]["axis"]["format"] == charts.NUMBER
    single = charts.latency_lines(benchpoints.latency_rows(points[:1])).to_dict()
    assert single["encoding"]["color"]["scale"]["domain"] == ["p50", "p90", "p95", "p99"]  # one target: short names
    spec = charts.throughput_lines(throughput).to_dict()
    assert spec["encoding"]["x"]["field"] == "concurrency" and spec["encoding"]["x"]["axis"]["values"] == [1, 4]
    names = spec["encoding"]["color"]["scale"]["domain"]
    assert names == ["hare · 16 tokens", "hare · 64 tokens", "vanilla · 16 tokens"]
    assert len(set(spec["encoding"]["color"]["scale"]["range"])) == 3
    bars = charts.target_bars(throughput).to_dict()["encoding"]
    assert bars["xOffset"]["field"] == "target"
    assert bars["x"]["sort"] == ["16 tokens, 1 user", "64 tokens, 4 users"]  # by length, then users
    assert bars["color"]["scale"]["range"] == [charts.TARGET_COLOURS["hare"], charts.TARGET_COLOURS["vanilla"]]


def test_progress_folds_the_jsonl_stream() -> None:
    point = make_point(7, 0).to_dict()
    settings = {"seq_len": 16, "batch": 1, "concurrency": 4, "load": "closed"}

    def tick(requests: int, p99: float = 8.0) -> str:
        figures = {"elapsed_s": 1.0, "duration_s": 2.0, "req_s": 50.0, "p50_ms": 3.0, "p99_ms": p99}
        return json.dumps({"event": "tick", "k": 1, "n": 4, "requests": requests, "errors": 0, **figures})

    lines = [
        json.dumps({"event": "start", "run_id": 7, "n": 4, "db": "x"}),
        json.dumps({"event": "server", "target": "vanilla", "state": "starting", "url": "u"}),
        json.dumps({"event": "point_start", "k": 1, "n": 4, "target": "hare", "settings": settings}),
    ]
    head = "Point 1 of 4: hare over HTTP, 16 tokens, batch 1, 4 concurrent clients"
    assert benchprogress.progress_from_lines(lines).describe() == head + " · warming up"
    # The first tick comes as the window opens, before any answer: no "0.0 req/s · p50 0.0 ms".
    assert benchprogress.progress_from_lines([*lines, tick(0)]).describe() == head + " · measuring, no answer yet"
    few = benchprogress.progress_from_lines([*lines, tick(40)]).describe()
    assert few == head + " · 40 answers · 50.0 req/s · p50 3.00 ms · p99 ~8.00 ms"
    lines += [tick(1200), "not json"]
    p = benchprogress.progress_from_lines(lines)
    assert p.run_id == 7 and p.fraction == pytest.approx(0.5 / 4)
    assert p.describe() == head + " · 1,200 answers · 50.0 req/s · p50 3.00 ms · p99 8.00 ms"
    assert p.servers == {"vanilla": "starting"} and p.log == ["not json"]
    # Two points asked for; the bench adds two of the model alone, and the page says so.
    plan = benchprogress.Plan(http_points=2, max_concurrency=4, cores=2)
    assert p.plan_note(plan).startswith("4 points: the 2 asked for, over HTTP, then 2 of the model alone")
    assert p.plan_note(benchprogress.Plan(http_points=4, max_concurrency=4, cores=2)) == ""
    # In two rounds the same 4 points are one HTTP point and one of the model alone, twice over.
    assert p.plan_note(benchprogress.Plan(http_points=1, max_concurrency=4, cores=2, rounds=2)).startswith(
        "4 points: 2 rounds of the 1 asked for, over HTTP, then 1 of the model alone"
    )
    assert p.plan_note(benchprogress.Plan(2, 4, 2, rounds=2)).endswith("each point is kept as its median round.")
    model = {"seq_len": 16, "batch": 1, "concurrency": 2, "load": "in-process"}
    later = [*lines, json.dumps({"event": "point_start", "k": 3, "n": 4, "target": "model-only", "settings": model})]
    assert benchprogress.progress_from_lines(later).describe(plan) == (
        "Point 3 of 4: the model alone, in process (no HTTP), 16 tokens, batch 1, "
        "2 streams (at most one per core; 4 clients asked) · measuring"
    )
    lines += [json.dumps({"event": "point", "k": 1, "n": 4, "point": point | {"new_field": 1}})]
    done = [*lines, json.dumps({"event": "done", "run_id": 7, "status": "done", "message": ""})]
    assert benchprogress.progress_from_lines(done).outcome() == "Run #7 done: 1 of 4 points measured"
    cancelled = benchprogress.progress_from_lines(
        [*lines, json.dumps({"event": "done", "run_id": 7, "status": "cancelled"})]
    )
    cancelled.message = "from the console"
    assert cancelled.describe() == "Run #7 cancelled (from the console): 1 of 4 points measured, kept under Results"
    lines += [json.dumps({"event": "done", "run_id": 7, "status": "failed", "message": "vanilla did not start"})]
    p = benchprogress.progress_from_lines(lines)
    assert p.fraction == 0.25 and p.describe() == "Run #7 failed: 1 of 4 points measured; vanilla did not start"
    assert [pt.seq_len for pt in benchprogress.live_point_rows(p)] == [16]


def test_a_server_that_died_is_no_point_measured_at_0_req_s() -> None:
    # "Run #11 done: 8 of 8 points measured", its points after the death charted at 0 req/s.
    settings = {"seq_len": 16, "batch": 1, "concurrency": 4, "load": "closed"}
    alive = make_point(11, 1, concurrency=1)
    dead = make_point(11, 2, concurrency=4, requests=1818, ok=0, errors={"connect": 1818}, req_s=0.0)
    message = (
        "hare stopped answering at point 2: 0 answers, 1,818 could not connect; its later points were not measured"
    )
    tick = {"event": "tick", "k": 2, "n": 3, "elapsed_s": 1.0, "duration_s": 2.0, "requests": 1818, "errors": 1818}
    lines = [
        json.dumps({"event": "start", "run_id": 11, "n": 3, "db": "x"}),
        json.dumps({"event": "point", "k": 1, "n": 3, "point": alive.to_dict()}),
        json.dumps({"event": "point_start", "k": 2, "n": 3, "target": "hare", "settings": settings}),
        json.dumps(tick),
    ]
    assert (
        benchprogress.progress_from_lines(lines)
        .describe()
        .endswith("4 concurrent clients · measuring, no answer yet · 1,818 failed requests")
    )
    lines += [
        json.dumps({"event": "point", "k": 2, "n": 3, "point": dead.to_dict()}),
        json.dumps({"event": "done", "run_id": 11, "status": "failed", "message": message}),
    ]
    p = benchprogress.progress_from_lines(lines)
    assert p.outcome() == f"Run #11 failed: 1 of 3 points measured; {message}"
    assert benchpoints.complete([alive, dead], None) == [alive]  # not a headline or a chart's 0 req/s
    table = benchpoints.point_table([alive, dead])
    assert [r["target"] for r in table.rows] == ["hare", "hare (no answer)"]
    assert table.notes[0] == (
        "No answer at point 2 (hare, 16 tokens, batch 1, 4 clients): 1,818 could not connect. "
        'Marked "no answer" and left out of the headline and the charts.'
    )


def test_bench_config_command_and_parsing(tmp_path: Path) -> None:
    config = BenchConfig(
        "http://h:1", task="text-ranking", model="/m", seq_lens=(16, "comet"), concurrency=(1, 4), duration_s=2.5,
        baselines=("vanilla", "comet"), name="n", model_only=False,
    )  # fmt: skip
    argv = config.command(tmp_path / "b.db", "py")
    assert argv[:6] == ["py", "-m", "hare.cli", "bench", "run", "http://h:1"]
    flags = dict(zip(argv[6:-1:2], argv[7:-1:2], strict=True))
    assert flags == {
        "--seq": "16,comet",
        "--batch": "1",
        "--concurrency": "1,4",
        "--duration": "2.5",
        "--warmup": "1",
        "--progress": "jsonl",
        "--db": str(tmp_path / "b.db"),
        "--task": "text-ranking",
        "--model": "/m",
        "--baseline": "vanilla,comet",
        "--name": "n",
    }
    assert argv[-1] == "--no-model-only" and "--no-model-only" not in BenchConfig("u").command(tmp_path / "b.db")
    assert "--rounds" not in argv and BenchConfig("u", rounds=3).command(tmp_path / "b.db")[-2:] == ["--rounds", "3"]
    assert BenchConfig("u", rounds=3).plan().rounds == 3
    assert config.plan() == benchprogress.Plan(http_points=2 * 1 * 2 * 3, max_concurrency=4, cores=physical_cores())
    assert parse_ints("16, 64 64", "x") == (16, 64)
    assert parse_seq_lens("8, Comet,8") == (8, "comet")
    assert parse_seq_lens("mix,16") == ("mix", 16)
    with pytest.raises(ValueError, match="sequence lengths: 'a'"):
        parse_seq_lens("16,a")
    with pytest.raises(ValueError, match=r"outside 1\.\.10"):
        parse_ints("0", "x", 1, 10)


def test_bundle_for_finds_the_served_bundle(tmp_path: Path) -> None:
    (tmp_path / "b" / "tiny-text-ranking").mkdir(parents=True)
    (tmp_path / "b" / "tiny-text-ranking" / "hare.json").write_text(json.dumps({"task": "text-ranking"}))
    folders = [tmp_path / "a", tmp_path / "b"]
    assert bundle_for(info("text-ranking"), folders) == tmp_path / "b" / "tiny-text-ranking"
    assert bundle_for(info("text-ranking") | {"task": "feature-extraction"}, folders) is None  # another task
    assert bundle_for({"task": "text-ranking", "model": "../b/tiny-text-ranking"}, folders) is None
    assert bundle_for({"task": "text-ranking"}, folders) is None


def test_job_runs_and_records(tmp_path: Path) -> None:
    job = BenchJob(fake_bench_argv(tmp_path / "b.db"), cwd=REPO)
    assert job.wait(60) == 0
    progress = job.progress()
    assert progress.status == "done" and progress.done_points == 2 and len(progress.points) == 2
    assert len(Store(tmp_path / "b.db").points(progress.run_id or 0)) == 2


def test_job_failure_keeps_the_message(tmp_path: Path) -> None:
    job = BenchJob(fake_bench_argv(tmp_path / "b.db", "fail"), cwd=REPO)
    job.wait(60)
    progress = job.progress()
    assert progress.status == "failed" and "cannot reach http://127.0.0.1:1" in progress.message


def test_job_cancel_stops_the_process_group(tmp_path: Path) -> None:
    job = BenchJob(fake_bench_argv(tmp_path / "b.db", "slow"), cwd=REPO)
    deadline = time.monotonic() + 30
    while "tick" not in "".join(job.lines()) and time.monotonic() < deadline:
        time.sleep(0.05)
    job.cancel(grace_s=10)
    job.wait(10)
    assert job.returncode == 130 and job.progress().status == "cancelled"


def test_two_starts_at_once_get_one_bench(tmp_path: Path) -> None:
    # Two tabs pressing Start, both drawn while nothing ran: two benches ran at once and skewed each other.
    import threading

    from admin_ui.benchjob import Busy, new_slot, start_alone

    slot, got = new_slot(), list[BenchJob | Busy]()
    barrier = threading.Barrier(2)

    def press(i: int) -> None:
        barrier.wait()
        try:
            got.append(start_alone(slot, fake_bench_argv(tmp_path / f"{i}.db", "slow")))
        except Busy as busy:
            got.append(busy)

    threads = [threading.Thread(target=press, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    jobs = [g for g in got if isinstance(g, BenchJob)]
    refused = [g for g in got if isinstance(g, Busy)]
    try:
        assert len(jobs) == 1 and len(refused) == 1 and refused[0].job is jobs[0] is slot["job"]
    finally:
        for job in jobs:
            job.cancel(grace_s=5)


def _page(db: Path, monkeypatch: pytest.MonkeyPatch, url: str = "http://127.0.0.1:9") -> AppTest:
    monkeypatch.setenv("HARE_CONSOLE_BENCH_DB", str(db))
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", url)
    return AppTest.from_function(benchmarks_page, default_timeout=30).run()


def _until_done(at: AppTest, timeout: float = 60) -> AppTest:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        at.run()
        if not any(getattr(p, "proto", None) is not None for p in at.get("progress")):
            return at
        time.sleep(0.2)
    raise AssertionError("the stand-in bench did not finish")


def _stand_in(monkeypatch: pytest.MonkeyPatch, mode: str = "ok") -> list[BenchConfig]:
    """Replace `hare bench run` by the stand-in; returns the configs the page asked for."""
    asked: list[BenchConfig] = []

    def command(self: BenchConfig, db: Path, python: str = "") -> list[str]:
        asked.append(self)
        return fake_bench_argv(db, mode)

    monkeypatch.setattr(BenchConfig, "command", command)
    return asked


def test_page_runs_a_benchmark_and_shows_percentiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _stand_in(monkeypatch)
    served = tmp_path / "bundles" / "tiny-token-classification"
    served.mkdir(parents=True)
    (served / "hare.json").write_text(json.dumps({"task": "token-classification"}))
    monkeypatch.setenv("HARE_CONSOLE_BUNDLE_DIRS", str(tmp_path / "bundles"))
    with fake_appliance("token-classification") as fake:
        at = _page(tmp_path / "bench.db", monkeypatch, fake.url)
        assert "No benchmark run yet" in at.info[0].value
        assert at.text_input(key="hare-bench-bundle").value == str(served)  # offered
        at.text_input(key="hare-bench-seq").input("16, 32")
        at.text_input(key="hare-bench-name").input("mine")
        at.number_input(key="hare-bench-duration").set_value(2.0)
        at.number_input(key="hare-bench-rounds").set_value(2)
        at.button[0].click().run()  # Start benchmark
        assert asked[0].target == fake.url and asked[0].task == "token-classification"
        assert asked[0].bundle == str(served) and asked[0].model_only
        assert asked[0].seq_lens == (16, 32) and asked[0].concurrency == (1, 4) and asked[0].name == "mine"
        assert asked[0].rounds == 2
        at = _until_done(at)
    assert not at.exception and not at.error
    assert at.success[0].value == "Run #1 done: 2 of 2 points measured"
    # The form is back as it was sent, not reset to its defaults.
    assert at.text_input(key="hare-bench-seq").value == "16, 32"
    assert at.text_input(key="hare-bench-name").value == "mine"
    assert at.number_input(key="hare-bench-duration").value == 2.0
    assert at.number_input(key="hare-bench-rounds").value == 2
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["p50"], metrics["p95"], metrics["p99"]) == ("3.00 ms", "4.50 ms", "6.00 ms")
    results = at.dataframe[1].value  # [0] is the run's live table, [1] the Results tab's
    assert list(results["p50"]) == ["3.00", "4.50"] and list(results["p99"]) == ["6.00", "9.00"]
    assert "req/s" in results and "None" not in results.to_string()
    assert at.get("download_button")
    assert at.selectbox(key="hare-bench-run").value == 1


def test_page_cancel_says_who_and_keeps_the_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(monkeypatch, "slow")
    with fake_appliance("text-classification") as fake:
        at = _page(tmp_path / "bench.db", monkeypatch, fake.url)
        at.text_input(key="hare-bench-conc").input("2")
        at.button[0].click().run()
        deadline = time.monotonic() + 30
        while "answers" not in (at.get("progress")[0].proto.text if at.get("progress") else ""):
            assert time.monotonic() < deadline, "the stand-in never ticked"
            time.sleep(0.2)
            at.run()
        text = at.get("progress")[0].proto.text
        assert text.startswith("Point 1 of 2: hare over HTTP, 16 tokens, batch 1, 1 concurrent client · 10 answers")
        next(b for b in at.button if b.label == "Cancel benchmark").click().run()
        at = _until_done(at)
    assert not at.exception
    # The point the cancel cut short (1 s of 20) is kept, marked, and not counted as measured.
    assert at.warning[0].value == (
        "Run #1 cancelled (from the console) before any point was measured in full: "
        "point 1 stopped after 1.00 of 20.0 s, kept as partial"
    )
    live, results, *_ = (d.value for d in at.dataframe)
    assert list(live["target"]) == ["hare (cancelled)"], live
    assert list(results["target"]) == ["hare (cancelled)"], results
    assert any(c.value.startswith("Point 1 (hare, 16 tokens, batch 1, 1 client) was cancelled after 1.00 of 20.0 s")
               for c in at.caption)  # fmt: skip
    assert at.text_input(key="hare-bench-conc").value == "2"
    run = Store(tmp_path / "bench.db").run(1)
    assert run.status == "cancelled" and run.message == "cancelled from the console after 0 of 2 points"


def start_then_render() -> None:
    """Tab B: its form's Start pressed once (its fragment reruns alone, the form drawn before A started)."""
    import os
    from pathlib import Path

    import streamlit as st

    from admin_ui.benchjob import BenchConfig
    from admin_ui.views import benchmarks

    if not st.session_state.get("pressed"):
        st.session_state["pressed"] = True
        benchmarks._start(BenchConfig(target="http://127.0.0.1:9"), Path(os.environ["HARE_CONSOLE_BENCH_DB"]))
    benchmarks.render()


def test_a_second_tab_is_told_a_run_is_under_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tab B's Start, drawn before tab A started a run, started a second bench beside it.
    _stand_in(monkeypatch, "slow")
    with fake_appliance("text-classification") as fake:
        a = _page(tmp_path / "bench.db", monkeypatch, fake.url)
        a.button[0].click().run()
        first = benchmarks_slot_job()
        deadline = time.monotonic() + 30
        while first.progress().run_id is None:
            assert time.monotonic() < deadline, "the stand-in never started"
            time.sleep(0.1)
        b = AppTest.from_function(start_then_render, default_timeout=30).run()
    assert benchmarks_slot_job() is first and first.running and not b.exception
    started = time.strftime("%H:%M:%S", time.localtime(first.started_at))
    assert [w.value for w in b.warning] == [
        f"Not started: run #1 (started {started} from this console, maybe in another tab) is under way; its "
        "progress is below."
    ]
    assert "Cancel benchmark" in [x.label for x in b.button]


def benchmarks_slot_job() -> BenchJob:
    from admin_ui.views import benchmarks

    job = benchmarks._slot()["job"]
    assert job is not None
    return job


def test_a_restarted_console_says_a_run_it_did_not_start_is_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A console restarted mid-run said nothing about the run its predecessor started.
    db = tmp_path / "bench.db"
    run_id = Store(db).create_run("run", task="text-classification", target="http://127.0.0.1:9")
    at = _page(db, monkeypatch)
    assert not at.exception
    assert [w.value for w in at.warning if w.value.startswith(f"Run #{run_id} is still marked running")]
    Store(db).finish_run(run_id, "done")
    assert not _page(db, monkeypatch).warning


def test_the_bench_gets_the_consoles_appliance_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The bench the console started sent no token: "does not answer GET /info ... (status 401): check the URL";
    # nor the API key: every /predict a 401.
    from admin_ui import benchjob

    _stand_in(monkeypatch)
    envs: list[dict[str, str]] = []

    def start(slot: Any, argv: list[str], env: dict[str, str]) -> BenchJob:
        envs.append(env)
        return benchjob.start_alone(slot, argv, env)

    monkeypatch.setattr("admin_ui.views.benchmarks.start_alone", start)
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCE_TOKEN", "s3cret")
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCE_API_KEY", "k3y")
    monkeypatch.delenv("HARE_BENCH_TOKEN", raising=False)
    monkeypatch.delenv("HARE_API_KEY", raising=False)
    with fake_appliance("text-classification", token="s3cret", api_key="k3y") as fake:
        at = _page(tmp_path / "bench.db", monkeypatch, fake.url)
        at.button[0].click().run()
        at = _until_done(at)
    assert not at.exception and [(e["HARE_BENCH_TOKEN"], e["HARE_API_KEY"]) for e in envs] == [("s3cret", "k3y")]


def test_page_shows_a_failed_benchmark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(monkeypatch, "fail")
    with fake_appliance("text-classification") as fake:
        at = _page(tmp_path / "bench.db", monkeypatch, fake.url)
        at.button[0].click().run()
    at = _until_done(at)
    assert "The benchmark failed: hare bench: error: cannot reach" in at.error[0].value and not at.exception


def test_a_refusal_after_a_failed_run_puts_the_failure_away(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "Cannot start: batch sizes: ..." was said above the old "The benchmark failed: ..." and its log.
    _stand_in(monkeypatch, "fail")
    with fake_appliance("text-classification") as fake:
        at = _page(tmp_path / "bench.db", monkeypatch, fake.url)
        at.button[0].click().run()
        at = _until_done(at)
        assert at.error[0].value.startswith("The benchmark failed")
        at.text_input(key="hare-bench-batches").input("0")
        next(b for b in at.button if b.label == "Start benchmark").click().run()
    assert [e.value for e in at.error] == ["Cannot start: batch sizes: 0 is outside 1..1024"]
    assert not at.get("expander") or all("Bench log" not in e.label for e in at.expander)


def test_page_says_a_store_it_cannot_open_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "The Benchmarks page failed unexpectedly: InputError: ...", above every tab, a traceback in the log.
    db = tmp_path / "bench.db"
    db.write_bytes(b"not sqlite at all" * 100)
    at = _page(db, monkeypatch)
    assert not at.exception
    assert [e.value for e in at.error if "bench store" in e.value] == [
        f"Cannot open the bench store: {db} is not a result store this user can open (file is not a database); "
        "give another --db (or HARE_BENCH_DB)"
    ]


def test_page_refuses_bad_input_before_starting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _stand_in(monkeypatch)
    at = _page(tmp_path / "bench.db", monkeypatch)
    at.text_input(key="hare-bench-seq").input("16, big")
    at.button[0].click().run()
    assert at.error[0].value == "Cannot start: sequence lengths: 'big' is not a whole number"
    at.text_input(key="hare-bench-seq").input("16")
    at.button[0].click().run()
    assert at.error[0].value.startswith("Cannot start: cannot reach http://127.0.0.1:9")
    at.multiselect(key="hare-bench-baselines").select("vanilla")
    at.button[0].click().run()
    assert "baselines load the original model" in at.error[0].value
    at.text_input(key="hare-bench-target").input(str(tmp_path / "missing"))
    at.multiselect(key="hare-bench-baselines").set_value([])
    at.button[0].click().run()
    assert "is neither a URL nor a folder" in at.error[0].value
    assert asked == [] and not at.exception


def test_out_of_range_numbers_are_refused_not_put_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 0 seconds per point or 999 rounds went back to the last value without a word, and the run went ahead.
    asked = _stand_in(monkeypatch)
    at = _page(tmp_path / "bench.db", monkeypatch)
    for key, value, said in [
        ("duration", 0.0, "seconds per point: 0 is outside 0.5..600"),
        ("duration", 100_000.0, "seconds per point: 100000 is outside 0.5..600"),
        ("warmup", -3.0, "warm-up seconds: -3 is outside 0..60"),
        ("rounds", 999, "rounds: 999 is outside 1..20"),
    ]:
        at.number_input(key=f"hare-bench-{key}").set_value(value)
        at.button[0].click().run()
        assert [e.value for e in at.error] == [f"Cannot start: {said}"]
        assert at.number_input(key=f"hare-bench-{key}").value == value  # kept as typed, to be corrected
        at.number_input(key=f"hare-bench-{key}").set_value(2)
    assert at.number_input(key="hare-bench-duration").help == "0.5 to 600 seconds"
    assert asked == [] and not at.exception


def test_a_model_folder_without_a_baseline_is_said_unused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A model folder, even a missing one, was ignored without a word when no baseline was picked.
    at = _page(tmp_path / "bench.db", monkeypatch)
    at.text_input(key="hare-bench-model").input(str(tmp_path / "missing")).run()
    assert f"The model folder {tmp_path / 'missing'} is not used: no baseline is picked." in [
        c.value for c in at.caption
    ]
    at.text_input(key="hare-bench-target").input(str(tmp_path))
    at.multiselect(key="hare-bench-baselines").select("vanilla")
    at.button[0].click().run()
    assert [e.value for e in at.error] == [
        f"Cannot start: model folder for the baselines: {tmp_path / 'missing'} is not a folder on this machine"
    ]


def test_page_history_and_comparison(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "bench.db"
    a, b = fill_store(db, baselines=True)
    at = _page(db, monkeypatch)
    assert not at.exception and not at.error
    tables = [d.value for d in at.dataframe]
    results, ratios, history, comparison = tables
    assert len(results) == 8 and set(results["target"]) == {"hare", "vanilla"}
    assert set(ratios["baseline"]) == {"vanilla"}
    assert list(history["id"]) == [f"#{b}", f"#{a}"] and list(history["message"]) == ["–", "–"]
    assert list(comparison[benchruns.MORE]) == ["1.25"] * 8
    assert not any("None" in t.to_string() for t in tables)
    assert len(at.get("download_button")) == 2
