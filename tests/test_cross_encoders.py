"""Cross-encoders scored as sentence-transformers' CrossEncoder scores them: the activation from the model's
config (activation_fn, or the pre-v4 sbert_ce_default_activation_function), sigmoid by default for one logit,
and the last label's probability for two-label heads (fp32 bundles, within 1e-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from container.bundle import read_manifest
from tests.api_helpers import assert_ranked, serve
from tests.conftest import quick_bundle
from tests.tiny_models import make_model

pytestmark = pytest.mark.anyio
QUERY = "capital of France"
DOCUMENTS = ["Paris is the capital of France", "The quick brown fox", "Berlin is in Germany", "hello"]
TOL = 1e-4


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _bundle(tmp_path: Path, **config: Any) -> tuple[Path, Path]:
    model = make_model(tmp_path / "model", "text-ranking", "electra", **config)
    return model, quick_bundle(model, "text-ranking", tmp_path / "bundle")


@pytest.mark.parametrize(
    ("config", "activation"),
    [
        ({}, "sigmoid"),
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}, "identity"),
        ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}, "tanh"),
    ],
)
async def test_one_logit_scores_equal_cross_encoder_predict(
    tmp_path: Path, config: dict[str, Any], activation: str
) -> None:
    from sentence_transformers import CrossEncoder

    model, bundle = _bundle(tmp_path, **config)
    assert read_manifest(bundle).activation == activation
    expected = CrossEncoder(str(model), device="cpu").predict([(QUERY, d) for d in DOCUMENTS])
    async with serve(bundle) as client:
        response = await client.post("/predict", json={"inputs": {"query": QUERY, "documents": DOCUMENTS}})
    ranked = response.json()
    assert_ranked(ranked, expected, TOL)


async def test_two_label_heads_score_the_last_label(tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    labels = {"id2label": {0: "irrelevant", 1: "relevant"}, "label2id": {"irrelevant": 0, "relevant": 1}}
    model, bundle = _bundle(tmp_path, **labels)
    expected = CrossEncoder(str(model), device="cpu").predict([(QUERY, d) for d in DOCUMENTS], apply_softmax=True)
    assert expected.shape == (len(DOCUMENTS), 2)
    inputs = {"query": QUERY, "documents": DOCUMENTS}
    async with serve(bundle) as client:
        response = await client.post("/predict", json={"inputs": inputs})
        raw = await client.post("/predict", json={"inputs": inputs, "parameters": {"raw_scores": True}})
    scores = {r["index"]: r["score"] for r in response.json()}
    assert np.allclose([scores[i] for i in range(len(DOCUMENTS))], expected[:, 1], atol=TOL)
    # raw_scores: the logit whose sigmoid is the score, in the score's order. It was the last label's own logit,
    # which ranked the documents otherwise and changed what top_n kept.
    assert [r["index"] for r in raw.json()] == [r["index"] for r in response.json()]
    logits = {r["index"]: r["score"] for r in raw.json()}
    assert np.allclose([1 / (1 + np.exp(-logits[i])) for i in range(len(DOCUMENTS))], expected[:, 1], atol=TOL)
