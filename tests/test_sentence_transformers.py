"""sentence-transformers folders read in full: every pooling mode, Dense modules, Normalize and prompts,
served equal to SentenceTransformer.encode on the same folder (fp32 bundles, within 1e-4)."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from container.bundle import DENSE_FILE, read_manifest
from container.optimize import source
from container.optimize.errors import UnsupportedModel
from tasks.ops import POOLINGS
from tasks.registry import get_task
from tests.api_helpers import serve
from tests.conftest import ModelFactory, quick_bundle
from tests.tiny_models import make_sentence_transformer

pytestmark = pytest.mark.anyio
TOL = 1e-4
TEXTS = ["Angela Merkel met Emmanuel Macron in Paris and Berlin.", "hello", "The quick brown fox jumps over it"]
PROMPTS = {"query": "query: ", "passage": "passage: "}
ST_MODE = {"mean_sqrt_len": "mean_sqrt_len_tokens"}  # sentence-transformers' name where it differs


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def st_folder(tiny_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MPNet, weighted-mean pooling, two Dense modules (tanh), Normalize, prompts with a default."""
    return make_sentence_transformer(
        tmp_path_factory.mktemp("st") / "model",
        tiny_model("feature-extraction", "mpnet"),
        pooling="weightedmean",
        dense=(24, 16),
        prompts=PROMPTS,
        default_prompt_name="query",
    )


@pytest.fixture(scope="module")
async def st_server(st_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    out = quick_bundle(st_folder, "feature-extraction", tmp_path_factory.mktemp("st-bundle") / "bundle")
    async with serve(out) as client:
        yield client


async def predict(client: httpx.AsyncClient, inputs: object, **parameters: object) -> Any:
    response = await client.post("/predict", json={"inputs": inputs, "parameters": parameters})
    assert response.status_code == 200, response.text
    return np.array(response.json(), dtype=np.float32)


async def test_dense_normalize_and_prompts_equal_sentence_transformers(
    st_server: httpx.AsyncClient, st_folder: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(st_folder), device="cpu")
    manifest = st_server.resources.manifest  # type: ignore[attr-defined]
    assert [d["out_features"] for d in manifest.dense] == [24, 16] and manifest.pooling == "weightedmean"
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {}),  # the default prompt ("query: ") applies to both
        ({"prompt_name": "passage"}, {"prompt_name": "passage"}),
        ({"prompt": "search: "}, {"prompt": "search: "}),
        ({"prompt": "search: ", "prompt_name": "passage"}, {"prompt": "search: "}),  # the literal prompt wins
    ]
    for ours_params, st_params in cases:
        expected = reference.encode(TEXTS, **st_params)
        got = await predict(st_server, TEXTS, **ours_params)
        assert got.shape == expected.shape == (3, 16)
        assert np.abs(got - expected).max() < TOL, ours_params
    # The prompt matters: without it the vectors differ (so the test above could fail).
    assert np.abs(await predict(st_server, TEXTS, prompt="") - reference.encode(TEXTS)).max() > 1e-3


async def test_a_folder_without_normalize_is_served_at_its_vectors_length(
    tiny_model: ModelFactory, tmp_path: Path
) -> None:
    """Normalize is a module of the folder, not a given: without it sentence-transformers' vectors keep their
    length, and hare's do by default (the bundle's normalize); `normalize` true still scales them."""
    from sentence_transformers import SentenceTransformer

    folder = make_sentence_transformer(tmp_path / "model", tiny_model("feature-extraction"), normalize=False)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert not np.allclose(np.linalg.norm(expected, axis=1), 1, atol=1e-2)
    async with serve(quick_bundle(folder, "feature-extraction", tmp_path / "bundle")) as client:
        got = await predict(client, TEXTS)
        scaled = await predict(client, TEXTS, normalize=True)
    assert np.abs(got - expected).max() < TOL
    assert np.allclose(np.linalg.norm(scaled, axis=1), 1, atol=1e-5)


async def test_prompt_errors_name_the_choices(st_server: httpx.AsyncClient) -> None:
    unknown = await st_server.post("/predict", json={"inputs": "hi", "parameters": {"prompt_name": "nope"}})
    # Listed as the folder holds them (sentence-transformers 6 saves its prompts sorted by name).
    assert unknown.status_code == 422 and "document, passage, query" in unknown.json()["error"]
    both = await st_server.post(
        "/predict", json={"inputs": "hi", "parameters": {"prompt_name": "query", "prompt": "x"}}
    )
    literal = await st_server.post("/predict", json={"inputs": "hi", "parameters": {"prompt": "x"}})
    # As sentence-transformers' encode: a literal prompt wins and prompt_name is ignored.
    assert both.status_code == 200 and both.json() == literal.json()


