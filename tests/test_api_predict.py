"""POST /predict for every task, in process: the answers equal transformers' pipelines (and sentence-
transformers) on the same tiny models, every parameter works, headers are there, long inputs are handled.

Tolerance: scores within 1e-4 of PyTorch (fp32 ONNX vs PyTorch differ by ~1e-6; padding in batches adds
nothing because attention masks it out), labels, words and offsets exactly equal.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import itertools
import re
import threading
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from container.bundle import MODEL_FILE, TOKENIZER_FILE
from container.runtime import OnnxModel
from tasks.ops import l2_normalize, pad_batch, softmax
from tests.api_helpers import assert_ranked, error_of, serve
from tests.conftest import ModelFactory, quick_bundle
from tests.test_token_spans import without_edge_spaces
from tests.tiny_models import make_model

pytestmark = pytest.mark.anyio
TOL = 1e-4
TEXTS = [
    "Angela Merkel met Emmanuel Macron in Paris and Berlin.",
    "The quick brown fox jumps over the lazy dog",
    "Zyxw qqq ÄÖÜ über naïve café!",  # unknown pieces, accents, punctuation
    "hello",
]
LONG = " ".join(["Angela Merkel met Emmanuel Macron in Paris and Berlin."] * 30)  # ~600 tokens > 126


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def classifier(fp32_bundle: ModelFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(fp32_bundle("text-classification")) as client:
        yield client


@pytest.fixture(scope="module")
async def embedder(fp32_bundle: ModelFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(fp32_bundle("feature-extraction")) as client:
        yield client


@pytest.fixture(scope="module")
async def ranker(fp32_bundle: ModelFactory) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(fp32_bundle("text-ranking")) as client:
        yield client


async def predict(client: httpx.AsyncClient, inputs: object, **parameters: object) -> Any:
    response = await client.post("/predict", json={"inputs": inputs, "parameters": parameters})
    assert response.status_code == 200, response.text
    return response.json()


def pipeline(task: str, model: Path, **kwargs: Any) -> Any:
    from transformers import pipeline as make

    return make(task, model=str(model), **kwargs)  # type: ignore[call-overload]


# ---- text classification -------------------------------------------------------------------------------


@pytest.mark.parametrize("function", [None, "softmax", "sigmoid", "none"])
async def test_classification_scores_equal_the_transformers_pipeline(
    classifier: httpx.AsyncClient, tiny_model: ModelFactory, function: str | None
) -> None:
    kwargs = {"function_to_apply": function} if function else {}
    reference = pipeline("text-classification", tiny_model("text-classification"), top_k=None, **kwargs)(TEXTS)
    ours = await predict(classifier, TEXTS, top_k=None, **kwargs)
    for ref, got in zip(reference, ours, strict=True):
        assert [r["label"] for r in ref] == [g["label"] for g in got]
        assert np.allclose([r["score"] for r in ref], [g["score"] for g in got], atol=TOL)


async def test_classification_shapes_top_k_and_raw_scores(classifier: httpx.AsyncClient) -> None:
    # The Hugging Face Inference API's shape: one text is answered with a list holding its list of labels.
    (single,) = await predict(classifier, "I like you. I love you")
    assert isinstance(single, list) and len(single) == 1 and set(single[0]) == {"label", "score"}
    several = await predict(classifier, ["I like you", "I love you"])
    assert len(several) == 2 and all(len(answer) == 1 for answer in several)
    assert len((await predict(classifier, "text", top_k=2))[0]) == 2
    (everything,) = await predict(classifier, "text", top_k=None)
    assert len(everything) == 3 and sum(e["score"] for e in everything) == pytest.approx(1.0, abs=1e-5)
    (raw,) = await predict(classifier, "text", top_k=None, raw_scores=True)
    logits = np.array([e["score"] for e in raw])
    assert np.allclose(softmax(logits.astype(np.float32)), [e["score"] for e in everything], atol=1e-5)
    # raw_scores beside a function_to_apply that is not "none" asks for two things: refused, naming both.
    assert await predict(classifier, "text", top_k=None, raw_scores=True, function_to_apply="none") == [raw]
    for function in ("softmax", "sigmoid"):  # either one, not only the default's
        both = {"inputs": "text", "parameters": {"raw_scores": True, "function_to_apply": function}}
        refused = await classifier.post("/predict", json=both)
        assert refused.status_code == 422, function
        said = refused.json()["error"]
        assert "raw_scores" in said and f'function_to_apply "{function}"' in said


async def test_every_predict_answer_carries_the_compute_headers(classifier: httpx.AsyncClient) -> None:
    response = await classifier.post("/predict", json={"inputs": "I like you. I love you"})
    headers = response.headers
    assert re.fullmatch(r"\d+\.\d{6}", headers["x-compute-time"])
    assert headers["x-compute-type"] == "cpu+optimized"
    assert headers["x-compute-characters"] == "22"
    assert int(headers["x-compute-tokens"]) > 2
    phases = dict(part.strip().split(";dur=") for part in headers["server-timing"].split(","))
    assert list(phases) == ["tokenize", "queue", "inference", "postprocess"]
    assert all(float(ms) >= 0 for ms in phases.values())
    assert "x-truncated" not in headers


async def test_a_long_input_is_truncated_and_says_so(classifier: httpx.AsyncClient) -> None:
    response = await classifier.post("/predict", json={"inputs": [LONG, "short"], "parameters": {"top_k": None}})
    assert response.headers["x-truncated"] == "true"
    short_tokens = int((await classifier.post("/predict", json={"inputs": "short"})).headers["x-compute-tokens"])
    assert int(response.headers["x-compute-tokens"]) == 126 + short_tokens  # cut to the model's maximum
    long, short = response.json()
    assert all(item["truncated"] is True for item in long)
    assert all("truncated" not in item for item in short)
    refused = await classifier.post("/predict", json={"inputs": LONG, "parameters": {"truncate": False}})
    assert refused.status_code == 413
    assert "at most 126" in refused.json()["error"] and "truncate" in refused.json()["error"]
    metrics = (await classifier.get("/metrics")).text
    assert re.search(r"^hare_truncated_total [1-9]", metrics, re.M)


# A long text whose end says something else than its start: cut on the left, the model reads only its end.
ENDS_ELSEWHERE = LONG + " " + " ".join(["The quick brown fox jumps over the lazy dog."] * 12)


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
async def test_truncation_direction_left_keeps_a_texts_end_as_transformers_does(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory, arch: str
) -> None:
    # TEI's truncation_direction "Left" (the huggingface_hub client sends "left"): transformers' truncation_side.
    classify = pipeline("text-classification", tiny_model("text-classification", arch), top_k=None, truncation=True)
    classify.tokenizer.truncation_side = "left"
    texts = [ENDS_ELSEWHERE, "short"]
    pairs = [{"text": ENDS_ELSEWHERE, "text_pair": LONG}, {"text": "short premise", "text_pair": ENDS_ELSEWHERE}]
    async with serve(fp32_bundle("text-classification", arch)) as classifier:
        right = await predict(classifier, texts, top_k=None)
        for direction in ("Left", "left"):
            for inputs in (texts, pairs):
                left = await predict(classifier, inputs, top_k=None, truncation_direction=direction)
                for text, got in zip(inputs, left, strict=True):
                    (reference,) = classify([text])
                    assert [r["label"] for r in reference] == [g["label"] for g in got]
                    assert np.allclose([r["score"] for r in reference], [g["score"] for g in got], atol=TOL)
                truncated = [g.get("truncated", False) for g, *_ in left]
                assert truncated == ([True, False] if inputs is texts else [True, True])
        left = await predict(classifier, texts, top_k=None, truncation_direction="Left")
        # The text's two ends differ, so its answers do (the tiny random model's scores move by 1e-6 to 1e-4).
        assert left[0] != right[0]
        assert left[1] == right[1]  # a text that fits is read whole either way
        tokens = (await classifier.post("/predict", json={"inputs": ENDS_ELSEWHERE, "parameters": {
            "truncation_direction": "Left"}})).headers["x-compute-tokens"]  # fmt: skip
        assert tokens == "126"
        refused = await classifier.post(
            "/predict", json={"inputs": LONG, "parameters": {"truncation_direction": "Left", "truncate": False}}
        )
        assert refused.status_code == 413


PAIRS = [
    {"text": "A man is playing a guitar.", "text_pair": "Someone plays music."},
    {"text": "The quick brown fox", "text_pair": "Zyxw qqq ÄÖÜ über naïve café!"},
    {"text": LONG, "text_pair": "short hypothesis"},  # cut: the longer member loses what does not fit
    {"text": "short premise", "text_pair": LONG},
    {"text": LONG, "text_pair": LONG[: len(LONG) // 2]},  # both over half: the longer takes the odd token
]


# Tokenizers that join a pair with [SEP], </s></s> and SentencePiece; DistilBERT and DeBERTa-v3 have no segment ids.
@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta", "distilbert", "deberta-v2"])
async def test_text_pairs_equal_the_transformers_pipeline(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory, arch: str
) -> None:
    # Inference (NLI) and paraphrase classifiers read two texts: transformers' {"text", "text_pair"}, or TEI's
    # [text, text_pair] lists.
    classify = pipeline("text-classification", tiny_model("text-classification", arch), top_k=None, truncation=True)
    async with serve(fp32_bundle("text-classification", arch)) as classifier:
        batch = await predict(classifier, PAIRS, top_k=None)
        assert await predict(classifier, [[p["text"], p["text_pair"]] for p in PAIRS], top_k=None) == batch
        for pair, got in zip(PAIRS, batch, strict=True):
            reference = classify(pair)
            assert [r["label"] for r in reference] == [g["label"] for g in got]
            assert np.allclose([r["score"] for r in reference], [g["score"] for g in got], atol=TOL)
            assert all(g.get("truncated", False) == (LONG in pair.values()) for g in got)
            (single,) = await predict(classifier, pair, top_k=None)  # one pair: one answer in a list, as one text
            assert np.allclose([g["score"] for g in single], [g["score"] for g in got], atol=1e-6)
        # Windows are a single text's: a long pair asked to be read in windows is cut, and its answer says so.
        assert await predict(classifier, PAIRS, top_k=None, long_input="window") == batch
        alone = await predict(classifier, PAIRS[0]["text"], top_k=None)
        assert alone[0] != batch[0]  # the pair's second text is read, not dropped


@pytest.mark.parametrize(
    ("inputs", "parameters", "status", "message"),
    [
        ({"text": "a"}, {}, 422, 'inputs must hold "text" and "text_pair"'),
        ([{"text": "a", "text_pair": "b"}, "c"], {}, 422, "inputs[1] must be a pair"),
        ([["a", "b"], ["c"]], {}, 422, "inputs[1] must be a pair [text, text_pair], got a list of 1"),
        # A third text or a third field would be dropped without a word: refused instead.
        ([["a", "b", "c"]], {}, 422, "inputs[0] must be a pair [text, text_pair], got a list of 3"),
        ({"text": "a", "text_pair": "b", "label": "c"}, {}, 422, 'inputs must hold "text" and "text_pair", and only'),
        ({"text": "a", "text_pair": ""}, {}, 400, "inputs.text_pair is an empty string"),
        ([["a", 3]], {}, 422, "inputs[0][1] must be a string"),
        ({"text": LONG, "text_pair": "b"}, {"truncate": False}, 413, "inputs is 634 tokens long"),
    ],
)
async def test_a_wrong_pair_is_refused_naming_it(
    classifier: httpx.AsyncClient, inputs: object, parameters: dict[str, object], status: int, message: str
) -> None:
    response = await classifier.post("/predict", json={"inputs": inputs, "parameters": parameters})
    assert response.status_code == status, response.text
    assert response.json()["error"].startswith(message), response.json()
    assert "window" not in response.json()["error"]  # a pair is never read in windows


def windows_of(bundle: Path, text: str, stride: int) -> list[Any]:
    """The long-input windows, built independently of the server with tokenizers' own overflow."""
    tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    tok.no_truncation()
    content = tok.encode(text, add_special_tokens=False)
    content.truncate(126 - tok.num_special_tokens_to_add(False), stride=stride)
    first = tok.post_process(content)
    return [first, *first.overflowing]


