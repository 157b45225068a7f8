"""The protocol routes in process: the API key, routes a bundle does not serve, and the refusals each
protocol gives in its own error shape ({"error": ...} everywhere, KServe's included; OpenAI's nests a message)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from tests.api_helpers import AppClient, error_of, serve
from tests.conftest import ModelFactory

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def ranker(tiny_bundle: ModelFactory) -> AsyncIterator[AppClient]:
    async with serve(tiny_bundle("text-ranking"), HARE_MODEL_NAME="tiny", HARE_API_KEY="s3cret") as client:
        yield client


KEY = {"authorization": "Bearer s3cret"}
RERANK = {"query": "q", "documents": ["a", "b"]}


async def test_the_api_key_guards_inference_routes_only(ranker: AppClient) -> None:
    for method, path, body in [
        ("POST", "/predict", {"inputs": RERANK}),
        ("POST", "/v2/rerank", RERANK),
        ("POST", "/tokenize", {"inputs": "a"}),
        ("GET", "/v1/models", None),
        ("GET", "/v2/models/tiny", None),
    ]:
        refused = await ranker.request(method, path, json=body)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == "Bearer" and "HARE_API_KEY" in error_of(refused)[0]
        wrong = await ranker.request(method, path, json=body, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert (await ranker.request(method, path, json=body, headers=KEY)).status_code == 200, path
    for path in ("/health", "/ready", "/v2/health/live", "/v2/health/ready", "/openapi.json"):
        assert (await ranker.get(path)).status_code == 200, path


async def test_without_a_key_an_authorization_header_is_ignored(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("text-ranking")) as client:
        answer = await client.post("/v2/rerank", json=RERANK, headers={"authorization": "Bearer hf_user_token"})
        assert answer.status_code == 200


async def test_routes_for_other_tasks_answer_404_naming_the_task(ranker: AppClient) -> None:
    for path in ("/v1/embeddings", "/embed", "/similarity"):
        refused = await ranker.post(path, json={"input": "a", "inputs": "a"}, headers=KEY)
        assert refused.status_code == 404 and "text-ranking" in error_of(refused)[0], path


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v2/models/other/infer", {"inputs": []}, 404, ("tiny",)),
        ("/v2/models/tiny/versions/2/infer", {"inputs": []}, 404, ("version",)),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{"name": "query", "shape": [1], "datatype": "FP32", "data": [1]}]},
            422,
            ("BYTES", "got 'FP32'"),
        ),
        (  # JSON's name for a missing datatype, not Python's None
            "/v2/models/tiny/infer",
            {"inputs": [{"name": "query", "shape": [1], "data": ["q"]}]},
            422,
            ("BYTES", "got null"),
        ),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{"name": "query", "shape": [2], "datatype": "BYTES", "data": ["q"]}]},
            422,
            ("shape",),
        ),
        (  # a shape whose product is 2**64 + 2: counted exactly, not wrapped to 2 as in int64
            "/v2/models/tiny/infer",
            {
                "inputs": [
                    {"name": "query", "shape": [1], "datatype": "BYTES", "data": ["q"]},
                    {"name": "documents", "shape": [3, 6148914691236517206], "datatype": "BYTES", "data": ["a", "b"]},
                ]
            },
            422,
            ("shape", "18446744073709551618"),
        ),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{"name": "query", "shape": [1], "datatype": "BYTES", "data": ["q"]}] * 2},
            422,
            ("two tensors named 'query'",),
        ),
        (
            "/v2/models/tiny/infer",
            {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["q"]}]},
            422,
            ("query", "documents"),
        ),
        ("/v2/rerank", {"query": "q", "documents": []}, 400, ("documents",)),
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, 422, ("top_n",)),
        ("/v1/rerank", {"query": "q", "documents": [{"title": "t"}]}, 422, ("documents[0].text",)),
        ("/rerank", {"query": "q", "texts": ["a"], "truncation_direction": "Middle"}, 422, ("truncation_direction",)),
        ("/decode", {"ids": [[1, -5]]}, 422, ("ids[0][1]",)),
        # "too many ids for this server's limits": neither which limit nor by how much
        (
            "/decode",
            {"ids": [[1]] * 10_001},
            413,
            ("ids has 10,001 rows, over this server's 10,000", "HARE_MAX_INPUTS"),
        ),
    ],
)
async def test_protocol_refusals_name_the_field(
    ranker: AppClient, path: str, body: object, status: int, words: tuple[str, ...]
) -> None:
    refused = await ranker.post(path, json=body, headers=KEY)
    assert refused.status_code == status, refused.text
    message = refused.json()["error"]
    assert all(w in message for w in words), message


@pytest.fixture(scope="module")
async def embedder(tiny_bundle: ModelFactory) -> AsyncIterator[AppClient]:
    async with serve(tiny_bundle("feature-extraction")) as client:
        yield client


async def test_a_classifiers_pair_tensors_are_named_text_and_text_pair(tiny_bundle: ModelFactory) -> None:
    def tensor(name: str, data: list[str]) -> dict[str, object]:
        return {"name": name, "shape": [len(data)], "datatype": "BYTES", "data": data}

    caps = {"HARE_MODEL_NAME": "tiny", "HARE_MAX_INPUT_CHARS": "100"}
    async with serve(tiny_bundle("text-classification"), **caps) as client:
        pair = await client.post(
            "/v2/models/tiny/infer", json={"inputs": [tensor("text", ["a"]), tensor("text_pair", ["b"])]}
        )
        assert pair.status_code == 200, pair.text
        alone = await client.post("/predict", json={"inputs": {"text": "a", "text_pair": "b"}})
        assert pair.json()["outputs"][1]["data"][0] == pytest.approx(alone.json()[0][0]["score"], abs=1e-6)
        for inputs, status, words in [
            ([tensor("text", ["a"]), tensor("hypothesis", ["b"])], 422, ('"text" and "text_pair"', "hypothesis")),
            (
                [tensor("text", ["a", "b"]), tensor("text_pair", ["c"])],
                422,
                ('"text" holds 2 strings and "text_pair" 1',),
            ),
            ([tensor("text", ["a"]), tensor("text_pair", [""])], 400, ("inputs[text_pair][0]",)),
            # A refusal names a member as the tensors hold it, and a pair by both.
            ([tensor("text", ["a", "b" * 101]), tensor("text_pair", ["c", "d"])], 413, ("inputs[text][1] is 101",)),
            (
                [tensor("text", ["a", "b"]), tensor("text_pair", ["c", "d" * 101])],
                413,
                ("inputs[text_pair][1] is 101",),
            ),
            ([tensor("a", ["a"]), tensor("b", ["b"]), tensor("c", ["c"])], 422, ('"text_pair"', "got 3")),
            # Second members alone: they were classified as texts.
            ([tensor("text_pair", ["b"])], 422, ('a "text_pair" input needs a "text" input',)),
        ]:
            refused = await client.post("/v2/models/tiny/infer", json={"inputs": inputs})
            assert refused.status_code == status, refused.text
            assert all(w in refused.json()["error"] for w in words), refused.text
        too_long = [tensor("text", ["!" * 90]), tensor("text_pair", ["?" * 90])]  # 180 tokens, over 126
        refused = await client.post(
            "/v2/models/tiny/infer", json={"inputs": too_long, "parameters": {"truncate": False}}
        )
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"].startswith("inputs[text][0] with inputs[text_pair][0] is 18"), refused.text


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/embeddings", {"input": "a", "dimensions": 0}, "dimensions must be at least 1, got 0"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format must be one of float"),
        ("/embed", {"inputs": "a", "normalize": "yes"}, "normalize must be true or false"),
        ("/v2/embed", {"texts": ["a"], "output_dimension": 0}, "output_dimension must be at least 1, got 0"),
        ("/predict", {"inputs": "a", "parameters": {"normalize": "yes"}}, "parameters.normalize must be true or"),
        ("/predict", {"inputs": "a", "parameters": {"dimensions": -1}}, "parameters.dimensions must be at least 1"),
        ("/predict", {"inputs": "a", "dimensions": -1}, "dimensions must be at least 1"),  # at its root
        ("/predict", {"inputs": "a", "parameters": {"dimensions": 9999}}, "parameters.dimensions is 9999, more"),
        ("/v1/embeddings", {"input": "a", "dimensions": 9999}, "dimensions is 9999, more than this model's"),
        ("/predict", {"inputs": {"source_sentence": "a", "sentences": ["b"]}, "truncate": 1}, "truncate must be"),
    ],
)
async def test_a_refusal_names_a_parameter_where_the_body_holds_it(
    embedder: AppClient, path: str, body: object, said: str
) -> None:
    """OpenAI's, TEI's and Cohere's bodies carry their parameters at the root, /predict's under "parameters" or
    at its root: the error names the field as the client sent it, and a lower bound as a lower bound."""
    refused = await embedder.post(path, json=body)
    assert refused.status_code == 422 and error_of(refused)[0].startswith(said), refused.text


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v2/rerank", {"query": "q", "documents": ["a"], "top_n": 0}, "top_n must be at least 1, got 0"),
        ("/v1/rerank", {"query": "q", "documents": ["a"], "max_chunks_per_doc": 0}, "max_chunks_per_doc must be"),
        ("/rerank", {"query": "q", "texts": ["a"], "raw_scores": 1}, "raw_scores must be true or false"),
    ],
)
async def test_a_rerank_refusal_names_the_field_at_the_root(
    ranker: AppClient, path: str, body: object, said: str
) -> None:
    refused = await ranker.post(path, json=body, headers=KEY)
    assert refused.status_code == 422 and error_of(refused)[0].startswith(said), refused.text


@pytest.mark.parametrize(
    ("path", "body"),
    [("/tokenize", {"inputs": "a", "add_special_tokens": "no"}), ("/decode", {"ids": [1], "skip_special_tokens": 1})],
)
async def test_a_field_at_the_bodys_root_is_named_there(ranker: AppClient, path: str, body: dict[str, object]) -> None:
    # It was named "parameters.<field>", where sending it gets "unknown field(s) parameters".
    refused = await ranker.post(path, json=body, headers=KEY)
    field = next(k for k in body if k not in ("inputs", "ids"))
    assert refused.status_code == 422 and refused.json()["error"].startswith(f"{field} must be true or false")


async def test_a_binary_body_whose_parts_do_not_add_up_is_refused(ranker: AppClient) -> None:
    # Bytes after the last tensor's binary_data_size were taken silently (a short one was refused).
    def part(*texts: str) -> bytes:
        return b"".join(len(t).to_bytes(4, "little") + t.encode() for t in texts)

    query, documents = part("q"), part("a", "b")
    tensors = [
        {"name": "query", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(query)}},
        {"name": "documents", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(documents)}},
    ]
    head = json.dumps({"inputs": tensors}).encode()
    for tail, status in [(b"", 200), (b"extra", 422)]:
        answer = await ranker.post(
            "/v2/models/tiny/infer",
            content=head + query + documents + tail,
            headers={**KEY, "inference-header-content-length": str(len(head))},
        )
        assert answer.status_code == status, answer.text
    assert "binary_data_size add up to" in answer.json()["error"]
