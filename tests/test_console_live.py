"""Live metrics: Prometheus parsing, rates and quantiles between scrapes, and the page against a fake."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import charts, prom
from tests.test_console_support import closed_port_url, fake_appliance, live_page, metrics_text


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    buckets = [(0.1, 50.0), (0.2, 90.0), (0.5, 100.0), (float("inf"), 100.0)]
    assert prom.histogram_quantile(0.5, buckets) == pytest.approx(0.1)
    assert prom.histogram_quantile(0.7, buckets) == pytest.approx(0.15)
    assert prom.histogram_quantile(0.99, buckets) == pytest.approx(0.47)
    assert prom.histogram_quantile(0.5, [(0.1, 0.0), (float("inf"), 0.0)]) is None
    assert prom.histogram_quantile(0.99, [(0.1, 1.0), (float("inf"), 10.0)]) == 0.1  # in +Inf: the last bound


def test_interval_rates_quantiles_and_shares() -> None:
    a = prom.parse(metrics_text(1, "text-classification"), at=100.0)
    b = prom.parse(metrics_text(3, "text-classification"), at=104.0)
    iv = prom.interval(a, b)
    assert iv.requests_per_s == pytest.approx((30 + 3 - 10 - 1) / 4)
    assert iv.errors_per_s == pytest.approx(2 / 4)  # the 422s
    assert iv.latency_ms[0.5] == pytest.approx(5.0)
    assert iv.latency_ms[0.9] == pytest.approx(10.0)
    assert iv.inference_ms[0.5] is not None and iv.inference_ms[0.5] < 2.0
    assert iv.queue_depth == 0.0  # gauge: the latest value (3 % 3)
    assert iv.mean_batch_size == pytest.approx(1.0) and iv.mean_tokens == pytest.approx(12.0)
    assert iv.truncated_share == pytest.approx(2 / 20) and iv.unknown_share == pytest.approx(4 / 240)
    assert iv.labels == {"POSITIVE": 14.0, "NEGATIVE": 6.0}
    assert iv.phase_ms["inference"] == pytest.approx(2.0) and iv.phase_ms["queue"] == pytest.approx(0.1)


def test_counter_reset_after_a_restart_counts_from_zero() -> None:
    a = prom.parse(metrics_text(5, "text-classification"), at=0.0)
    b = prom.parse(metrics_text(1, "text-classification"), at=2.0)
    iv = prom.interval(a, b)
    assert iv.requests_per_s == pytest.approx(11 / 2)
    assert iv.latency_ms[0.5] == pytest.approx(5.0)


def test_samples_of_several_workers_are_summed() -> None:
    text = (
        "# TYPE hare_requests_total counter\n"
        'hare_requests_total{route="/predict",status="200",pid="1"} 4\n'
        'hare_requests_total{route="/predict",status="200",pid="2"} 6\n'
        'hare_requests_total{route="/info",status="200",pid="2"} 1\n'
    )
    snap = prom.parse(text, 0.0)
    assert snap.total(prom.REQUESTS) == 11 and snap.total(prom.REQUESTS, route="/predict") == 10
    assert snap.by_label(prom.REQUESTS, "route") == {"/predict": 10.0, "/info": 1.0}


def test_parse_rejects_text_that_is_not_prometheus() -> None:
    with pytest.raises(ValueError):
        prom.parse("<html>hello</html>\n", 0.0)


def test_history_rows_for_charts() -> None:
    history = prom.History(keep=3)
    for n in range(1, 6):
        history.add(prom.parse(metrics_text(n, "text-classification"), at=float(n)))
    intervals = history.intervals()
    assert len(intervals) == 2  # only the last three scrapes are kept
    rows = prom.timeline_rows(intervals, origin=3.0)
    assert [r["t"] for r in rows] == [1.0, 2.0]
    assert rows[0]["latency p50 ms"] == pytest.approx(5.0) and "inference p99 ms" in rows[0]
    shares = prom.label_share_rows(intervals, origin=3.0)
    assert shares[0] == {"t": 1.0, "label": "NEGATIVE", "share": pytest.approx(0.3)}
    assert charts.label_share_area(shares).to_dict()["mark"]["type"] == "area"


def test_quantiles_cover_a_window_of_scrapes_and_say_how_many_requests() -> None:
    history = prom.History()
    for n in range(1, 8):  # a scrape every 2 s, 10 requests between scrapes
        history.add(prom.parse(metrics_text(n, "text-classification"), at=2.0 * n))
    intervals = history.intervals()
    assert [iv.window_s for iv in intervals] == [2.0, 4.0, 6.0, 8.0, 10.0, 10.0]
    assert intervals[0].latency_count == 10 and intervals[-1].latency_count == 50
    assert intervals[-1].requests_per_s == pytest.approx(11 / 2)  # rates stay per scrape interval
    assert intervals[-1].p99_bucket_ms == pytest.approx((10.0, 50.0))
    assert prom.bucket_around(0.5, [(0.1, 5.0), (0.2, 10.0), (float("inf"), 10.0)]) == (0.0, 0.1)
    assert [prom.needed_requests(q) for q in prom.QUANTILES] == [2, 10, 100]
    life = prom.lifetime(history.snapshots[-1])
    assert (life.requests, life.errors) == (77.0, 7.0) and life.latency_ms[0.5] == pytest.approx(5.0)
    assert history.watched_s == 12.0


def test_timeline_charts_format_axes_colour_each_series_and_skip_gaps() -> None:
    rows = [{"t": 2.1, "latency p50 ms": 3.0, "latency p99 ms": None}]
    spec = charts.timeline(rows, ["latency p50 ms", "latency p99 ms"], "ms").to_dict()
    assert spec["mark"]["type"] == "line" and spec["mark"]["point"]  # one interval still draws a dot
    assert spec["encoding"]["x"]["axis"]["format"] == charts.NUMBER == spec["encoding"]["y"]["axis"]["format"]
    assert spec["data"]["values"] == [{"t": 2.1, "series": "latency p50 ms", "value": 3.0}]  # no null points
    scale = spec["encoding"]["color"]["scale"]
    assert scale["domain"] == ["latency p50 ms", "latency p99 ms"] and len(set(scale["range"])) == 2
    stacked = charts.timeline(rows, ["latency p50 ms"], "ms", stacked=True).to_dict()
    assert stacked["mark"]["type"] == "area" and stacked["encoding"]["y"]["stack"] == "zero"
    bars = charts.count_bars([{"label": "a", "predictions": 3}], "label", "predictions").to_dict()
    assert bars["layer"][0]["encoding"]["x"]["axis"]["format"] == ",d"


def test_page_plots_after_two_scrapes(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_appliance("text-classification") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(live_page, default_timeout=30).run()
        assert "rates appear from the second one on" in at.info[0].value
        at.run()
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert float(metrics["requests/s"]) > 0 and metrics["latency p50"] == "5.00 ms"
    assert metrics["latency p99"] == "~46.0 ms"  # 10 requests: too few for a p99, and marked
    assert metrics["requests since start"] == "22"
    assert len(at.get("vega_lite_chart")) == 9  # seven timelines, label drift, labels since start


def test_page_says_no_traffic_since_it_watched_and_what_came_before(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before any inference request the charts would show "null" and "0.000000" axes.
    with fake_appliance("text-classification", mode="idle") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(live_page, default_timeout=30).run()
        at.run()
    assert not at.exception and not at.error
    info = at.info[0].value
    assert info.startswith("No inference request in the ") and "s this page has watched (since " in info
    assert info.endswith("The appliance has answered no inference request since it started.")
    assert not at.get("vega_lite_chart") and not at.metric
    # An appliance busy before the page looked: "no traffic yet" would be wrong; say what it answered.
    with fake_appliance("text-classification", mode="quiet") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(live_page, default_timeout=30).run()
        at.run()
    assert "Since it started, the appliance answered 550 inference requests (p50 5.00 ms, p99 46.0 ms" in (
        at.info[0].value
    )
    assert len(at.get("vega_lite_chart")) == 1  # the labels predicted since start


def test_page_says_when_metrics_cannot_be_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", closed_port_url())
    at = AppTest.from_function(live_page, default_timeout=30).run()
    assert "cannot reach" in at.error[0].value and not at.exception
    with fake_appliance(mode="html") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(live_page, default_timeout=30).run()
    assert "is this a hare appliance" in at.error[0].value and not at.exception
