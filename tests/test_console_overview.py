"""Overview: /info turned into summary rows, and the page against live, dead and foreign appliances."""

from __future__ import annotations

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
    assert variants[1]["s8xb1 ms"] == 0.33 and list(variants[1])[-2:] == ["s8xb1 ms", "s128xb1 ms"]
    chosen = overview.chosen_variant(data)
    assert chosen is not None and chosen["name"] == "int8"
    gates = overview.gate_rows(chosen)
    assert gates[0] == {"metric": "token_agreement", "value": 0.995, "threshold": 0.98, "verdict": "pass"}
    assert gates[1]["metric"] == "max_abs_diff" and gates[1]["verdict"] == "not gated"
    assert overview.gate_rows(None) == []


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


def test_markdown_tables_escape_what_markdown_would_eat() -> None:
    from admin_ui.views.common import escape_markdown, markdown_table

    assert escape_markdown("my_model_v2 *x* a|b\nc") == "my\\_model\\_v2 \\*x\\* a\\|b c"
    table = markdown_table([{"name": "a_b", "n": 1.5, "none": None}, {"name": "c", "n": 12, "none": None}])
    assert table.splitlines() == [
        "| name | n | none |",
        "| --- | ---: | --- |",
        "| a\\_b | 1.50 | – |",
        "| c | 12 | – |",
    ]
    assert markdown_table([]) == ""


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
    # Small Markdown tables: long values wrap rather than being cut, empty cells read "–", never "None".
    tables = [m.value for m in at.markdown if m.value.startswith("| ")]
    summary, gates = tables[0].splitlines(), tables[1].splitlines()
    assert summary[:2] == ["| field | value |", "| --- | --- |"]
    assert "| task | text-classification |" in summary
    assert "| batching | max batch size 32, max batch tokens 8192, max wait ms 2, max queue 256 |" in summary
    assert gates[:2] == ["| metric | value | threshold | verdict |", "| --- | ---: | ---: | --- |"]
    assert gates[2:] == ["| top1\\_agreement | 0.995 | 0.98 | pass |", "| max\\_abs\\_diff | 0.012 | – | not gated |"]
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
