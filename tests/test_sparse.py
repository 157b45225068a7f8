"""sparse-embedding end to end: a tiny random SPLADE masked LM and a bge-m3-shaped XLM-R through the real
optimizer, served by the real app, against sentence-transformers' SparseEncoder and FlagEmbedding's math."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from api.bulk.job import BulkOptions, run_job
from api.bulk.model import BulkModel
from api.config import Settings
from container.bundle import MODEL_FILE, read_manifest
from container.optimize.errors import UnsupportedModel
from tasks.errors import InvalidRequest
from tests.api_helpers import serve
from tests.conftest import quick_bundle
from tests.sparse_models import make_bge_m3, make_splade
from tests.tiny_models import make_model

TEXTS = ["A cat sits on the mat.", "How do I speed up inference on a small machine with many users?", "Paris"]
# FlagEmbedding drops CLS, EOS, padding and the unknown token by id: typed in the text as well.
M3_TEXTS = [*TEXTS, "typed </s>, <pad>, <s> and <unk> are no words"]
TOL = 1e-4  # fp32 graph against PyTorch
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def splade(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_splade(tmp_path_factory.mktemp("splade"))


@pytest.fixture(scope="module")
def splade_bundle(splade: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quick_bundle(splade, "sparse-embedding", tmp_path_factory.mktemp("bundles") / "splade", ["fp32"])


@pytest.fixture(scope="module")
def m3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bge_m3(tmp_path_factory.mktemp("bge-m3"))


@pytest.fixture(scope="module")
def m3_bundle(m3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quick_bundle(m3, "sparse-embedding", tmp_path_factory.mktemp("bundles") / "bge-m3", ["fp32"])


def _sparse_encoder(folder: Path) -> np.ndarray:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(folder), device="cpu")
    found: Any = model.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False)
    return np.asarray(found.cpu().numpy(), dtype=np.float32)


def _dense(entries: list[dict[str, Any]], size: int) -> np.ndarray:
    vector = np.zeros(size, dtype=np.float32)
    for e in entries:
        vector[e["index"]] = e["value"]
    return vector


def test_splade_graph_pools_inside(splade_bundle: Path) -> None:
    """The session's one output is [batch, vocab]: the [batch, sequence, vocab] logits never leave it."""
    graph = onnx.load(str(splade_bundle / MODEL_FILE), load_external_data=False).graph
    (output,) = graph.output
    dims = [d.dim_value or d.dim_param for d in output.type.tensor_type.shape.dim]
    assert dims == ["batch", 400]


async def test_splade_matches_sparse_encoder(splade: Path, splade_bundle: Path) -> None:
    reference = _sparse_encoder(splade)
    async with serve(splade_bundle) as client:
        predicted = (await client.post("/predict", json={"inputs": TEXTS})).json()
        tei = await client.post("/embed_sparse", json={"inputs": TEXTS})
        one = (await client.post("/predict", json={"inputs": TEXTS[1]})).json()
    assert tei.status_code == 200
    assert tei.json() == predicted
    assert one == predicted[1]
    for entries, ref in zip(predicted, reference, strict=True):
        assert [e["index"] for e in entries] == np.flatnonzero(ref > 0).tolist()  # every non-zero weight, by index
        assert np.allclose(_dense(entries, len(ref)), ref, atol=TOL)


async def test_splade_pruning(splade: Path, splade_bundle: Path) -> None:
    reference = _sparse_encoder(splade)
    async with serve(splade_bundle) as client:
        top = (await client.post("/predict", json={"inputs": TEXTS, "parameters": {"top_k": 5}})).json()
        above = (await client.post("/embed_sparse", json={"inputs": TEXTS, "threshold": 1.0})).json()
        # Past float32's range: nothing is above it (numpy warned of an overflow casting it to the weights' type).
        beyond = await client.post("/embed_sparse", json={"inputs": TEXTS, "threshold": 1e308})
        # One weight more than top_k is cut too (each text's non-zero count less one).
        counts = [int((ref > 0).sum()) for ref in reference]
        one_less = [
            (await client.post("/predict", json={"inputs": text, "parameters": {"top_k": n - 1}})).json()
            for text, n in zip(TEXTS, counts, strict=True)
        ]
    assert [len(entries) for entries in one_less] == [n - 1 for n in counts]
    assert beyond.status_code == 200 and beyond.json() == [[] for _ in TEXTS]
    for entries, ref in zip(top, reference, strict=True):
        # The 5 largest weights, answered by index as every sparse vector is (TEI's order), not by weight.
        assert [e["index"] for e in entries] == sorted(np.argsort(-ref)[:5].tolist())
    for entries, ref in zip(above, reference, strict=True):
        assert [e["index"] for e in entries] == np.flatnonzero(ref > 1.0).tolist()


