"""Playground: request building, answer shaping for each task, and the page end to end against a fake."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import charts
from admin_ui import playground as pg
from tests.test_console_support import closed_port_url, fake_appliance, playground_page


def test_build_inputs_per_task() -> None:
    assert pg.build_inputs("text-classification", "hi") == "hi"
    assert pg.build_inputs("text-classification", "hi", " there ") == {"text": "hi", "text_pair": "there"}
    assert pg.build_inputs("token-classification", "hi", "there") == "hi"  # no pairs there
    assert pg.build_inputs("feature-extraction", "a\n\n b \n") == ["a", "b"]
    assert pg.build_inputs("feature-extraction", "only one") == "only one"
    assert pg.build_inputs("text-ranking", " q ", "d1\nd2") == {"query": "q", "documents": ["d1", "d2"]}
    with pytest.raises(ValueError, match="at least one document"):
        pg.build_inputs("text-ranking", "q", "  ")
    with pytest.raises(ValueError, match="type some text"):
        pg.build_inputs("token-classification", " ")


def test_classification_rows_sorted_and_unwrapped() -> None:
    answer = [[{"label": "a", "score": 0.1}, {"label": "b", "score": 0.9}]]
    assert pg.classification_rows(answer) == [{"label": "b", "score": 0.9}, {"label": "a", "score": 0.1}]
    assert pg.classification_rows({"label": "x", "score": 1}) == [{"label": "x", "score": 1.0}]
    with pytest.raises(pg.ShapeError, match="label, score"):
        pg.classification_rows([[0.1, 0.2]])


def test_entities_become_highlighted_segments() -> None:
    text = "Ada met <Bob> in Paris"
    rows = pg.entity_rows(
        [
            {"entity_group": "LOC", "score": 0.8, "word": "Paris", "start": 17, "end": 22},
            {"entity_group": "PER", "score": 0.9, "word": "Ada", "start": 0, "end": 3},
            {"entity_group": "PER", "score": 0.5, "word": "da", "start": 1, "end": 3},  # overlaps: skipped
        ]
    )
    parts = pg.segments(text, rows)
    assert [(p.text, p.label) for p in parts] == [("Ada", "PER"), (" met <Bob> in ", None), ("Paris", "LOC")]
    html = pg.highlight_html(parts)
    assert "&lt;Bob&gt;" in html and "<Bob>" not in html
    assert html.count('class="hare-entity"') == 2 and "PER</small>" in html


def test_vectors_and_cosine_heatmap() -> None:
    vecs = pg.vectors([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    m = pg.cosine_matrix(vecs)
    assert m[0][0] == pytest.approx(1.0) and m[0][1] == pytest.approx(0.0) and m[0][2] == pytest.approx(0.7071, 1e-3)
    assert pg.vectors([0.5, 0.5]) == [[0.5, 0.5]]
    assert pg.cosine_matrix([[0.0, 0.0], [1.0, 0.0]])[0] == [0.0, 0.0]
    rows = pg.similarity_rows(["a", "a", "c"], m)
    assert len(rows) == 9 and rows[1] == {"a": "1. a", "b": "2. a", "similarity": 0.0}
    spec = charts.heatmap(rows).to_dict()
    assert spec["layer"][0]["mark"]["type"] == "rect"
    with pytest.raises(pg.ShapeError, match="different lengths"):
        pg.vectors([[1.0], [1.0, 2.0]])
    with pytest.raises(pg.ShapeError, match="feature-extraction"):
        pg.vectors([{"label": "x"}])


def test_ranking_rows_attach_documents() -> None:
    rows = pg.ranking_rows([{"index": 1, "score": 0.2}, {"index": 0, "score": 3.5}], ["first", "second"])
    assert rows == [
        {"rank": 1, "index": 0, "document": "first", "score": 3.5},
        {"rank": 2, "index": 1, "document": "second", "score": 0.2},
    ]
    with pytest.raises(pg.ShapeError, match="names document 5"):
        pg.ranking_rows([{"index": 5, "score": 1.0}], ["a"])


def test_timing_rows_in_pipeline_order() -> None:
    rows = pg.timing_rows({"inference": 2.0, "zeta": 0.1, "tokenize": 0.3})
    assert [r["phase"] for r in rows] == ["tokenize", "inference", "zeta"]
    spec = charts.timing_bar(rows).to_dict()
    assert spec["mark"]["type"] == "bar" and spec["encoding"]["x"]["stack"] == "zero"
    assert spec["encoding"]["y"]["field"] == "bar"  # one category, or Vega-Lite draws no bar at all


def _send(at: AppTest) -> AppTest:
    return at.button[0].click().run()  # the form's Send button


@pytest.mark.parametrize("task", ["text-classification", "token-classification", "feature-extraction", "text-ranking"])
def test_page_sends_and_shows_each_task(monkeypatch: pytest.MonkeyPatch, task: str) -> None:
    with fake_appliance(task) as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = _send(AppTest.from_function(playground_page, default_timeout=30).run())
    assert not at.exception and not at.error
    assert fake.requests and "inputs" in fake.requests[0]
    if task == "text-classification":
        assert fake.requests[0]["parameters"] == {"top_k": None}  # every label's bar
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["x-compute-time"] == "2.20 ms"
    assert metrics["server phases"] == "2.20 ms"
    if task == "token-classification":
        assert "Ada Lovelace" in at.get("html")[0].proto.body
        assert list(at.dataframe[0].value["entity"]) == ["PER", "LOC"]
    if task == "text-ranking":
        assert list(at.dataframe[0].value["rank"]) == [1, 2, 3]
    if task == "feature-extraction":
        assert any("3 vector(s) of 3 dimensions" in c.value for c in at.caption)


def test_page_sends_a_pair_to_a_classifier(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_appliance("text-classification") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(playground_page, default_timeout=30).run()
        at.text_input(key="hare-pg-pair-text-classification").input("It is quick.")
        at = _send(at)
    assert not at.exception and not at.error
    text = pg.form("text-classification").example
    assert fake.requests[0]["inputs"] == {"text": text, "text_pair": "It is quick."}
    assert {m.label: m.value for m in at.metric}["x-compute-time"] == "2.20 ms"  # answered as for one text


def test_page_reports_problems_without_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_appliance("text-classification", mode="error") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = _send(AppTest.from_function(playground_page, default_timeout=30).run())
        assert [e.value for e in at.error] == [
            "POST /predict failed (422 input_too_long): input 0 has 900 tokens; this model takes 128"
        ]
        at.text_area(key="hare-pg-params-text-classification").input("[1, 2]")
        at = _send(at)
        assert "not a JSON object" in at.error[0].value
        at.text_area(key="hare-pg-params-text-classification").input("{}")
        at.text_area(key="hare-pg-text-text-classification").input("   ")
        at = _send(at)
        assert at.warning[0].value == "Type some text first"
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", closed_port_url())
    at = AppTest.from_function(playground_page, default_timeout=30).run()
    assert "cannot reach" in at.error[0].value and not at.exception


def test_page_reports_an_answer_of_the_wrong_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    with fake_appliance("text-classification") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        monkeypatch.setattr("tests.test_console_support.predict_output", lambda task, inputs: [[0.1, 0.9]])
        at = _send(AppTest.from_function(playground_page, default_timeout=30).run())
    assert "does not fit its task" in at.error[0].value and not at.exception


def test_page_says_when_the_server_cut_the_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 2,000-word text is answered about its first 128 tokens: the page says so, and how many were read."""
    with fake_appliance("text-classification") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(playground_page, default_timeout=30).run()
        at.text_area(key="hare-pg-text-text-classification").input("word " * 2000)
        at = _send(at)
        assert not at.exception and not at.error
        assert at.warning[0].value.startswith(
            "The input was longer than the model's maximum length of 128 tokens and was cut to it "
            "(128 tokens read in all)"
        )
        assert {m.label: m.value for m in at.metric}["tokens read"] == "128"
        at.text_area(key="hare-pg-text-text-classification").input("a short text")
        at = _send(at)
    assert not at.warning and {m.label: m.value for m in at.metric}["tokens read"] == "5"


