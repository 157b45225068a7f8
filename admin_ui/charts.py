"""Vega-Lite charts (Altair, which ships with Streamlit) built from the pages' row lists.

Each function takes plain rows and returns a chart, so tests can check the spec without a browser. Streamlit
ignores the height of a layered chart, so the pages pass `rows_height(n)` to st.altair_chart for those.

What every chart here shares, so a reader can take it in at a glance:
- every number on an axis or in a tooltip has an explicit format (`NUMBER`): without one, Vega prints an axis
  of a single value, such as the first scrape's only timestamp or a run's only concurrency, as "2.100000";
- whole-number axes (sequence length, concurrency) tick at the measured values only;
- every series has its own colour (Okabe-Ito, colour-blind safe, then wine and grey), named in a legend whose
  symbols are drawn the way the lines are (colour and dash), never as black dots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import altair as alt

Rows = Sequence[Mapping[str, Any]]

NUMBER = ",~r"  # d3-format: thousands separators, six significant digits, no trailing zeros ("2.1", "16")
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#882255", "#999999")
# One colour per bench target wherever targets are compared, and one dash per target on line charts.
TARGET_COLOURS = {"hare": "#0072B2", "vanilla": "#E69F00", "comet": "#009E73", "model-only": "#CC79A7"}
TARGET_DASHES = {"hare": [1, 0], "vanilla": [6, 3], "comet": [2, 2], "model-only": [8, 2, 2, 2]}
PERCENTILE_ORDER = ("p50", "p90", "p95", "p99")


def _data(rows: Rows) -> alt.Data:
    return alt.Data(values=[dict(r) for r in rows])  # type: ignore[no-untyped-call]


def rows_height(n: int, per_row: int = 32, axes: int = 60) -> int:
    """Pixels for a chart with `n` rows of bars or cells (layered charts need it given to st.altair_chart)."""
    return axes + per_row * max(n, 1)


def palette(names: Sequence[str]) -> list[str]:
    """A distinct colour for each of `names`, in order (bench targets keep their own colour)."""
    out: list[str] = []
    spare = [c for c in PALETTE if c not in {TARGET_COLOURS.get(n) for n in names}]
    for name in names:
        colour = TARGET_COLOURS.get(name)
        if colour is None or colour in out:
            colour = spare.pop(0) if spare else PALETTE[len(out) % len(PALETTE)]
        out.append(colour)
    return out


def _legend(title: str | None) -> alt.Legend:
    """A legend whose symbols are short strokes in the series' colour and dash."""
    return alt.Legend(title=title, symbolType="stroke", symbolStrokeWidth=3, symbolSize=300)


def _count_axis(title: str, values: Sequence[Any]) -> alt.Axis:
    """A whole-number axis that ticks at the measured values only (8, 32, 128 tokens; 1, 4 users)."""
    ticks = sorted({float(v) for v in values if isinstance(v, int | float)})
    if not ticks:
        return alt.Axis(title=title, format=",d", tickMinStep=1)
    return alt.Axis(title=title, format=",d", values=ticks, grid=True)