async def test_splade_bad_requests(splade_bundle: Path) -> None:
    async with serve(splade_bundle) as client:
        heads = await client.post("/predict", json={"inputs": "hi", "parameters": {"return_dense": True}})
        unknown = await client.post("/predict", json={"inputs": "hi", "parameters": {"return_foo": True}})
        at_root = await client.post("/predict", json={"inputs": "hi", "return_foo": True})
        negative = await client.post("/embed_sparse", json={"inputs": "hi", "top_k": 0})
        below = await client.post("/predict", json={"inputs": "hi", "parameters": {"threshold": -0.5}})
        dense_route = await client.post("/embed", json={"inputs": "hi"})
        spec = (await client.get("/openapi.json")).json()
        info = (await client.get("/info")).json()
    assert heads.status_code == 422 and "SPLADE" in heads.json()["error"]
    assert unknown.status_code == 422 and "return_foo" in unknown.json()["error"]
    assert "top_k" in unknown.json()["error"]
    # What the 422 lists as accepted is what this bundle takes: not bge-m3's output flags, which it refuses.
    with pytest.raises(InvalidRequest) as in_bulk:  # hare run's --param
        BulkModel(dataclasses.replace(Settings.from_env({}), bundle=splade_bundle), {"return_foo": True})
    for said in (unknown.json()["error"], at_root.json()["error"], str(in_bulk.value), " ".join(info["parameters"])):
        assert "top_k" in said and not any(f"return_{h}" in said for h in ("dense", "sparse", "colbert")), said
    assert negative.status_code == 422 and "top_k" in negative.json()["error"]
    # Below 0 every zero weight of the vocabulary would be "above" it: refused, naming the bound.
    assert below.status_code == 422 and "parameters.threshold must be at least 0" in below.json()["error"]
    assert dense_route.status_code == 404
    assert "/embed_sparse" in spec["paths"]
    documented = spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    names = documented["properties"]["parameters"]["anyOf"][0]["properties"]
    assert "top_k" in names and "return_dense" not in names  # bge-m3's flags only where the bundle has them


def test_dense_model_is_refused(tmp_path: Path) -> None:
    dense = make_model(tmp_path / "dense", "feature-extraction")
    with pytest.raises(UnsupportedModel, match="--task feature-extraction"):
        quick_bundle(dense, "sparse-embedding", tmp_path / "out", ["fp32"])
    assert not (tmp_path / "out").exists()


def test_bge_m3_missing_head_is_refused(m3: Path, tmp_path: Path) -> None:
    import shutil

    copy = Path(shutil.copytree(m3, tmp_path / "m3"))
    (copy / "colbert_linear.pt").unlink()
    with pytest.raises(UnsupportedModel, match=r"colbert_linear\.pt"):
        quick_bundle(copy, "sparse-embedding", tmp_path / "out", ["fp32"])


def test_bge_m3_head_of_the_wrong_shape_is_refused(m3: Path, tmp_path: Path) -> None:
    import shutil

    import torch

    copy = Path(shutil.copytree(m3, tmp_path / "m3"))
    torch.save(torch.nn.Linear(32, 2).state_dict(), copy / "sparse_linear.pt")
    with pytest.raises(UnsupportedModel, match=r"sparse_linear\.pt should hold a Linear\(32, 1\)"):
        quick_bundle(copy, "sparse-embedding", tmp_path / "out", ["fp32"])
    assert not (tmp_path / "out").exists()


