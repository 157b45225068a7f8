"""The real default model end to end: /predict and /v1/embeddings on an fp32 all-MiniLM-L6-v2 bundle equal
sentence-transformers (max |Δ| 1e-4 per component; fp32 ONNX vs PyTorch differ by ~1e-6)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from container.defaults import default_model_dir
from container.optimize.pipeline import OptimizeOptions, optimize
from tasks.registry import get_task
from tests.api_helpers import serve
from tests.conftest import TorchWork

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
TEXTS = [
    "I like you. I love you",
    "A man is eating a piece of bread.",
    "Stock markets fell sharply after the announcement.",
    "naïve café über straße",
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, torch_work: TorchWork) -> Path:
    out = tmp_path_factory.mktemp("minilm-serve") / "bundle"
    task = get_task("feature-extraction")
    options = OptimizeOptions(
        default_model_dir(),
        task,
        out,
        only=["fp32"],
        tune_lengths=[16],
        tune_batches=[1],
        tune_seconds=0.05,
        tune_streams=1,
        tune_budgets=(128, 256),  # the climb to 8,192 tokens, which nothing here reads, took most of the build
    )
    with torch_work.reused():  # one export (and reference) of MiniLM for this file and tests/test_default_model.py
        optimize(options)
    return out


async def test_minilm_embeddings_equal_sentence_transformers(bundle: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(default_model_dir()), device="cpu").encode(TEXTS)
    async with serve(bundle) as client:
        ours = np.array((await client.post("/predict", json={"inputs": TEXTS})).json(), dtype=np.float32)
        openai = (await client.post("/v1/embeddings", json={"input": TEXTS})).json()
        single = await client.post("/predict", json={"inputs": "I like you. I love you"})
    assert ours.shape == (4, 384) and np.abs(ours - reference).max() < 1e-4
    assert np.abs(np.array([d["embedding"] for d in openai["data"]]) - reference).max() < 1e-4
    assert single.headers["x-compute-type"] == "cpu+optimized" and float(single.headers["x-compute-time"]) > 0
    assert np.abs(np.array(single.json()) - reference[0]).max() < 1e-4