def run_alone(bundle: Path, encodings: list[Any]) -> list[np.ndarray]:
    """Each window through the model on its own (batch 1: no padding anywhere)."""
    model = OnnxModel(bundle / MODEL_FILE)
    return [model.run(pad_batch([e], model.input_names))[0] for e in encodings]


async def test_window_classification_averages_the_windows_scores(classifier: httpx.AsyncClient, tmp_path: Path) -> None:
    # Weights wider than the tiny models' 0.02, which score every window within 1e-4 of the others: there, the
    # first window's scores alone, or the softmax of the mean logits, passed for the mean of the windows' scores.
    model = make_model(tmp_path / "model", "text-classification", initializer_range=0.5)
    bundle = quick_bundle(model, "text-classification", tmp_path / "bundle")
    windows = windows_of(bundle, ENDS_ELSEWHERE, stride=16)
    assert len(windows) >= 4
    logits = run_alone(bundle, windows)
    expected = np.mean([softmax(x) for x in logits], axis=0)
    # The windows disagree: neither the first one's scores nor the softmax of their mean logits is the answer.
    assert np.abs(softmax(logits[0]) - expected).max() > 0.01
    assert np.abs(softmax(np.mean(logits, axis=0)) - expected).max() > 0.01
    async with serve(bundle) as client:
        response = await client.post(
            "/predict",
            json={"inputs": ENDS_ELSEWHERE, "parameters": {"long_input": "window", "stride": 16, "top_k": None}},
        )
    assert "x-truncated" not in response.headers
    assert int(response.headers["x-compute-tokens"]) == sum(len(w) for w in windows)
    labels = ["negative", "neutral", "positive"]
    got = {e["label"]: e["score"] for e in response.json()[0]}
    assert np.allclose([got[label] for label in labels], expected, atol=TOL)
    short = await predict(classifier, "short text", top_k=None)
    assert await predict(classifier, "short text", top_k=None, long_input="window") == short


