"""Benchmarks: start `hare bench run` in the background, follow it, and read the results from the bench store.

One bench at a time for the whole console (a second would share the cores and skew both), kept in a
process-wide slot so a page reload finds the running job again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import streamlit as st

from admin_ui import benchbulk, benchpoints, benchruns, charts, state
from admin_ui.benchjob import BenchConfig, BenchJob, Busy, bench_env, new_slot, start_alone
from admin_ui.benchprogress import Plan, Progress, live_point_rows
from admin_ui.percentiles import needed_answers, resolved
from admin_ui.tables import figure
from admin_ui.views import benchform, common
from bench.store import Store
from tasks.errors import InputError

FOLLOWED = "hare.bench.followed"  # the run id the Results tab shows
REFUSED = "hare.bench.refused"  # why this session's Start did not start a run (another was under way)


@st.cache_resource
def _slot() -> dict[str, Any]:
    """The console's one bench job (`benchjob.new_slot`), shared by every session."""
    return new_slot()


def render() -> None:
    common.title_and_appliance("Benchmarks")
    db = state.bench_db()
    st.caption(f"Results are kept in the bench store {db}")
    run_tab, results_tab, history_tab = st.tabs(["Run", "Results", "History and comparison"])
    with run_tab, state.guard("The benchmark run panel"):
        _run_panel(db)
    store = _store(db)
    if store is None:
        return
    with results_tab, state.guard("The results panel"):
        _results_panel(store)
    with history_tab, state.guard("The history panel"):
        _history_panel(store)


def _store(db: Path) -> Store | None:
    try:
        return Store(db)
    except InputError as exc:  # not SQLite, a folder, a place this user cannot write
        st.error(f"Cannot open the bench store: {exc.message}")
        return None
    except (OSError, sqlite3.Error) as exc:
        st.error(f"Cannot open the bench store {db}: {exc}")
        return None


# -- starting and following a run ---------------------------------------------------------------------------


def _run_panel(db: Path) -> None:
    slot = _slot()
    job: BenchJob | None = slot["job"]
    refused = st.session_state.pop(REFUSED, None)
    if refused:
        st.warning(refused)
    if job is not None and job.running:
        st.info("A benchmark is running; its progress is below. Start another once it ends or after cancelling it.")
    else:
        if job is None:
            _unfollowed(db)
        benchform.form(db, slot, _start)
    if job is not None and (job.running or st.session_state.get(benchform.DISMISSED) != job.pid):
        _follow(job, slot.get("plan"), db)


def _unfollowed(db: Path) -> None:
    """A run the store calls running that this console did not start: a console stopped or restarted mid-run
    left it going (the bench outlives it), or `hare bench run` was started elsewhere. Said, not followed."""
    with contextlib.suppress(InputError, OSError, sqlite3.Error):
        running = [r for r in Store(db).runs(limit=20) if r.status == "running"]
        for run in running[:1]:
            st.warning(
                f"Run #{run.id} is still marked running in the bench store, and this console is not following it: "
                "the console that started it stopped or restarted (the bench goes on without it), or it was started "
                "elsewhere. Its points appear under Results as they are measured; a bench that was killed stays "
                "marked running. Starting another now would share the cores with it."
            )


def _start(config: BenchConfig, db: Path) -> None:
    slot = _slot()
    s = state.settings()
    try:
        start_alone(slot, config.command(db), env=bench_env(os.environ, s.appliance_token, s.appliance_api_key))
    except Busy as busy:  # this tab's form was drawn before another tab started one
        st.session_state[REFUSED] = f"Not started: {_which(busy.job)} is under way; its progress is below."
        st.rerun()
    except OSError as exc:
        st.error(f"Could not start `hare bench run`: {exc}")
        return
    slot["plan"], slot["noted"] = config.plan(), None
    st.session_state.pop(FOLLOWED, None)
    st.rerun()


def _which(job: BenchJob) -> str:
    """ "run #12 (started 14:02:11 from this console)", as another tab's user needs to recognize it."""
    run_id = job.progress().run_id
    started = time.strftime("%H:%M:%S", time.localtime(job.started_at))
    what = f"run #{run_id}" if run_id is not None else "a benchmark"
    return f"{what} (started {started} from this console, maybe in another tab)"


def _follow(job: BenchJob, plan: Plan | None, db: Path) -> None:
    @st.fragment(run_every=1.0 if job.running else None)
    def progress_panel() -> None:
        with state.guard("Following the benchmark"):
            _progress(job, plan, db)

    progress_panel()


