"""`hare bench overload` end to end on a tiny bundle, briefly: every phase is stored as a point of one run,
and every goal is printed with its figure (with rounds, on the median of its rounds)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from bench.overload import OverloadOptions, evaluate, run_overload, stored_goals
from bench.servers import group_pss_mb, group_rss_mb
from bench.store import Point, Store
from bench.tables import POINT_COLUMNS, point_row, points_table
from container.machine import physical_cores
from hare.cli import main as hare
from tests.conftest import ModelFactory


def test_every_phase_is_stored_and_every_goal_printed(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "bench.db")
    bundle = tiny_bundle("feature-extraction")
    options = OverloadOptions(bundle, seq_len=16, flood=20, duration_s=1.0, tail_seqs=(8,), rounds=2)
    watched: list[tuple[str, bool]] = []  # each moment told to a watcher, and whether its server group was alive
    watch = lambda pgid, name: watched.append((name, bool(group_rss_mb(pgid))))  # noqa: E731
    run_id = run_overload(options, store, threading.Event(), watch)
    scenarios = [p.extra["scenario"] for p in store.points(run_id)]
    cores = physical_cores()
    tail = [f"tail-8t-{cores}u", "tail-8t-16u"]
    past = ["capacity", "open-3x", "flood", "recovery"]
    assert scenarios == ["one-user", *tail, *past, *(f"{name}#2" for name in past)]
    assert watched == [(name, True) for name in ["warm", *scenarios]]  # scripts/overload-memory.py reads these
    printed = capsys.readouterr().out
    goals = ("model-only p50", "p99 from the intended send time", "open-3x: goodput", "never answered", "Retry-After")
    later = ("5xx", "flood goodput", "1 s after the flood", "RSS after")  # the recovery at --duration 1, not 10
    for goal in (*goals, *later, f"{tail[0]} (8 tokens, {cores} users): p99 / p50"):
        assert goal in printed, goal
    assert "open-3x: goodput / capacity: " in printed and "(median of 2 rounds, " in printed
    assert "open-3x#2" not in "".join(line for line in printed.splitlines() if line.startswith(("met ", "MISS")))
    points = {p.extra["scenario"]: p for p in store.points(run_id)}
    # The server's CPU over each phase's window, from its processes' clocks: every phase had it answer (or
    # refuse) requests, so none is zero (a probe that read nothing, or the same process twice, would be).
    seen = "; ".join(f"{k}: {p.server_cpu} cores, {p.requests} answers, {p.duration_s} s" for k, p in points.items())
    assert all(p.server_cpu is not None and p.server_cpu > 0 for p in points.values()), seen
    # ... and the stored rows show it, with the CPU per answer (`hare bench show`, the results page).
    rows = {k: dict(zip(POINT_COLUMNS, point_row(p), strict=True)) for k, p in points.items()}
    assert all(row["server cpu"] != "-" and row["server ms/req"] != "-" for row in rows.values()), rows
    shown = Console(width=100, record=True, file=io.StringIO())
    shown.print(points_table(store.points(run_id)))
    text = shown.export_text()
    assert all(name in text for name in points), text  # each phase's name whole
    # A phase's refusals with their CPU cost each; a phase that refused none gives no cost (it printed "nan").
    phases = [line for line in printed.splitlines() if " refused " in line and "unanswered" in line]
    assert phases and all(("µs CPU each" in line) != (" refused 0 " in line) for line in phases), phases
    # The whole server's memory beside the largest process's: every process's PSS summed, stored with the run.
    pss = store.run(run_id).summary["pss_mb"]
    assert set(pss) == {"warm", "flood"} and all(v > 0 for v in pss.values()), pss
    assert "every process's PSS" in printed
    # The results page judges the stored run again (bench/page.py): the same lines, every goal included.
    stored = stored_goals(store.run(run_id), store.points(run_id))
    assert len(stored) == len([line for line in printed.splitlines() if line.startswith(("met ", "MISS"))])
    assert all(line in printed for line in stored)


def test_a_process_groups_pss_counts_its_shared_pages_once() -> None:
    """Two processes that share a big mapping each show it whole in their RSS; their PSS sums to it once."""
    size = 64 * 2**20
    script = (
        "import mmap, os, time\n"
        f"m = mmap.mmap(-1, {size}, flags=mmap.MAP_SHARED)\n"
        f"m.write(b'x' * {size})\n"
        "os.fork()\n"
        f"s = sum(m[i] for i in range(0, {size}, 4096))\n"  # the child touches every page too
        "os.write(1, b'ready\\n')\n"  # each process once it has: one write, whole in the pipe
        "time.sleep(30)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert [proc.stdout.readline() for _ in range(2)] == ["ready\n"] * 2
            rss, pss = group_rss_mb(proc.pid), group_pss_mb(proc.pid)
            assert len(rss) == 2 and set(pss) == set(rss), (rss, pss)
            assert all(v > 64 for v in rss.values()), rss  # each holds the whole mapping
            assert 64 < sum(pss.values()) < 64 + min(rss.values()), (rss, pss)  # the mapping once, not twice
        finally:
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_soak_is_held_to_the_memory_goal_and_figures_read_without_exponents() -> None:
    # The memory goal holds after 30 minutes of soak too, not only after warm-up and the flood.
    rss = {"warm": 180.0, "flood": 1334.0, "soak_start": 300.0, "soak_end": 350.0}
    lines = evaluate({}, one_p50=16.5, model_p50=25.0, rss=rss, file_mb=100.0)
    assert "met   largest process RSS after warm - model file: 80 MB (goal ≤ 200 MB)" in lines
    assert "MISS  largest process RSS after flood - model file: 1234 MB (goal ≤ 200 MB)" in lines
    assert "MISS  largest process RSS after the soak - model file: 250 MB (goal ≤ 200 MB)" in lines
    assert "MISS  RSS growth over the soak: 0.167 (goal ≤ 0.05)" in lines
    assert "met   one user p50 / one-thread model-only p50: 0.66 (goal ≤ 0.7)" in lines


def phase(
    name: str, req_s: float, errors: dict[str, int] | None = None, retry_after: int = 0, seconds: float = 10.0
) -> Point:
    n = int(req_s * seconds)
    return Point(
        run_id=1, idx=0, target="hare", load="closed", workers=2, threads=1, seq_len=128, batch=1, concurrency=4,
        rate=0.0, duration_s=seconds, requests=n, ok=n, errors=errors or {}, req_s=req_s,
        seq_s=req_s, tokens_s=req_s * 128, lat_min=10.0, lat_avg=30.0, lat_p50=30.0, lat_p90=40.0, lat_p95=45.0,
        lat_p99=50.0, lat_max=60.0, server={}, client_cpu=0.1, server_cpu=1.9,
        extra={"scenario": name, "retry_after": retry_after},
    )  # fmt: skip


def test_each_round_is_judged_against_its_own_capacity_and_a_goal_on_their_median() -> None:
    """Three rounds whose goodput moved with the host (0.7, 0.85, 0.9 of their own capacities): the goal is met
    on the median, with the range beside it; a 5xx in any round is a miss, counted over all of them."""
    points: dict[str, Point] = {}
    for r, (capacity, served, flood) in enumerate([(100.0, 70.0, 90.0), (120.0, 102.0, 60.0), (80.0, 72.0, 64.0)], 1):
        tag = "" if r == 1 else f"#{r}"
        errors = {"429": 50, "503": 1} if r == 3 else {"429": 50}
        points |= {
            f"capacity{tag}": phase(f"capacity{tag}", capacity),
            f"open-3x{tag}": phase(f"open-3x{tag}", served, errors, retry_after=50),
            f"flood{tag}": phase(f"flood{tag}", flood),
        }
    lines = evaluate(points, one_p50=16.5, model_p50=None, rss={}, file_mb=None, cores=2)
    assert "met   open-3x: goodput / capacity: 0.85 (median of 3 rounds, 0.7-0.9) (goal ≥ 0.8)" in lines
    assert "met   flood goodput / capacity: 0.8 (median of 3 rounds, 0.5-0.9) (goal ≥ 0.8)" in lines
    assert "MISS  open-3x: 5xx answers: 1 (goal ≤ 0)" in lines
    assert "met   open-3x: refusals without Retry-After: 0 (goal ≤ 0)" in lines
    assert not any("#" in line for line in lines)  # one line a goal, whatever the rounds


def test_the_recovery_goal_names_the_seconds_its_phase_recorded() -> None:
    # `--duration 2` printed "10 s after the flood": the goal named the default, not what was measured.
    points = {"capacity": phase("capacity", 100.0, seconds=2.0), "recovery": phase("recovery", 95.0, seconds=2.0)}
    lines = evaluate(points, one_p50=16.5, model_p50=None, rss={}, file_mb=None, cores=2)
    assert "met   2 s after the flood / capacity: 0.95 (goal ≥ 0.9)" in lines
    assert not any("10 s" in line for line in lines), lines


def test_no_rounds_is_refused_before_a_server_starts(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "b.db"
    assert hare(["bench", "overload", str(tiny_bundle("feature-extraction")), "--rounds", "0", "--db", str(db)]) == 2
    assert "--rounds: at least 1 (got 0)" in capsys.readouterr().err
    assert not db.exists() or Store(db).runs() == []


def test_a_run_that_cannot_start_its_server_is_stored_failed_and_a_length_over_the_bundle_refused(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A server that did not start left the run "running" for ever; --seq past max_length was measured at the
    # server's cut and named at --seq.
    db, bundle = tmp_path / "b.db", str(tiny_bundle("feature-extraction"))
    bogus = ["--serve-arg=--bogus", "--seq", "16", "--no-tail", "--duration", "1"]
    assert hare(["bench", "overload", bundle, *bogus, "--db", str(db)]) == 1
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    [run] = Store(db).runs()
    assert run.status == "failed" and run.message, run
    assert hare(["bench", "overload", bundle, "--seq", "100000", "--db", str(db)]) == 2
    assert "--seq 100000 exceeds the bundle's max_length" in capsys.readouterr().err
    assert len(Store(db).runs()) == 1


def test_a_cancelled_run_is_stored_so_and_judges_no_goal(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "bench.db")
    options = OverloadOptions(tiny_bundle("feature-extraction"), seq_len=16, flood=20, duration_s=30.0, tail_seqs=())
    stop = threading.Event()
    watch = lambda pgid, name: threading.Timer(1.0, stop.set).start() if name == "warm" else None  # noqa: E731
    run_id = run_overload(options, store, stop, watch)
    assert store.run(run_id).status == "cancelled"
    printed = capsys.readouterr().out
    assert "cancelled: the goals are not judged" in printed
    assert not [line for line in printed.splitlines() if line.startswith(("met ", "MISS"))]  # "MISS ... 0" came
