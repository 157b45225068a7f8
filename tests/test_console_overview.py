"""Overview: /info turned into summary rows, and the page against live, dead and foreign appliances."""

from __future__ import annotations

import re

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import overview
from tests.test_console_support import closed_port_url, fake_appliance, info, overview_page


def test_summary_rows_name_what_is_served() -> None:
    rows = {r["field"]: r["value"] for r in overview.summary_rows(info("text-classification"))}
    assert rows["task"] == "text-classification"
    assert rows["model"] == "tiny-text-classification"
    assert rows["architecture"] == "BertForSequenceClassification / bert"
    assert rows["labels"] == "2: NEGATIVE, POSITIVE"
    assert rows["max length"] == "128"
    assert rows["variant"] == "int8 int8 cpu"
    assert rows["workers × streams × threads"] == "1 × 2 × 1"
    assert rows["batching"] == "max batch size 32, max batch tokens 8192, max wait ms 2, max queue 256"
    assert "pooling" not in rows


def test_summary_rows_of_an_embedder_show_pooling_and_tolerate_gaps() -> None:
    rows = {r["field"]: r["value"] for r in overview.summary_rows(info("feature-extraction"))}
    assert rows["pooling"] == "mean, normalized"
    assert rows["labels"] == "-"
    sparse = {r["field"]: r["value"] for r in overview.summary_rows({"task": "text-ranking"})}
    assert sparse["max length"] == "-" and sparse["workers × streams × threads"] == "- × - × -"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"1": "b", "0": "a", "10": "k", "2": "c"}, ["a", "b", "c", "k"]),
        ({0: "x"}, ["x"]),
        (["p", "q"], ["p", "q"]),
        (None, []),
    ],
)
def test_label_list_orders_by_id(labels: object, expected: list[str]) -> None:
    assert overview.label_list(labels) == expected


def test_variants_and_gates_of_the_chosen_variant() -> None:
    data = info("token-classification")
    variants = overview.variant_rows(data)
    assert [v["variant"] for v in variants] == ["fp32", "★ int8"]
    assert variants[1]["8×1"] == 0.33 and list(variants[1])[-2:] == ["8×1", "128×1"]
    chosen = overview.chosen_variant(data)
    assert chosen is not None and chosen["name"] == "int8"
    gates = overview.gate_rows(chosen)
    # Named in words; a figure no gate checks is information, not a verdict that reads as a fault.
    assert gates[0] == {
        "metric": "token labels agree with PyTorch", "value": 0.995, "threshold": 0.98, "verdict": "pass",
    }  # fmt: skip
    assert gates[1]["metric"] == "largest raw output difference" and gates[1]["verdict"] == "for information"
    assert overview.gate_rows(None) == []
    assert overview.metric_label("new_metric_p5") == "new metric p5"
    worst = overview.gate_rows({"metrics": {"max_abs_diff_tokens": 40.0}})
    assert worst == [{"metric": "tokens of the sample furthest from PyTorch", "value": 40, "threshold": None,
                      "verdict": "for information"}]  # fmt: skip


def test_a_failed_variant_says_why_under_the_table() -> None:
    # At 800 pixels the reason in its cell squeezed the variant, precision and gates columns to a letter a line.
    gated = {"name": "int8", "precision": "int8", "passed": False, "gates": {
        "cosine_p1": {"value": 0.981, "threshold": 0.99, "passed": False},
        "max_abs_diff": {"value": 0.5, "threshold": 1.0, "passed": True},
    }}  # fmt: skip
    broken = {"name": "mixed", "precision": "fp16", "passed": False, "error": "ORT refused the graph", "gates": {}}
    info = {"variants": [gated, broken, {"name": "fp32", "precision": "fp32", "passed": True, "chosen": True}]}
    rows = overview.variant_rows(info)
    assert [(r["variant"], r["gates"]) for r in rows] == [
        ("int8", "failed"), ("mixed (fp16)", "build failed"), ("★ fp32", "passed"),
    ]  # fmt: skip
    assert list(rows[0]) == ["variant", "MB", "gates"]
    assert overview.variant_failures(info) == [
        "int8: failed: cosine to PyTorch, 1st percentile 0.981 (needs 0.99)",
        "mixed: build failed: ORT refused the graph",
    ]


