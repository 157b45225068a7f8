"""Vega-Lite charts (Altair, which ships with Streamlit) built from the pages' row lists.

Each function takes plain rows and returns a chart, so tests can check the spec without a browser. Streamlit
ignores the height of a layered chart, so the pages pass `rows_height(n)` to st.altair_chart for those.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt

Rows = Sequence[dict[str, Any]]


def _data(rows: Rows) -> alt.Data:
    return alt.Data(values=[dict(r) for r in rows])  # type: ignore[no-untyped-call]


def rows_height(n: int, per_row: int = 32, axes: int = 60) -> int:
    """Pixels for a chart with `n` rows of bars or cells (layered charts need it given to st.altair_chart)."""
    return axes + per_row * max(n, 1)


def score_bars(rows: Rows, label: str = "label", value: str = "score", unit_range: bool = True) -> alt.Chart:
    """Horizontal bars, highest first, with the score printed at the end of each bar.

    unit_range: scores are probabilities (0..1 axis); ranking scores may be raw logits, so they scale freely.
    """
    scale = alt.Scale(domain=[0, 1]) if unit_range else alt.Scale(zero=True)
    base = alt.Chart(_data(rows)).encode(
        y=alt.Y(f"{label}:N", sort="-x", title=None, axis=alt.Axis(labelLimit=360)),
        x=alt.X(f"{value}:Q", scale=scale, title=value),
        tooltip=[f"{label}:N", alt.Tooltip(f"{value}:Q", format=".4f")],
    )
    bars = base.mark_bar(color="#0072B2")
    text = base.mark_text(align="left", dx=4).encode(text=alt.Text(f"{value}:Q", format=".3f"))
    return bars + text


def heatmap(rows: Rows) -> alt.Chart:
    """Cosine similarity matrix of embedded sentences, values printed in the cells."""
    order = list(dict.fromkeys(r["a"] for r in rows))
    base = alt.Chart(_data(rows)).encode(
        x=alt.X("b:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30, labelLimit=220)),
        y=alt.Y("a:N", sort=order, title=None, axis=alt.Axis(labelLimit=260)),
    )
    cells = base.mark_rect().encode(
        color=alt.Color("similarity:Q", scale=alt.Scale(scheme="blues", domain=[-1, 1]), title="cosine"),
        tooltip=["a:N", "b:N", alt.Tooltip("similarity:Q", format=".4f")],
    )
    text = base.mark_text().encode(
        text=alt.Text("similarity:Q", format=".2f"),
        color=alt.condition("datum.similarity > 0.5", alt.value("white"), alt.value("black")),
    )
    return cells + text


def timing_bar(rows: Rows) -> alt.Chart:
    """One stacked horizontal bar: the server's time per phase (Server-Timing), in pipeline order."""
    data = [dict(r, bar="server") for r in rows]  # a single y category: without one Vega-Lite draws no bar
    return (
        alt.Chart(_data(data))
        .mark_bar()
        .encode(
            x=alt.X("ms:Q", title="server time (ms)", stack="zero"),
            y=alt.Y("bar:N", title=None),
            color=alt.Color("phase:N", sort=[r["phase"] for r in rows]),
            order=alt.Order("order:Q"),
            tooltip=["phase:N", alt.Tooltip("ms:Q", format=".3f")],
        )
    )


def latency_lines(rows: Rows) -> alt.Chart:
    """Client latency percentiles against sequence length; one colour per percentile, one dash per target."""
    return (
        alt.Chart(_data(rows))
        .mark_line(point=True)
        .encode(
            x=alt.X("seq len:Q", title="sequence length (tokens)"),
            y=alt.Y("ms:Q", title="latency (ms)"),
            color=alt.Color("percentile:N", sort=["p50", "p90", "p95", "p99"]),
            strokeDash=alt.StrokeDash("target:N"),
            detail="target:N",
            tooltip=["target:N", "seq len:Q", "percentile:N", alt.Tooltip("ms:Q", format=".2f")],
        )
        .properties(height=300)
    )


def throughput_lines(rows: Rows) -> alt.Chart:
    """Requests per second against concurrency; one colour per target, one dash per sequence length."""
    return (
        alt.Chart(_data(rows))
        .mark_line(point=True)
        .encode(
            x=alt.X("concurrency:Q", title="concurrent clients"),
            y=alt.Y("req/s:Q", title="requests per second"),
            color=alt.Color("target:N"),
            strokeDash=alt.StrokeDash("seq len:N", title="seq len"),
            tooltip=["target:N", "seq len:Q", "concurrency:Q", alt.Tooltip("req/s:Q", format=".1f")],
        )
        .properties(height=300)
    )


def target_bars(rows: Rows) -> alt.Chart:
    """hare against its baselines: throughput per target, grouped by setting (seq len × concurrency)."""
    data = [dict(r, setting=f"s{r['seq len']} c{r['concurrency']}") for r in rows]
    return (
        alt.Chart(_data(data))
        .mark_bar()
        .encode(
            x=alt.X("setting:N", title="seq len / concurrency"),
            xOffset="target:N",
            y=alt.Y("req/s:Q", title="requests per second"),
            color="target:N",
            tooltip=["target:N", "setting:N", alt.Tooltip("req/s:Q", format=".1f")],
        )
        .properties(height=280)
    )


def label_share_area(rows: Rows) -> alt.Chart:
    """Share of each predicted label per scrape interval: a drifting input shows as moving bands."""
    return (
        alt.Chart(_data(rows))
        .mark_area()
        .encode(
            x=alt.X("t:Q", title="seconds"),
            y=alt.Y("share:Q", stack="normalize", title="share of predictions"),
            color="label:N",
            tooltip=["t:Q", "label:N", alt.Tooltip("share:Q", format=".2%")],
        )
        .properties(height=240)
    )