def _cancelled_here(job: BenchJob, progress: Progress, db: Path) -> None:
    """A run cancelled with the Cancel button says so (the bench itself only knows it got a signal), on the
    page and in the bench store's history, once."""
    if not (job.cancelled and progress.status == "cancelled"):
        return
    progress.message = "from the console"
    slot = _slot()
    if progress.run_id is not None and slot.get("noted") != progress.run_id:
        slot["noted"] = progress.run_id
        done = f"after {progress.measured} of {progress.planned} points" if progress.planned else ""
        with contextlib.suppress(OSError, sqlite3.Error):
            Store(db).update_run(progress.run_id, message=" ".join(["cancelled from the console", done]).strip())


def _progress(job: BenchJob, plan: Plan | None, db: Path) -> None:
    progress = job.progress()
    _cancelled_here(job, progress, db)
    if progress.status is None:
        st.progress(progress.fraction, text=progress.describe(plan))
        note = progress.plan_note(plan)
        if note:
            st.caption(note)
        # Keyed by the process: a Cancel drawn for one run cannot stop another started since from another tab.
        if st.button("Cancel benchmark", type="secondary", key=f"hare-bench-cancel-{job.pid}"):
            job.cancel()
            st.rerun()
    elif progress.status == "done":
        st.success(progress.outcome())
    elif progress.status == "cancelled":
        st.warning(progress.outcome())
    else:
        st.error(f"The benchmark failed: {progress.message or 'see the log below'}")
    points = live_point_rows(progress)
    if points:
        _point_table(points, progress.cut(), progress.asked_s)
    if progress.log or progress.status == "failed":
        with st.expander("Bench log", expanded=progress.status == "failed"):
            st.code("\n".join([*progress.log, job.stderr_tail()]).strip() or "(empty)", language=None)
    # A bench that failed before it made a run (a bundle that is not there) has no run id, and is redrawn too:
    # else the page kept saying a benchmark was running, with neither the form nor a Cancel button.
    seen = progress.run_id if progress.run_id is not None else f"job {id(job)}"
    finished = progress.status is not None and not job.running
    if finished and st.session_state.get("hare.bench.seen") != seen:
        st.session_state["hare.bench.seen"] = seen
        if progress.run_id is not None:
            st.session_state[FOLLOWED] = progress.run_id
            st.session_state["hare-bench-run"] = progress.run_id  # the Results tab opens on the finished run
        st.rerun()  # redraw the whole page: the form, and Results and History with the finished run


def _point_table(points: list[Any], cut: Any = None, asked_s: float | None = None) -> None:
    """The points as a table: latency in ms, shared settings said once, marks and what they mean below."""
    t = benchpoints.point_table(points, cut, asked_s)
    shared = t.shared_text()
    st.caption("Latency in ms." + (f" Every point: {shared}." if shared else ""))
    common.table(t.rows, t.numeric)
    for note in t.notes:
        st.caption(note)


# -- reading the store ---------------------------------------------------------------------------------------


