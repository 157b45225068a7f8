"""Benchmarks: start `hare bench run` in the background, follow it, and read the results from the bench store.

One bench at a time for the whole console (a second would share the cores and skew both), kept in a
process-wide slot so a page reload finds the running job again.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import streamlit as st

from admin_ui import benchpoints, benchruns, charts, state
from admin_ui.benchjob import BASELINES, BenchConfig, BenchJob, bundle_for, parse_ints, parse_seq_lens
from admin_ui.benchprogress import Plan, Progress, live_point_rows
from admin_ui.percentiles import needed_answers, resolved
from admin_ui.tables import figure
from admin_ui.views import common
from bench.store import Store

FOLLOWED = "hare.bench.followed"  # the run id the Results tab shows


@st.cache_resource
def _slot() -> dict[str, Any]:
    """The console's one bench job ({"job": BenchJob | None}), shared by every session."""
    return {"job": None}


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
    except (OSError, sqlite3.Error) as exc:
        st.error(f"Cannot open the bench store {db}: {exc}")
        return None


# -- starting and following a run ---------------------------------------------------------------------------

FORM = "hare.bench.form"  # the values of the last form sent in this session (the slot keeps the console's last)
DRAFT = "hare.bench.draft"  # the form as the user left it, sent or not
WIDGET = "hare-bench-"  # the form's widget keys: WIDGET + field name
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
    """What the form showed when it was last sent (this session's, else the console's last run's)."""
    saved = st.session_state.get(FORM) or _slot().get("form") or {}
    return {**DEFAULTS, **saved}


def _draft(url: str | None) -> dict[str, Any]:
    """The form as the user left it, sent or not. Streamlit forgets a widget's value once a page without it
    has been shown (and while a run hides the form), so every edit is copied here, under a key of its own, and
    the widgets start from it: a visit to another page, a run or a cancel leaves the form as it was."""
    draft: dict[str, Any] | None = st.session_state.get(DRAFT)
    if draft is None:
        draft = st.session_state[DRAFT] = dict(_saved_form())
    if draft.get("url") != url:  # another appliance: measure it, with the bundle it serves
        draft |= {"url": url, "target": url or "", "bundle": _served_bundle(url)}
        for name in ("target", "bundle"):
            st.session_state[WIDGET + name] = draft[name]
    elif not draft["bundle"] and "bundle" not in draft.get("edited", ()):
        draft["bundle"] = st.session_state[WIDGET + "bundle"] = _served_bundle(url)  # the appliance was starting
    return draft


def _field(draft: dict[str, Any], name: str, widget: Callable[..., Any], label: str, *args: Any, **kw: Any) -> Any:
    """A form widget that starts from the draft and copies every edit back to it."""
    key = WIDGET + name
    if key not in st.session_state:
        st.session_state[key] = draft[name]

    def keep() -> None:
        draft[name] = st.session_state[key]
        draft.setdefault("edited", set()).add(name)

    value = widget(label, *args, key=key, on_change=keep, **kw)
    draft[name] = value
    return value


@st.fragment
def _config_form(db: Path) -> None:
    """The run's settings (a fragment: an edit redraws the form, not the whole page) and the Start button."""
    url = state.selected()
    draft = _draft(url)
    # Rows that wrap: at 800 pixels a field moves to the next line instead of squeezing its label.
    with st.container(horizontal=True, vertical_alignment="bottom"):
        target = _field(
            draft,
            "target",
            st.text_input,
            "Appliance URL or bundle folder",
            width=420,
            help="a URL is measured as it runs; for a bundle folder the bench starts `hare serve` itself",
        )
        name = _field(draft, "name", st.text_input, "Run name (optional)", width=260)
    with st.container(horizontal=True, vertical_alignment="bottom"):
        seq = _field(draft, "seq", st.text_input, "Sequence lengths (tokens)", width=200)
        batches = _field(draft, "batches", st.text_input, "Batch sizes", width=130)
        conc = _field(draft, "conc", st.text_input, "Concurrency", width=130)
        duration = _field(draft, "duration", st.number_input, "Seconds per point", 0.5, 600.0, step=1.0, width=170)
        warmup = _field(draft, "warmup", st.number_input, "Warm-up seconds", 0.0, 60.0, step=0.5, width=170)
    with st.container(horizontal=True, vertical_alignment="bottom"):
        draft["baselines"] = [b for b in draft["baselines"] if b in BASELINES]
        baselines = _field(draft, "baselines", st.multiselect, "Baselines in the same run", BASELINES, width=260)
        bundle = _field(
            draft,
            "bundle",
            st.text_input,
            "Bundle the URL serves (for exact token lengths)",
            width=460,
            help="exact token counts, the model-only figure, and the model folder the baselines load",
        )
        model = _field(
            draft,
            "model",
            st.text_input,
            "Model folder for the baselines (optional)",
            width=340,
            help="default: the folder the bundle was built from",
        )
    model_only = _field(
        draft, "model_only", st.checkbox,
        "Also measure the model alone, in process (adds points after the HTTP ones)",
        help="needs the bundle: its model called in the bench's own process, without HTTP, at each sequence "
        "length and batch size, with 1 stream and as many side by side as the concurrency asks, at most one "
        "per core of this machine. It shows what the server adds to the model's own time.",
    )  # fmt: skip
    start = st.button("Start benchmark", type="primary")
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
        if st.button("Cancel benchmark", type="secondary"):
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
    finished = progress.status is not None and progress.run_id is not None and not job.running
    if finished and st.session_state.get("hare.bench.seen") != progress.run_id:
        st.session_state["hare.bench.seen"] = progress.run_id
        st.session_state[FOLLOWED] = progress.run_id
        st.session_state["hare-bench-run"] = progress.run_id  # the Results tab opens on the finished run
        st.rerun()  # redraw the whole page: Results and History now include the finished run


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
