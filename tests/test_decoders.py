"""Decoder models as their users run them: a Qwen3-Reranker-style causal LM scoring pairs as its model card
does, decoder embedders' prompts chosen per request, graphs that answer the same under left and right
padding, Qwen3.5's linear-attention layers at any length and padding, and the folders `hare optimize` must
refuse (with the stage, the cause and what to do).

Every family and task is checked against transformers / sentence-transformers in test_families.py; this file
covers what only decoders have.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from container.bundle import MODEL_FILE, read_manifest
from container.optimize.source import QWEN3_RERANKER
from container.runtime import OnnxModel
from hare.cli import main
from tests.api_helpers import assert_ranked, serve
from tests.conftest import ModelFactory
from tests.tiny_models import HEADS, LM_POSITIONS, REFUSED, make_gemma4, make_lm_reranker, make_model

pytestmark = pytest.mark.anyio
TOL = 1e-4
QUICK = ["--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "0.02"]
QUERY = "capital of France"
DOCUMENTS = [
    "Paris is the capital of France",
    "The quick brown fox jumps over the lazy dog",
    "Angela Merkel met Emmanuel Macron in Paris and Berlin.",
    "hello",
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def lm_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lm_reranker(tmp_path_factory.mktemp("qwen3-reranker"))


@pytest.fixture(scope="module")
def lm_bundle(lm_reranker: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lm-bundle") / "bundle"
    assert main(["optimize", str(lm_reranker), "--task", "text-ranking", "--out", str(out), *QUICK]) == 0
    return out


def model_card_scores(folder: Path, query: str, documents: list[str], instruction: str | None = None) -> np.ndarray:
    """Qwen3-Reranker's model card, step by step: the pair in its template, prefix and suffix tokenized on
    their own, the LM's last-position logits, softmax over ("no", "yes"), the probability of "yes"."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    prefix = tokenizer.encode(QWEN3_RERANKER["prefix"], add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_RERANKER["suffix"], add_special_tokens=False)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    instruction = instruction or QWEN3_RERANKER["instruction"]
    scores = []
    for document in documents:
        text = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        ids = prefix + tokenizer(text)["input_ids"] + suffix
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        pair = torch.log_softmax(torch.stack([logits[no], logits[yes]]), dim=0)
        scores.append(float(pair[1].exp()))
    return np.array(scores)


async def test_an_lm_reranker_scores_pairs_as_its_model_card(lm_reranker: Path, lm_bundle: Path) -> None:
    async with serve(lm_bundle) as client:
        answer = await client.post("/predict", json={"inputs": {"query": QUERY, "documents": DOCUMENTS}})
        assert answer.status_code == 200, answer.text
        assert_ranked(answer.json(), model_card_scores(lm_reranker, QUERY, DOCUMENTS), TOL)

        # Another instruction, per request, as the card's format_instruction takes it.
        instruction = "Given a question, find the passage that names a city"
        body = {"inputs": {"query": QUERY, "documents": DOCUMENTS}, "parameters": {"instruction": instruction}}
        answer = await client.post("/predict", json=body)
        assert answer.status_code == 200, answer.text
        assert_ranked(answer.json(), model_card_scores(lm_reranker, QUERY, DOCUMENTS, instruction), TOL)

        # Braces in a text stay as sent: a query that says "{document}" is not filled in with each document.
        braced = "what does {document} say about the {query}"
        answer = await client.post("/predict", json={"inputs": {"query": braced, "documents": DOCUMENTS}})
        assert_ranked(answer.json(), model_card_scores(lm_reranker, braced, DOCUMENTS), TOL)

        # The documents come back as the client sent them, not as the template wrote them.
        body = {"inputs": {"query": QUERY, "documents": DOCUMENTS}, "parameters": {"return_documents": True}}
        ranked = (await client.post("/predict", json=body)).json()
        assert {r["document"] for r in ranked} == set(DOCUMENTS)

        # raw_scores: the logit whose sigmoid is the card's probability (logit("yes") - logit("no")).
        body = {"inputs": {"query": QUERY, "documents": DOCUMENTS}, "parameters": {"raw_scores": True}}
        raw = (await client.post("/predict", json=body)).json()
        expected = model_card_scores(lm_reranker, QUERY, DOCUMENTS)
        assert np.allclose([1 / (1 + np.exp(-r["score"])) for r in raw], expected[[r["index"] for r in raw]], atol=TOL)