# ---- token classification ------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "roberta", "xlm-roberta"])  # WordPiece, byte-level BPE, Unigram
async def test_entities_equal_the_transformers_pipeline_for_every_strategy(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory, arch: str
) -> None:
    model = tiny_model("token-classification", arch)
    async with serve(fp32_bundle("token-classification", arch)) as client:
        for strategy in ("none", "simple", "first", "average", "max"):
            ignores: tuple[list[str] | None, ...] = (None, [])
            for ignore in ignores:
                kwargs: dict[str, Any] = {"aggregation_strategy": strategy}
                if ignore is not None:
                    kwargs["ignore_labels"] = ignore
                with warnings.catch_warnings():
                    # transformers warns that BPE/Unigram tokenizers "do not support real words"; expected.
                    warnings.simplefilter("ignore")
                    reference = pipeline("token-classification", model, **kwargs)(TEXTS)
                ours = await predict(client, TEXTS, **kwargs)
                for text, ref, got in zip(TEXTS, reference, ours, strict=True):
                    # Spans leave out edge whitespace, which byte-level offsets carry (test_token_spans.py).
                    assert [without_edge_spaces(text, e) for e in ref] == [
                        {k: v for k, v in e.items() if k != "score"} for e in got
                    ], (strategy, ignore)
                    assert np.allclose([e["score"] for e in ref], [e["score"] for e in got], atol=TOL)


