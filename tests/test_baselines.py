"""The vanilla baselines answer as their libraries do: a sentence-transformers folder is measured as
`SentenceTransformer.encode` (its own pooling and normalization), not as a mean-pooled pipeline."""

from __future__ import annotations

import numpy as np
import pytest

from bench.baseline_app import BaselineConfig, load_predictor
from tests.conftest import ModelFactory


@pytest.mark.parametrize("arch", ["bert", "qwen3"])
def test_the_vanilla_embedding_baseline_is_sentence_transformers(tiny_model: ModelFactory, arch: str) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tiny_model("feature-extraction", arch)
    predict = load_predictor(BaselineConfig(str(folder), "feature-extraction", "vanilla"))
    texts = ["The quick brown fox", "Paris is the capital of France and a city"]
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert np.abs(np.array(predict(texts)) - expected).max() < 1e-5
    assert np.abs(np.array(predict(texts[0])) - expected[0]).max() < 1e-5


def test_the_baseline_device_comes_from_the_environment() -> None:
    env = {"HARE_BASELINE_MODEL": "/m", "HARE_BASELINE_TASK": "feature-extraction"}
    assert BaselineConfig.from_env(env).device == "cpu"
    assert BaselineConfig.from_env(env | {"HARE_BASELINE_DEVICE": "cuda"}).device == "cuda"
    # The comet baseline's dynamic int8 Linear layers exist on the CPU only: said at start, not at the first request.
    with pytest.raises(RuntimeError, match="comet runs on the CPU"):
        BaselineConfig.from_env(env | {"HARE_BASELINE_MODE": "comet", "HARE_BASELINE_DEVICE": "cuda"})


@pytest.mark.parametrize(
    ("task", "inputs"),
    [
        ("text-classification", ["I like you", "word " * 2000]),
        ("token-classification", ["Paris is in France", "word " * 2000]),
        ("text-ranking", {"query": "capital", "documents": ["Paris", "word " * 2000]}),
    ],
)
def test_every_tasks_vanilla_baseline_answers_short_and_long_inputs(
    tiny_model: ModelFactory, task: str, inputs: object
) -> None:
    # The token-classification baseline raised TypeError on every request (transformers 5's pipeline takes no
    # `truncation`), so `hare bench --baseline vanilla` on an NER bundle measured only errors.
    predict = load_predictor(BaselineConfig(str(tiny_model(task)), task, "vanilla"))
    answer = predict(inputs)
    assert isinstance(answer, list) and len(answer) == 2
