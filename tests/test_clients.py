"""The clients people already use, installed from PyPI, each against a real `hare serve` on loopback for the
matching task: huggingface_hub's InferenceClient, openai, cohere (v1 and v2), tritonclient (KServe's Open
Inference Protocol v2), and TEI's routes over plain HTTP. Each server runs one worker, to keep this quick."""

from __future__ import annotations

import base64
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cohere
import httpx
import huggingface_hub.constants
import numpy as np
import openai
import pydantic
import pytest
import tritonclient.http as triton
from huggingface_hub import InferenceClient, close_session

from tasks import quantize
from tests.conftest import ModelFactory
from tests.live_server import hare_serve

TEXTS = ["Angela Merkel lives in Berlin", "I love this movie", "The weather is cold"]
QUERY = "where does Merkel live"
NAME = "tiny"


@contextmanager
def serve_tiny(bundle: Path, **env: str) -> Iterator[str]:
    """`hare serve BUNDLE` (one worker, named NAME), ready; yields its URL."""
    with (
        tempfile.TemporaryDirectory() as folder,
        hare_serve(bundle, Path(folder) / "server.log", env={"HARE_MODEL_NAME": NAME, **env}) as (url, _),
    ):
        yield url


Server = Callable[[str], str]


@pytest.fixture(scope="module")
def server(fp32_bundle: ModelFactory) -> Iterator[Server]:
    """server(task) -> the URL of a `hare serve` on that task's tiny fp32 bundle (started once per module). fp32:
    the tests compare a protocol's numbers with /predict's at 1e-6, and an int8 bundle's depend on the batch at
    about 5e-5 (activations quantized per call): a request's three texts run as one call alone on a worker's
    connection, as two calls side by side when the worker serves others too."""
    started: dict[str, str] = {}
    with_stack = []

    def get(task: str) -> str:
        if task not in started:
            manager = serve_tiny(fp32_bundle(task))
            started[task] = manager.__enter__()
            with_stack.append(manager)
        return started[task]

    yield get
    for manager in reversed(with_stack):
        manager.__exit__(None, None, None)