async def test_max_tokens_per_doc_cuts_the_document_not_the_template(lm_reranker: Path, lm_bundle: Path) -> None:
    """Cohere's max_tokens_per_doc on an LM reranker: each document cut to that many of its own tokens, then
    written into the template (the whole template was cut to it: every document scored alike, unread)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(lm_bundle / "tokenizer.json"))
    most = 4
    cut = []
    for document in DOCUMENTS:
        offsets = tokenizer.encode(document, add_special_tokens=False).offsets
        cut.append(document[: offsets[min(most, len(offsets)) - 1][1]])
    async with serve(lm_bundle) as client:
        body = {"query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": most}
        answer = await client.post("/v2/rerank", json=body)
    assert answer.status_code == 200, answer.text
    results = sorted(answer.json()["results"], key=lambda r: r["index"])
    assert np.allclose([r["relevance_score"] for r in results], model_card_scores(lm_reranker, QUERY, cut), atol=TOL)
    assert [r.get("truncated", False) for r in results] == [c != d for c, d in zip(cut, DOCUMENTS, strict=True)]


async def test_a_left_cut_loses_the_documents_start_not_the_instruction(lm_reranker: Path, lm_bundle: Path) -> None:
    """truncation_direction Left on an LM reranker: a document too long for the model loses its first tokens,
    as few as fit, and the instruction and query before it are read (cut with the rest, every document was
    scored alike on its last tokens alone)."""
    from tokenizers import Tokenizer

    from tasks.text_ranking import write_pair

    tokenizer = Tokenizer.from_file(str(lm_bundle / "tokenizer.json"))
    tokenizer.no_truncation()
    most = read_manifest(lm_bundle).max_length
    template = QWEN3_RERANKER["format"]
    documents = [" ".join([d] * 90) for d in DOCUMENTS[:3]]
    tails = []
    for document in documents:
        writing = write_pair(template, QWEN3_RERANKER["instruction"], QUERY, "")
        starts = [start for start, _ in tokenizer.encode(document, add_special_tokens=False).offsets]
        tail = next(document[s:] for s in starts if len(tokenizer.encode(writing + document[s:])) <= most)
        assert len(tail) < len(document)
        tails.append(tail)
    async with serve(lm_bundle) as client:
        body = {"inputs": {"query": QUERY, "documents": documents}, "parameters": {"truncation_direction": "Left"}}
        answer = await client.post("/predict", json=body)
    assert answer.status_code == 200, answer.text
    assert_ranked(answer.json(), model_card_scores(lm_reranker, QUERY, tails), TOL)
    assert all(r["truncated"] for r in answer.json())


async def test_instruction_is_documented_and_accepted_by_lm_rerankers_only(
    fp32_bundle: ModelFactory, lm_bundle: Path
) -> None:
    def documented(spec: dict[str, Any]) -> bool:
        predict = spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        return "instruction" in json.dumps(predict)

    async with serve(fp32_bundle("text-ranking")) as client:
        assert not documented((await client.get("/openapi.json")).json())
        body = {"inputs": {"query": QUERY, "documents": DOCUMENTS}, "parameters": {"instruction": "x"}}
        answer = await client.post("/predict", json=body)
        assert answer.status_code == 422
        assert "LM rerankers" in answer.json()["error"]
    async with serve(lm_bundle) as client:
        assert documented((await client.get("/openapi.json")).json())


def test_an_lm_reranker_bundle_computes_nothing_vocabulary_sized(lm_reranker: Path, lm_bundle: Path) -> None:
    """Only the LM head's "yes" and "no" rows are kept: no product with the [vocab, hidden] matrix, one
    logit per pair out."""
    vocab = json.loads((lm_reranker / "config.json").read_text())["vocab_size"]
    graph = onnx.load(str(lm_bundle / MODEL_FILE))
    shapes = {t.name: list(t.dims) for t in graph.graph.initializer}
    for node in graph.graph.node:
        if node.op_type.startswith(("MatMul", "Gemm", "DynamicQuantizeMatMul")):
            assert all(vocab not in shapes.get(name, []) for name in node.input), node.name
    session = OnnxModel(lm_bundle / MODEL_FILE)
    ids = np.array([[5, 6, 7, 8], [9, 10, 0, 0]], dtype=np.int64)
    out = session.run({"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64)})
    assert out.shape == (2, 1)
    assert read_manifest(lm_bundle).pair_template["format"] == QWEN3_RERANKER["format"]


@pytest.mark.parametrize("arch", ["qwen3", "lfm2"])
def test_a_decoder_graph_answers_the_same_under_left_and_right_padding(fp32_bundle: ModelFactory, arch: str) -> None:
    """Positions come from the mask, so a row's real tokens get the same states wherever the padding is; LFM2's
    short convolutions after its attention layer see the padding's states, which the 2D mask zeroes."""
    bundle = fp32_bundle("feature-extraction", arch)
    session = OnnxModel(bundle / MODEL_FILE)
    pad = read_manifest(bundle).pad_id
    rows = [[11, 12, 13, 14, 15, 16], [21, 22, 23]]
    alone = [session.run(_feeds([r]))[0] for r in rows]
    for left in (True, False):
        feeds = _padded(rows, pad, left)
        states = session.run(feeds)
        for i in range(len(rows)):
            real = states[i][feeds["attention_mask"][i] == 1]
            assert np.abs(real - alone[i]).max() < TOL, ("left" if left else "right", i)


