"""The Benchmarks page's pure logic that a reader trusts without looking twice: a point a cancel cut short,
the comparison's order and marks, and which model-only point the core cap applies to."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import benchpoints, benchprogress, benchruns
from bench.store import Comparison, Store
from tests.test_console_support import benchmarks_page_or_elsewhere, fill_store, make_point


def test_a_point_cut_short_by_a_cancel_is_marked_and_not_counted() -> None:
    full = make_point(1, 1, duration_s=20.0)
    cut = make_point(1, 2, seq_len=64, duration_s=1.0, requests=20, ok=20)
    assert benchpoints.cut_short([full, cut], 20.0, cancelled=True) == cut
    assert benchpoints.cut_short([full, cut], 20.0, cancelled=False) is None  # only a cancel cuts a point short
    assert benchpoints.cut_short([full], 20.0, cancelled=True) is None  # cancelled between points
    assert benchpoints.cut_short([full, cut], None, cancelled=True) is None  # the run does not say what it asked
    # The bench measures the model alone for at most 3 s a point: 2.9 s of 20 asked is a whole point.
    model = make_point(1, 3, "model-only", load="in-process", duration_s=2.9)
    assert benchpoints.cut_short([full, model], 20.0, cancelled=True) is None
    assert benchpoints.complete([full, cut], cut) == [full]
    t = benchpoints.point_table([full, cut], cut, 20.0)
    assert [r["target"] for r in t.rows] == ["hare", "hare (cancelled)"]
    assert t.notes[0].startswith("Point 2 (hare, 64 tokens, batch 1, 1 client) was cancelled after 1.00 of 20.0 s")


def test_progress_does_not_count_the_point_a_cancel_cut_short() -> None:
    settings = {"seq_len": 8, "batch": 1, "concurrency": 1, "load": "closed", "duration_s": 20.0}
    lines = [
        {"event": "start", "run_id": 3, "n": 8},
        {"event": "point_start", "k": 1, "n": 8, "target": "hare", "settings": settings},
        {"event": "point", "k": 1, "n": 8, "point": make_point(3, 1, seq_len=8, duration_s=1.0).to_dict()},
        {"event": "done", "run_id": 3, "status": "cancelled", "message": ""},
    ]
    p = benchprogress.progress_from_lines(json.dumps(e) for e in lines)
    assert p.asked_s == 20.0 and p.measured == 0 and p.cut() is not None
    assert p.outcome() == (
        "Run #3 cancelled before any point was measured in full: point 1 stopped after 1.00 of 20.0 s, kept as partial"
    )
    whole = [*lines[:3], {"event": "point", "k": 2, "n": 8, "point": make_point(3, 2, duration_s=1.0).to_dict()}]
    whole[2] = {"event": "point", "k": 1, "n": 8, "point": make_point(3, 1, duration_s=20.0).to_dict()}
    p = benchprogress.progress_from_lines(json.dumps(e) for e in [*whole, lines[3]])
    assert p.measured == 1
    assert p.outcome().startswith("Run #3 cancelled: 1 of 8 points measured; point 2 stopped after 1.00 of 20.0 s")


def test_comparison_orders_by_number_marks_few_answers_and_says_which_way_is_better() -> None:
    def comparison(seq: int, ok: int) -> Comparison:
        a = make_point(1, seq, seq_len=seq, ok=ok, requests=ok)
        b = make_point(2, seq, seq_len=seq, ok=ok, requests=ok)
        key = {"load": "closed", "seq_len": seq, "batch": 1, "concurrency": 1, "rate": 0.0}
        return Comparison("hare", key, a, b, 1.25, 0.8)

    stored = [comparison(128, 500), comparison(32, 93), comparison(8, 500)]  # as the store sorts them: as text
    rows, numeric, notes = benchruns.comparison_table(stored)
    assert [r["seq len"] for r in rows] == ["8", "32", "128"]
    few = rows[1]
    assert few["A p99 ms"].startswith("~") and few["B p99 ms"].startswith("~") and not few["A p50 ms"].startswith("~")
    assert not rows[0]["A p99 ms"].startswith("~")
    assert notes and notes[0].startswith("~ marks a percentile from fewer answers than it needs")
    assert rows[0][benchruns.FASTER] == "0.80" and benchruns.FASTER == "B/A p50 (below 1: B faster)"
    assert rows[0][benchruns.MORE] == "1.25" and benchruns.FASTER in numeric
    stopped = stored[1].b
    rows, _, notes = benchruns.comparison_table(stored, [None, stopped])
    assert [r["target"] for r in rows] == ["hare", "hare (B cancelled)", "hare"]
    assert notes[0].startswith("(A cancelled), (B cancelled): that run's point was stopped by a cancel")
    csv_rows = benchruns.comparison_rows(stored)
    assert [r["seq len"] for r in csv_rows] == [8, 32, 128] and isinstance(csv_rows[1]["A p99 ms"], float)


def test_only_the_point_held_to_the_core_count_says_so() -> None:
    plan = benchprogress.Plan(http_points=4, max_concurrency=4, cores=2)

    def line(streams: int, p: benchprogress.Plan = plan) -> str:
        settings = {"seq_len": 8, "batch": 1, "concurrency": streams, "load": "in-process"}
        return benchprogress.point_setting("model-only", settings, p)

    assert line(1) == "the model alone, in process (no HTTP), 8 tokens, batch 1, 1 stream"
    assert line(2).endswith("2 streams (at most one per core; 4 clients asked)")
    assert line(4, benchprogress.Plan(4, 4, cores=8)).endswith("4 streams")  # enough cores: nothing held back
    one_core = benchprogress.Plan(4, 4, cores=1)
    assert line(1, one_core).endswith("1 stream (at most one per core; 4 clients asked)")


def test_an_unsent_form_edit_survives_runs_that_do_not_draw_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Streamlit drops a widget's value once a run has not drawn it (another page, or a benchmark running);
    the form's widgets keep theirs. The browser test walks through the pages and a cancel for real."""
    monkeypatch.setenv("HARE_CONSOLE_BENCH_DB", str(tmp_path / "bench.db"))
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", "http://127.0.0.1:9")
    at = AppTest.from_function(benchmarks_page_or_elsewhere, default_timeout=30).run()
    at.text_input(key="hare-bench-seq").input("8, 512").run()  # typed, not started
    at.number_input(key="hare-bench-duration").set_value(7.0).run()
    at.session_state["elsewhere"] = True
    at.run()
    assert not at.text_input and not at.exception
    at.session_state["elsewhere"] = False
    at.run()
    assert at.text_input(key="hare-bench-seq").value == "8, 512"
    assert at.number_input(key="hare-bench-duration").value == 7.0 and not at.exception


def test_history_comparison_and_baseline_rows(tmp_path: Path) -> None:
    db = tmp_path / "bench.db"
    a, b = fill_store(db, baselines=True)
    store = Store(db)
    history = benchruns.run_rows(store.runs())
    assert [r["id"] for r in history] == [f"#{b}", f"#{a}"] and history[0]["status"] == "done"
    assert re.fullmatch(rf"#{a} x1\.0 · done · \d{{4}}-\d\d-\d\d \d\d:\d\d", benchruns.run_label(store.run(a)))
    rows = benchruns.comparison_rows(store.compare(a, b))
    assert len(rows) == 8 and all(r[benchruns.MORE] == 1.25 for r in rows)
    ratios = benchpoints.ratio_rows(store.ratios(b))
    assert len(ratios) == 4 and all(r["throughput ×"] > 1 and r["p50 speed-up ×"] > 1 for r in ratios)
