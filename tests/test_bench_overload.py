"""`hare bench overload` end to end on a tiny bundle, briefly: every phase is stored as a point of one run,
and every goal is printed with its figure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from bench.overload import OverloadOptions, evaluate, run_overload, stored_goals
from bench.servers import group_pss_mb, group_rss_mb
from bench.store import Store
from bench.tables import POINT_COLUMNS, point_row
from container.machine import physical_cores
from tests.conftest import ModelFactory


def test_every_phase_is_stored_and_every_goal_printed(
    tiny_bundle: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(tmp_path / "bench.db")
    options = OverloadOptions(tiny_bundle("feature-extraction"), seq_len=16, flood=20, duration_s=1.0, tail_seqs=(8,))
    watched: list[tuple[str, bool]] = []  # each moment told to a watcher, and whether its server group was alive
    watch = lambda pgid, name: watched.append((name, bool(group_rss_mb(pgid))))  # noqa: E731
    run_id = run_overload(options, store, threading.Event(), watch)
    scenarios = [p.extra["scenario"] for p in store.points(run_id)]
    cores = physical_cores()
    tail = [f"tail-8t-{cores}u", "tail-8t-16u"]
    assert scenarios == ["one-user", *tail, "capacity", "open-3x", "flood", "recovery"]
    assert watched == [(name, True) for name in ["warm", *scenarios]]  # scripts/overload-memory.py reads these
    printed = capsys.readouterr().out
    goals = ("model-only p50", "p99 from the intended send time", "open-3x: goodput", "never answered", "Retry-After")
    for goal in (*goals, "5xx", "flood goodput", "RSS after", f"{tail[0]} (8 tokens, {cores} users): p99 / p50"):
        assert goal in printed, goal
    points = {p.extra["scenario"]: p for p in store.points(run_id)}
    # The server's CPU over each phase's window, from its processes' clocks: every phase had it answer (or
    # refuse) requests, so none is zero (a probe that read nothing, or the same process twice, would be).
    seen = "; ".join(f"{k}: {p.server_cpu} cores, {p.requests} answers, {p.duration_s} s" for k, p in points.items())
    assert all(p.server_cpu is not None and p.server_cpu > 0 for p in points.values()), seen
    # ... and the stored rows show it, with the CPU per answer (`hare bench show`, the results page).
    rows = {k: dict(zip(POINT_COLUMNS, point_row(p), strict=True)) for k, p in points.items()}
    assert all(row["server cpu"] != "-" and row["server ms/req"] != "-" for row in rows.values()), rows
    assert "µs CPU each" in printed and "unanswered" in printed
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
    lines = evaluate({}, one_p50=16.5, model_p50=25.0, capacity=75.0, rss=rss, file_mb=100.0)
    assert "met   largest process RSS after warm - model file: 80 MB (goal ≤ 200 MB)" in lines
    assert "MISS  largest process RSS after flood - model file: 1234 MB (goal ≤ 200 MB)" in lines
    assert "MISS  largest process RSS after the soak - model file: 250 MB (goal ≤ 200 MB)" in lines
    assert "MISS  RSS growth over the soak: 0.167 (goal ≤ 0.05)" in lines
    assert "met   one user p50 / one-thread model-only p50: 0.66 (goal ≤ 0.7)" in lines
