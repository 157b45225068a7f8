"""The embedded default, all-MiniLM-L6-v2: the bundle must agree with sentence-transformers itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from container.bundle import read_manifest
from container.defaults import default_model_dir
from container.optimize.pipeline import OptimizeOptions, optimize
from container.runtime import OnnxModel
from tasks.ops import l2_normalize, pad_batch, pool_tokens
from tasks.registry import get_task
from tests.conftest import TorchWork

pytestmark = pytest.mark.slow

TEXTS = [
    "I like you. I love you",
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "The cat plays in the garden.",
    "Stock markets fell sharply after the announcement.",
    " ".join(["A very long text about the history of the Roman empire and its many emperors."] * 30),
]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, torch_work: TorchWork) -> Path:
    out = tmp_path_factory.mktemp("minilm") / "bundle"
    with torch_work.reused():  # one export (and reference) of MiniLM for this file and tests/test_api_minilm.py
        optimize(
            OptimizeOptions(
                model_dir=default_model_dir(),
                task=get_task("feature-extraction"),
                out=out,
                only=["fp32", "int8", "int8-block32"],
                tune_lengths=[16],
                tune_batches=[1],
                tune_seconds=0.05,
                tune_streams=1,
                tune_budgets=(128, 256),  # the budget's climb to 8,192 tokens took 37 of this build's 51 s
            )
        )
    return out


def embed(model_file: Path, bundle: Path, texts: list[str]) -> np.ndarray:
    manifest = read_manifest(bundle)
    model = OnnxModel(model_file, output=manifest.output)
    enc = Tokenizer.from_file(str(bundle / "tokenizer.json")).encode_batch(texts)
    feeds = pad_batch(enc, model.input_names)
    states, lengths = model.run(feeds), feeds["attention_mask"].sum(axis=1)
    mode = manifest.pooling or "mean"
    vectors = np.stack([pool_tokens(row[:n], mode) for row, n in zip(states, lengths, strict=True)])
    return l2_normalize(vectors) if manifest.normalize else vectors


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(default_model_dir()), device="cpu")
    return np.asarray(st.encode(TEXTS, normalize_embeddings=False))


def test_manifest_reads_the_model_files(bundle: Path) -> None:
    manifest = read_manifest(bundle)
    assert (manifest.pooling, manifest.normalize) == ("mean", True)
    assert manifest.max_length == 256  # sentence_bert_config's max_seq_length, below the 512 positions
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    assert tok.padding is None  # the shipped tokenizer.json pads to 128: the bundle must not
    assert len(tok.encode("short").ids) == 3
    assert len(tok.encode(TEXTS[-1]).ids) == 256


def test_chosen_bundle_and_fp32_match_sentence_transformers(
    bundle: Path, tmp_path: Path, reference: np.ndarray, torch_work: TorchWork
) -> None:
    from container.optimize import source

    task = get_task("feature-extraction")
    fp32 = tmp_path / "fp32.onnx"
    torch_work.export(source.inspect_source(default_model_dir(), task), task, fp32)
    cos_fp32 = (embed(fp32, bundle, TEXTS) * l2_normalize(reference)).sum(-1)
    assert cos_fp32.min() >= 0.999
    manifest = read_manifest(bundle)
    cos_chosen = (embed(bundle / "model.onnx", bundle, TEXTS) * l2_normalize(reference)).sum(-1)
    assert cos_chosen.min() >= (0.999 if manifest.precision == "fp32" else 0.99)


def test_int8_variants_are_gated_on_minilm(bundle: Path) -> None:
    variants = {v["name"]: v for v in read_manifest(bundle).variants}
    # Per-tensor dynamic int8 loses too much on MiniLM's short inputs; blockwise int8 keeps cosine >= 0.99.
    assert variants["int8-block32"]["passed"]
    assert variants["int8-block32"]["metrics"]["cosine_p1"] >= 0.99
    for v in variants.values():
        assert v["passed"] == all(g["passed"] for g in v["gates"].values())
        assert v["gates"]["cosine_p1"]["passed"] == (v["metrics"]["cosine_p1"] >= 0.99)


def test_related_sentences_are_closer_than_unrelated(bundle: Path) -> None:
    e = embed(bundle / "model.onnx", bundle, TEXTS[1:5])
    related, unrelated = float(e[0] @ e[1]), float(e[0] @ e[3])
    assert related > 0.6 > unrelated
