"""The Playground's logic: build a /predict request for a task and turn the answer into tables and figures.

Every function here is pure (JSON in, rows or HTML out), so the page stays a thin layer of widgets. An answer
of the wrong shape (a server of another task, a changed contract) raises `ShapeError` with a sentence that
says what was expected.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tasks.base import Playground
from tasks.registry import TASKS

PHASES = ("tokenize", "queue", "inference", "postprocess")

# Highlight colours for entity groups, in order of first appearance (colour-blind-safe Okabe-Ito palette).
PALETTE = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")


class ShapeError(ValueError):
    """The appliance answered, but not in the shape this task's contract promises."""


def lines(text: str) -> list[str]:
    """Non-empty lines, stripped: how the page reads several sentences or documents from one text area."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def form(task: str) -> Playground:
    """The task's playground: its form, its drawing and its example, from the task's spec (tasks/)."""
    return TASKS[task].playground


def build_inputs(task: str, text: str, documents: str = "") -> Any:
    """The `inputs` of a /predict request for `task` (`documents`: a ranking's, one per line, or the text a
    classifier's text is paired with); raises ValueError with what to type when it is empty."""
    kind = form(task).form
    if kind == "pairs":
        docs = lines(documents)
        if not text.strip() or not docs:
            raise ValueError("type a query and at least one document (one per line)")
        return {"query": text.strip(), "documents": docs}
    if kind == "sentences":
        sentences = lines(text)
        if not sentences:
            raise ValueError("type at least one sentence (one per line)")
        return sentences if len(sentences) > 1 else sentences[0]
    if not text.strip():
        raise ValueError("type some text first")
    if kind == "text-pair" and documents.strip():
        return {"text": text, "text_pair": documents.strip()}
    return text


def _unwrap_single(output: Any) -> Any:
    """A pipeline answers one input with a list, and sometimes a list of one list; take the first input's."""
    if isinstance(output, list) and len(output) == 1 and isinstance(output[0], list):
        return output[0]
    return output


def _records(output: Any, keys: Sequence[str], task: str) -> list[dict[str, Any]]:
    output = _unwrap_single(output)
    if isinstance(output, dict):
        output = [output]
    if not isinstance(output, list) or not all(isinstance(r, dict) and set(keys) <= set(r) for r in output):
        raise ShapeError(f"a {task} answer is a list of objects with {', '.join(keys)}; got {_preview(output)}")
    return output


def _preview(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def classification_rows(output: Any) -> list[dict[str, Any]]:
    """text-classification `[{"label","score"}]` -> rows sorted by score, highest first."""
    rows = _records(output, ("label", "score"), "text-classification")
    return sorted(({"label": str(r["label"]), "score": float(r["score"])} for r in rows), key=lambda r: -r["score"])


@dataclass(frozen=True)
class Segment:
    """A stretch of the input text, with its entity group when it is part of an entity."""

    text: str
    label: str | None = None
    score: float | None = None


def entity_rows(output: Any) -> list[dict[str, Any]]:
    """token-classification `[{"entity_group","score","word","start","end"}]` -> rows in text order."""
    rows = _records(output, ("entity_group", "score", "start", "end"), "token-classification")
    out = [
        {
            "entity": str(r["entity_group"]),
            "word": str(r.get("word", "")),
            "score": float(r["score"]),
            "start": int(r["start"]),
            "end": int(r["end"]),
        }
        for r in rows
    ]
    return sorted(out, key=lambda r: (r["start"], r["end"]))


def segments(text: str, entities: Sequence[dict[str, Any]]) -> list[Segment]:
    """Cut `text` into plain and entity segments using the entities' character offsets.

    Overlapping or out-of-range entities are skipped rather than garbling the text.
    """
    out: list[Segment] = []
    pos = 0
    for e in sorted(entities, key=lambda r: (r["start"], r["end"])):
        start, end = int(e["start"]), int(e["end"])
        if start < pos or end <= start or end > len(text):
            continue
        if start > pos:
            out.append(Segment(text[pos:start]))
        out.append(Segment(text[start:end], str(e["entity"]), float(e["score"])))
        pos = end
    if pos < len(text):
        out.append(Segment(text[pos:]))
    return out


def label_colours(labels: Sequence[str]) -> dict[str, str]:
    """A stable colour per label, in order of first appearance."""
    colours: dict[str, str] = {}
    for label in labels:
        if label not in colours:
            colours[label] = PALETTE[len(colours) % len(PALETTE)]
    return colours


def highlight_html(parts: Sequence[Segment]) -> str:
    """Segments -> HTML with each entity in a coloured <mark> tagged with its group (text escaped)."""
    colours = label_colours([p.label for p in parts if p.label])
    out = []
    for p in parts:
        text = html.escape(p.text)
        if p.label is None:
            out.append(text)
            continue
        title = f"{p.label} {p.score:.3f}" if p.score is not None else p.label
        out.append(
            f'<mark class="hare-entity" title="{html.escape(title)}" style="background:{colours[p.label]}33;'
            f"border:1px solid {colours[p.label]};border-radius:4px;padding:0 3px;color:inherit"
            f'">{text} <small style="font-weight:600;color:{colours[p.label]}">{html.escape(p.label)}</small></mark>'
        )
    return '<div class="hare-ner" style="line-height:2.2;font-size:1.05rem">' + "".join(out) + "</div>"


def vectors(output: Any) -> list[list[float]]:
    """feature-extraction output -> one vector per input (a single vector is one input)."""
    if isinstance(output, list) and output and all(isinstance(x, (int, float)) for x in output):
        output = [output]
    ok = (
        isinstance(output, list)
        and output
        and all(isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v) for v in output)
    )
    if not ok:
        raise ShapeError(f"a feature-extraction answer is a vector or a list of vectors; got {_preview(output)}")
    if len({len(v) for v in output}) != 1:
        raise ShapeError("the vectors have different lengths")
    return [[float(x) for x in v] for v in output]


def cosine_matrix(vecs: Sequence[Sequence[float]]) -> list[list[float]]:
    """Pairwise cosine similarities (a zero vector is similar to nothing)."""
    norms = [math.sqrt(sum(x * x for x in v)) for v in vecs]
    return [
        [
            sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb) if na > 0 and nb > 0 else 0.0
            for b, nb in zip(vecs, norms, strict=True)
        ]
        for a, na in zip(vecs, norms, strict=True)
    ]


