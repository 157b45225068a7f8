"""The protocol routes in process: the API key, routes a bundle does not serve, and the refusals each
protocol gives in its own error shape ({"error": ...} everywhere, KServe's included; OpenAI's nests a message)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from api.web.protocols.rerank import document_text
from container.bundle import MANIFEST_FILE
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


async def test_openai_marks_an_answer_whose_input_was_cut(embedder: AppClient) -> None:
    """An input past the model's 126 tokens is cut and embedded: OpenAI's answer says so with "truncated":
    true (and the x-truncated header), so a client can tell its vector covers only the start; a short one's
    answer carries no such field."""
    long = await embedder.post("/v1/embeddings", json={"input": ["short", "word " * 300]})
    assert long.status_code == 200, long.text
    assert long.json()["truncated"] is True and long.headers["x-truncated"] == "true"
    short = await embedder.post("/v1/embeddings", json={"input": ["short"]})
    assert "truncated" not in short.json() and "x-truncated" not in short.headers


@pytest.mark.parametrize(
    ("body", "said"),
    [
        # LangChain's OpenAIEmbeddings sends token ids unless told not to: the message says what to change.
        ({"input": [[1, 7, 2]]}, "input must be a string or a list of strings; token-id arrays are not"),
        ({"input": [1, 7, 2]}, "input must be a string or a list of strings; token-id arrays are not"),
        ({"input": "a", "model": 5}, "model must be a string, got a number"),
        ({"input": "a", "user": ["me"]}, "user must be a string, got a list"),
    ],
)
async def test_openais_refusals_say_what_the_body_got_wrong(
    embedder: AppClient, body: dict[str, object], said: str
) -> None:
    refused = await embedder.post("/v1/embeddings", json=body)
    assert refused.status_code == 422 and error_of(refused)[0].startswith(said), refused.text


async def test_tei_rerank_returns_the_texts_only_when_asked(ranker: AppClient) -> None:
    """TEI's return_text defaults to false: an answer without it has index and score only, as TEI's, and not a
    copy of every document sent."""
    texts = ["a", "b"]
    plain = await ranker.post("/rerank", json={"query": "q", "texts": texts}, headers=KEY)
    assert plain.status_code == 200 and all(set(r) == {"index", "score"} for r in plain.json()), plain.text
    asked = await ranker.post("/rerank", json={"query": "q", "texts": texts, "return_text": True}, headers=KEY)
    assert [r["text"] for r in asked.json()] == [texts[r["index"]] for r in asked.json()]


async def test_decode_takes_every_token_id_up_to_the_last_and_no_row_past_the_limit(tiny_bundle: ModelFactory) -> None:
    """/decode's bounds at their edges: the vocabulary's last id decodes and the next is refused naming the
    range (not decoded to nothing); JSON's 1.0 is the id 1; a row of HARE_MAX_INPUT_CHARS ids is taken and
    one more is a 413 naming the setting."""
    async with serve(tiny_bundle("text-ranking"), HARE_MAX_INPUT_CHARS="4") as client:
        size = client.resources.encoder.whole.get_vocab_size()
        assert (await client.post("/decode", json={"ids": [size - 1]})).status_code == 200
        refused = await client.post("/decode", json={"ids": [1, size]})
        assert refused.status_code == 422, refused.text
        assert error_of(refused)[0] == f"ids[1] must be a token id from 0 to {size - 1}"
        exact = await client.post("/decode", json={"ids": [[1, 2]], "skip_special_tokens": False})
        floats = await client.post("/decode", json={"ids": [[1.0, 2]], "skip_special_tokens": False})
        assert floats.status_code == 200 and floats.json() == exact.json(), floats.text
        assert (await client.post("/decode", json={"ids": [1, 2, 3, 4]})).status_code == 200
        long = await client.post("/decode", json={"ids": [[1], [1, 2, 3, 4, 5]]})
        assert long.status_code == 413 and error_of(long)[0].startswith("ids[1] has 5 ids, over this server's 4")


async def test_kserve_echoes_the_request_id_and_refuses_what_it_cannot_read(ranker: AppClient) -> None:
    """tritonclient matches an answer to its request by the id it sent, so the answer carries it back. A query
    tensor of two strings is refused (one would be ranked against, the other dropped unseen), as are an
    Inference-Header-Content-Length that is no number or runs past the body, and a binary_data_size past the
    binary part: each a 422 saying which, not a 500 or an answer to part of the request."""

    def tensor(name: str, data: list[str]) -> dict[str, object]:
        return {"name": name, "shape": [len(data)], "datatype": "BYTES", "data": data}

    url = "/v2/models/tiny/infer"
    inputs = [tensor("query", ["q"]), tensor("documents", ["a", "b"])]
    answer = await ranker.post(url, json={"id": "req-7", "inputs": inputs}, headers=KEY)
    assert answer.status_code == 200 and answer.json()["id"] == "req-7", answer.text
    assert "id" not in (await ranker.post(url, json={"inputs": inputs}, headers=KEY)).json()
    two = await ranker.post(url, json={"inputs": [tensor("query", ["q", "r"]), inputs[1]]}, headers=KEY)
    assert two.status_code == 422 and 'the "query" input holds exactly one string' in two.json()["error"]
    head = json.dumps({"inputs": inputs}).encode()
    for declared, said in [("abc", "must be a number of bytes"), (str(len(head) + 1), f"the body has {len(head)}")]:
        refused = await ranker.post(url, content=head, headers={**KEY, "inference-header-content-length": declared})
        assert refused.status_code == 422 and said in refused.json()["error"], refused.text
    query = len("q").to_bytes(4, "little") + b"q"
    binary = [{"name": "query", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 50}}]
    head = json.dumps({"inputs": [*binary, inputs[1]]}).encode()
    refused = await ranker.post(
        url, content=head + query, headers={**KEY, "inference-header-content-length": str(len(head))}
    )
    assert refused.status_code == 422 and "binary_data_size does not match" in refused.json()["error"], refused.text


async def test_kserve_liveness_fails_once_the_batching_loop_has_died(tiny_bundle: ModelFactory) -> None:
    """A worker whose batching loop ended can never answer again: KServe's liveness probe says so (503,
    {"live": false}), so Kubernetes restarts the pod rather than routing requests to it for good."""
    async with serve(tiny_bundle("text-ranking")) as client:
        assert (await client.get("/v2/health/live")).json() == {"live": True}
        task = client.resources.batcher._task
        assert task is not None
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        live = await client.get("/v2/health/live")
        assert live.status_code == 503 and live.json() == {"live": False}
        assert (await client.get("/v2/health/ready")).status_code == 503
        assert (await client.get("/health")).status_code == 503


async def test_cohere_answers_say_their_api_version_and_carry_documents_only_when_asked(
    ranker: AppClient, embedder: AppClient
) -> None:
    """Cohere's meta names the API version the client called; a rerank result carries its document only with
    return_documents (Cohere's default is false), and then as it was sent, object fields included; rank_fields
    write a number as JSON does (1e-7, not Python's 1e-07): a structured document scores as its lines typed."""
    for path, body, client, headers in [
        ("/v1/rerank", RERANK, ranker, KEY),
        ("/v2/rerank", RERANK, ranker, KEY),
        ("/v1/embed", {"texts": ["a"]}, embedder, {}),
        ("/v2/embed", {"texts": ["a"]}, embedder, {}),
    ]:
        answer = await client.post(path, json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["meta"]["api_version"]["version"] == path[2], path
    plain = await ranker.post("/v2/rerank", json=RERANK, headers=KEY)
    assert all("document" not in r for r in plain.json()["results"])
    sent = [{"text": "a", "id": 7, "source": "wiki"}, "b"]
    answer = await ranker.post("/v1/rerank", json={**RERANK, "documents": sent, "return_documents": True}, headers=KEY)
    returned = {r["index"]: r["document"] for r in answer.json()["results"]}
    assert returned == {0: sent[0], 1: {"text": "b"}}
    fields = {"query": "q", "documents": [{"title": "x", "n": 1e-7}], "rank_fields": ["title", "n"]}
    structured = await ranker.post("/v2/rerank", json=fields, headers=KEY)
    by_hand = await ranker.post("/v2/rerank", json={"query": "q", "documents": ["title: x\nn: 1e-7"]}, headers=KEY)
    assert structured.json()["results"][0]["relevance_score"] == by_hand.json()["results"][0]["relevance_score"]
    # The tiny model's vocabulary reads 1e-7 and 1e-07 alike: the lines themselves, as the model is given them.
    lines = document_text({"title": "x", "new": True, "n": 1e-7}, 0, ("title", "new", "n"))
    assert lines == "title: x\nnew: true\nn: 1e-7"


async def test_a_ranking_bundle_from_before_activation_was_recorded_scores_with_sigmoid(
    tiny_bundle: ModelFactory, tmp_path: Path
) -> None:
    """hare.json's activation came later: a one-logit ranker's bundle built before it (activation absent, or
    null) ranks with sigmoid, CrossEncoder's default, and scores as a bundle that names it."""
    bundle = tmp_path / "old"
    shutil.copytree(tiny_bundle("text-ranking"), bundle)
    manifest = json.loads((bundle / MANIFEST_FILE).read_text())
    assert manifest["activation"] == "sigmoid"
    del manifest["activation"]
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest))
    async with serve(tiny_bundle("text-ranking")) as named, serve(bundle) as old:
        want = await named.post("/v2/rerank", json=RERANK)
        got = await old.post("/v2/rerank", json=RERANK)
        assert got.status_code == 200, got.text
        assert got.json()["results"] == want.json()["results"]