def _m3_reference(folder: Path) -> list[dict[str, Any]]:
    """FlagEmbedding's BGE-M3 computation with torch, from the same files: normalized CLS; relu(sparse_linear)
    max per token id without CLS/EOS/PAD/UNK; colbert_linear over the tokens after CLS, normalized."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    hidden = model.config.hidden_size
    sparse, colbert = torch.nn.Linear(hidden, 1), torch.nn.Linear(hidden, hidden)
    sparse.load_state_dict(torch.load(folder / "sparse_linear.pt", weights_only=True))
    colbert.load_state_dict(torch.load(folder / "colbert_linear.pt", weights_only=True))
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    found = []
    with torch.no_grad():
        for text in M3_TEXTS:
            feeds = tokenizer(text, return_tensors="pt")
            states = model(**feeds).last_hidden_state
            weights = torch.relu(sparse(states))[0, :, 0].numpy()
            lexical: dict[str, float] = {}
            for w, i in zip(weights, feeds["input_ids"][0].tolist(), strict=True):
                if i not in unused and w > 0 and w > lexical.get(str(i), 0):
                    lexical[str(i)] = float(w)
            found.append(
                {
                    "dense_vecs": torch.nn.functional.normalize(states[0, 0], dim=-1).numpy(),
                    "lexical_weights": lexical,
                    "colbert_vecs": torch.nn.functional.normalize(colbert(states[0, 1:]), dim=-1).numpy(),
                }
            )
    return found


async def test_bge_m3_matches_flag_embedding_math(m3: Path, m3_bundle: Path) -> None:
    assert read_manifest(m3_bundle).heads == ["dense", "sparse", "colbert"]
    reference = _m3_reference(m3)
    every = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}
    async with serve(m3_bundle) as client:
        answer = (await client.post("/predict", json={"inputs": M3_TEXTS, "parameters": every})).json()
        default = (await client.post("/predict", json={"inputs": TEXTS[0]})).json()
        colbert_only = (
            await client.post(
                "/predict",
                json={"inputs": TEXTS, "return_colbert_vecs": True, "return_dense": False, "return_sparse": False},
            )
        ).json()
        tei = (await client.post("/embed_sparse", json={"inputs": M3_TEXTS})).json()
        pruned = (await client.post("/predict", json={"inputs": M3_TEXTS, "parameters": {"top_k": 3}})).json()
    # FlagEmbedding's answer: every key, null when not asked; one text: the items themselves.
    assert all(answer[k] is not None for k in ("dense_vecs", "lexical_weights", "colbert_vecs"))
    assert default["colbert_vecs"] is None and default["lexical_weights"] is not None
    assert colbert_only["dense_vecs"] is None and colbert_only["lexical_weights"] is None
    assert len(colbert_only["colbert_vecs"]) == len(TEXTS)
    for i, ref in enumerate(reference):
        assert np.allclose(answer["dense_vecs"][i], ref["dense_vecs"], atol=TOL)
        got = answer["lexical_weights"][i]
        assert got.keys() == ref["lexical_weights"].keys()
        assert np.allclose([got[k] for k in got], [ref["lexical_weights"][k] for k in got], atol=TOL)
        assert np.allclose(answer["colbert_vecs"][i], ref["colbert_vecs"], atol=TOL)
        assert tei[i] == [{"index": int(k), "value": v} for k, v in got.items()]
        # top_k prunes the lexical weights as it prunes SPLADE's: the 3 largest, by token id.
        largest = sorted(got, key=lambda k: -got[k])[:3]
        assert list(pruned["lexical_weights"][i]) == sorted(largest, key=int)
    assert any(len(weights) > 3 for weights in answer["lexical_weights"])  # so that top_k cut some
    assert np.allclose(default["dense_vecs"], reference[0]["dense_vecs"], atol=TOL)


async def test_bge_m3_requests_that_ask_little_or_wrong(m3_bundle: Path) -> None:
    none = {"return_dense": False, "return_sparse": False, "return_colbert_vecs": False}
    async with serve(m3_bundle) as client:
        nothing = await client.post("/predict", json={"inputs": ["hi"], "parameters": none})
        misspelt = await client.post("/predict", json={"inputs": "hi", "parameters": {"return_colbert": True}})
        at_root = await client.post("/predict", json={"inputs": "hi", "return_colbert": True})
        spec = (await client.get("/openapi.json")).json()
    assert nothing.json() == {"dense_vecs": None, "lexical_weights": None, "colbert_vecs": None}  # as FlagEmbedding
    assert misspelt.status_code == 422
    message = misspelt.json()["error"]
    assert "return_colbert" in message and "return_dense, return_sparse, return_colbert_vecs" in message
    # At the body's root too (it said only the body's shape); no stride, which a sparse bundle refuses.
    said = at_root.json()["error"]
    assert at_root.status_code == 422 and "return_dense, return_sparse, return_colbert_vecs" in said
    assert "stride" not in said and "stride" not in message
    documented = spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "return_colbert_vecs" in documented["properties"]["parameters"]["anyOf"][0]["properties"]


async def test_bge_m3_colbert_vectors_are_capped_as_token_vectors(m3_bundle: Path) -> None:
    """ColBERT's vector a token makes answers as big as token_embeddings': past HARE_MAX_ANSWER_VALUES numbers a
    413; the same texts without them are answered."""
    texts = ["word " * 40] * 2
    colbert = {"return_colbert_vecs": True}
    async with serve(m3_bundle, HARE_MAX_ANSWER_VALUES="2000") as client:
        big = await client.post("/predict", json={"inputs": texts, "parameters": colbert})
        small = await client.post("/predict", json={"inputs": "hi", "parameters": colbert})
        without = await client.post("/predict", json={"inputs": texts})
    assert big.status_code == 413 and "HARE_MAX_ANSWER_VALUES" in big.json()["error"]
    assert small.status_code == 200 and len(small.json()["colbert_vecs"]) > 0
    assert without.status_code == 200 and without.json()["colbert_vecs"] is None


async def test_bench_baseline_answers_as_hare(splade: Path, splade_bundle: Path) -> None:
    """`hare bench`'s vanilla baseline for sparse-embedding (SparseEncoder) answers hare's /predict shape."""
    from bench.baseline_app import BaselineConfig, load_predictor

    baseline = load_predictor(BaselineConfig(str(splade), "sparse-embedding", "vanilla"))(TEXTS)
    async with serve(splade_bundle) as client:
        served = (await client.post("/predict", json={"inputs": TEXTS})).json()
    for ours, theirs in zip(served, baseline, strict=True):
        assert [e["index"] for e in ours] == [e["index"] for e in theirs]
        assert np.allclose([e["value"] for e in ours], [e["value"] for e in theirs], atol=TOL)


async def test_sparse_encoder_folder_pooling_is_honoured(splade: Path, tmp_path: Path) -> None:
    """A folder SparseEncoder saved with sum pooling and log1p_relu is served as SparseEncoder computes it."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    mlm = MLMTransformer(str(splade))
    pooling = SpladePooling("sum", "log1p_relu", embedding_dimension=mlm.get_embedding_dimension())
    folder = tmp_path / "st"
    SparseEncoder(modules=[mlm, pooling], device="cpu").save(str(folder))
    reference = _sparse_encoder(folder)
    async with serve(quick_bundle(folder, "sparse-embedding", tmp_path / "bundle", ["fp32"])) as client:
        served = (await client.post("/predict", json={"inputs": TEXTS})).json()
    for entries, ref in zip(served, reference, strict=True):
        assert np.allclose(_dense(entries, len(ref)), ref, atol=TOL)