async def test_every_pooling_mode_equals_sentence_transformers(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory
) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    folder = tiny_model("feature-extraction")
    transformer = models.Transformer(str(folder), max_seq_length=64)
    async with serve(fp32_bundle("feature-extraction")) as client:
        for mode in POOLINGS:
            pooling = models.Pooling(transformer.get_embedding_dimension(), ST_MODE.get(mode, mode))
            expected = SentenceTransformer(modules=[transformer, pooling], device="cpu").encode(TEXTS)
            got = await predict(client, TEXTS, pooling=mode, normalize=False)
            assert np.abs(got - expected).max() < TOL, mode


async def test_a_text_too_long_with_its_prompt_says_the_prompt_counts(st_server: httpx.AsyncClient) -> None:
    # "inputs is 66 tokens long; this model reads at most 64" of a text that alone fits: its prompt unnamed.
    limit = st_server.resources.manifest.max_length  # type: ignore[attr-defined]
    text = " ".join(["word"] * 200)
    while len(st_server.resources.encoder.whole.encode(text)) > limit:  # type: ignore[attr-defined]
        text = text.rsplit(" ", 1)[0]
    body = {"inputs": text, "parameters": {"truncate": False}}
    alone = await st_server.post("/predict", json=body | {"parameters": {"truncate": False, "prompt_name": "document"}})
    assert alone.status_code == 200  # the empty prompt: the text fits
    refused = await st_server.post("/predict", json=body)  # the default prompt, "query: "
    assert refused.status_code == 413
    assert refused.json()["error"].startswith("inputs with the prompt or template it is written in is")


async def test_a_folder_saved_with_truncate_dim_is_served_cut_there(
    st_folder: Path, st_server: httpx.AsyncClient, tmp_path: Path
) -> None:
    """sentence-transformers 6 saves truncate_dim and its encode cuts every vector there; hare refused such
    folders. Now it is the bundle's default `dimensions`: encode's vectors, re-normalized as every `dimensions`
    is (encode leaves the cut vector at its length), and a request may still ask for more."""
    from sentence_transformers import SentenceTransformer

    folder = _copy_with(st_folder, tmp_path / "model", "config_sentence_transformers.json", {"truncate_dim": 8})
    assert source.inspect_source(folder, get_task("feature-extraction")).truncate_dim == 8
    wide = _copy_with(st_folder, tmp_path / "wide", "config_sentence_transformers.json", {"truncate_dim": 16})
    assert source.inspect_source(wide, get_task("feature-extraction")).truncate_dim is None  # cuts nothing
    # The served bundle as the optimizer writes it from that folder (its graph and Dense are the same).
    bundle = tmp_path / "bundle"
    shutil.copytree(st_server.resources.settings.bundle, bundle)  # type: ignore[attr-defined]
    manifest = json.loads((bundle / "hare.json").read_text())
    (bundle / "hare.json").write_text(json.dumps(manifest | {"truncate_dim": 8}))
    reference = SentenceTransformer(str(folder), device="cpu")
    assert reference.truncate_dim == 8
    expected = reference.encode(TEXTS)
    async with serve(bundle) as client:
        got = await predict(client, TEXTS)
        assert got.shape == expected.shape == (3, 8)
        assert np.abs(got - expected / np.linalg.norm(expected, axis=1, keepdims=True)).max() < TOL
        whole = await predict(client, TEXTS, dimensions=16)
        assert np.abs(whole - reference.encode(TEXTS, truncate_dim=16)).max() < TOL


def test_bundle_carries_the_dense_weights(st_folder: Path, tmp_path: Path) -> None:
    out = quick_bundle(st_folder, "feature-extraction", tmp_path / "bundle")
    assert (out / DENSE_FILE).is_file()
    manifest = read_manifest(out)
    assert manifest.prompts == {"query": "query: ", "document": "", "passage": "passage: "}
    assert manifest.default_prompt_name == "query"
    assert [d["activation"] for d in manifest.dense] == ["tanh", "tanh"]


def _copy_with(folder: Path, dst: Path, path: str, edit: dict[str, Any]) -> Path:
    shutil.copytree(folder, dst)
    target = dst / path
    target.write_text(json.dumps(json.loads(target.read_text()) | edit))
    return dst