def test_short_words_in_a_table_break_between_words_only() -> None:
    # "precis/ion", "pas/sed": a cell that could break anywhere was squeezed to a few letters a line.
    from admin_ui.views.common import html_table

    page = html_table([{"precision": "int8", "path": "/very/long/path/to/a/model/folder/onnx", "n": 3}])
    assert '<th style="overflow-wrap:normal">precision</th>' in page
    assert '<td style="overflow-wrap:normal">int8</td>' in page
    assert '<td style="overflow-wrap:anywhere">/very/long/path/to/a/model/folder/onnx</td>' in page
    named = html_table([{"variant": "fused-int8-per-channel"}], whole=["variant"])
    assert '<td style="white-space:nowrap">fused-int8-per-channel</td>' in named


def test_versions_of_server_and_bundle_side_by_side() -> None:
    data = {
        "versions": {"hare": "0.1.0", "onnxruntime": "1.32.0", "bundle": {"onnxruntime": "1.31.0", "torch": "2.13"}}
    }
    assert overview.versions_rows(data) == [
        {"package": "hare", "server": "0.1.0", "bundle built with": "-"},
        {"package": "onnxruntime", "server": "1.32.0", "bundle built with": "1.31.0"},
        {"package": "torch", "server": "-", "bundle built with": "2.13"},
    ]
    assert overview.versions_rows({}) == []


def test_chosen_variant_falls_back_to_the_served_name() -> None:
    data = {"variant": "fp16", "variants": [{"name": "fp32"}, {"name": "fp16"}]}
    assert overview.chosen_variant(data) == {"name": "fp16"}


def test_small_tables_escape_their_text_and_scroll_rather_than_spill() -> None:
    from admin_ui.views.common import NUMBER_CELL, WORD_CELL, html_table

    table = html_table([{"name": "a_b <x>", "n": 1.5, "none": None}, {"name": "c", "n": 12, "none": None}])
    assert table.startswith('<div class="hare-table" style="overflow-x:auto"><table><thead><tr>')
    assert f'<td style="{WORD_CELL}">a_b &lt;x&gt;</td><td style="{NUMBER_CELL}">1.50</td>' in table
    assert f'<td style="{NUMBER_CELL}">12</td><td style="{WORD_CELL}">–</td>' in table
    assert html_table([]) == ""


def test_page_shows_each_appliance_or_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = closed_port_url()
    with fake_appliance("text-classification") as good, fake_appliance(mode="html") as foreign:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", f"{good.url},{dead},{foreign.url}")
        at = AppTest.from_function(overview_page, default_timeout=30).run()
    assert not at.exception
    headers = [h.value for h in at.subheader]
    assert headers[0].startswith(f"`{good.url}`") and "healthy" in headers[0] and "ready" in headers[0]
    errors = [e.value for e in at.error]
    assert any(dead in e and "cannot reach" in e for e in errors)
    assert any(foreign.url in e and "is this a hare appliance" in e for e in errors)
    # Small HTML tables: long values wrap rather than being cut, empty cells read "–", never "None".
    tables = [m.value for m in at.markdown if "<table>" in m.value]
    summary, gates = tables[0], tables[1]
    assert "<th" in summary and ">field</th>" in summary and ">text-classification</td>" in summary
    assert ">max batch size 32, max batch tokens 8192, max wait ms 2, max queue 256</td>" in summary
    heads = re.findall(r"<th[^>]*>([^<]*)</th>", gates)
    assert heads == ["metric", "value", "threshold", "verdict"]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", gates)
    assert cells == [
        "top label agrees with PyTorch", "0.995", "0.98", "pass",
        "largest raw output difference", "0.012", "–", "for information",
    ]  # fmt: skip
    assert not at.dataframe and not any("None" in t for t in tables)


def test_add_and_remove_appliances(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_appliance("text-ranking") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", closed_port_url())
        at = AppTest.from_function(overview_page, default_timeout=30).run()
        at.text_input(key="hare-add-url").input(fake.url.removeprefix("http://") + "/")
        at.button[0].click().run()  # the form's Add button
        assert at.session_state["hare.appliances"][-1] == fake.url
        assert any(h.value.startswith(f"`{fake.url}`") for h in at.subheader)
        at.text_input(key="hare-add-url").input("ftp://nope")
        at.button[0].click().run()
        assert any("Cannot add 'ftp://nope'" in e.value for e in at.error)
        at.button(key=f"hare-remove-{fake.url}").click().run()
    assert fake.url not in at.session_state["hare.appliances"]
    assert not at.exception