async def test_sparse_encoder_max_active_dims_is_the_default_top_k(splade: Path, tmp_path: Path) -> None:
    """A SparseEncoder saved with max_active_dims keeps that many weights a vector, as its encode does, unless a
    request names its own top_k (null: every weight)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    mlm = MLMTransformer(str(splade))
    pooling = SpladePooling("max", "relu", embedding_dimension=mlm.get_embedding_dimension())
    folder = tmp_path / "st"
    SparseEncoder(modules=[mlm, pooling], device="cpu", max_active_dims=5).save(str(folder))
    reference = _sparse_encoder(folder)
    bundle = quick_bundle(folder, "sparse-embedding", tmp_path / "bundle", ["fp32"])
    async with serve(bundle) as client:
        served = (await client.post("/predict", json={"inputs": TEXTS})).json()
        every = (await client.post("/predict", json={"inputs": TEXTS, "parameters": {"top_k": None}})).json()
    assert [len(entries) for entries in served] == [5] * len(TEXTS)
    for entries, ref in zip(served, reference, strict=True):
        assert np.allclose(_dense(entries, len(ref)), ref, atol=TOL)
    assert all(len(entries) > 5 for entries in every)


async def test_sparse_encoder_prompts_are_applied(splade: Path, tmp_path: Path) -> None:
    """A SparseEncoder saved with prompts: its default prompt, a named one and a literal one are prepended as its
    encode prepends them; a prompt it does not declare is a 422 naming those it does."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling

    mlm = MLMTransformer(str(splade))
    pooling = SpladePooling("max", "relu", embedding_dimension=mlm.get_embedding_dimension())
    folder = tmp_path / "st"
    prompts = {"query": "query: ", "doc": "passage: "}
    model: Any = SparseEncoder(modules=[mlm, pooling], device="cpu", prompts=prompts, default_prompt_name="query")
    model.save(str(folder))
    asked = {"default": {}, "doc": {"prompt_name": "doc"}, "literal": {"prompt": "search this: "}}
    reference = {
        case: np.asarray(model.encode(TEXTS, convert_to_tensor=True, convert_to_sparse_tensor=False, **kw).cpu())
        for case, kw in asked.items()
    }
    bundle = quick_bundle(folder, "sparse-embedding", tmp_path / "bundle", ["fp32"])
    async with serve(bundle) as client:
        served = {
            case: (await client.post("/predict", json={"inputs": TEXTS, "parameters": kw})).json()
            for case, kw in asked.items()
        }
        unknown = await client.post("/predict", json={"inputs": TEXTS, "parameters": {"prompt_name": "title"}})
    for case, answer in served.items():
        for entries, ref in zip(answer, reference[case], strict=True):
            assert np.allclose(_dense(entries, len(ref)), ref, atol=TOL), case
    assert not np.allclose(reference["default"], reference["doc"])  # the prompts change the vectors
    said = unknown.json()["error"]  # sentence-transformers saves a "document" prompt of its own beside these two
    assert unknown.status_code == 422 and all(name in said for name in ("'title'", "doc, ", "query"))