@pytest.mark.parametrize(
    ("path", "edit", "message"),
    [
        ("1_Pooling/config.json", {"include_prompt": False}, "include_prompt"),
        # sentence-transformers 6 takes the first token after the prompt: hare answered the first one.
        ("1_Pooling/config.json", {"pooling_mode": "cls", "include_prompt": False}, "pools cls without its prompt"),
        ("1_Pooling/config.json", {"pooling_mode": ["cls", "mean"]}, "pools with cls, mean;"),  # was "no mode"
        ("2_Dense/config.json", {"activation_function": "my.Activation"}, "my.Activation"),
        # Each was served as if absent, so its vectors were not the model's:
        ("2_Dense/config.json", {"use_residual": True}, "use_residual"),
        ("2_Dense/config.json", {"module_input_name": "token_embeddings"}, "projects token_embeddings"),
        ("config_sentence_transformers.json", {"truncate_dim": 0}, "truncate_dim must be a positive integer"),
        ("config_sentence_transformers.json", {"truncate_dim": "8"}, "truncate_dim must be a positive integer"),
        ("config_sentence_transformers.json", {"default_prompt_name": "other"}, "default_prompt_name"),
    ],
)
def test_what_hare_cannot_apply_is_refused(
    st_folder: Path, tmp_path: Path, path: str, edit: dict[str, Any], message: str
) -> None:
    folder = _copy_with(st_folder, tmp_path / "model", path, edit)
    with pytest.raises(UnsupportedModel, match=message):
        source.inspect_source(folder, get_task("feature-extraction"))


def test_an_unknown_module_is_refused(st_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(st_folder, folder)
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_X", "type": "sentence_transformers.models.LayerNorm"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(UnsupportedModel, match="'LayerNorm'"):
        source.inspect_source(folder, get_task("feature-extraction"))


@pytest.mark.parametrize(
    ("order", "message"),
    [
        # Normalize before a Dense: served as Dense then Normalize.
        (["0", "1", "4", "2", "3"], "in the order Transformer, Pooling, Normalize, Dense, Dense"),
        # The older layout: "has no config.json; is it a Hugging Face model folder?"
        (["0_Transformer", "1", "2", "3", "4"], "keeps its transformer in 0_Transformer/"),
    ],
    ids=["normalize first", "transformer in a subfolder"],
)
def test_modules_hare_cannot_apply_as_laid_out_are_refused(
    st_folder: Path, tmp_path: Path, order: list[str], message: str
) -> None:
    folder = tmp_path / "model"
    shutil.copytree(st_folder, folder)
    modules = sorted(json.loads((folder / "modules.json").read_text()), key=lambda m: int(m["idx"]))
    if order[0] == "0_Transformer":
        modules[0]["path"] = "0_Transformer"
    else:
        modules = [modules[int(i)] for i in order]
    (folder / "modules.json").write_text(json.dumps([m | {"idx": i} for i, m in enumerate(modules)]))
    with pytest.raises(UnsupportedModel, match=message):
        source.inspect_source(folder, get_task("feature-extraction"))


def test_the_maximum_length_is_sentence_transformers_max_seq_length_over_the_tokenizers(
    st_folder: Path, tmp_path: Path
) -> None:
    # sentence-transformers sets the tokenizer's model_max_length to max_seq_length: hare took the smaller.
    from sentence_transformers import SentenceTransformer

    folder = _copy_with(st_folder, tmp_path / "model", "tokenizer_config.json", {"model_max_length": 32})
    config = folder / "sentence_bert_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"max_seq_length": 48}))
    length = source.inspect_source(folder, get_task("feature-extraction")).max_length
    assert length == SentenceTransformer(str(folder), device="cpu").max_seq_length == 48


async def test_do_lower_case_lowercases_as_sentence_transformers_does(tiny_model: ModelFactory, tmp_path: Path) -> None:
    # sentence_bert_config.json's do_lower_case adds a Lowercase to a cased tokenizer; hare served it as cased.
    from sentence_transformers import SentenceTransformer

    folder = make_sentence_transformer(tmp_path / "model", tiny_model("feature-extraction", "roberta"))
    config = folder / "sentence_bert_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"do_lower_case": True}))
    texts = ["Hello World", "THE Quick Brown Fox", "already lower"]
    async with serve(quick_bundle(folder, "feature-extraction", tmp_path / "bundle")) as client:
        got = await predict(client, texts)
    expected = SentenceTransformer(str(folder), device="cpu").encode(texts)
    assert np.abs(got - expected).max() < TOL


async def test_a_sentence_t5_folder_serves_its_encoders_vectors(tiny_model: ModelFactory, tmp_path: Path) -> None:
    """sentence-t5 and GTR: sentence-transformers saves T5's encoder alone (config.json then says
    is_encoder_decoder false), mean pooling, a Dense projection and Normalize. hare builds it as the encoder,
    not as transformers' whole T5, whose decoder would want inputs the graph does not have."""
    from sentence_transformers import SentenceTransformer

    folder = make_sentence_transformer(tmp_path / "model", tiny_model("feature-extraction", "t5"), dense=(16,))
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["T5EncoderModel"]
    async with serve(quick_bundle(folder, "feature-extraction", tmp_path / "bundle")) as client:
        got = await predict(client, TEXTS)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    assert got.shape == expected.shape == (3, 16)
    assert np.abs(got - expected).max() < TOL