async def test_entities_are_grouped_by_default(fp32_bundle: ModelFactory) -> None:
    # The default strategy is simple (docs/api.md), as the Hugging Face Inference API's; the pipeline's own
    # default is none, so the comparisons above, which name every strategy, would not see it change.
    async with serve(fp32_bundle("token-classification")) as client:
        default = await predict(client, TEXTS, ignore_labels=[])
        simple = await predict(client, TEXTS, aggregation_strategy="simple", ignore_labels=[])
    assert default == simple
    assert default[0] and all("entity_group" in e and "entity" not in e for e in default[0])


async def test_window_entities_cover_the_whole_text_with_true_offsets(fp32_bundle: ModelFactory) -> None:
    async with serve(fp32_bundle("token-classification")) as client:
        params = {"aggregation_strategy": "none", "ignore_labels": []}
        cut = await predict(client, LONG, **params)
        whole = await predict(client, LONG, long_input="window", stride=20, **params)
    # Every content token once, in order, with offsets into the original text.
    assert [e["index"] for e in whole] == list(range(1, len(whole) + 1))
    assert whole[-1]["end"] == len(LONG) and cut[-1]["end"] < len(LONG) // 3
    for e in whole:
        piece = LONG[e["start"] : e["end"]]
        assert piece and e["word"].lstrip("#").lower() == piece.lower()
    # Tokens far from the first window's edge read exactly as in the truncated run (same window).
    keep = len(cut) - 20
    assert all(e.pop("truncated") for e in cut)
    assert whole[:keep] == cut[:keep]


