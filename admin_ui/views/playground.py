"""Playground: send one request to the selected appliance and look at the answer the way its task reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import streamlit as st

from admin_ui import charts, state
from admin_ui import playground as pg
from admin_ui.client import ApplianceError, Prediction
from admin_ui.views import common

RESULT = "hare.playground.result"


def render() -> None:
    url = common.title_and_appliance("Playground")
    if url is None:
        st.info("Add an appliance on the Overview page first.")
        return
    p = state.describe(url)
    if p.error or p.info is None:
        st.error(p.error or f"{url} did not describe itself")
        return
    task = str(p.info["task"])
    st.caption(f"{url} · {task} · {p.info.get('architecture', '')} · variant {p.info.get('variant', '?')}")
    if not p.ready:
        st.warning(f"{url} is not ready yet (loading its model or draining); requests may be refused.")

    with st.form("hare-playground"):
        text, documents = _inputs(task)
        with st.expander("Parameters (JSON)"):
            accepted = p.info.get("parameters")
            if isinstance(accepted, list) and accepted:
                st.caption("This appliance accepts: " + ", ".join(str(a) for a in accepted))
            raw_params = st.text_area(
                "parameters", value=pg.form(task).parameters, key=f"hare-pg-params-{task}",
                label_visibility="collapsed",
            )  # fmt: skip
        sent = st.form_submit_button("Send", type="primary")
    if sent:
        _send(url, task, text, documents, raw_params)
    result = st.session_state.get(RESULT)
    if result and result["url"] == url and result["task"] == task:
        _show(task, result["request"], result["prediction"], p.info.get("max_length"))


def _inputs(task: str) -> tuple[str, str]:
    form = pg.form(task)
    if form.form == "pairs":
        query = st.text_input("Query", value=form.example, key=f"hare-pg-query-{task}")
        docs = st.text_area("Documents, one per line", value=form.documents, key=f"hare-pg-docs-{task}", height=140)
        return query, docs
    if form.form == "sentences":
        return st.text_area("Sentences, one per line", value=form.example, key=f"hare-pg-text-{task}", height=140), ""
    text = st.text_area("Text", value=form.example, key=f"hare-pg-text-{task}", height=100)
    if form.form == "text-pair":
        hint = 'inference (NLI) and paraphrase models read two texts: sent as {"text", "text_pair"}'
        return text, st.text_input("Paired with (optional)", key=f"hare-pg-pair-{task}", help=hint)
    return text, ""


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (Python's json reads it, but no server does)")


def _send(url: str, task: str, text: str, documents: str, raw_params: str) -> None:
    # A new attempt puts the last answer away first: its heatmap and timings stayed under a refusal of this one
    # ("Type at least one sentence", bad JSON, a 422) and read as this request's answer.
    st.session_state.pop(RESULT, None)
    try:
        inputs = pg.build_inputs(task, text, documents)
    except ValueError as exc:
        st.warning(str(exc).capitalize())
        return
    try:
        params = json.loads(raw_params or "{}", parse_constant=_no_constant)
        if not isinstance(params, dict):
            raise ValueError("parameters must be a JSON object")
    except ValueError as exc:
        st.error(f"The parameters are not a JSON object: {exc}")
        return
    try:
        with state.client(url) as client:
            prediction = client.predict(inputs, params)
    except ApplianceError as exc:
        st.error(str(exc))
        return
    st.session_state[RESULT] = {"url": url, "task": task, "request": inputs, "prediction": prediction}


def _labels(request: Any, output: Any) -> None:
    rows = pg.classification_rows(output)
    st.altair_chart(charts.score_bars(rows), width="stretch", height=charts.rows_height(len(rows)))


def _entities(request: Any, output: Any) -> None:
    rows = pg.entity_rows(output)
    st.html(pg.highlight_html(pg.segments(request, rows)))
    if rows:
        st.dataframe(rows, hide_index=True, width="stretch")
    else:
        st.caption("No entity found.")


SIMILARITY_MAX = 40  # sentences the similarity heatmap compares, at most (the first ones)


def _similarity(request: Any, output: Any) -> None:
    vecs = pg.vectors(output)
    sentences = request if isinstance(request, list) else [request]
    st.caption(f"{len(vecs)} vector(s) of {len(vecs[0])} dimensions")
    if len(vecs) > SIMILARITY_MAX:  # n x n cells: 1,000 sentences held the page for minutes and took 9 GB
        st.caption(f"Similarity of the first {SIMILARITY_MAX} of the {len(vecs)} sentences")
        vecs, sentences = vecs[:SIMILARITY_MAX], sentences[:SIMILARITY_MAX]
    if len(vecs) > 1:
        rows = pg.similarity_rows(sentences, pg.cosine_matrix(vecs))
        height = charts.rows_height(len(vecs), per_row=48, axes=120)
        st.altair_chart(charts.heatmap(rows), width="stretch", height=height)
    else:
        st.caption("Give several sentences (one per line) to see how similar they are.")


def _ranking(request: Any, output: Any) -> None:
    rows = pg.ranking_rows(output, request["documents"])
    bars = [{"document": f"{r['rank']}. {r['document'][:60]}", "score": r["score"]} for r in rows]
    chart = charts.score_bars(bars, label="document", unit_range=False)
    st.altair_chart(chart, width="stretch", height=charts.rows_height(len(bars)))
    st.dataframe(rows, hide_index=True, width="stretch")


def _terms(request: Any, output: Any) -> None:
    rows = pg.term_rows(output)
    st.caption("The heaviest vocabulary entries of the (first) text, by token id")
    chart = charts.score_bars(rows, label="term", unit_range=False)
    st.altair_chart(chart, width="stretch", height=charts.rows_height(len(rows)))


# Playground.view (each task's spec names one) -> how its answer is drawn
VIEWS: dict[str, Callable[[Any, Any], None]] = {
    "labels": _labels,
    "entities": _entities,
    "similarity": _similarity,
    "ranking": _ranking,
    "terms": _terms,
}


def _show(task: str, request: Any, prediction: Prediction, max_length: Any) -> None:
    st.subheader("Answer", anchor=False)
    # A dict is a pair (a ranking's query and documents, a classifier's text and text_pair): never windows.
    note = pg.truncation_note(prediction.truncated, prediction.tokens, max_length, not isinstance(request, dict))
    if note:
        st.warning(note)
    try:
        VIEWS[pg.form(task).view](request, prediction.output)
    except pg.ShapeError as exc:
        st.error(f"The appliance's answer does not fit its task: {exc}")
    _timing(prediction)
    with st.expander("Raw JSON"):
        st.json(prediction.output, expanded=False)


def _timing(prediction: Prediction) -> None:
    compute = prediction.compute_time_s
    phases = pg.timing_rows(prediction.phases_ms)
    # A row that wraps: each figure keeps its width (and its unit) instead of being squeezed to "11.8 …".
    with st.container(horizontal=True, gap="large"):
        st.metric("x-compute-time", f"{compute * 1000:.2f} ms" if compute is not None else "–", width="content")
        st.metric("round trip (console)", f"{prediction.round_trip_s * 1000:.1f} ms", width="content")
        st.metric("server phases", f"{sum(r['ms'] for r in phases):.2f} ms" if phases else "–", width="content")
        st.metric(
            "tokens read",
            f"{prediction.tokens:,}" if prediction.tokens is not None else "–",
            help="x-compute-tokens: tokens fed to the model, special tokens and every window included",
            width="content",
        )
    if phases:
        st.altair_chart(charts.timing_bar(phases), width="stretch")