def _series_encodings(series_targets: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A line chart's `series` field drawn with one colour per series and one dash per target, in one legend:
    the color and strokeDash encodings, for `.encode(**...)`."""
    names = [s for s, _ in series_targets]
    dashes = alt.Scale(domain=names, range=[TARGET_DASHES.get(t, [1, 0]) for _, t in series_targets])
    return {
        "color": alt.Color(
            "series:N", sort=names, scale=alt.Scale(domain=names, range=palette(names)), legend=_legend(None)
        ),
        "strokeDash": alt.StrokeDash("series:N", sort=names, scale=dashes, legend=_legend(None)),
    }


def score_bars(rows: Rows, label: str = "label", value: str = "score", unit_range: bool = True) -> alt.Chart:
    """Horizontal bars, highest first, with the score printed at the end of each bar.

    unit_range: scores are probabilities (0..1 axis); ranking scores may be raw logits, so they scale freely.
    """
    scale = alt.Scale(domain=[0, 1]) if unit_range else alt.Scale(zero=True)
    base = alt.Chart(_data(rows)).encode(
        y=alt.Y(f"{label}:N", sort="-x", title=None, axis=alt.Axis(labelLimit=360)),
        x=alt.X(f"{value}:Q", scale=scale, title=value, axis=alt.Axis(format=NUMBER, tickCount=10)),
        tooltip=[f"{label}:N", alt.Tooltip(f"{value}:Q", format=".4f")],
    )
    bars = base.mark_bar(color=PALETTE[0])
    text = base.mark_text(align="left", dx=4).encode(text=alt.Text(f"{value}:Q", format=".3f"))
    return bars + text


def count_bars(rows: Rows, label: str, value: str) -> alt.Chart:
    """Horizontal bars of counts, largest first, each with its count printed (predictions per label)."""
    base = alt.Chart(_data(rows)).encode(
        y=alt.Y(f"{label}:N", sort="-x", title=None, axis=alt.Axis(labelLimit=360)),
        x=alt.X(f"{value}:Q", title=value, axis=alt.Axis(format=",d", tickMinStep=1)),
        tooltip=[f"{label}:N", alt.Tooltip(f"{value}:Q", format=",d")],
    )
    bars = base.mark_bar(color=PALETTE[0])
    text = base.mark_text(align="left", dx=4).encode(text=alt.Text(f"{value}:Q", format=",d"))
    return bars + text


def heatmap(rows: Rows) -> alt.Chart:
    """Cosine similarity matrix of embedded sentences, values printed in the cells."""
    order = list(dict.fromkeys(r["a"] for r in rows))
    base = alt.Chart(_data(rows)).encode(
        x=alt.X("b:N", sort=order, title=None, axis=alt.Axis(labelAngle=-30, labelLimit=220)),
        y=alt.Y("a:N", sort=order, title=None, axis=alt.Axis(labelLimit=260)),
    )
    cells = base.mark_rect().encode(
        color=alt.Color(
            "similarity:Q",
            scale=alt.Scale(scheme="blues", domain=[-1, 1]),
            title="cosine",
            legend=alt.Legend(format=NUMBER),
        ),
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
    phases = [str(r["phase"]) for r in rows]
    return (
        alt.Chart(_data(data))
        .mark_bar()
        .encode(
            x=alt.X("ms:Q", title="server time (ms)", stack="zero", axis=alt.Axis(format=NUMBER)),
            y=alt.Y("bar:N", title=None),
            color=alt.Color(
                "phase:N",
                sort=phases,
                scale=alt.Scale(domain=phases, range=palette(phases)),
                legend=alt.Legend(title="phase", orient="bottom", columns=2),
            ),
            order=alt.Order("order:Q"),
            tooltip=["phase:N", alt.Tooltip("ms:Q", format=".3f")],
        )
    )


def latency_lines(rows: Rows) -> alt.Chart:
    """Client latency percentiles against sequence length: one colour per series (target and percentile),
    one dash per target, both in the one legend."""
    targets = list(dict.fromkeys(str(r["target"]) for r in rows))
    series_targets = list(
        dict.fromkeys(
            (series_name(str(r["target"]), str(r["percentile"]), len(targets)), str(r["target"]))
            for r in sorted(rows, key=lambda r: (targets.index(str(r["target"])), _percentile_rank(r["percentile"])))
        )
    )
    data = [dict(r, series=series_name(str(r["target"]), str(r["percentile"]), len(targets))) for r in rows]
    return (
        alt.Chart(_data(data))
        .mark_line(point=True)
        .encode(
            x=alt.X("seq len:Q", axis=_count_axis("sequence length (tokens)", [r["seq len"] for r in rows])),
            y=alt.Y("ms:Q", title="latency (ms)", axis=alt.Axis(format=NUMBER)),
            **_series_encodings(series_targets),
            tooltip=[
                "target:N",
                alt.Tooltip("seq len:Q", format=",d"),
                "percentile:N",
                alt.Tooltip("ms:Q", format=",.2f"),
                alt.Tooltip("answers:Q", format=",d"),
            ],
        )
        .properties(height=300)
    )


def series_name(target: str, part: str, targets: int) -> str:
    """How a line is named in a legend: just the percentile when one target is drawn, else both."""
    return part if targets <= 1 else f"{target} {part}"


def _percentile_rank(name: Any) -> int:
    return PERCENTILE_ORDER.index(name) if name in PERCENTILE_ORDER else len(PERCENTILE_ORDER)


def throughput_lines(rows: Rows) -> alt.Chart:
    """Requests per second against concurrency: one colour per series (target and sequence length), one dash
    per target, both in the one legend."""
    ordered = sorted(rows, key=lambda r: (str(r["target"]) != "hare", str(r["target"]), r["seq len"]))
    series_targets = list(dict.fromkeys((_throughput_series(r), str(r["target"])) for r in ordered))
    data = [dict(r, series=_throughput_series(r)) for r in rows]
    return (
        alt.Chart(_data(data))
        .mark_line(point=True)
        .encode(
            x=alt.X("concurrency:Q", axis=_count_axis("concurrent clients", [r["concurrency"] for r in rows])),
            y=alt.Y("req/s:Q", title="requests per second", axis=alt.Axis(format=NUMBER)),
            **_series_encodings(series_targets),
            tooltip=[
                "target:N",
                alt.Tooltip("seq len:Q", format=",d"),
                alt.Tooltip("concurrency:Q", format=",d"),
                alt.Tooltip("req/s:Q", format=",.1f"),
            ],
        )
        .properties(height=300)
    )


def _throughput_series(row: Mapping[str, Any]) -> str:
    return f"{row['target']} · {row['seq len']} tokens"


def target_bars(rows: Rows) -> alt.Chart:
    """hare against its baselines: throughput per target, grouped by setting (seq len × concurrency)."""

    def setting(r: Mapping[str, Any]) -> str:
        users = r["concurrency"]
        return f"{r['seq len']} tokens, {users} user{'s' if users != 1 else ''}"

    data = [dict(r, setting=setting(r)) for r in rows]
    settings = [setting(r) for r in sorted(rows, key=lambda r: (r["seq len"], r["concurrency"]))]
    targets = list(dict.fromkeys(str(r["target"]) for r in rows))
    return (
        alt.Chart(_data(data))
        .mark_bar()
        .encode(
            x=alt.X(
                "setting:N",
                sort=list(dict.fromkeys(settings)),
                title="sequence length, concurrent clients",
                axis=alt.Axis(labelAngle=0),
            ),
            xOffset=alt.XOffset("target:N", sort=targets),
            y=alt.Y("req/s:Q", title="requests per second", axis=alt.Axis(format=NUMBER)),
            color=alt.Color(
                "target:N",
                sort=targets,
                scale=alt.Scale(domain=targets, range=palette(targets)),
                legend=alt.Legend(title="target"),
            ),
            tooltip=["target:N", "setting:N", alt.Tooltip("req/s:Q", format=",.1f")],
        )
        .properties(height=280)
    )


def timeline(rows: Rows, columns: Sequence[str], title: str, height: int = 220, stacked: bool = False) -> alt.Chart:
    """Some columns of the Live metrics rows over time, one coloured line (or stacked band) each, with dots so
    that the first interval, a single row, shows as dots rather than an empty plot. Empty values are left
    out rather than drawn as zero."""
    names = [str(c) for c in columns]
    data = [
        {"t": r["t"], "series": c, "value": float(r[c])}
        for r in rows
        for c in names
        if r.get(c) is not None and r.get("t") is not None
    ]
    base = alt.Chart(_data(data))
    mark = base.mark_area(opacity=0.85) if stacked else base.mark_line(point=alt.OverlayMarkDef(size=30))
    return mark.encode(
        x=alt.X("t:Q", title="seconds since this page began watching", axis=alt.Axis(format=NUMBER, tickMinStep=1)),
        y=alt.Y("value:Q", title=title, stack="zero" if stacked else None, axis=alt.Axis(format=NUMBER)),
        color=alt.Color(
            "series:N",
            sort=names,
            scale=alt.Scale(domain=names, range=palette(names)),
            # One series is named by the chart's title; several get a legend.
            # Two entries a row: a legend in one row ran past a half-width chart at 1,280 pixels.
            legend=alt.Legend(title=None, orient="bottom", columns=2, symbolType="circle" if stacked else "stroke")
            if len(names) > 1
            else None,
        ),
        tooltip=[
            alt.Tooltip("t:Q", format=",.1f", title="seconds"),
            "series:N",
            alt.Tooltip("value:Q", format=",.3~r"),
        ],
    ).properties(height=height)


def label_share_area(rows: Rows) -> alt.Chart:
    """Share of each predicted label per scrape interval: a drifting input shows as moving bands."""
    labels = sorted({str(r["label"]) for r in rows})
    return (
        alt.Chart(_data(rows))
        .mark_area()
        .encode(
            x=alt.X("t:Q", title="seconds since this page began watching", axis=alt.Axis(format=NUMBER)),
            y=alt.Y("share:Q", stack="normalize", title="share of predictions", axis=alt.Axis(format=".0%")),
            color=alt.Color(
                "label:N", sort=labels, scale=alt.Scale(domain=labels, range=palette(labels)), legend=alt.Legend()
            ),
            tooltip=[alt.Tooltip("t:Q", format=",.1f"), "label:N", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(height=240)
    )
