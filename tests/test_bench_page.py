"""`hare bench report` without a run: the dated results page, rendered from a real store filled through the
store's own API (the clock set, so that the dates are known), read back through the command line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.peers.results import Row, goal
from bench.store import Store
from bench.tables import point_row, ratio_row
from hare.cli import main as hare
from tests.test_bench_store import point

MACHINE = {"cpu": "Test CPU 9000", "physical_cores": 2, "logical_cores": 4, "flags": ["avx2", "avx512_vnni"],
           "int8_path": "avx512-vnni", "platform": "Linux-test"}  # fmt: skip
# When each run starts and ends (the store keeps local time with its offset; the page says UTC).
CLOCK = [
    *("2026-11-20T10:00:00+0100", "2026-11-20T10:05:00+0100"),  # run 1: a grid run (09:00 UTC)
    *("2026-11-21T08:00:00+0000", "2026-11-21T08:02:00+0000"),  # run 2: overload
    *("2026-11-22T08:00:00+0000", "2026-11-22T08:00:30+0000"),  # run 3: a grid run that failed
    *("2026-11-24T12:30:00+0000", "2026-11-24T12:35:00+0000"),  # run 4: a grid run, the newest of its kind
    *("2026-11-25T08:00:00+0000", "2026-11-25T08:10:00+0000"),  # run 5: peers
    *("2026-11-26T08:00:00+0000", "2026-11-26T08:04:00+0000"),  # run 6: headline
]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    clock: Iterator[str] = iter(CLOCK)
    monkeypatch.setattr("bench.store._now", lambda: next(clock))
    store = Store(tmp_path / "bench.db")
    versions = {"onnxruntime": "1.32.0", "hare": "0.1.0"}

    def run(kind: str, **kw: Any) -> int:
        return store.create_run(
            kind, task="feature-extraction", target="bundles/x", machine=MACHINE, versions=versions, **kw
        )

    old = run("run", name="before", settings={"grid": {"seq_lens": [8, 128]}, "baselines": ["vanilla"]})
    store.add_point(point(old, 1, "hare", 8, 111.1, 5.0))
    store.finish_run(old, "done")

    over = run("overload", settings={"seq_len": "16"})
    phases = [("one-user", 1, 40.0, 10.0), ("capacity", 4, 100.0, 40.0), ("flood", 1000, 30.0, 900.0),
              ("recovery", 4, 95.0, 41.0)]  # fmt: skip
    for i, (name, users, req_s, p50) in enumerate(phases, 1):
        p = replace(point(over, i, "hare", 16, req_s, p50), concurrency=users, errors={}, extra={"scenario": name})
        store.add_point(p)
    memory = {"rss_mb": {"warm": 150.0}, "pss_mb": {"warm": 240.4}, "file_mb": 100.0}
    store.update_run(over, summary={"model_p50_ms": 20.0, **memory})
    store.finish_run(over, "done")

    failed = run("run", name="broken")
    store.finish_run(failed, "failed", "the server never became ready")

    new = run("run", name="after")
    store.add_point(point(new, 1, "hare", 8, 222.2, 4.0))
    store.add_point(point(new, 2, "vanilla", 8, 44.4, 20.0, workers=1))
    store.finish_run(new, "done")

    peers = run("peers", settings={"threads": [1], "batch": 4, "seq_len": 16})
    rows = [Row("hare", "hare's bundle", p50_ms={1: 3.0}, sentences_s={1: 500.0}, cosine_p1=0.9999),
            Row("torch", "torch reference", p50_ms={1: 9.0}, sentences_s={1: 150.0}, cosine_p1=1.0)]  # fmt: skip
    store.update_run(peers, summary={"peers": [r.to_dict() for r in rows], "goal": goal(rows, [1])})
    store.finish_run(peers, "done")

    head = run("headline")
    store.add_point(point(head, 1, "hare", 128, 33.3, 55.0))
    goals = [{"goal": "throughput at seq 128", "value": 33.3, "target": "≥ 35 req/s", "met": False, "gap": "-5%"}]
    store.update_run(head, summary={"goals": goals, "runs": [head]})
    store.finish_run(head, "done")
    return store


def md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def page(store: Store, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert hare(["bench", "report", "--db", str(store.path), *args]) == 0
    return capsys.readouterr().out


def test_the_page_names_every_run_its_machine_and_figures_newest_first(
    store: Store, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = page(store, capsys=capsys)
    # Sections by kind, in the page's order; runs newest first within each.
    order = ["## headline:", "### Run 6, 2026-11-26 08:00 UTC", "## run:", "### Run 4, 2026-11-24 12:30 UTC: after",
             "### Run 1, 2026-11-20 09:00 UTC: before", "## overload:", "### Run 2, 2026-11-21 08:00 UTC",
             "## peers:", "### Run 5, 2026-11-25 08:00 UTC"]  # fmt: skip
    positions = [text.index(heading) for heading in order]
    assert positions == sorted(positions)
    assert "broken" not in text and "Run 3" not in text  # failed runs only with --all
    assert "5 done runs, 2026-11-20 to 2026-11-26" in text

    machine = "Test CPU 9000, 2 physical / 4 logical cores, int8 path avx512-vnni, flags avx2 avx512_vnni"
    assert text.count(machine) == 5 and "onnxruntime 1.32.0" in text
    assert "`grid.seq_lens=[8, 128]`" in text and '`baselines=["vanilla"]`' in text
    # The figures, in the rows bench/tables.py makes for the terminal.
    for run_id in (1, 4, 6):
        for p in store.points(run_id):
            assert md_row(point_row(p)) in text
    (ratio,) = store.ratios(4)
    assert md_row(ratio_row(ratio)) in text
    assert "| throughput at seq 128 | 33.3 | ≥ 35 req/s | NO | -5% |" in text  # the headline's goal
    # Overload: the phases by name, and the goals judged again, met or MISS.
    over = store.points(2)
    assert md_row(["flood", *point_row(over[2])]) in text
    assert "- met   one user p50 / one-thread model-only p50: 0.5 (goal ≤ 0.7)" in text
    assert "- MISS  flood goodput / capacity: 0.3 (goal ≥ 0.8)" in text
    assert "- met   largest process RSS after warm - model file: 50 MB (goal ≤ 200 MB)" in text
    assert "- the whole server, every process's PSS (MB, shared pages counted once): warm 240" in text
    # Peers: the candidates' table from the run's summary, and its goal.
    assert "**hare against its peers: 16-token texts, in process (hare-http: over loopback)**" in text
    assert (
        "| hare's bundle | 3.0 | 500.0 | 0.9999 |" in text
        and "| batch 1 p50 ms | 1 | 3.0 | torch | 9.0 | yes |" in text
    )

    # The same store renders the same page, to a file as to stdout.
    out = tmp_path / "docs" / "results.md"
    assert hare(["bench", "report", "--db", str(store.path), "--out", str(out)]) == 0
    assert out.read_text() == text == page(store, capsys=capsys)
    # A place no file can go: said in one line, with what the machine said, not a trace.
    (tmp_path / "a-file").write_text("")
    assert hare(["bench", "report", "--db", str(store.path), "--out", str(tmp_path / "a-file" / "r.md")]) == 1
    said = capsys.readouterr().err.strip()
    assert said.startswith("hare bench: error: [Errno") and "a-file" in said and len(said.splitlines()) == 1


def test_kind_since_and_all_choose_the_runs(store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    runs = page(store, "--kind", "run", capsys=capsys)
    assert "### Run 4" in runs and "### Run 1" in runs
    assert "## overload" not in runs and "## peers" not in runs and "### Run 6" not in runs
    assert "2 done runs of kind run, 2026-11-20 to 2026-11-24" in runs

    recent = page(store, "--kind", "run", "--since", "2026-11-21", capsys=capsys)
    assert "### Run 4" in recent and "### Run 1" not in recent

    every = page(store, "--kind", "run", "--all", capsys=capsys)
    assert "### Run 3, 2026-11-22 08:00 UTC: broken" in every
    assert "failed, 08:00:00 UTC to 08:00:30 UTC (the server never became ready)" in every

    assert "No runs match." in page(store, "--kind", "nothing", capsys=capsys)
    assert hare(["bench", "report", "1", "--kind", "run", "--db", str(store.path)]) == 2  # a run's report: no filters
    assert hare(["bench", "report", "--format", "html", "--db", str(store.path)]) == 2  # the page is Markdown


def test_an_overload_run_stored_before_its_summary_keeps_the_goals_its_points_hold(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    store.update_run(2, summary={})
    text = page(store, "--kind", "overload", capsys=capsys)
    assert "MISS  flood goodput / capacity" in text
    assert "one user p50" not in text and "largest process RSS" not in text
    assert "stored before overload runs kept the one-thread model figure" in text