async def test_a_large_requests_entities_are_grouped_while_the_worker_answers_others(
    fp32_bundle: ModelFactory,
) -> None:
    # Grouping costs Python about 15 us a token: it ran on the event loop, so a 1 MB request of entities held its
    # worker, health probes included, for 8 s. Here its grouping waits until a /health is answered meanwhile.
    entered, released, waited = threading.Event(), threading.Event(), []
    async with serve(fp32_bundle("token-classification")) as client:
        pipeline = client.resources.pipeline
        grouping = pipeline.task.postprocess

        def held(*args: Any) -> Any:
            entered.set()
            waited.append(released.wait(10))  # False: nothing else ran meanwhile
            return grouping(*args)

        pipeline.task = dataclasses.replace(pipeline.task, postprocess=held)
        large = asyncio.ensure_future(client.post("/predict", json={"inputs": ["John lives in Berlin. " * 50] * 20}))
        await asyncio.to_thread(entered.wait, 30)
        health = await client.get("/health")
        released.set()
        assert health.status_code == 200 and (await large).status_code == 200
    assert waited == [True]


async def test_window_entities_overlap_nowhere_as_the_pipelines(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory
) -> None:
    # Byte-level BPE spells a CJK character in several tokens of the same span. Read in windows, the pipeline
    # keeps one entity of overlapping ones (aggregate_overlapping_entities) anywhere in the text; hare kept them all.
    from transformers import pipeline

    text = "東京都に住んでいる" * 40
    params: dict[str, Any] = {"aggregation_strategy": "simple", "ignore_labels": [], "stride": 8}
    async with serve(fp32_bundle("token-classification", "roberta")) as client:
        entities = await predict(client, text, **params)
        cut = await predict(client, text, aggregation_strategy="simple", ignore_labels=[])
        tokens = await predict(client, text, aggregation_strategy="none", ignore_labels=[], stride=8)
    reference: Any = pipeline(
        "token-classification", model=str(tiny_model("token-classification", "roberta")), **params
    )
    # Strategy none answers every token once (the pipeline refuses it with a stride): no overlap is dropped.
    assert [e["index"] for e in tokens] == list(range(1, len(tokens) + 1))
    assert tokens[-1]["end"] == len(text) and len({(e["start"], e["end"]) for e in tokens}) < len(tokens)
    spans = [(e["start"], e["end"]) for e in entities]
    assert all(end <= start for (_, end), (start, _) in itertools.pairwise(spans))
    assert len({(s, e) for s, e in [(c["start"], c["end"]) for c in cut]}) < len(cut)  # what one window keeps
    # Within the first window, short of its overlap with the next, the pipeline's entities.
    first = [e for e in reference(text) if e["end"] <= 30]
    assert [(e["entity_group"], e["start"], e["end"]) for e in entities if e["end"] <= 30] == [
        (e["entity_group"], e["start"], e["end"]) for e in first
    ]