def similarity_rows(sentences: Sequence[str], matrix: Sequence[Sequence[float]]) -> list[dict[str, Any]]:
    """Long-form (a, b, similarity) rows for a heatmap; sentences are numbered so duplicates stay apart."""
    names = [f"{i + 1}. {_short(s)}" for i, s in enumerate(sentences)]
    return [
        {"a": names[i], "b": names[j], "similarity": round(matrix[i][j], 4)}
        for i in range(len(names))
        for j in range(len(names))
    ]


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ranking_rows(output: Any, documents: Sequence[str]) -> list[dict[str, Any]]:
    """text-ranking `[{"index","score"}]` -> rows ranked by score with the document text."""
    rows = _records(output, ("index", "score"), "text-ranking")
    out: list[dict[str, Any]] = []
    for r in rows:
        i = int(r["index"])
        if not 0 <= i < len(documents):
            raise ShapeError(f"the ranking names document {i}, but only {len(documents)} were sent")
        out.append({"index": i, "document": documents[i], "score": float(r["score"])})
    out.sort(key=lambda r: -float(r["score"]))
    return [{"rank": k + 1, **r} for k, r in enumerate(out)]


def term_rows(output: Any, limit: int = 20) -> list[dict[str, Any]]:
    """sparse-embedding: the (first) text's heaviest vocabulary entries, best first: `[{"index", "value"}]`
    (SPLADE), or a bge-m3 answer's `lexical_weights` ({token id: weight})."""
    first = output[0] if isinstance(output, list) and output and isinstance(output[0], list) else output
    if isinstance(first, dict):
        weights = first.get("lexical_weights")
        if isinstance(weights, list):  # several texts: the first one's
            weights = weights[0] if weights else {}
        if not isinstance(weights, dict):
            raise ShapeError("a bge-m3 answer without lexical_weights: ask for them with return_sparse")
        pairs = [(str(k), float(v)) for k, v in weights.items()]
    elif isinstance(first, list):
        pairs = [(str(e["index"]), float(e["value"])) for e in _records(first, ("index", "value"), "sparse-embedding")]
    else:
        raise ShapeError(f"expected sparse entries, got {_preview(output)}")
    pairs.sort(key=lambda p: -p[1])
    return [{"term": f"#{t}", "score": w} for t, w in pairs[:limit]]


def timing_rows(phases_ms: dict[str, float]) -> list[dict[str, Any]]:
    """Server-Timing phases in pipeline order (known phases first), for a one-bar breakdown."""
    order = [p for p in PHASES if p in phases_ms] + sorted(p for p in phases_ms if p not in PHASES)
    return [{"phase": p, "ms": phases_ms[p], "order": k} for k, p in enumerate(order)]


def truncation_note(truncated: bool, tokens: int | None, max_length: Any, windows: bool = True) -> str:
    """What the page says when the server cut an input to the model's maximum length (its x-truncated
    header): the answer is about the beginning of the text only. `windows`: the request could have asked for
    windows instead (single texts can; a ranking's or a classifier's pairs cannot)."""
    if not truncated:
        return ""
    limit = f" of {max_length:,} tokens" if isinstance(max_length, int) else ""
    read = f" ({tokens:,} tokens read in all)" if tokens is not None else ""
    window = ', or `"long_input": "window"` to read all of it' if windows else ""
    return (
        f"The input was longer than the model's maximum length{limit} and was cut to it{read}: the answer is "
        f'about its beginning only. Send `"truncate": false` to be refused instead{window}.'
    )