def test_truncation_note() -> None:
    assert pg.truncation_note(False, 12, 128) == ""
    assert "maximum length and was cut to it:" in pg.truncation_note(True, None, None)
    assert '"long_input": "window"' in pg.truncation_note(True, 128, 128)
    assert "window" not in pg.truncation_note(True, 128, 128, windows=False)  # a pair is never read in windows


def test_page_compares_at_most_the_first_sentences(monkeypatch: pytest.MonkeyPatch) -> None:
    """1,000 sentences answered at once held the page for minutes and grew the console to 9 GB: a heatmap of a
    million cells. It compares the first SIMILARITY_MAX and says so."""
    from admin_ui.views.playground import SIMILARITY_MAX

    with fake_appliance("feature-extraction") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(playground_page, default_timeout=30).run()
        text = "\n".join(f"sentence {i}" for i in range(300))
        at.text_area(key="hare-pg-text-feature-extraction").input(text)
        at = _send(at)
    assert not at.exception and not at.error
    captions = [c.value for c in at.caption]
    assert "300 vector(s) of 3 dimensions" in captions
    assert f"Similarity of the first {SIMILARITY_MAX} of the 300 sentences" in captions


def test_page_refuses_parameters_no_server_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # NaN passed json.loads and failed in httpx: "The Playground page failed unexpectedly: ValueError".
    with fake_appliance("feature-extraction") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_function(playground_page, default_timeout=30).run()
        at.text_area(key="hare-pg-params-feature-extraction").input('{"dimensions": NaN}')
        at = _send(at)
    assert not at.exception and not fake.requests
    assert [e.value for e in at.error] == [
        "The parameters are not a JSON object: NaN is not JSON (Python's json reads it, but no server does)"
    ]


def test_a_new_attempt_puts_the_last_answer_away(monkeypatch: pytest.MonkeyPatch) -> None:
    # The last heatmap and timings stayed under "Type at least one sentence", bad JSON or a 422, as if its answer.
    def answered(at: AppTest) -> bool:
        return bool(at.metric) or bool(at.get("arrow_vega_lite_chart")) or bool(at.subheader)

    with fake_appliance("feature-extraction") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = _send(AppTest.from_function(playground_page, default_timeout=30).run())
        assert answered(at) and not at.error
        text = str(at.text_area(key="hare-pg-text-feature-extraction").value)
        at.text_area(key="hare-pg-text-feature-extraction").input("  ")
        at = _send(at)
        assert [w.value for w in at.warning] == ["Type at least one sentence (one per line)"] and not answered(at)
        at.text_area(key="hare-pg-text-feature-extraction").input(text)
        at = _send(at)
        assert answered(at)
        at.text_area(key="hare-pg-params-feature-extraction").input("{oops")
        at = _send(at)
        assert at.error[0].value.startswith("The parameters are not a JSON object") and not answered(at)
        at.text_area(key="hare-pg-params-feature-extraction").input("{}")
        assert answered(_send(at))
        fake.mode = "error"
        at = _send(at)
    assert [e.value for e in at.error] == [
        "POST /predict failed (422 input_too_long): input 0 has 900 tokens; this model takes 128"
    ]
    assert not answered(at) and not at.exception
