"""Live metrics: scrape the selected appliance's /metrics every few seconds and plot rates over time."""

from __future__ import annotations

import time

import streamlit as st

from admin_ui import charts, prom, state
from admin_ui.client import ApplianceError
from admin_ui.tables import figure
from admin_ui.views import common

HISTORIES = "hare.live.histories"


def render() -> None:
    url = common.title_and_appliance("Live metrics")
    if url is None:
        st.info("Add an appliance on the Overview page first.")
        return
    with st.container(horizontal=True, vertical_alignment="bottom", gap="large"):
        every = st.select_slider(
            "Scrape every", options=[1, 2, 5, 10, 30], value=2, format_func=lambda s: f"{s} s", width=300
        )
        auto = st.toggle("Auto-refresh", value=True)
        if st.button("Clear history"):
            _histories().pop(url, None)
    st.caption(
        f"{url}/metrics · rates are differences between successive scrapes, as Prometheus' rate() computes them; "
        "the charts start when this page begins watching"
    )
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
    latest = history.snapshots[-1]
    life = prom.lifetime(latest)
    intervals = history.intervals()
    since = _since(latest, life)
    if not intervals:
        st.info(f"First scrape taken; rates appear from the second one on. {since}")
        _labels_total(latest)
        return
    if not any(iv.requests_per_s > 0 for iv in intervals):
        watched = time.strftime("%H:%M:%S", time.localtime(history.snapshots[0].at))
        st.info(
            f"No inference request in the {history.watched_s:,.0f} s this page has watched (since {watched}); "
            f"the charts start with the next one. {since}"
        )
        _labels_total(latest)
        return
    origin = history.snapshots[0].at
    rows = prom.timeline_rows(intervals, origin)
    last = intervals[-1]
    # A row that wraps: each figure keeps its width, its unit and its "~" instead of being cut to "~29.…".
    with st.container(horizontal=True, gap="large"):
        st.metric("requests/s", f"{last.requests_per_s:,.1f}", width="content")
        st.metric("errors/s", f"{last.errors_per_s:,.2f}", width="content")
        window = f"over the last {last.window_s:.0f} s, from {last.latency_count:,.0f} requests"
        for q in (0.5, 0.99):
            few = last.latency_count < prom.needed_requests(q)
            st.metric(
                f"latency {prom.quantile_label(q)}",
                _ms(last.latency_ms.get(q), approximate=few),
                help=window + (f"; {prom.quantile_label(q)} needs {prom.needed_requests(q)}" if few else ""),
                width="content",
            )
        st.metric("queue depth", f"{last.queue_depth:g}", width="content")
        st.metric(
            "requests since start",
            f"{life.requests:,.0f}",
            help="inference requests the appliance answered",
            width="content",
        )
    st.caption(_quantile_note(last))

    left, right = st.columns(2)
    with left:
        _chart("Requests per second", rows, ["requests/s", "errors/s"], "per second")
        _chart("Queue depth and mean batch size", rows, ["queue depth", "mean batch size"], "sequences")
        _chart(
            "Truncated inputs per request, unknown tokens per token",
            rows,
            ["truncated/request", "unknown tokens/token"],
            "share",
        )
    with right:
        latency = [f"latency {prom.quantile_label(q)} ms" for q in prom.QUANTILES]
        _chart("Request latency quantiles (ms)", rows, latency, "ms")
        inference = [f"inference {prom.quantile_label(q)} ms" for q in prom.QUANTILES]
        _chart("Inference latency quantiles (ms, per model call)", rows, inference, "ms")
        phases = [f"{p} ms" for p in prom.PHASES]
        _chart("Server time per phase (mean ms, as in Server-Timing)", rows, phases, "ms", stacked=True)
    _chart("Tokens per request (mean)", rows, ["mean tokens/request"], "tokens", height=180)
    shares = prom.label_share_rows(intervals, origin)
    if shares:
        st.markdown("**Predicted label distribution over time** (a drifting input shows as moving bands)")
        st.altair_chart(charts.label_share_area(shares), width="stretch")
    _labels_total(latest)


def _quantile_note(last: prom.Interval) -> str:
    """How far the latency quantiles can be trusted: their window, their requests, their buckets."""
    note = (
        f"Latency quantiles over the last {prom.WINDOW_S:.0f} s of scrapes, interpolated within the server's "
        "histogram buckets; ~ marks one from too few requests."
    )
    if last.p99_bucket_ms is not None:
        lo, hi = last.p99_bucket_ms
        if lo > 0 and hi / lo > 1.4:
            note += (
                f" The p99 lies in the bucket {figure(lo)}-{figure(hi)} ms: the server's buckets are that coarse "
                "there (older hare servers have buckets that double), so within it the p99 is an interpolation."
            )
    return note


def _since(latest: prom.Snapshot, life: prom.Lifetime) -> str:
    """One sentence on everything the appliance answered since it started, whatever this page saw."""
    if life.requests <= 0:
        return "The appliance has answered no inference request since it started."
    p50, p99 = life.latency_ms.get(0.5), life.latency_ms.get(0.99)
    few = life.requests < prom.needed_requests(0.99)
    figures = f" (p50 {_ms(p50)}, p99 {_ms(p99, approximate=few)} over all of them)" if p50 is not None else ""
    return f"Since it started, the appliance answered {life.requests:,.0f} inference requests{figures}."


def _chart(
    title: str,
    rows: list[dict[str, float | None]],
    columns: list[str],
    unit: str,
    height: int = 220,
    stacked: bool = False,
) -> None:
    st.markdown(f"**{title}**")
    st.altair_chart(charts.timeline(rows, columns, unit, height, stacked), width="stretch")


def _labels_total(snapshot: prom.Snapshot) -> None:
    totals = prom.cumulative_labels(snapshot)
    if any(totals.values()):
        st.markdown("**Predictions per label since the appliance started**")
        rows = [{"label": k, "predictions": v} for k, v in sorted(totals.items())]
        st.altair_chart(
            charts.count_bars(rows, "label", "predictions"), width="stretch", height=charts.rows_height(len(rows))
        )


def _ms(value: float | None, approximate: bool = False) -> str:
    if value is None:
        return "–"
    return ("~" if approximate else "") + f"{figure(value)} ms"