async def test_entities_of_a_text_cut_on_the_left_point_into_the_text_as_sent(fp32_bundle: ModelFactory) -> None:
    # LONG is read whole; four of it, too long to tokenize whole for 124 tokens, by its end alone. Both keep the
    # same last tokens, so the same entities, apart by the characters the longer text has more before them.
    longer = " ".join([LONG] * 4)
    params = {"aggregation_strategy": "none", "ignore_labels": [], "truncation_direction": "Left"}
    async with serve(fp32_bundle("token-classification")) as client:
        short, long = await predict(client, [LONG, longer], **params)
    assert short[0]["start"] > 0 and short[-1]["end"] == len(LONG)  # its last tokens
    moved = len(longer) - len(LONG)
    assert long == [{**e, "start": e["start"] + moved, "end": e["end"] + moved} for e in short]
    for e in long:
        assert e["word"].lstrip("#").lower() == longer[e["start"] : e["end"]].lower()


# ---- embeddings ----------------------------------------------------------------------------------------


async def test_embeddings_equal_sentence_transformers(embedder: httpx.AsyncClient, tiny_model: ModelFactory) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(tiny_model("feature-extraction")), device="cpu").encode(TEXTS)
    ours = np.array(await predict(embedder, TEXTS), dtype=np.float32)
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).max() < TOL
    single = await predict(embedder, TEXTS[0])
    assert np.allclose(single, ours[0], atol=1e-6)


async def test_an_embedding_cut_at_its_start_reads_the_texts_end(
    embedder: httpx.AsyncClient, tiny_model: ModelFactory
) -> None:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_model("feature-extraction")), device="cpu")
    model.tokenizer.truncation_side = "left"
    reference = model.encode([ENDS_ELSEWHERE])
    left = await embedder.post("/embed", json={"inputs": [ENDS_ELSEWHERE], "truncation_direction": "Left"})
    assert np.abs(np.array(left.json()) - reference).max() < TOL
    cohere = await embedder.post("/v2/embed", json={"texts": [ENDS_ELSEWHERE], "truncate": "START"})
    assert np.allclose(cohere.json()["embeddings"]["float"], left.json(), atol=1e-6)
    right = await embedder.post("/embed", json={"inputs": [ENDS_ELSEWHERE]})
    assert not np.allclose(right.json(), left.json(), atol=1e-5)


async def test_embedding_parameters(embedder: httpx.AsyncClient) -> None:
    plain = np.array(await predict(embedder, "I like you", normalize=False))
    normalized = np.array(await predict(embedder, "I like you"))
    assert np.allclose(l2_normalize(plain.astype(np.float32)), normalized, atol=1e-6)
    short = np.array(await predict(embedder, "I like you", dimensions=8))
    assert short.shape == (8,) and np.linalg.norm(short) == pytest.approx(1.0, abs=1e-5)
    assert np.allclose(short, l2_normalize(plain[:8].astype(np.float32)), atol=1e-6)
    cls = np.array(await predict(embedder, "I like you", pooling="cls", normalize=False))
    assert not np.allclose(cls, plain)
    packed = await predict(embedder, ["I like you"], encoding_format="base64")
    assert np.allclose(np.frombuffer(base64.b64decode(packed[0]), dtype="<f4"), normalized, atol=1e-7)


