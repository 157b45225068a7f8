"""Benchmarks: start `hare bench run` in the background, follow it, and read the results from the bench store.

One bench at a time for the whole console (a second would share the cores and skew both), kept in a
process-wide slot so a page reload finds the running job again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import streamlit as st

from admin_ui import benchdata, charts, state
from admin_ui.benchdata import Plan, Progress
from admin_ui.benchjob import BASELINES, BenchConfig, BenchJob, bundle_for, parse_ints, parse_seq_lens
from admin_ui.tables import figure
from admin_ui.views import common
from bench.store import Store

FOLLOWED = "hare.bench.followed"  # the run id the Results tab shows


@st.cache_resource
def _slot() -> dict[str, Any]:
    """The console's one bench job ({"job": BenchJob | None}), shared by every session."""
    return {"job": None}


def render() -> None:
    st.title("Benchmarks")
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
    except (OSError, sqlite3.Error) as exc:
        st.error(f"Cannot open the bench store {db}: {exc}")
        return None


# -- starting and following a run ---------------------------------------------------------------------------

FORM = "hare.bench.form"  # the values of the last form sent in this session (the slot keeps the console's last)
DEFAULTS: dict[str, Any] = {
    "name": "",
    "seq": "16, 64",
    "batches": "1",
    "conc": "1, 4",
    "duration": 3.0,
    "warmup": 1.0,
    "baselines": [],
    "model": "",
    "model_only": True,
}


def _run_panel(db: Path) -> None:
    slot = _slot()
    job: BenchJob | None = slot["job"]
    if job is not None and job.running:
        st.info("A benchmark is running; its progress is below. Start another once it ends or after cancelling it.")
    else:
        _config_form(db)
    if job is not None:
        _follow(job, slot.get("plan"), db)


def _served_bundle(url: str | None) -> str:
    """The bundle the selected appliance serves, when it sits in one of the console's bundle folders (found
    once per session and appliance: the page then draws without asking the appliance again)."""
    if not url:
        return ""
    found: dict[str, str] = state.remember("bench.served", {})
    if url not in found:
        p = state.describe(url)
        bundle = bundle_for(p.info, state.settings().bundle_dirs) if p.info else None
        if bundle is None:
            return ""  # asked again next time: the appliance may be starting
        found[url] = str(bundle)
    return found[url]


def _saved_form() -> dict[str, Any]:
    """What the form showed when it was last sent (this session's, else the console's last run's): a run, a
    cancel or a visit to another page then leaves the form as the user left it."""
    saved = st.session_state.get(FORM) or _slot().get("form") or {}
    return {**DEFAULTS, **saved}