def predict(url: str, inputs: object, **parameters: object) -> Any:
    response = httpx.post(f"{url}/predict", json={"inputs": inputs, "parameters": parameters}, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


# huggingface_hub InferenceClient


@pytest.fixture
def hf(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], InferenceClient]]:
    """InferenceClient(model=URL), with the hub's offline switch (set for the whole suite) off: a URL model
    never reaches the hub, and offline mode would refuse loopback too."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    close_session()
    yield lambda url: InferenceClient(model=url)
    close_session()


def test_hf_feature_extraction_and_sentence_similarity(server: Server, hf: Callable[[str], InferenceClient]) -> None:
    url = server("feature-extraction")
    client = hf(url)
    vector = client.feature_extraction(TEXTS[0])
    assert vector.dtype == np.float32 and vector.shape == np.asarray(predict(url, TEXTS[0])).shape
    assert np.allclose(vector, predict(url, TEXTS[0]), atol=1e-6)
    raw = client.feature_extraction(TEXTS[0], normalize=False, truncate=True, truncation_direction="right")
    assert np.linalg.norm(raw) != pytest.approx(1.0, abs=1e-3)  # the option at the root was applied
    assert np.allclose(raw / np.linalg.norm(raw), vector, atol=1e-5)
    long = " ".join([TEXTS[0]] * 60 + [TEXTS[2]] * 60)  # far over the tiny model's maximum, and its ends differ
    left = client.feature_extraction(long, truncation_direction="left")
    assert not np.allclose(left, client.feature_extraction(long), atol=1e-3)
    assert np.allclose(left, client.feature_extraction(long[len(long) // 2 :], truncation_direction="left"), atol=1e-5)
    cosines = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS)
    vectors = np.asarray(predict(url, TEXTS))
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    assert len(cosines) == 3 and cosines[0] == pytest.approx(1.0, abs=1e-5)
    assert np.allclose(cosines, unit @ unit[0], atol=2e-3)  # int8: batch company moves the last digits


def test_hf_text_classification_top_k(server: Server, hf: Callable[[str], InferenceClient]) -> None:
    url = server("text-classification")
    client = hf(url)
    labels = client.text_classification(TEXTS[1], top_k=3)
    assert len(labels) == 3 and [e.label for e in labels] == [e["label"] for e in predict(url, TEXTS[1], top_k=3)[0]]
    assert labels[0].score >= labels[1].score >= labels[2].score
    assert len(client.text_classification(TEXTS[1])) == 1
    sigmoid = client.text_classification(TEXTS[1], top_k=2, function_to_apply="sigmoid")
    assert sum(e.score for e in sigmoid) != pytest.approx(1.0)


def test_hf_token_classification(server: Server, hf: Callable[[str], InferenceClient]) -> None:
    url = server("token-classification")
    client = hf(url)
    entities = client.token_classification(TEXTS[0], ignore_labels=[], aggregation_strategy="simple")
    expected = predict(url, TEXTS[0], ignore_labels=[], aggregation_strategy="simple")
    assert entities and [e.entity_group for e in entities] == [e["entity_group"] for e in expected]
    assert all(TEXTS[0][e.start : e.end].strip() for e in entities)
    windowed = client.token_classification(TEXTS[0], ignore_labels=[], stride=4)  # stride: read in windows
    assert [e.word for e in windowed] == [e.word for e in entities]


# OpenAI


def test_openai_embeddings_and_models(server: Server) -> None:
    url = server("feature-extraction")
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        check_openai(client, url)


def check_openai(client: openai.OpenAI, url: str) -> None:
    answer = client.embeddings.create(model=NAME, input=TEXTS)  # base64 on the wire, the client decodes it
    vectors = np.array([d.embedding for d in answer.data])
    assert np.allclose(vectors, predict(url, TEXTS), atol=1e-6)
    assert answer.usage.total_tokens > len(TEXTS) and answer.model == NAME
    short = client.embeddings.create(model=NAME, input=TEXTS[0], dimensions=8, encoding_format="float")
    assert len(short.data[0].embedding) == 8
    packed = client.embeddings.create(model=NAME, input=TEXTS[0], dimensions=8)  # base64 on the wire
    assert np.allclose(packed.data[0].embedding, short.data[0].embedding, atol=1e-6)
    assert np.linalg.norm(packed.data[0].embedding) == pytest.approx(1.0, abs=1e-5)  # re-normalized
    assert [m.id for m in client.models.list()] == [NAME]
    assert client.models.retrieve(NAME).owned_by == "hare"
    # The client shows what to fix, as for OpenAI's own refusals (on hare's shape: "Error code: 400" alone).
    with pytest.raises(openai.NotFoundError, match=r"Error code: 404 - .*gpt-4"):
        client.models.retrieve("gpt-4")
    with pytest.raises(openai.BadRequestError, match=r"Error code: 400 - .*empty"):
        client.embeddings.create(model=NAME, input="")
    with pytest.raises(openai.UnprocessableEntityError, match=r"Error code: 422 - .*dimensions") as refused:
        client.embeddings.create(model=NAME, input=TEXTS[0], dimensions=10_000)
    # OpenAI's type, which code written for OpenAI branches on; hare's class as the code.
    assert refused.value.type == "invalid_request_error" and refused.value.code == "InvalidRequest"


# Cohere v1 and v2, Jina's shape


def test_cohere_rerank_v2_and_v1(server: Server) -> None:
    url = server("text-ranking")
    expected = predict(url, {"query": QUERY, "documents": TEXTS})
    assert isinstance(expected, list)
    with httpx.Client() as http:
        v2_client = cohere.ClientV2(base_url=url, api_key="unused", httpx_client=http)
        v1_client = cohere.Client(base_url=url, api_key="unused", httpx_client=http)
        v2 = v2_client.rerank(model=NAME, query=QUERY, documents=TEXTS, top_n=2)
        v1 = v1_client.rerank(model=NAME, query=QUERY, documents=[{"text": t} for t in TEXTS], return_documents=True)
    assert [(r.index, pytest.approx(r.relevance_score, abs=1e-6)) for r in v2.results] == [
        (e["index"], e["score"]) for e in expected[:2]
    ]
    assert [r.index for r in v1.results] == [e["index"] for e in expected]
    assert [r.document.text for r in v1.results if r.document] == [TEXTS[e["index"]] for e in expected]
    jina = httpx.post(
        f"{url}/v1/rerank", json={"model": NAME, "query": QUERY, "documents": TEXTS, "return_documents": True}
    ).json()
    assert jina["usage"]["total_tokens"] > 0 and jina["results"][0]["document"] == {"text": TEXTS[expected[0]["index"]]}


def test_cohere_embed_v2_and_v1_every_type(server: Server) -> None:
    url = server("feature-extraction")
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    with httpx.Client() as http:
        v2_client = cohere.ClientV2(base_url=url, api_key="unused", httpx_client=http)
        v1_client = cohere.Client(base_url=url, api_key="unused", httpx_client=http)
        v2 = v2_client.embed(model=NAME, texts=TEXTS, input_type="search_query", embedding_types=types)
        short = v2_client.embed(
            model=NAME, texts=TEXTS, input_type="search_document", embedding_types=["float"], output_dimension=8
        )
        v1 = v1_client.embed(model=NAME, texts=TEXTS, input_type="classification")
        with warnings.catch_warnings():  # cohere 7.3.1 merges typed v1 answers through deprecated pydantic calls
            warnings.simplefilter("ignore", pydantic.warnings.PydanticDeprecationWarning)
            v1_typed = v1_client.embed(model=NAME, texts=TEXTS, embedding_types=["ubinary"], truncate="END")
        with pytest.raises(cohere.errors.UnprocessableEntityError):
            v2_client.embed(model=NAME, texts=TEXTS, input_type="search_query", embedding_types=["int4"])
        long = " ".join([TEXTS[0]] * 60 + [TEXTS[2]] * 60)  # over the tiny model's maximum; its ends differ
        ends = [
            v2_client.embed(
                model=NAME, texts=[long], input_type="search_document", embedding_types=["float"], truncate=t
            )
            for t in ("START", "END")
        ]
    floats = np.array(v2.embeddings.float_, dtype=np.float32)
    assert floats.shape == (3, 32) and np.allclose(floats, predict(url, TEXTS), atol=2e-3)  # int8 bundle
    for kind in ("int8", "uint8", "binary", "ubinary"):
        assert np.array_equal(np.array(getattr(v2.embeddings, kind)), quantize.quantize(floats, kind)), kind
    assert np.array(v2.embeddings.binary).shape == (3, 4) and v2.texts == TEXTS and v2.id
    decoded = np.array([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in v2.embeddings.base64 or ()])
    assert np.array_equal(decoded, floats)
    cut = np.array(short.embeddings.float_)
    assert cut.shape == (3, 8) and np.allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)
    assert v1.response_type == "embeddings_floats" and np.array(v1.embeddings).shape == (3, 32)
    assert v1_typed.response_type == "embeddings_by_type" and np.array(v1_typed.embeddings.ubinary).shape == (3, 4)
    start, end = (np.array(e.embeddings.float_) for e in ends)
    assert np.allclose(start, predict(url, long, truncation_direction="Left"), atol=1e-6)
    assert np.allclose(end, predict(url, long), atol=1e-6) and not np.allclose(start, end, atol=1e-3)


# text-embeddings-inference's routes


def test_tei_routes(server: Server) -> None:
    url = server("feature-extraction")
    embedded = httpx.post(f"{url}/embed", json={"inputs": TEXTS[0], "normalize": False}).json()
    assert len(embedded) == 1 and np.linalg.norm(embedded[0]) != pytest.approx(1.0, abs=1e-3)
    cosines = httpx.post(f"{url}/similarity", json={"inputs": {"source_sentence": "a", "sentences": TEXTS}}).json()
    assert len(cosines) == 3
    tokens = httpx.post(f"{url}/tokenize", json={"inputs": [TEXTS[0]]}).json()
    (first,) = tokens
    (states,) = httpx.post(f"{url}/embed_all", json={"inputs": TEXTS[0], "truncate": True}).json()
    assert np.array(states).shape == (len(first), 32)  # one vector per token, [CLS] and [SEP] included
    mean = np.mean(states, axis=0)
    assert np.allclose(
        mean / np.linalg.norm(mean), httpx.post(f"{url}/embed", json={"inputs": TEXTS[0]}).json()[0], atol=1e-5
    )
    assert first[0]["special"] and first[0]["start"] is None
    words = [t for t in first if not t["special"]]
    assert all(TEXTS[0][t["start"] : t["stop"]] == t["text"] for t in words)
    decoded = httpx.post(f"{url}/decode", json={"ids": [[t["id"] for t in first]]}).json()
    assert decoded[0].lower().split() == TEXTS[0].lower().split()
    refused = httpx.post(f"{url}/rerank", json={"query": "q", "texts": ["a"]})
    assert refused.status_code == 404 and "text-ranking" in refused.json()["error"]
    ranking = server("text-ranking")
    ranked = httpx.post(f"{ranking}/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True}).json()
    assert [r["index"] for r in ranked] == [e["index"] for e in predict(ranking, {"query": QUERY, "documents": TEXTS})]
    assert all(r["text"] == TEXTS[r["index"]] for r in ranked)


# KServe Open Inference Protocol v2, through tritonclient


def _texts(name: str, texts: list[str], binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object), binary_data=binary)
    return tensor


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_triton_embeddings_and_classification(server: Server, binary: bool) -> None:
    url = server("feature-extraction")
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(NAME)
    assert client.is_model_ready(NAME, "1") and not client.is_model_ready("other")
    meta = client.get_model_metadata(NAME)
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert client.get_server_metadata()["name"] == "hare"
    outputs = None if binary else [triton.InferRequestedOutput("embeddings", binary_data=False)]
    result = client.infer(NAME, [_texts("text", TEXTS, binary)], outputs=outputs)
    assert np.allclose(result.as_numpy("embeddings"), predict(url, TEXTS), atol=1e-6)
    for algorithm in ("gzip", "deflate"):  # the whole body compressed, its JSON part's length as before
        packed = client.infer(
            NAME, [_texts("text", TEXTS, binary)], outputs=outputs, request_compression_algorithm=algorithm
        )
        assert np.allclose(packed.as_numpy("embeddings"), result.as_numpy("embeddings"), atol=1e-6)
    classes = server("text-classification")
    client = triton.InferenceServerClient(classes.removeprefix("http://"))
    labelled = client.infer(NAME, [_texts("text", TEXTS, binary)], parameters={"top_k": 2}, model_version="1")
    expected = predict(classes, TEXTS, top_k=2)
    assert isinstance(expected, list)
    labels = labelled.as_numpy("labels")
    assert labels.shape == (3, 2)
    assert [[x.decode() if isinstance(x, bytes) else x for x in row] for row in labels] == [
        [e["label"] for e in row] for row in expected
    ]
    assert np.allclose(labelled.as_numpy("scores"), [[e["score"] for e in row] for row in expected], atol=1e-6)
    with pytest.raises(triton.InferenceServerException, match="unknown parameter"):
        client.infer(NAME, [_texts("text", TEXTS, binary)], parameters={"topk": 2})
    # Text pairs (inference, paraphrase): two tensors, as transformers' pipeline names a pair's members.
    seconds = [TEXTS[2], TEXTS[0], TEXTS[1]]
    paired = client.infer(NAME, [_texts("text_pair", seconds, binary), _texts("text", TEXTS, binary)])
    expected = predict(classes, [{"text": a, "text_pair": b} for a, b in zip(TEXTS, seconds, strict=True)])
    assert isinstance(expected, list)
    assert np.allclose(paired.as_numpy("scores")[:, 0], [row[0]["score"] for row in expected], atol=1e-6)
    with pytest.raises(triton.InferenceServerException, match='"text" holds 3 strings and "text_pair" 2'):
        client.infer(NAME, [_texts("text", TEXTS, binary), _texts("text_pair", seconds[:2], binary)])


def test_triton_token_classification_and_ranking(server: Server) -> None:
    url = server("token-classification")
    client = triton.InferenceServerClient(url.removeprefix("http://"))
    result = client.infer(NAME, [_texts("text", TEXTS[:2], True)], parameters={"ignore_labels": []})
    entities = [orjson_loads(x) for x in result.as_numpy("entities")]
    assert entities == predict(url, TEXTS[:2], ignore_labels=[])
    ranking = server("text-ranking")
    client = triton.InferenceServerClient(ranking.removeprefix("http://"))
    ranked = client.infer(NAME, [_texts("query", [QUERY], True), _texts("documents", TEXTS, True)])
    expected = predict(ranking, {"query": QUERY, "documents": TEXTS})
    assert isinstance(expected, list)
    assert ranked.as_numpy("order").tolist() == [e["index"] for e in expected]
    assert np.allclose(ranked.as_numpy("scores"), [e["score"] for e in expected], atol=1e-6)


def orjson_loads(value: bytes | str) -> object:
    import json

    return json.loads(value)
