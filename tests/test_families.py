"""Every model family through `hare optimize` and the served API, against the model's own library: the
transformers pipeline (classification, NER), sentence-transformers (embeddings) and CrossEncoder (ranking).

Fast suite: each family with one task (tasks rotated over families); the other pairs under `slow`. The
bundles are fp32 (exact parity, 1e-4); int8 variants and their gates are covered per family in
test_optimize_stages.py. The support table in docs/optimizer.md is checked against the same family list.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.api_helpers import assert_ranked, serve
from tests.conftest import ModelFactory
from tests.test_token_spans import without_edge_spaces
from tests.tiny_models import ARCHS, FAST_PAIRS, SLOW_PAIRS

pytestmark = pytest.mark.anyio
TOL = 1e-4
TEXTS = [
    "Angela Merkel met Emmanuel Macron in Paris and Berlin.",
    "The quick brown fox jumps over the lazy dog",
    "Zyxw qqq ÄÖÜ über naïve café!",
    "hello",
]
DOCUMENTS = [*TEXTS, "Paris is the capital of France"]
FAMILIES_PAGE = Path(__file__).resolve().parent.parent / "docs" / "optimizer.md"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def predict(client: httpx.AsyncClient, inputs: object, **parameters: object) -> Any:
    response = await client.post("/predict", json={"inputs": inputs, "parameters": parameters})
    assert response.status_code == 200, response.text
    return response.json()


async def _classification(client: httpx.AsyncClient, model: Path) -> None:
    from transformers import pipeline

    for function in ("softmax", "sigmoid"):
        classify: Any = pipeline("text-classification", model=str(model), top_k=None, function_to_apply=function)
        reference = classify(TEXTS)
        ours = await predict(client, TEXTS, top_k=None, function_to_apply=function)
        for ref, got in zip(reference, ours, strict=True):
            assert [r["label"] for r in ref] == [g["label"] for g in got]
            assert np.allclose([r["score"] for r in ref], [g["score"] for g in got], atol=TOL)


async def _entities(client: httpx.AsyncClient, model: Path) -> None:
    from transformers import pipeline

    for strategy in ("none", "simple", "max"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BPE/Unigram tokenizers "do not support real words": expected
            reference = pipeline("token-classification", model=str(model), aggregation_strategy=strategy)(TEXTS)
        ours = await predict(client, TEXTS, aggregation_strategy=strategy, ignore_labels=[])
        for text, ref, got in zip(TEXTS, reference, ours, strict=True):
            # The pipeline drops "O" by default; ours was asked for every label, so compare the non-O ones.
            # Spans leave out edge whitespace, which some tokenizers' offsets carry (test_token_spans.py).
            got = [e for e in got if e.get("entity", e.get("entity_group")) != "O"]
            assert [without_edge_spaces(text, e) for e in ref] == [
                {k: v for k, v in e.items() if k != "score"} for e in got
            ], strategy
            assert np.allclose([e["score"] for e in ref], [e["score"] for e in got], atol=TOL)


async def _embeddings(client: httpx.AsyncClient, model: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(model), device="cpu").encode(TEXTS)
    ours = np.array(await predict(client, TEXTS), dtype=np.float32)
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).max() < TOL


async def _ranking(client: httpx.AsyncClient, model: Path) -> None:
    from sentence_transformers import CrossEncoder

    query = "capital of France"
    expected = CrossEncoder(str(model), device="cpu").predict([(query, d) for d in DOCUMENTS])
    ranked = await predict(client, {"query": query, "documents": DOCUMENTS})
    assert_ranked(ranked, expected, TOL)


CHECKS = {
    "text-classification": _classification,
    "token-classification": _entities,
    "feature-extraction": _embeddings,
    "text-ranking": _ranking,
}


@pytest.mark.parametrize(
    ("arch", "task"), [*FAST_PAIRS, *(pytest.param(*pair, marks=pytest.mark.slow) for pair in SLOW_PAIRS)]
)
async def test_served_answers_equal_the_models_own_library(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory, arch: str, task: str
) -> None:
    async with serve(fp32_bundle(task, arch)) as client:
        await CHECKS[task](client, tiny_model(task, arch))


def test_the_support_table_lists_the_families_the_tests_prove() -> None:
    text = FAMILIES_PAGE.read_text()
    table = text[text.index("<!-- families -->") : text.index("<!-- /families -->")]
    rows = re.findall(r"^\| `([a-z0-9_-]+)` \|", table, flags=re.MULTILINE)
    assert rows == list(ARCHS)