def _config_form(db: Path) -> None:
    url = state.selected()
    saved = _saved_form()
    same = saved.get("url") == url  # the target and bundle typed for this appliance, else its own
    with st.form("hare-bench-config"):
        top = st.columns([3, 2])
        target = top[0].text_input(
            "Appliance URL or bundle folder",
            value=saved["target"] if same and "target" in saved else url or "",
            key="hare-bench-target",
            help="a URL is measured as it runs; for a bundle folder the bench starts `hare serve` itself",
        )
        name = top[1].text_input("Run name (optional)", value=saved["name"], key="hare-bench-name")
        grid = st.columns(5)
        seq = grid[0].text_input("Sequence lengths (tokens)", value=saved["seq"], key="hare-bench-seq")
        batches = grid[1].text_input("Batch sizes", value=saved["batches"], key="hare-bench-batch")
        conc = grid[2].text_input("Concurrency", value=saved["conc"], key="hare-bench-conc")
        duration = grid[3].number_input(
            "Seconds per point", 0.5, 600.0, float(saved["duration"]), step=1.0, key="hare-bench-duration"
        )
        warmup = grid[4].number_input(
            "Warm-up seconds", 0.0, 60.0, float(saved["warmup"]), step=0.5, key="hare-bench-warmup"
        )
        more = st.columns([2, 3, 3])
        baselines = more[0].multiselect(
            "Baselines in the same run",
            BASELINES,
            default=[b for b in saved["baselines"] if b in BASELINES],
            key="hare-bench-baselines",
        )
        bundle = more[1].text_input(
            "Bundle the URL serves (for exact token lengths)",
            value=saved["bundle"] if same and "bundle" in saved else _served_bundle(url),
            key=f"hare-bench-bundle-{url}",
            help="exact token counts, the model-only figure, and the model folder the baselines load",
        )
        model = more[2].text_input(
            "Model folder for the baselines (optional)",
            value=saved["model"],
            key="hare-bench-model",
            help="default: the folder the bundle was built from",
        )
        model_only = st.checkbox(
            "Also measure the model alone, in process (adds points after the HTTP ones)",
            value=bool(saved["model_only"]),
            key="hare-bench-model-only",
            help="needs the bundle: its model called in the bench's own process, without HTTP, at each sequence "
            "length and batch size, with 1 stream and as many side by side as the concurrency asks, at most one "
            "per core of this machine. It shows what the server adds to the model's own time.",
        )
        start = st.form_submit_button("Start benchmark", type="primary")
    if not start:
        return
    values = {
        "url": url, "target": target, "name": name, "seq": seq, "batches": batches, "conc": conc,
        "duration": float(duration), "warmup": float(warmup), "baselines": list(baselines), "bundle": bundle,
        "model": model, "model_only": bool(model_only),
    }  # fmt: skip
    st.session_state[FORM] = values
    _slot()["form"] = values
    try:
        config = BenchConfig(
            target=target.strip(),
            bundle=bundle.strip(),
            model=model.strip(),
            seq_lens=parse_seq_lens(seq),
            batches=parse_ints(batches, "batch sizes", 1, 1024),
            concurrency=parse_ints(conc, "concurrency", 1, 1024),
            duration_s=float(duration),
            warmup_s=float(warmup),
            baselines=tuple(baselines),
            name=name.strip(),
            model_only=bool(model_only),
        )
        if not config.target:
            raise ValueError("give the appliance URL or bundle folder to measure")
        if config.baselines and not (config.model or config.bundle or not _is_url(config.target)):
            raise ValueError("baselines load the original model: give the bundle or the model folder")
        config = _with_task(config)
    except ValueError as exc:
        st.error(f"Cannot start: {exc}")
        return
    _start(config, db)


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def _with_task(config: BenchConfig) -> BenchConfig:
    """A URL's task comes from its /info, which also proves the appliance is there before the bench starts."""
    if not _is_url(config.target):
        if not Path(config.target).is_dir():
            raise ValueError(f"{config.target} is neither a URL nor a folder on this machine")
        return config
    p = state.describe(config.target)
    if p.error or p.info is None:
        raise ValueError(p.error or f"{config.target} did not describe itself")
    return replace(config, target=p.url, task=str(p.info["task"]))


def _start(config: BenchConfig, db: Path) -> None:
    try:
        job = BenchJob(config.command(db), env=dict(os.environ))
    except OSError as exc:
        st.error(f"Could not start `hare bench run`: {exc}")
        return
    slot = _slot()
    slot["job"], slot["plan"], slot["noted"] = job, config.plan(), None
    st.session_state.pop(FOLLOWED, None)
    st.rerun()


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
        done = f"after {progress.done_points} of {progress.planned} points" if progress.planned else ""
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
        if st.button("Cancel benchmark", type="secondary"):
            job.cancel()
            st.rerun()
    elif progress.status == "done":
        st.success(progress.outcome())
    elif progress.status == "cancelled":
        st.warning(progress.outcome())
    else:
        st.error(f"The benchmark failed: {progress.message or 'see the log below'}")
    points = benchdata.live_point_rows(progress)
    if points:
        _point_table(points)
    if progress.log or progress.status == "failed":
        with st.expander("Bench log", expanded=progress.status == "failed"):
            st.code("\n".join([*progress.log, job.stderr_tail()]).strip() or "(empty)", language=None)
    finished = progress.status is not None and progress.run_id is not None and not job.running
    if finished and st.session_state.get("hare.bench.seen") != progress.run_id:
        st.session_state["hare.bench.seen"] = progress.run_id
        st.session_state[FOLLOWED] = progress.run_id
        st.session_state["hare-bench-run"] = progress.run_id  # the Results tab opens on the finished run
        st.rerun()  # redraw the whole page: Results and History now include the finished run


