"""Vector output, in process on fp32 bundles: TEI's /embed_all and output_value token_embeddings equal
sentence-transformers' token embeddings; every encoding_format equals tasks/quantize.py's codes of the float
answer; Cohere's /v2/embed and /v1/embed (types, output_dimension, input_type to prompts); and the refusals.
Real clients (cohere, openai) against a real server are in tests/test_clients.py."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from api.web.protocols.cohere_embed import prompt_name
from tasks import quantize
from tasks.errors import InvalidRequest
from tasks.ops import l2_normalize
from tests.api_helpers import serve
from tests.conftest import ModelFactory, quick_bundle
from tests.tiny_models import make_sentence_transformer

TOL = 1e-4  # fp32 ONNX against PyTorch
TEXTS = ["Angela Merkel met Emmanuel Macron in Paris.", "hello", "The quick brown fox jumps over the lazy dog"]
pytestmark = pytest.mark.anyio
PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def st_folder(tiny_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BERT, mean pooling, a Dense module to 16 dimensions, Normalize, prompts query and passage."""
    return make_sentence_transformer(
        tmp_path_factory.mktemp("vectors") / "model", tiny_model("feature-extraction"), dense=(16,), prompts=PROMPTS
    )


@pytest.fixture(scope="module")
async def server(st_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    out = quick_bundle(st_folder, "feature-extraction", tmp_path_factory.mktemp("vectors-bundle") / "bundle")
    async with serve(out) as client:
        yield client


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


async def predict(client: httpx.AsyncClient, inputs: object, **parameters: object) -> Any:
    return await post(client, "/predict", {"inputs": inputs, "parameters": parameters})


async def test_embed_all_equals_sentence_transformers_token_embeddings(
    server: httpx.AsyncClient, st_folder: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(st_folder), device="cpu")
    expected = reference.encode(TEXTS, output_value="token_embeddings", convert_to_numpy=False)
    answer = await post(server, "/embed_all", {"inputs": TEXTS})
    assert len(answer) == len(TEXTS)
    tokenized = await post(server, "/tokenize", {"inputs": TEXTS})
    for ours, theirs, tokens in zip(answer, expected, tokenized, strict=True):
        states = np.array(ours, dtype=np.float32)
        assert states.shape == tuple(theirs.shape) and len(states) == len(tokens)  # [CLS] and [SEP] included
        assert states.shape[1] == 32  # the hidden size: before the Dense module (16), as TEI and ST
        assert np.abs(states - theirs.numpy()).max() < TOL
    one = await post(server, "/embed_all", {"inputs": TEXTS[1]})  # TEI nests one input too
    assert np.array(one).shape == (1, *expected[1].shape)
    prompted = await post(server, "/embed_all", {"inputs": [TEXTS[1]], "prompt_name": "query"})
    with_prompt = reference.encode([TEXTS[1]], prompt_name="query", output_value="token_embeddings")
    assert np.abs(np.array(prompted[0]) - with_prompt[0].numpy()).max() < TOL


async def test_token_embeddings_on_predict_and_windows(server: httpx.AsyncClient) -> None:
    states = np.array(await predict(server, TEXTS[0], output_value="token_embeddings"), dtype=np.float32)
    tokens = np.array((await post(server, "/embed_all", {"inputs": TEXTS[0]}))[0], dtype=np.float32)
    assert np.allclose(states, tokens, atol=1e-6)
    bits = await predict(server, TEXTS[0], output_value="token_embeddings", encoding_format="ubinary")
    assert np.array_equal(np.array(bits, dtype=np.uint8), quantize.quantize(states, "ubinary"))
    long = " ".join(["The quick brown fox jumps over the lazy dog."] * 30)  # over the model's maximum
    (count,) = [len(t) for t in await post(server, "/tokenize", {"inputs": [long]})]
    whole = np.array(await predict(server, long, output_value="token_embeddings", long_input="window", stride=8))
    cut = np.array(await predict(server, long, output_value="token_embeddings"))
    maximum = server.resources.model.max_length  # type: ignore[attr-defined]
    assert len(whole) == count > len(cut) == maximum  # every token once, specials at both ends
    assert np.allclose(whole[:20], cut[:20], atol=TOL)  # the first window's start is its own


async def test_every_encoding_is_the_float_vector_quantized(server: httpx.AsyncClient) -> None:
    floats = np.array(await predict(server, TEXTS), dtype=np.float32)
    assert floats.shape == (3, 16)
    for encoding in ("int8", "uint8", "binary", "ubinary"):
        codes = np.array(await predict(server, TEXTS, encoding_format=encoding))
        expected = quantize.quantize(floats, encoding)
        width = 16 if encoding.endswith("int8") else 2  # 8 sign bits a byte
        assert codes.shape == (3, width) and np.array_equal(codes, expected), encoding
    packed = await predict(server, TEXTS[0], encoding_format="base64")
    assert np.allclose(np.frombuffer(base64.b64decode(packed), dtype="<f4"), floats[0], atol=1e-6)
    tei = await post(server, "/embed", {"inputs": TEXTS, "encoding_format": "int8"})
    assert np.array_equal(np.array(tei), quantize.quantize(floats, "int8"))
    name = server.resources.model_name  # type: ignore[attr-defined]
    tensor = {"name": "text", "shape": [3], "datatype": "BYTES", "data": TEXTS}
    for encoding in ("float", "base64"):  # KServe's FP32 tensor either way: base64 is decoded back to the floats
        body = {"inputs": [tensor], "parameters": {"encoding_format": encoding}}
        (out,) = (await post(server, f"/v2/models/{name}/infer", body))["outputs"]
        assert out["shape"] == [3, 16] and np.allclose(out["data"], floats.reshape(-1), atol=1e-6), encoding


async def test_vector_options_that_do_not_apply_are_ignored_as_sentence_transformers_does(
    server: httpx.AsyncClient,
) -> None:
    tokens = await predict(server, TEXTS[1], output_value="token_embeddings")
    ignored = await predict(
        server, TEXTS[1], output_value="token_embeddings", normalize=True, dimensions=4, pooling="cls"
    )
    assert np.allclose(ignored, tokens, atol=1e-6)  # ST's encode applies them to sentence embeddings only
    pair = {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}
    cosines = await predict(server, pair)
    for shape in ({"encoding_format": "binary"}, {"output_value": "token_embeddings"}):
        for path in ("/similarity", "/predict"):  # the answer is cosines of float sentence vectors
            assert np.allclose(await post(server, path, {"inputs": pair, "parameters": shape}), cosines, atol=1e-6)
    # A text against itself: float32 rounding gave 1.0000001 to some, whose arccos is NaN.
    for text in TEXTS:
        same = await predict(server, {"source_sentence": text, "sentences": [text, text.upper()]})
        assert same[0] == 1.0 and -1.0 <= same[1] <= 1.0, same


async def test_cohere_v2_embed(server: httpx.AsyncClient) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary", "base64"]
    answer = await post(server, "/v2/embed", {"texts": TEXTS, "input_type": "search_query", "embedding_types": types})
    assert answer["texts"] == TEXTS and answer["response_type"] == "embeddings_by_type" and answer["id"]
    assert answer["meta"]["api_version"]["version"] == "2" and answer["meta"]["billed_units"]["input_tokens"] > 0
    assert set(answer["embeddings"]) == set(types)
    query = np.array(await predict(server, TEXTS, prompt_name="query"), dtype=np.float32)
    assert np.allclose(answer["embeddings"]["float"], query, atol=1e-6)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        assert np.array_equal(np.array(answer["embeddings"][kind]), quantize.quantize(query, kind)), kind
    decoded = [np.frombuffer(base64.b64decode(b), dtype="<f4") for b in answer["embeddings"]["base64"]]
    assert np.allclose(decoded, query, atol=1e-6)
    document = await post(server, "/v2/embed", {"texts": TEXTS, "input_type": "search_document"})
    assert list(document["embeddings"]) == ["float"]  # v2's default type
    # sentence-transformers saved a "document" prompt (empty) beside ours: encode_document's first choice
    assert server.resources.model.prompts["document"] == ""  # type: ignore[attr-defined]
    assert np.allclose(document["embeddings"]["float"], await predict(server, TEXTS, prompt_name="document"), atol=1e-6)
    plain = await post(server, "/v2/embed", {"texts": TEXTS, "input_type": "clustering"})  # no such prompt
    assert np.allclose(plain["embeddings"]["float"], await predict(server, TEXTS), atol=1e-6)
    short = await post(server, "/v2/embed", {"texts": TEXTS, "input_type": "search_query", "output_dimension": 8})
    vectors = np.array(short["embeddings"]["float"], dtype=np.float32)
    assert vectors.shape == (3, 8) and np.allclose(vectors, l2_normalize(query[:, :8]), atol=1e-6)


def test_input_type_picks_the_prompt_sentence_transformers_would() -> None:
    nomic = {"search_query": "search_query: ", "search_document": "search_document: ", "query": "q: "}
    assert (
        prompt_name("search_query", nomic) == "search_query"
        and prompt_name("search_document", nomic) == "search_document"
    )
    e5 = {"query": "query: ", "passage": "passage: "}
    assert prompt_name("search_query", e5) == "query" and prompt_name("search_document", e5) == "passage"
    assert prompt_name("classification", e5) is None and prompt_name(None, e5) is None  # the default prompt
    with pytest.raises(InvalidRequest, match="search_query, search_document, classification, clustering"):
        prompt_name("image", e5)


async def test_cohere_v1_embed(server: httpx.AsyncClient) -> None:
    floats = await post(server, "/v1/embed", {"texts": TEXTS[:2], "input_type": "search_query"})
    assert floats["response_type"] == "embeddings_floats" and np.array(floats["embeddings"]).shape == (2, 16)
    typed = await post(server, "/v1/embed", {"texts": TEXTS[:2], "embedding_types": ["ubinary"], "truncate": "END"})
    assert typed["response_type"] == "embeddings_by_type" and np.array(typed["embeddings"]["ubinary"]).shape == (2, 2)


async def test_cohere_max_tokens_cuts_each_text_at_its_own_tokens(server: httpx.AsyncClient, st_folder: Path) -> None:
    # sentence-transformers with max_seq_length 7: five of a text's own tokens beside BERT's two.
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    texts = ["Angela Merkel met Emmanuel Macron in Paris and Berlin.", "hello there"]
    reference = SentenceTransformer(str(st_folder), device="cpu")
    reference.max_seq_length = 7
    for truncate, side in (("END", "right"), ("START", "left")):
        reference.tokenizer.truncation_side = side
        body = {"texts": texts, "embedding_types": ["float"], "max_tokens": 5, "truncate": truncate}
        got = np.array((await post(server, "/v2/embed", body))["embeddings"]["float"])
        assert np.abs(got - reference.encode(texts)).max() < TOL, truncate
    # With a prompt (input_type -> "query: "), the cap is still the text's: the prompt is read besides (it took
    # the cap's room, so a prompt as long as the cap left every text unread).
    reference.max_seq_length, reference.tokenizer.truncation_side = 128, "right"
    tokenizer = Tokenizer.from_file(str(st_folder / "tokenizer.json"))
    tokenizer.no_truncation()
    offsets = [tokenizer.encode(t, add_special_tokens=False).offsets for t in texts]
    cut = [t[: o[min(2, len(o)) - 1][1]] for t, o in zip(texts, offsets, strict=True)]
    body = {"texts": texts, "embedding_types": ["float"], "max_tokens": 2, "input_type": "search_query"}
    got = np.array((await post(server, "/v2/embed", body))["embeddings"]["float"])
    assert np.abs(got - reference.encode(cut, prompt_name="query")).max() < TOL
    refused = await post(server, "/v2/embed", {"texts": texts, "max_tokens": 5, "truncate": "NONE"}, 413)
    assert re.match(r"texts\[0\] is \d+ tokens long, more than max_tokens \(5\); send truncate END", refused["error"])
    whole = await post(server, "/v2/embed", {"texts": texts, "max_tokens": 4096})
    assert whole["embeddings"] == (await post(server, "/v2/embed", {"texts": texts}))["embeddings"]


async def test_refusals_name_what_to_send(server: httpx.AsyncClient) -> None:
    def error(answer: Any) -> str:
        message: str = answer["error"]["message"] if isinstance(answer["error"], dict) else answer["error"]
        return message  # OpenAI's routes nest it

    accepted = "float, base64, int8, uint8, binary, ubinary"
    wrong = await post(server, "/predict", {"inputs": "hi", "parameters": {"encoding_format": "int4"}}, 422)
    assert accepted in error(wrong) and "encoding_format" in error(wrong)
    wrong = await post(server, "/v2/embed", {"texts": ["hi"], "embedding_types": ["float", "int4"]}, 422)
    assert "embedding_types[1]" in error(wrong) and accepted in error(wrong)
    wrong = await post(server, "/v2/embed", {"texts": ["hi"], "output_dimension": 17}, 422)
    assert "output_dimension is 17" in error(wrong) and "1 to 16" in error(wrong)
    wrong = await post(server, "/v2/embed", {"texts": ["hi"], "output_dimension": 0}, 422)
    assert "output_dimension" in error(wrong)
    for field, value in (("input_type", "image"), ("truncate", "MIDDLE"), ("max_tokens", 0), ("images", ["x"])):
        wrong = await post(server, "/v2/embed", {"texts": ["hi"], field: value}, 422)
        assert field in error(wrong)
    wrong = await post(server, "/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, 422)
    assert "float, base64" in error(wrong)
    for output in ("sentence_embedding", "token_embeddings"):  # 16: the Dense module's width, not the hidden 32
        body = {"inputs": "hi", "parameters": {"dimensions": 17, "output_value": output}}
        assert "at most 16" in error(await post(server, "/predict", body, 422))
        whole = {"inputs": "hi", "parameters": {"dimensions": 16, "output_value": output}}  # the width itself
        assert await post(server, "/predict", whole) == await predict(server, "hi", output_value=output)
    wrong = await post(
        server,
        "/similarity",
        {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": {"output_value": "all"}},
        422,
    )
    assert "output_value" in error(wrong)
    name = server.resources.model_name  # type: ignore[attr-defined]
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}
    # An FP32 tensor carries float sentence vectors: refused before the model runs, naming what it takes.
    refusals = (({"encoding_format": "int8"}, "float, base64"), ({"output_value": "token_embeddings"}, "sentence"))
    for shape, accepted in refusals:
        wrong = await post(server, f"/v2/models/{name}/infer", {"inputs": [tensor], "parameters": shape}, 422)
        assert accepted in error(wrong) and next(iter(shape)) in error(wrong)
    wrong = await post(server, "/embed_all", {"inputs": "hi", "normalize": True}, 422)
    assert "normalize" in error(wrong) and "prompt_name" in error(wrong)
    wrong = await post(server, "/embed_all", {"inputs": "hi", "prompt_name": "nope"}, 422)
    assert "document, passage, query" in error(wrong)


async def test_embed_all_and_cohere_need_an_embeddings_bundle(fp32_bundle: ModelFactory) -> None:
    async with serve(fp32_bundle("text-classification")) as classifier:
        for path, body in (("/embed_all", {"inputs": "hi"}), ("/v2/embed", {"texts": ["hi"]})):
            wrong = await post(classifier, path, body, 404)
            assert "embeddings bundle" in wrong["error"]
