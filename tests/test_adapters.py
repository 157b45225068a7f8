"""A checkpoint with task adapters (jina-embeddings-v3's LoRA layout) builds one bundle per adapter, the adapter
merged into the weights; without a choice the build refuses, naming the adapters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from container.bundle import read_manifest
from container.optimize import adapters
from hare.cli import main
from tests.conftest import ModelFactory

QUICK = ["--variants", "fp32", "--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "0.02"]
NAMES = ["retrieval.query", "text-matching"]
RANK, ALPHA = 2, 4.0


@pytest.fixture(scope="module")
def with_adapters(tiny_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny jina_embeddings_v3 (transformers 5 saves it under jina's own names: mixer.Wqkv, emb_ln) with two
    adapters on a linear layer and the word embeddings, saved as jina's own code saves them (the weight as
    `.parametrizations.weight.original`, A and B beside it)."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path_factory.mktemp("jina-lora")
    shutil.copytree(tiny_model("feature-extraction", "jina_embeddings_v3"), folder, dirs_exist_ok=True)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    linear = next(k for k in tensors if k.endswith("mixer.Wqkv.weight"))
    embedding = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    rng = np.random.default_rng(0)
    for key, kind in ((linear, "linear"), (embedding, "embedding")):
        rows, cols = tensors[key].shape
        prefix = key.removesuffix(".weight")
        n = len(NAMES)
        if kind == "linear":  # A [n, rank, in], B [n, out, rank]
            a, b = rng.normal(size=(n, RANK, cols)), rng.normal(size=(n, rows, RANK))
        else:  # A [n, vocab, rank], B [n, rank, dim]
            a, b = rng.normal(size=(n, rows, RANK)), rng.normal(size=(n, RANK, cols))
        tensors[prefix + adapters.ORIGINAL] = tensors.pop(key)
        tensors[prefix + adapters.LORA + "A"] = (0.1 * a).astype(np.float32)
        tensors[prefix + adapters.LORA + "B"] = (0.1 * b).astype(np.float32)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config |= {"lora_adaptations": NAMES, "lora_rank": RANK, "lora_alpha": ALPHA}
    (folder / "config.json").write_text(json.dumps(config))
    prompts = {"retrieval.query": "Represent the query for retrieving evidence documents: ", "text-matching": ""}
    (folder / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts}))
    return folder


def test_the_merge_adds_the_chosen_adapters_product(with_adapters: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    before = load_file(str(with_adapters / "model.safetensors"))
    after = load_file(str(adapters.merge(with_adapters, "text-matching", tmp_path / "merged") / "model.safetensors"))
    assert not any(adapters.LORA in k or adapters.ORIGINAL in k for k in after)
    for key in before:
        if not key.endswith(adapters.ORIGINAL):
            continue
        prefix = key.removesuffix(adapters.ORIGINAL)
        a, b = before[prefix + adapters.LORA + "A"][1], before[prefix + adapters.LORA + "B"][1]
        delta = b @ a if "Wqkv" in prefix else a @ b
        np.testing.assert_allclose(after[prefix + ".weight"], before[key] + ALPHA / RANK * delta, rtol=1e-5, atol=1e-6)
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["hare_adapter"] == "text-matching"


def test_a_build_without_a_chosen_adapter_is_refused_with_their_names(
    with_adapters: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main(["optimize", str(with_adapters), "--task", "feature-extraction", "--out", str(out), *QUICK]) == 2
    message = capsys.readouterr().err
    assert "--adapter" in message and all(name in message for name in NAMES)
    assert not out.exists()
    args = ["optimize", str(with_adapters), "--task", "feature-extraction", "--out", str(out), "--adapter", "nope"]
    assert main([*args, *QUICK]) == 2


def test_each_adapter_builds_its_own_bundle(with_adapters: Path, tmp_path: Path) -> None:
    """Both bundles pass their gates against their merged model; their answers differ, so each carries its own
    adapter; the adapter's prompt of the same name becomes the bundle's default."""
    from tokenizers import Tokenizer

    from container.bundle import MODEL_FILE, TOKENIZER_FILE
    from container.runtime import OnnxModel

    outputs = []
    for name in NAMES:
        out = tmp_path / name
        args = ["optimize", str(with_adapters), "--task", "feature-extraction", "--out", str(out), "--adapter", name]
        assert main([*args, *QUICK]) == 0
        manifest = read_manifest(out)
        assert manifest.source["adapter"] == name
        assert manifest.source["path"] == str(with_adapters.resolve())
        assert manifest.default_prompt_name == (name if name in manifest.prompts else None)
        encoding = Tokenizer.from_file(str(out / TOKENIZER_FILE)).encode("the same text for both")
        feeds = {"input_ids": np.array([encoding.ids]), "attention_mask": np.array([encoding.attention_mask])}
        outputs.append(OnnxModel(out / MODEL_FILE).run(feeds))
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-3