def _feeds(rows: list[list[int]]) -> dict[str, Any]:
    ids = np.array(rows, dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


def _padded(rows: list[list[int]], pad: int, left: bool) -> dict[str, Any]:
    """`rows` as one batch padded with `pad` to the longest, on the left or on the right."""
    width = max(map(len, rows))
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        at = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, at], mask[i, at] = row, 1
    return {"input_ids": ids, "attention_mask": mask}


async def test_decoder_embedder_prompts_are_chosen_per_request(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory
) -> None:
    from sentence_transformers import SentenceTransformer

    folder = tiny_model("feature-extraction", "qwen3")
    reference = SentenceTransformer(str(folder), device="cpu")
    texts = ["The quick brown fox", "Paris is the capital of France"]
    async with serve(fp32_bundle("feature-extraction", "qwen3")) as client:
        for parameters, kwargs in (
            ({}, {}),  # the folder's default prompt (query)
            ({"prompt_name": "document"}, {"prompt_name": "document"}),
            ({"prompt": "Represent this: "}, {"prompt": "Represent this: "}),
            ({"dimensions": 16}, {"truncate_dim": 16}),
        ):
            answer = await client.post("/predict", json={"inputs": texts, "parameters": parameters})
            assert answer.status_code == 200, answer.text
            expected = reference.encode(texts, **kwargs)
            if "truncate_dim" in kwargs:  # hare renormalizes a shortened vector, as the HF Inference API does
                expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
            assert np.abs(np.array(answer.json()) - expected).max() < TOL, parameters


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def _drop_pad_token(folder: Path) -> None:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.is_file():
            data = json.loads(path.read_text())
            data.pop("pad_token", None)
            path.write_text(json.dumps(data))
    config = json.loads((folder / "config.json").read_text())
    config.pop("pad_token_id", None)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("task", ["feature-extraction", "text-classification"])
def test_a_decoder_without_a_pad_token_is_refused_at_build_time(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str], task: str
) -> None:
    folder = _copy(tiny_model(task, "qwen3"), tmp_path / "model")
    _drop_pad_token(folder)
    out = tmp_path / "bundle"
    assert main(["optimize", str(folder), "--task", task, "--out", str(out), *QUICK]) == 2
    err = capsys.readouterr().err
    assert "stage export" in err and "no pad token" in err and "pad_token" in err
    assert not out.exists()