def _results_panel(store: Store) -> None:
    runs = store.runs(limit=200)
    if not runs:
        st.info("No benchmark run yet: start one on the Run tab.")
        return
    by_id = {r.id: r for r in runs}
    followed = st.session_state.get(FOLLOWED)
    ids = list(by_id)
    index = ids.index(followed) if followed in by_id else 0
    run_id = st.selectbox(
        "Run", ids, index=index, format_func=lambda i: benchruns.run_label(by_id[i]), key="hare-bench-run"
    )
    run = by_id[run_id]
    if run.status in ("failed", "cancelled") and run.message:
        st.warning(benchruns.run_outcome(run))
    if run.kind == "bulk":  # no points: a bulk run's figures are its summary's
        _bulk(run)
        return
    points = store.points(run.id)
    if not points:
        st.info("This run has no measured point.")
        return
    asked = benchpoints.asked_seconds(run)
    cut = benchpoints.cut_short(points, asked, run.status == "cancelled")
    full = benchpoints.complete(points, cut)
    _headline(full)
    st.markdown("**Latency and throughput per point**")
    _point_table(points, cut, asked)
    st.download_button(
        "Download CSV",
        benchpoints.to_csv(benchpoints.point_rows(points)),
        file_name=f"hare-bench-{run.id}.csv",
        mime="text/csv",
        key="hare-csv",
    )
    errors = benchpoints.error_summary(points)
    if errors:
        st.warning("Failed requests: " + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
    if full:
        _charts(full)
    ratios = benchpoints.ratio_rows(store.ratios(run.id))
    if ratios:
        st.markdown("**hare against its baselines (same run, same settings; above 1 means hare is ahead)**")
        common.rows_table(ratios)
        st.altair_chart(charts.target_bars(benchpoints.throughput_rows(full)), width="stretch")
    with st.expander("Machine, versions and settings of this run"):
        st.json({"machine": run.machine, "versions": run.versions, "settings": run.settings}, expanded=False)


def _bulk(run: Any) -> None:
    """A `hare bench bulk` run: its candidates and goals as tables, its corpus, memory and load below."""
    view = benchbulk.bulk_view(run)
    if not view.candidates:
        st.info("This bulk run measured nothing.")
        return
    st.markdown("**hare run against the model alone and its peers: the same texts through each**")
    common.table(view.candidates, view.numeric, key="hare-bulk", widths={"candidate": 240})
    if view.goals:
        st.markdown("**Goals (issue 49)**")
        common.table(view.goals, view.numeric, key="hare-bulk-goals", widths={"goal": 380})
    for note in view.notes:
        st.caption(note)
    with st.expander("Machine, versions and settings of this run"):
        st.json({"machine": run.machine, "versions": run.versions, "settings": run.settings}, expanded=False)


def _headline(points: list[Any]) -> None:
    h = benchpoints.headline(points)
    if h is None:
        return
    p = h.point
    with st.container(horizontal=True, gap="large"):  # wraps at 800 pixels rather than cutting a figure
        for q in ("p50", "p95", "p99"):
            few = not resolved(q, p.ok)
            st.metric(
                q,
                h.latency(q),
                help=f"{p.ok:,} answers: {q} needs {needed_answers(q)}, so this is about the slowest one"
                if few
                else None,
                width="content",
            )
        st.metric("peak throughput", f"{figure(h.peak_req_s)} req/s", width="content")
    st.caption(
        f"Latency of hare at {p.seq_len} tokens, batch {p.batch}, {p.concurrency} concurrent client(s), from "
        f"{p.ok:,} answers; peak throughput at {h.peak_at.seq_len} tokens and {h.peak_at.concurrency} client(s). "
        "Every point below."
    )


def _pick(label: str, options: list[Any], key: str) -> Any:
    """A chart filter shown only when there is a choice; the first value otherwise."""
    if len(options) <= 1:
        return options[0] if options else None
    return st.segmented_control(label, options, default=options[0], key=key) or options[0]


def _charts(points: list[Any]) -> None:
    batch = _pick("Batch size", benchpoints.values(points, "batch"), "hare-chart-batch")
    shown = [p for p in points if p.batch == batch or p.load == "in-process"]
    left, right = st.columns(2)
    with left:
        st.markdown("**Latency percentiles against sequence length**")
        concurrency = _pick("Concurrency", benchpoints.values(shown, "concurrency"), "hare-chart-conc")
        latency = benchpoints.latency_rows(p for p in shown if p.concurrency == concurrency)
        if latency:
            st.altair_chart(charts.latency_lines(latency), width="stretch")
            if any(not resolved(r["percentile"], r["answers"]) for r in latency):
                st.caption("Some of these percentiles come from too few answers (marked ~ in the table).")
    with right:
        st.markdown("**Throughput against concurrency**")
        throughput = benchpoints.throughput_rows(shown)
        if throughput:
            st.altair_chart(charts.throughput_lines(throughput), width="stretch")


def _history_panel(store: Store) -> None:
    runs = store.runs(limit=500)
    if not runs:
        st.info("No benchmark run yet.")
        return
    common.rows_table(benchruns.run_rows(runs))
    if len(runs) < 2:
        st.caption("Two runs are needed for a comparison.")
        return
    by_id = {r.id: r for r in runs}
    ids = list(by_id)
    cols = st.columns(2)
    a = cols[0].selectbox("Run A", ids, index=1, format_func=lambda i: benchruns.run_label(by_id[i]), key="hare-cmp-a")
    b = cols[1].selectbox("Run B", ids, index=0, format_func=lambda i: benchruns.run_label(by_id[i]), key="hare-cmp-b")
    comparisons = store.compare(a, b)
    if not comparisons:
        st.info("Neither run has points.")
        return
    st.markdown(f"**Run #{a} (A) against run #{b} (B) at matching settings**")
    cut = [benchpoints.cut_short(store.points(r.id), benchpoints.asked_seconds(r), r.status == "cancelled")
           for r in (by_id[a], by_id[b])]  # fmt: skip
    rows, numeric, notes = benchruns.comparison_table(comparisons, cut)
    common.table(rows, numeric)
    for note in notes:
        st.caption(note)
    csv = benchpoints.to_csv(benchruns.comparison_rows(comparisons))
    st.download_button("Download comparison CSV", csv, file_name=f"hare-bench-{a}-vs-{b}.csv", mime="text/csv")
