"""Live metrics: scrape the selected appliance's /metrics every few seconds and plot rates over time."""

from __future__ import annotations

import time

import streamlit as st

from admin_ui import charts, prom, state
from admin_ui.client import ApplianceError

HISTORIES = "hare.live.histories"


def render() -> None:
    st.title("Live metrics")
    url = state.selected()
    if url is None:
        st.info("Add an appliance on the Overview page first.")
        return
    cols = st.columns([2, 2, 1], vertical_alignment="bottom")
    every = cols[0].select_slider("Scrape every", options=[1, 2, 5, 10, 30], value=2, format_func=lambda s: f"{s} s")
    auto = cols[1].toggle("Auto-refresh", value=True)
    if cols[2].button("Clear history"):
        _histories().pop(url, None)
    st.caption(f"{url}/metrics · rates are differences between successive scrapes, as Prometheus' rate() computes them")
    _panel(url, run_every=every if auto else None)


def _histories() -> dict[str, prom.History]:
    value: dict[str, prom.History] = state.remember("live.histories", {})
    return value


def _panel(url: str, run_every: float | None) -> None:
    @st.fragment(run_every=run_every)
    def panel() -> None:
        with state.guard("Live metrics"):
            _scrape_and_draw(url)

    panel()


def _scrape_and_draw(url: str) -> None:
    history = _histories().setdefault(url, prom.History())
    try:
        with state.client(url) as client:
            text = client.metrics_text()
        history.add(prom.parse(text, time.time()))
    except ApplianceError as exc:
        st.error(str(exc))
    except ValueError as exc:
        st.error(f"{url}/metrics is not in the Prometheus text format: {exc}")
    if not history.snapshots:
        return
    intervals = history.intervals()
    if not intervals:
        st.info("First scrape taken; rates appear from the second one on.")
        _labels_total(history.snapshots[-1])
        return
    if not any(iv.requests_per_s > 0 for iv in intervals):
        # Empty charts would draw "null" and "0.000000" axes.
        st.info("No traffic yet: the charts start with the first inference request.")
        _labels_total(history.snapshots[-1])
        return
    origin = history.snapshots[0].at
    rows = prom.timeline_rows(intervals, origin)
    last = intervals[-1]
    top = st.columns(5)
    top[0].metric("requests/s", f"{last.requests_per_s:.1f}")
    top[1].metric("errors/s", f"{last.errors_per_s:.2f}")
    top[2].metric("latency p50", _ms(last.latency_ms.get(0.5)))
    top[3].metric("latency p99", _ms(last.latency_ms.get(0.99)))
    top[4].metric("queue depth", f"{last.queue_depth:g}")

    left, right = st.columns(2)
    with left:
        st.markdown("**Requests per second**")
        st.line_chart(rows, x="t", y=["requests/s", "errors/s"], x_label="seconds", height=220)
        st.markdown("**Queue depth and mean batch size**")
        st.line_chart(rows, x="t", y=["queue depth", "mean batch size"], x_label="seconds", height=220)
        st.markdown("**Truncated inputs per request, unknown tokens per token**")
        st.line_chart(rows, x="t", y=["truncated/request", "unknown tokens/token"], x_label="seconds", height=220)
    with right:
        st.markdown("**Request latency quantiles (ms)**")
        latency = [f"latency {prom.quantile_label(q)} ms" for q in prom.QUANTILES]
        st.line_chart(rows, x="t", y=latency, x_label="seconds", height=220)
        st.markdown("**Inference latency quantiles (ms)**")
        inference = [f"inference {prom.quantile_label(q)} ms" for q in prom.QUANTILES]
        st.line_chart(rows, x="t", y=inference, x_label="seconds", height=220)
        st.markdown("**Server time per phase (mean ms, as in Server-Timing)**")
        phases = [f"{p} ms" for p in prom.PHASES]
        st.area_chart(rows, x="t", y=phases, x_label="seconds", height=220, stack=True)
    st.markdown("**Tokens per request (mean)**")
    st.line_chart(rows, x="t", y=["mean tokens/request"], x_label="seconds", height=180)
    shares = prom.label_share_rows(intervals, origin)
    if shares:
        st.markdown("**Predicted label distribution over time** (a drifting input shows as moving bands)")
        st.altair_chart(charts.label_share_area(shares), width="stretch")
    _labels_total(history.snapshots[-1])


def _labels_total(snapshot: prom.Snapshot) -> None:
    totals = prom.cumulative_labels(snapshot)
    if any(totals.values()):
        st.markdown("**Predictions per label since the appliance started**")
        st.bar_chart(
            [{"label": k, "predictions": v} for k, v in sorted(totals.items())], x="label", y="predictions", height=200
        )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