async def test_window_embeddings_pool_the_windows(embedder: httpx.AsyncClient, fp32_bundle: ModelFactory) -> None:
    bundle = fp32_bundle("feature-extraction")
    tok = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)  # over the 64-token maximum
    tok.no_truncation()
    content = tok.encode(text, add_special_tokens=False)
    content.truncate(64 - 2, stride=8)
    first = tok.post_process(content)
    windows = [first, *first.overflowing]
    states = run_alone(bundle, windows)
    pooled = np.stack([s.mean(axis=0) for s in states])
    weights = np.array([len(w) for w in windows], dtype=np.float32)
    expected = l2_normalize((pooled * weights[:, None]).sum(axis=0) / weights.sum())
    got = np.array(await predict(embedder, text, long_input="window", stride=8))
    assert np.abs(got - expected).max() < TOL
    # Last-token pooling (decoder embedders) reads the text's last token: the last window's, not a mean of windows.
    last = np.array(await predict(embedder, text, long_input="window", stride=8, pooling="lasttoken"))
    assert np.abs(last - l2_normalize(states[-1][-1])).max() < TOL


async def test_openai_embeddings(embedder: httpx.AsyncClient) -> None:
    response = await embedder.post("/v1/embeddings", json={"input": ["I like you", "hi"], "model": "anything"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == "bert-feature-extraction"
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == int(response.headers["x-compute-tokens"])
    assert np.allclose(body["data"][0]["embedding"], await predict(embedder, "I like you"), atol=1e-6)
    packed = await embedder.post("/v1/embeddings", json={"input": "hi", "encoding_format": "base64", "dimensions": 4})
    vector = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), dtype="<f4")
    assert vector.shape == (4,)
    tokens = await embedder.post("/v1/embeddings", json={"input": [[1, 2, 3]]})
    assert tokens.status_code == 422


async def test_openai_embeddings_need_an_embeddings_bundle(classifier: httpx.AsyncClient) -> None:
    response = await classifier.post("/v1/embeddings", json={"input": "hi"})
    assert response.status_code == 404 and "embeddings bundle" in error_of(response)[0]


# ---- ranking -------------------------------------------------------------------------------------------