async def test_a_decoder_classifier_whose_config_names_no_pad_id_reads_each_texts_last_token(
    tiny_model: ModelFactory, tmp_path: Path
) -> None:
    """config.json's pad_token_id null, the tokenizer's pad_token set (as in many Llama and Qwen fine-tunes):
    transformers' head reads one text at a time at its last token (it refuses batches); hare pads with the
    tokenizer's pad and answers each text as transformers does alone."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = _copy(tiny_model("text-classification", "qwen3"), tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"pad_token_id": None}))
    out = tmp_path / "bundle"
    # fp32 alone: the answers are compared within 1e-4, which an int8 pick (within its gates) is not held to
    args = ["optimize", str(folder), "--task", "text-classification", "--out", str(out), "--variants", "fp32"]
    assert main([*args, *QUICK]) == 0
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        expected = [model(**tokenizer(t, return_tensors="pt")).logits[0].softmax(-1).numpy() for t in DOCUMENTS]
    async with serve(out) as client:
        body = {"inputs": DOCUMENTS, "parameters": {"top_k": None}}
        answer = await client.post("/predict", json=body)
    assert answer.status_code == 200, answer.text
    for ranked, want in zip(answer.json(), expected, strict=True):
        got = {r["label"]: r["score"] for r in ranked}
        labels = [model.config.id2label[i] for i in range(len(want))]
        assert np.allclose([got[label] for label in labels], want, atol=TOL)


def test_a_causal_lm_that_cannot_answer_yes_or_no_is_refused_as_a_reranker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_lm_reranker(tmp_path / "model", answers=False)
    out = tmp_path / "bundle"
    assert main(["optimize", str(folder), "--task", "text-ranking", "--out", str(out), *QUICK]) == 2
    err = capsys.readouterr().err
    assert "without a ranking head" in err and "AutoModelForSequenceClassification" in err
    assert not out.exists()


def _long_qwen3_5(folder: Path, task: str) -> Path:
    """A tiny Qwen3.5 read at up to LM_POSITIONS tokens (its gated delta rule then spans up to 8 chunks of 64,
    and the export's scan takes 3 steps), with
    - slow decay (transformers draws a head's from 0.01 to 16 a token, mostly too fast for one chunk's keys to
      count two chunks later), so the scan's work shows;
    - a linear-attention layer after the attention layer, and a pad token whose embedding is not 0 (as in a
      trained model, whose pad is its EOS), so the padding reaches a linear-attention layer as states that
      only the mask zeroes."""
    import torch
    import transformers

    layers = ["linear_attention", "full_attention", "linear_attention"]
    make_model(
        folder, task, "qwen3_5_text", max_position_embeddings=LM_POSITIONS, layer_types=layers, num_hidden_layers=3
    )
    model = getattr(transformers, HEADS[task][0]).from_pretrained(str(folder)).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("linear_attn.A_log"):
                weight.fill_(math.log(1e-3))
        embeddings = model.get_input_embeddings().weight
        embeddings[model.config.pad_token_id] = embeddings[model.config.eos_token_id + 1]
    model.save_pretrained(str(folder), safe_serialization=True)
    for name, key in (("tokenizer_config.json", "model_max_length"), ("sentence_bert_config.json", "max_seq_length")):
        if (folder / name).is_file():
            config = json.loads((folder / name).read_text())
            (folder / name).write_text(json.dumps(config | {key: LM_POSITIONS}))
    return folder


@pytest.mark.parametrize(
    ("task", "output"), [("feature-extraction", "last_hidden_state"), ("text-classification", "logits")]
)
def test_qwen3_5_answers_as_transformers_at_any_length_and_padding(tmp_path: Path, task: str, output: str) -> None:
    """Qwen3.5's linear-attention layers, exported without their loop over the sequence's chunks
    (container/optimize/delta_rule.py): the bundle passes the gates, then answers as transformers at lengths
    other than the traced example's 8 (within one chunk, at three) and in left- and right-padded batches."""
    import torch
    import transformers

    folder = _long_qwen3_5(tmp_path / "model", task)
    out = tmp_path / "bundle"
    assert main(["optimize", str(folder), "--task", task, "--out", str(out), "--variants", "fp32", *QUICK]) == 0
    manifest = read_manifest(out)
    assert (manifest.variant, manifest.max_length) == ("fp32", LM_POSITIONS)

    model = getattr(transformers, HEADS[task][0]).from_pretrained(str(folder)).eval()
    ids = np.random.default_rng(0).integers(5, 300, size=200)
    rows = [ids[:3].tolist(), ids[:37].tolist(), ids[60:190].tolist()]

    def alone(row: list[int]) -> np.ndarray:
        with torch.no_grad():
            return getattr(model(input_ids=torch.tensor([row])), output)[0].numpy()

    _assert_alone_and_padded(OnnxModel(out / MODEL_FILE), rows, manifest.pad_id, alone, output == "last_hidden_state")


def _assert_alone_and_padded(
    session: OnnxModel, rows: list[list[int]], pad_id: int, alone: Callable[[list[int]], np.ndarray], states: bool
) -> None:
    """The graph answers each row as `alone(row)` computes it, and so in left- and right-padded batches: a
    padded row's states at its real tokens (`states`), or a classifier's logits at its last one, are its own."""
    expected = [alone(row) for row in rows]
    for row, want in zip(rows, expected, strict=True):
        assert np.abs(session.run(_feeds([row]))[0] - want).max() < TOL, len(row)
    for left in (True, False):
        feeds = _padded(rows, pad_id, left)
        answers = session.run(feeds)
        for i, row in enumerate(rows):
            got = answers[i][feeds["attention_mask"][i] == 1] if states else answers[i]
            assert np.abs(got - expected[i]).max() < TOL, ("left" if left else "right", len(row))


def test_a_gemma4_checkpoint_embeds_its_text_as_transformers_at_any_length_and_padding(tmp_path: Path) -> None:
    """Gemma 4's checkpoints are the multimodal wrapper (gemma4), not its text model: built for embeddings, it
    exports the wrapper's text path (masks per layer type from its text config, per-layer inputs) and answers
    as transformers' Gemma4Model alone and in left- and right-padded batches, at lengths past its sliding
    window."""
    import torch
    import transformers

    folder = make_gemma4(tmp_path / "model")
    out = tmp_path / "bundle"
    args = ["optimize", str(folder), "--task", "feature-extraction", "--out", str(out), "--variants", "fp32"]
    assert main([*args, *QUICK]) == 0
    manifest = read_manifest(out)
    assert manifest.model_type == "gemma4" and manifest.pooling == "lasttoken"

    model = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    ids = np.random.default_rng(0).integers(5, 300, size=60)
    rows = [ids[:3].tolist(), ids[:37].tolist(), ids[10:60].tolist()]

    def alone(row: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(input_ids=torch.tensor([row])).last_hidden_state[0].numpy()

    _assert_alone_and_padded(OnnxModel(out / MODEL_FILE), rows, manifest.pad_id, alone, states=True)


# What the refusal calls each refused family's layers, with the class it found (container/optimize/decoder.py).
REFUSED_LAYERS = {
    "minimax": "lightning attention (MiniMax's linear attention) layers (MiniMaxLightningAttention)",
    "jamba": "Mamba (state-space) layers (JambaMambaMixer)",
    "zamba": "Mamba (state-space) layers (ZambaMambaMixer)",
    "zamba2": "Mamba (state-space) layers (Zamba2MambaMixer)",
    "bamba": "Mamba (state-space) layers (BambaMixer)",
    "nemotron_h": "Mamba (state-space) layers (NemotronHMamba2Mixer)",
    "granitemoehybrid": "Mamba (state-space) layers (GraniteMoeHybridMambaLayer)",
    "falcon_h1": "Mamba (state-space) layers (FalconH1Mixer)",
    "mamba": "Mamba (state-space) layers (MambaMixer)",
    "mamba2": "Mamba (state-space) layers (Mamba2Mixer)",
    "falcon_mamba": "Mamba (state-space) layers (FalconMambaMixer)",
    "recurrent_gemma": "RG-LRU (Griffin's recurrence) layers (RecurrentGemmaRglru)",
    "rwkv": "RWKV time mixing layers (RwkvSelfAttention)",
    "xlstm": "mLSTM (xLSTM) layers (xLSTMLayer)",
    "kimi_linear": "Kimi delta attention layers (KimiLinearDeltaAttention)",
    "bailing_hybrid": "Kimi delta attention layers (BailingHybridDeltaAttention)",
}
REFUSED_PAIRS = [
    (arch, task)
    for arch, family in REFUSED.items()
    for task in ("feature-extraction", "text-classification")
    if task in family.tasks
]


@pytest.mark.parametrize(("arch", "task"), REFUSED_PAIRS)
def test_a_model_with_recurrent_layers_is_refused_before_its_weights_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, arch: str, task: str
) -> None:
    """Mamba-style hybrids, pure state-space and recurrent models, MiniMax's lightning attention, Kimi's delta
    attention: each carries a state along the sequence in a Python loop that tracing would fix at the
    example's length. Refused from the model's skeleton, before its weights are read (minutes for a real
    checkpoint), naming the stage, the layers found and what to use instead."""
    from container.optimize import export

    loads: list[str] = []
    real_load = export.load_torch_model

    def load(*args: Any) -> Any:
        loads.append(arch)
        return real_load(*args)

    monkeypatch.setattr(export, "load_torch_model", load)
    folder = make_model(tmp_path / "model", task, arch)
    out = tmp_path / "bundle"
    assert main(["optimize", str(folder), "--task", task, "--out", str(out), *QUICK]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"stage export: {arch} has {REFUSED_LAYERS[arch]}" in err, err
    assert "fixes at the example's length" in err and "Use a family built of those, e.g. Qwen3, Qwen3.5 or LFM2" in err
    assert loads == [] and not out.exists()


def test_an_encoder_decoders_head_hare_does_not_export_is_refused_before_its_weights_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """T5's classification head reads its decoder's states at the EOS tokens: not the shifted-decoder head hare
    exports (T5Gemma 2's, test_families), so the build stops at once, from config.json, naming the stage, the
    cause and what to use (T5's embeddings, the encoder's, are served)."""
    from container.optimize import export

    monkeypatch.setattr(export, "skeleton", lambda *_: pytest.fail("the refusal should need config.json only"))
    folder = make_model(tmp_path / "model", "text-classification", "t5")
    out = tmp_path / "bundle"
    assert main(["optimize", str(folder), "--task", "text-classification", "--out", str(out), *QUICK]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "stage export: t5 is an encoder-decoder; hare exports the text-classification heads of t5gemma2" in err
    assert "hare serves its encoder for embeddings (--task feature-extraction" in err
    assert not out.exists()