def test_int8_candidates_are_gated(splade: Path, tmp_path: Path) -> None:
    """Every candidate is measured on the sparse gates (cosine and top-20 overlap), not only fp32's exactness."""
    manifest = read_manifest(quick_bundle(splade, "sparse-embedding", tmp_path / "bundle", ["fp32", "int8"]))
    for variant in manifest.variants:
        assert {"cosine_p1", "top20_overlap_p1"} <= set(variant["gates"])
    int8 = next(v for v in manifest.variants if v["name"] == "int8")
    assert "max_abs_diff" not in int8["gates"] and 0 < int8["metrics"]["top20_overlap_p1"] <= 1


def test_cli_overlap_gate_refuses(splade: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`hare optimize --min-top20-overlap` sets the gate: where no int8 candidate reaches it, nothing ships;
    above what any candidate can reach (an overlap is a share), it is refused before the build."""
    from hare.cli import main

    out = tmp_path / "bundle"
    args = ["optimize", str(splade), "--task", "sparse-embedding", "--out", str(out), "--variants", "int8"]
    assert main([*args, "--min-top20-overlap", "1.01"]) == 2
    assert "--min-top20-overlap 1.01 is outside the values top20_overlap_p1 takes" in capsys.readouterr().err
    assert main([*args, "--min-top20-overlap", "1", "--tune-lengths", "8", "--tune-batches", "1"]) == 3
    assert "top20_overlap_p1" in capsys.readouterr().err
    assert not out.exists()


def test_served_by_hare_serve(m3: Path, m3_bundle: Path, tmp_path: Path) -> None:
    """The whole process tree (`hare serve`, gunicorn, a worker) answers a bge-m3 bundle over HTTP."""
    import httpx

    from tests.live_server import hare_serve

    reference = _m3_reference(m3)
    with hare_serve(m3_bundle, tmp_path / "serve.log") as (url, _process):
        sparse = httpx.post(f"{url}/embed_sparse", json={"inputs": TEXTS[0]}, timeout=30)
        dense = httpx.post(f"{url}/predict", json={"inputs": TEXTS[0], "return_sparse": False}, timeout=30)
    assert sparse.status_code == 200 and dense.status_code == 200
    expected = reference[0]["lexical_weights"]
    assert [str(e["index"]) for e in sparse.json()[0]] == sorted(expected, key=int)  # TEI: by index
    assert np.allclose(dense.json()["dense_vecs"], reference[0]["dense_vecs"], atol=TOL)


async def test_the_openapi_paths_are_the_route_table(splade_bundle: Path) -> None:
    """Sparse routes in the document, dense ones out (tests/test_openapi.py's check)."""
    from tests.test_openapi import assert_paths_are_the_route_table

    async with serve(splade_bundle) as client:
        await assert_paths_are_the_route_table(client)


@pytest.mark.parametrize("kind", ["splade", pytest.param("bge-m3", marks=pytest.mark.slow)])  # as test_openapi's
def test_schemathesis_finds_nothing(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The OpenAPI document of each kind of sparse bundle is exact (tests/test_openapi.py's fuzzing)."""
    from tests.test_openapi import assert_schemathesis_finds_nothing

    bundle = request.getfixturevalue("splade_bundle" if kind == "splade" else "m3_bundle")
    assert_schemathesis_finds_nothing(bundle, tmp_path)


async def test_kserve_answers_one_json_text_per_input(splade_bundle: Path) -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": TEXTS[:2]}]}
    async with serve(splade_bundle, HARE_MODEL_NAME="splade") as client:
        served = (await client.post("/predict", json={"inputs": TEXTS[:2]})).json()
        answer = await client.post("/v2/models/splade/infer", json=body)
    assert answer.status_code == 200
    (output,) = answer.json()["outputs"]
    assert output["name"] == "sparse" and output["datatype"] == "BYTES" and output["shape"] == [2]
    assert [json.loads(text) for text in output["data"]] == served


async def test_a_bulk_job_writes_predicts_sparse_answers_as_typed_columns(
    splade_bundle: Path, m3_bundle: Path, tmp_path: Path
) -> None:
    """`hare run` over a sparse bundle: SPLADE's entries and bge-m3's three outputs, each /predict's, in columns
    of float32 (a map of token id to weight for lexical weights); an output not asked has no column."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"text": t}) + "\n" for t in M3_TEXTS))
    every = {"return_dense": True, "return_sparse": True, "return_colbert_vecs": True}

    def job(bundle: Path, out: str, parameters: dict[str, Any]) -> pa.Table:
        settings = dataclasses.replace(Settings.from_env({}), bundle=bundle)
        run_job(settings, BulkOptions(source, tmp_path / out, parameters=parameters))
        return pq.read_table(tmp_path / out)

    m3, default, splade = (
        job(m3_bundle, "m3.parquet", every),
        job(m3_bundle, "d.parquet", {}),
        job(splade_bundle, "s.parquet", {}),
    )
    async with serve(m3_bundle) as client:
        answer = (await client.post("/predict", json={"inputs": M3_TEXTS, "parameters": every})).json()
    async with serve(splade_bundle) as client:
        entries = (await client.post("/predict", json={"inputs": M3_TEXTS})).json()
    float32 = pa.float32()
    assert m3.schema.field("lexical_weights").type == pa.map_(pa.string(), float32)
    assert m3.schema.field("dense_vecs").type == pa.list_(float32, 32)
    assert m3.schema.field("colbert_vecs").type == pa.list_(pa.list_(float32, 32))
    assert default.column_names == ["id", "dense_vecs", "lexical_weights", "truncated"]  # colbert not asked
    for i, row in enumerate(m3.to_pylist()):
        assert np.allclose(row["dense_vecs"], answer["dense_vecs"][i], atol=1e-6)
        weights = dict(row["lexical_weights"])
        assert weights.keys() == answer["lexical_weights"][i].keys()
        assert np.allclose(list(weights.values()), list(answer["lexical_weights"][i].values()), atol=1e-6)
        assert np.allclose(row["colbert_vecs"], answer["colbert_vecs"][i], atol=1e-6)
    assert splade.schema.field("sparse").type == pa.list_(pa.struct([("index", pa.int64()), ("value", float32)]))
    for got, want in zip(splade.column("sparse").to_pylist(), entries, strict=True):
        assert [e["index"] for e in got] == [e["index"] for e in want]
        assert np.allclose([e["value"] for e in got], [e["value"] for e in want], atol=1e-6)