async def test_ranking_order_and_scores_equal_pytorch(ranker: httpx.AsyncClient, tiny_model: ModelFactory) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tiny_model("text-ranking")
    query, documents = "capital of France", [*TEXTS, "Paris is the capital of France"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        logits = model(**tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt")).logits
    expected = torch.sigmoid(logits[:, 0]).numpy()
    ranked = await predict(ranker, {"query": query, "documents": documents})
    assert_ranked(ranked, expected, TOL)
    assert all("document" not in r for r in ranked)


async def test_max_tokens_per_doc_cuts_each_document_first(ranker: httpx.AsyncClient, tiny_model: ModelFactory) -> None:
    # Cohere's max_tokens_per_doc: each document cut to that many of its own tokens, then paired with the query.
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tiny_model("text-ranking")
    query, documents = "capital of France", [LONG, "Paris is the capital of France", "hello"]
    tokenizer = AutoTokenizer.from_pretrained(str(folder)).backend_tokenizer
    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    expected = []
    for document in documents:
        cut = tokenizer.encode(document, add_special_tokens=False)
        cut.truncate(5)
        pair = tokenizer.post_process(tokenizer.encode(query, add_special_tokens=False), cut)
        with torch.inference_mode():
            feeds = {"input_ids": torch.tensor([pair.ids]), "token_type_ids": torch.tensor([pair.type_ids])}
            expected.append(float(torch.sigmoid(model(**feeds).logits[0, 0])))
    answer = await ranker.post("/v2/rerank", json={"query": query, "documents": documents, "max_tokens_per_doc": 5})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert_ranked([{"index": r["index"], "score": r["relevance_score"]} for r in results], np.array(expected), TOL)
    assert [r.get("truncated", False) for r in sorted(results, key=lambda r: r["index"])] == [True, True, False]
    whole = await ranker.post("/v2/rerank", json={"query": query, "documents": documents, "max_tokens_per_doc": 4096})
    plain = await ranker.post("/v2/rerank", json={"query": query, "documents": documents})
    assert whole.json()["results"] == plain.json()["results"]  # at or above the room, it changes nothing


async def test_rank_fields_rank_documents_without_text(ranker: httpx.AsyncClient) -> None:
    # Cohere's structured documents: the listed fields are what is ranked, and no "text" is needed (it was refused).
    documents = [{"Title": "Paris", "Content": "capital of France", "year": 2024}, {"Title": "fox", "Content": "quick"}]
    fields = ["Title", "Content", "year"]
    body = {"query": "capital", "documents": documents, "rank_fields": fields, "return_documents": True}
    answer = await ranker.post("/v1/rerank", json=body)
    assert answer.status_code == 200, answer.text
    written = ["Title: Paris\nContent: capital of France\nyear: 2024", "Title: fox\nContent: quick"]
    plain = (await ranker.post("/v1/rerank", json={"query": "capital", "documents": written})).json()
    assert [(r["index"], r["relevance_score"]) for r in answer.json()["results"]] == [
        (r["index"], r["relevance_score"]) for r in plain["results"]
    ]
    assert answer.json()["results"][0]["document"] in documents  # the object as sent
    lacking = await ranker.post("/v2/rerank", json={**body, "documents": [{"Author": "x"}]})
    assert lacking.status_code == 422
    assert lacking.json()["error"] == "documents[0] has none of rank_fields (Title, Content, year) and no text"
    typo = await ranker.post("/v1/rerank", json={**body, "rank_fields": ["Title", 3]})
    assert typo.status_code == 422 and typo.json()["error"].startswith("rank_fields[1] must be a string, got ")


async def test_ranking_parameters(ranker: httpx.AsyncClient) -> None:
    documents = ["a cat", "a dog", "Paris is the capital of France"]
    full = await predict(ranker, {"query": "capital", "documents": documents})
    top = await predict(ranker, {"query": "capital", "texts": documents}, top_n=2, return_documents=True)
    assert [t["index"] for t in top] == [f["index"] for f in full[:2]]
    assert [t["document"] for t in top] == [documents[f["index"]] for f in full[:2]]
    many = [f"document number {i}" for i in range(25)]  # without top_n, every document: no cap of some default
    assert sorted(r["index"] for r in await predict(ranker, {"query": "capital", "documents": many})) == list(range(25))
    raw = await predict(ranker, {"query": "capital", "documents": documents}, raw_scores=True)
    assert np.allclose(1 / (1 + np.exp(-np.array([r["score"] for r in raw]))), [f["score"] for f in full], atol=1e-6)
    long_doc = await ranker.post("/predict", json={"inputs": {"query": "capital", "documents": ["short", LONG]}})
    assert long_doc.headers["x-truncated"] == "true"
    assert [("truncated" in r) for r in sorted(long_doc.json(), key=lambda r: r["index"])] == [False, True]
    refused = await ranker.post(
        "/predict",
        json={"inputs": {"query": "capital", "documents": [LONG]}, "parameters": {"truncate": False}},
    )
    assert refused.status_code == 413 and "documents[0]" in refused.json()["error"]
    window = await ranker.post(
        "/predict", json={"inputs": {"query": "q", "documents": ["d"]}, "parameters": {"long_input": "window"}}
    )
    assert window.status_code == 422 and "text-ranking" in window.json()["error"]