def _point_table(points: list[Any]) -> None:
    """The points as a table: latency in ms, shared settings said once, marks and what they mean below."""
    t = benchdata.point_table(points)
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
        "Run", ids, index=index, format_func=lambda i: benchdata.run_label(by_id[i]), key="hare-bench-run"
    )
    run = by_id[run_id]
    if run.status in ("failed", "cancelled") and run.message:
        st.warning(benchdata.run_outcome(run))
    points = store.points(run.id)
    if not points:
        st.info("This run has no measured point.")
        return
    _headline(points)
    st.markdown("**Latency and throughput per point**")
    _point_table(points)
    st.download_button(
        "Download CSV",
        benchdata.to_csv(benchdata.point_rows(points)),
        file_name=f"hare-bench-{run.id}.csv",
        mime="text/csv",
        key="hare-csv",
    )
    errors = benchdata.error_summary(points)
    if errors:
        st.warning("Failed requests: " + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items())))
    _charts(points)
    ratios = benchdata.ratio_rows(store.ratios(run.id))
    if ratios:
        st.markdown("**hare against its baselines (same run, same settings; above 1 means hare is ahead)**")
        common.rows_table(ratios)
        st.altair_chart(charts.target_bars(benchdata.throughput_rows(points)), width="stretch")
    with st.expander("Machine, versions and settings of this run"):
        st.json({"machine": run.machine, "versions": run.versions, "settings": run.settings}, expanded=False)


def _headline(points: list[Any]) -> None:
    h = benchdata.headline(points)
    if h is None:
        return
    p = h.point
    cols = st.columns(4)
    for col, q in zip(cols, ("p50", "p95", "p99"), strict=False):
        few = not benchdata.resolved(q, p.ok)
        col.metric(
            q,
            h.latency(q),
            help=f"{p.ok:,} answers: {q} needs {benchdata.needed_answers(q)}, so this is about the slowest one"
            if few
            else None,
        )
    cols[3].metric("peak throughput", f"{figure(h.peak_req_s)} req/s")
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
    batch = _pick("Batch size", benchdata.values(points, "batch"), "hare-chart-batch")
    shown = [p for p in points if p.batch == batch or p.load == "in-process"]
    left, right = st.columns(2)
    with left:
        st.markdown("**Latency percentiles against sequence length**")
        concurrency = _pick("Concurrency", benchdata.values(shown, "concurrency"), "hare-chart-conc")
        latency = benchdata.latency_rows(p for p in shown if p.concurrency == concurrency)
        if latency:
            st.altair_chart(charts.latency_lines(latency), width="stretch")
            if any(not benchdata.resolved(r["percentile"], r["answers"]) for r in latency):
                st.caption("Some of these percentiles come from too few answers (marked ~ in the table).")
    with right:
        st.markdown("**Throughput against concurrency**")
        throughput = benchdata.throughput_rows(shown)
        if throughput:
            st.altair_chart(charts.throughput_lines(throughput), width="stretch")


def _history_panel(store: Store) -> None:
    runs = store.runs(limit=500)
    if not runs:
        st.info("No benchmark run yet.")
        return
    common.rows_table(benchdata.run_rows(runs), widths=benchdata.RUN_WIDTHS)
    if len(runs) < 2:
        st.caption("Two runs are needed for a comparison.")
        return
    by_id = {r.id: r for r in runs}
    ids = list(by_id)
    cols = st.columns(2)
    a = cols[0].selectbox("Run A", ids, index=1, format_func=lambda i: benchdata.run_label(by_id[i]), key="hare-cmp-a")
    b = cols[1].selectbox("Run B", ids, index=0, format_func=lambda i: benchdata.run_label(by_id[i]), key="hare-cmp-b")
    rows = benchdata.comparison_rows(store.compare(a, b))
    if not rows:
        st.info("Neither run has points.")
        return
    st.markdown(f"**Run #{a} (A) against run #{b} (B) at matching settings**")
    common.rows_table(rows)
    st.download_button(
        "Download comparison CSV", benchdata.to_csv(rows), file_name=f"hare-bench-{a}-vs-{b}.csv", mime="text/csv"
    )
