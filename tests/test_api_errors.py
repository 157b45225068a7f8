"""Bad input never crashes or hangs the server: every refusal is one JSON shape with the right status and a
message naming the field; overload answers 429 at once; a failing model call fails only its requests."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import math
import threading
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from api.engine.backend import Backend
from api.engine.errors import ClientGone
from api.web.schemas import parse_predict
from container.models import Model
from tasks.base import Answer, ModelInfo, Outputs
from tests.api_helpers import AppClient, error_of, serve, without_special_tokens
from tests.conftest import ModelFactory

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def classifier(tiny_bundle: ModelFactory) -> AsyncIterator[AppClient]:
    async with serve(tiny_bundle("text-classification")) as client:
        yield client


@pytest.fixture(scope="module")
async def ranker(tiny_bundle: ModelFactory) -> AsyncIterator[AppClient]:
    async with serve(tiny_bundle("text-ranking")) as client:
        yield client


def refused(response: httpx.Response, status: int, kind: str, *words: str) -> None:
    assert response.status_code == status, response.text
    message, said = error_of(response)  # in the shape its route answers
    assert said == kind
    assert "Traceback" not in response.text
    for word in words:
        assert word in message, message


BAD_BODIES: list[tuple[str, bytes, int, str, tuple[str, ...]]] = [
    ("empty string", b'{"inputs": ""}', 400, "InputError", ("inputs",)),
    ("empty list", b'{"inputs": []}', 400, "InputError", ("inputs",)),
    ("empty string in a list", b'{"inputs": ["a", ""]}', 400, "InputError", ("inputs[1]",)),
    ("no body", b"", 422, "InvalidRequest", ("empty",)),
    ("not JSON", b"{inputs: nope", 422, "InvalidRequest", ("JSON",)),
    ("invalid UTF-8", b'{"inputs": "\xff\xfe"}', 422, "InvalidRequest", ("UTF-8",)),
    ("nested too deep", b'{"inputs": ' + b"[" * 1100 + b"]" * 1100 + b"}", 422, "InvalidRequest", ("1,024 levels",)),
    ("not an object", b"[1, 2]", 422, "InvalidRequest", ("object",)),
    ("no inputs", b'{"text": "hi"}', 422, "InvalidRequest", ("text",)),
    ("missing inputs", b'{"parameters": {}}', 422, "InvalidRequest", ("inputs",)),
    ("number inputs", b'{"inputs": 5}', 422, "InvalidRequest", ("inputs", "number")),
    ("nested junk", b'{"inputs": [["a", {"b": null}]]}', 422, "InvalidRequest", ("inputs[0]",)),
    ("parameters a list", b'{"inputs": "a", "parameters": [1]}', 422, "InvalidRequest", ("parameters",)),
    (
        "unknown parameter",
        b'{"inputs": "a", "parameters": {"temperature": 1}}',
        422,
        "InvalidRequest",
        ("temperature", "top_k"),
    ),
    ("top_k a string", b'{"inputs": "a", "parameters": {"top_k": "x"}}', 422, "InvalidRequest", ("top_k",)),
    ("top_k zero", b'{"inputs": "a", "parameters": {"top_k": 0}}', 422, "InvalidRequest", ("top_k",)),
    (  # a parameter at the root wins over the same one under "parameters", which is still checked
        "bad parameter hidden at the root",
        b'{"inputs": "a", "top_k": 1, "parameters": {"top_k": "x"}}',
        422,
        "InvalidRequest",
        ("parameters.top_k",),
    ),
    (
        "bad function",
        b'{"inputs": "a", "parameters": {"function_to_apply": "relu"}}',
        422,
        "InvalidRequest",
        ("softmax",),
    ),
    ("truncate a string", b'{"inputs": "a", "parameters": {"truncate": "yes"}}', 422, "InvalidRequest", ("truncate",)),
    ("bad long_input", b'{"inputs": "a", "parameters": {"long_input": "all"}}', 422, "InvalidRequest", ("window",)),
    (
        "stride null",
        b'{"inputs": "a", "parameters": {"stride": null}}',
        422,
        "InvalidRequest",
        ("stride",),
    ),
    (
        "stride too big",
        b'{"inputs": "a", "parameters": {"long_input": "window", "stride": 999}}',
        422,
        "InvalidRequest",
        ("stride",),
    ),
]


@pytest.mark.parametrize(("case", "body", "status", "kind", "words"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
async def test_bad_input_table(
    classifier: AppClient, case: str, body: bytes, status: int, kind: str, words: tuple[str, ...]
) -> None:
    refused(await classifier.post("/predict", content=body), status, kind, *words)


async def test_a_stride_over_half_a_window_is_refused(classifier: AppClient) -> None:
    # Nearer a whole window each window moved a token or two: 2.6 KB of text became 147,200 tokens to run.
    half = classifier.resources.limits.window_tokens // 2
    text = "word " * 300
    answer = await classifier.post("/predict", json={"inputs": text, "parameters": {"stride": half}})
    assert answer.status_code == 200 and int(answer.headers["x-compute-tokens"]) < 4 * 300
    over = await classifier.post("/predict", json={"inputs": text, "parameters": {"stride": half + 1}})
    refused(over, 422, "InvalidRequest", "parameters.stride", f"from 0 to {half}", "half")


async def test_bodies_over_the_cap_are_refused_before_reading(classifier: AppClient) -> None:
    huge = b'{"inputs": "' + b"a" * (10 * 2**20) + b'"}'
    refused(await classifier.post("/predict", content=huge), 413, "InputTooLong", "bytes")

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
        for _ in range(11):
            yield b"a" * 2**20

    # Counted while streaming, the rest unread: it says how much it read, not that this is the body's length.
    refused(await classifier.post("/predict", content=chunks()), 413, "InputTooLong", "the body is at least")


async def test_a_body_of_exactly_the_largest_size_is_answered_one_byte_more_refused(tiny_bundle: ModelFactory) -> None:
    """HARE_MAX_BODY_BYTES is the largest body taken, however it comes: with a Content-Length, streamed without
    one, or compressed (its decompressed size counts)."""

    def padded(size: int) -> bytes:  # a request, and JSON's trailing whitespace up to `size` bytes
        return b'{"inputs": "I like you"}'.ljust(size)

    async def streamed(body: bytes) -> AsyncIterator[bytes]:
        for at in range(0, len(body), 700):
            yield body[at : at + 700]

    async with serve(tiny_bundle("text-classification"), HARE_MAX_BODY_BYTES="2000") as client:
        for size, status in ((2000, 200), (2001, 413)):
            body = padded(size)
            assert (await client.post("/predict", content=body)).status_code == status, size
            assert (await client.post("/predict", content=streamed(body))).status_code == status, size
            zipped = {"content-encoding": "gzip"}
            sent = await client.post("/predict", content=gzip.compress(body), headers=zipped)
            assert sent.status_code == status, size


async def test_compressed_bodies_are_taken_and_bad_ones_refused_with_what_to_fix(classifier: AppClient) -> None:
    """gzip and deflate bodies answer as the plain body does; a bomb stops at the body limit (413), a stream cut
    short or corrupt is 422, an encoding hare cannot undo 415 naming those it can, and a gzip body sent without
    its header is told to say so."""
    plain = b'{"inputs": "I like you"}'
    expected = (await classifier.post("/predict", content=plain)).json()
    member = gzip.compress(plain[:10]) + gzip.compress(plain[10:])  # two gzip members, as `cat a.gz b.gz` makes
    for encoding, body in [("gzip", gzip.compress(plain)), ("deflate", zlib.compress(plain)), ("GZip", member)]:
        answer = await classifier.post("/predict", content=body, headers={"content-encoding": encoding})
        assert answer.status_code == 200 and answer.json() == expected, (encoding, answer.text)
    both = gzip.compress(zlib.compress(plain))  # deflated, then gzipped: undone in reverse order
    answer = await classifier.post("/predict", content=both, headers={"content-encoding": "deflate, gzip"})
    assert answer.json() == expected
    bomb = gzip.compress(b" " * (5 * 2**20))  # 5 MB of spaces in about 5 KB, past the 4 MB limit
    assert len(bomb) < 2**14
    refused(await classifier.post("/predict", content=bomb, headers={"content-encoding": "gzip"}), 413, "InputTooLong")
    cut = gzip.compress(plain)[:-12]
    refused(
        await classifier.post("/predict", content=cut, headers={"content-encoding": "gzip"}),
        422,
        "InvalidRequest",
        "ends",
    )
    refused(
        await classifier.post("/predict", content=plain, headers={"content-encoding": "gzip"}),
        422,
        "InvalidRequest",
        "gzip",
    )
    brotli = await classifier.post("/predict", content=plain, headers={"content-encoding": "br"})
    refused(brotli, 415, "UnsupportedEncoding", "br", "gzip", "deflate")
    unsaid = await classifier.post("/predict", content=gzip.compress(plain))
    refused(unsaid, 422, "InvalidRequest", "Content-Encoding: gzip")
    latin = await classifier.post("/predict", content='{"inputs": "café"}'.encode("latin-1"))
    refused(latin, 422, "InvalidRequest", "not UTF-8", "0xe9", "offset 15")


async def test_many_and_huge_inputs_are_answered(tiny_bundle: ModelFactory) -> None:
    # No time bound at the door: 10,000 inputs are about a second of work beside a busy process, and admission
    # refusing them then (429) is its job, tested in test_batching.py; this test is about splitting.
    async with serve(tiny_bundle("text-classification"), HARE_MAX_QUEUE_MS="0") as client:

        def batches() -> float:
            (family,) = list(client.resources.metrics.batch_size.collect())
            return next(s.value for s in family.samples if s.name.endswith("_count"))

        start = batches()
        many = await client.post("/predict", json={"inputs": [f"text {i}" for i in range(10_000)]})
        assert many.status_code == 200 and len(many.json()) == 10_000
        await asyncio.sleep(0.01)  # batch statistics are recorded just after the answers
        assert batches() - start >= math.ceil(10_000 / 32)  # split into batches of at most 32
        huge = await client.post("/predict", json={"inputs": "word " * 20_000})  # 100k characters
        assert huge.status_code == 200 and huge.headers["x-truncated"] == "true"


async def test_input_count_and_size_caps(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("text-classification"), HARE_MAX_INPUTS="3", HARE_MAX_INPUT_CHARS="10") as client:
        refused(await client.post("/predict", json={"inputs": ["a"] * 4}), 413, "InputTooLong", "at most 3")
        refused(await client.post("/predict", json={"inputs": "a" * 11}), 413, "InputTooLong", "limit is 10")
        pairs = [{"text": "a", "text_pair": "b"}, {"text": "a", "text_pair": "b" * 11}]  # each text is capped
        refused(await client.post("/predict", json={"inputs": pairs}), 413, "InputTooLong", "inputs[1].text_pair is 11")
        one = {"text": "a" * 12, "text_pair": "b"}
        refused(await client.post("/predict", json={"inputs": one}), 413, "InputTooLong", "inputs.text is 12")


async def test_a_refusal_names_a_text_as_its_route_does(tiny_bundle: ModelFactory) -> None:
    # Each client's own field: OpenAI's input, Cohere's texts and documents, TEI's texts beside its query.
    caps = {"HARE_MAX_INPUT_CHARS": "10"}
    long, ok = "x" * 11, "fine"
    async with serve(tiny_bundle("feature-extraction"), **caps) as client:
        embeds: tuple[tuple[str, dict[str, Any], str], ...] = (
            ("/v1/embeddings", {"input": [ok, long]}, "input[1] is 11 characters"),
            ("/v2/embed", {"texts": [ok, long], "embedding_types": ["float"]}, "texts[1] is 11 characters"),
            ("/embed", {"inputs": [ok, long]}, "inputs[1] is 11 characters"),
            ("/predict", {"inputs": {"source_sentence": ok, "sentences": [ok, long]}}, "inputs.sentences[1] is 11"),
            ("/similarity", {"inputs": {"source_sentence": long, "sentences": [ok]}}, "inputs.source_sentence is 11"),
        )
        for path, body, name in embeds:
            response = await client.post(path, json=body)
            refused(response, 413, "InputTooLong", name)
            assert error_of(response)[0].startswith(name), (path, response.json())
    async with serve(tiny_bundle("text-ranking"), **caps) as client:
        ranks: tuple[tuple[str, dict[str, Any], str], ...] = (
            ("/v2/rerank", {"query": ok, "documents": [ok, long]}, "documents[1] is 11 characters"),
            ("/v2/rerank", {"query": long, "documents": [ok]}, "query is 11 characters"),
            ("/rerank", {"query": ok, "texts": [ok, long]}, "texts[1] is 11 characters"),
            ("/predict", {"inputs": {"query": ok, "texts": [long]}}, "inputs.texts[0] is 11 characters"),
            ("/predict", {"inputs": {"query": long, "documents": [ok]}}, "inputs.query is 11 characters"),
        )
        for path, body, name in ranks:
            response = await client.post(path, json=body)
            refused(response, 413, "InputTooLong", name)
            assert error_of(response)[0].startswith(name), (path, response.json())


async def test_a_text_joined_to_every_text_counts_as_text(tiny_bundle: ModelFactory) -> None:
    """A prompt or a ranking query is joined to each text of the request: it is capped as a text, and the
    texts it makes within what the largest body holds (a 1 MB prompt before 10,000 one-letter texts asked 10 GB
    of tokenizing from a 1 MB body, and was answered)."""
    caps = {"HARE_MAX_INPUT_CHARS": "100", "HARE_MAX_BODY_BYTES": "2000"}
    async with serve(tiny_bundle("feature-extraction"), **caps) as client:
        long = await client.post("/predict", json={"inputs": "a", "parameters": {"prompt": "p" * 101}})
        refused(long, 413, "InputTooLong", "parameters.prompt is 101 characters; the limit is 100")
        at_root = await client.post("/embed", json={"inputs": "a", "prompt": "p" * 101})
        refused(at_root, 413, "InputTooLong", "prompt is 101 characters")
        many = await client.post("/predict", json={"inputs": ["a"] * 30, "parameters": {"prompt": "p" * 90}})
        refused(many, 413, "InputTooLong", "parameters.prompt joined to each of the 30 texts make 2730 characters")
        fine = await client.post("/predict", json={"inputs": ["a"] * 20, "parameters": {"prompt": "p" * 90}})
        assert fine.status_code == 200 and len(fine.json()) == 20
    async with serve(tiny_bundle("text-ranking"), **caps) as client:
        ranked = await client.post("/v2/rerank", json={"query": "q" * 100, "documents": ["d"] * 25})
        refused(ranked, 413, "InputTooLong", "query joined to each of the 25 texts make 2525 characters")
        assert (await client.post("/v2/rerank", json={"query": "q" * 100, "documents": ["d"] * 15})).status_code == 200


async def test_an_answer_of_token_vectors_is_capped(tiny_bundle: ModelFactory) -> None:
    """Token vectors make answers far bigger than their body (a 40,000-word text read in windows: 80 KB in,
    181 MB out, and a killed worker under a memory limit): past HARE_MAX_ANSWER_VALUES numbers, a 413 that says
    what to do; one vector a text of the same texts is answered."""
    async with serve(tiny_bundle("feature-extraction"), HARE_MAX_ANSWER_VALUES="2000") as client:
        small = await client.post("/embed_all", json={"inputs": "two words"})
        assert small.status_code == 200
        width = len(small.json()[0][0])
        texts = ["word " * 40] * 2  # over 80 token vectors: past 2000 numbers at any width above 24
        assert width * 80 > 2000
        big = await client.post("/embed_all", json={"inputs": texts})
        refused(big, 413, "InputTooLong", "at most 2000 (HARE_MAX_ANSWER_VALUES)")
        windows = {"output_value": "token_embeddings", "long_input": "window"}
        read_whole = await client.post("/predict", json={"inputs": "word " * 400, "parameters": windows})
        refused(read_whole, 413, "InputTooLong", "token vectors")
        pooled = await client.post("/predict", json={"inputs": texts})
        assert pooled.status_code == 200 and len(pooled.json()) == 2


async def test_a_text_without_tokens_is_refused_on_every_route(tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    """Whitespace or a zero-width space, where the tokenizer adds no special tokens, is no token at all: the model
    failed on it alone (500, ONNX Runtime's Reshape), and beside other texts answered null vectors or the scores
    of padding."""
    blank, words = "has no tokens", ("drops every character",)
    embedder = without_special_tokens(tiny_bundle("feature-extraction"), tmp_path / "embedder")
    async with serve(embedder) as client:
        window = {"long_input": "window"}
        embeds: tuple[tuple[str, dict[str, Any], str], ...] = (
            ("/predict", {"inputs": " "}, "inputs"),
            ("/predict", {"inputs": ["hi", "\u200b"]}, "inputs[1]"),
            ("/predict", {"inputs": ["hi", " "], "parameters": window}, "inputs[1]"),
            ("/v1/embeddings", {"input": [" ", "hi"]}, "input[0]"),
            ("/v2/embed", {"texts": ["hi", " "], "embedding_types": ["float"]}, "texts[1]"),
            ("/similarity", {"inputs": {"source_sentence": " ", "sentences": ["a", "b"]}}, "inputs.source_sentence"),
        )
        for path, body, name in embeds:
            response = await client.post(path, json=body)
            refused(response, 400, "InputError", f"{name} {blank}", *words)
            assert error_of(response)[0].startswith(f"{name} "), (path, response.json())
        assert (await client.post("/predict", json={"inputs": ["hi", " hi "]})).status_code == 200
    classifier = without_special_tokens(tiny_bundle("text-classification"), tmp_path / "classifier")
    async with serve(classifier) as client:
        pairs = [{"text": "a", "text_pair": " "}, {"text": " ", "text_pair": "\t"}]  # one blank member is read
        for inputs, name in ((["hello", " "], "inputs[1]"), (pairs, "inputs[1]")):
            refused(await client.post("/predict", json={"inputs": inputs}), 400, "InputError", f"{name} {blank}")
    ranker = without_special_tokens(tiny_bundle("text-ranking"), tmp_path / "ranker")
    async with serve(ranker) as client:
        body = {"query": " ", "documents": ["d", " "]}
        refused(await client.post("/v2/rerank", json=body), 400, "InputError", f"documents[1] with the query {blank}")


async def test_ranking_input_errors(ranker: AppClient) -> None:
    async def post(inputs: Any) -> httpx.Response:
        return await ranker.post("/predict", json={"inputs": inputs})

    refused(await post({"query": "q", "documents": []}), 400, "InputError", "documents")
    refused(await post({"query": "q"}), 422, "InvalidRequest", "documents")
    refused(await post({"documents": ["d"]}), 422, "InvalidRequest", "query")
    refused(await post({"query": "", "documents": ["d"]}), 400, "InputError", "query")
    refused(await post({"query": "q", "documents": ["d"], "texts": ["d"]}), 422, "InvalidRequest", "texts")
    refused(await post({"query": "q", "documents": [1]}), 422, "InvalidRequest", "documents[0]")
    refused(await post("just a string"), 422, "InvalidRequest", "query")


async def test_an_empty_or_non_object_body_is_shown_its_routes_own_body(tiny_bundle: ModelFactory) -> None:
    """Each route's refusal shows a body of its own protocol: every route suggested {"inputs": "some text"}."""
    routes = {
        "feature-extraction": (
            ("/v1/embeddings", '{"input": '),
            ("/v1/embed", '{"texts": '),
            ("/v2/embed", '{"texts": '),
            ("/similarity", '{"inputs": {"source_sentence": '),
            ("/embed", '{"inputs": "'),
            ("/decode", '{"ids": '),
            ("/v2/models/x/infer", '{"inputs": [{"name": "text", '),
            ("/predict", '{"inputs": "'),
        ),
        "text-ranking": (
            ("/v1/rerank", '{"query": "some text", "documents": '),
            ("/rerank", '"texts": '),
            ("/predict", '{"inputs": {"query": "some text", "documents": '),
        ),
    }
    for task, shown in routes.items():
        async with serve(tiny_bundle(task)) as client:
            name = (await client.get("/info")).json()["model"]
            for path, example in shown:
                path = path.replace("/x/", f"/{name}/")
                refused(await client.post(path, content=b""), 422, "InvalidRequest", "body is empty", example)
                refused(await client.post(path, content=b"[1]"), 422, "InvalidRequest", "JSON object", example)


async def test_unknown_routes_and_methods_answer_json(classifier: AppClient) -> None:
    refused(await classifier.get("/nope"), 404, "NotFound", "/nope")
    refused(await classifier.get("/predict"), 405, "MethodNotAllowed", "GET")
    # A trailing slash is an unknown route too: Starlette redirected it (307, an empty body, a Location from Host).
    for path in ("/predict/", "/v1/rerank/", "/v1/embeddings/"):
        refused(await classifier.post(path, json={"inputs": "hi"}), 404, "NotFound", path)
    refused(await classifier.get("/health/"), 404, "NotFound", "/health/")


async def test_a_full_queue_answers_429_with_retry_after_at_once(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("text-classification"), HARE_QUEUE_SIZE="1") as client:
        with client.resources.batcher.admit():  # the one place is taken
            response = await client.post("/predict", json={"inputs": "hi"})
            refused(response, 429, "Overloaded", "capacity")
            assert int(response.headers["retry-after"]) >= 1
        assert (await client.post("/predict", json={"inputs": "hi"})).status_code == 200


async def test_a_crowded_workers_refusal_says_connection_close_once(tiny_bundle: ModelFactory) -> None:
    """A worker holding more connections than another asks each client to reconnect (Connection: close on its
    answers, app.py Rebalance); a 429 already says it: once, not "close, close"."""
    async with serve(tiny_bundle("text-classification"), HARE_QUEUE_SIZE="1") as client:
        client.resources.rebalance = lambda: True
        answered = await client.post("/predict", json={"inputs": "hi"})
        assert answered.status_code == 200 and answered.headers.get_list("connection") == ["close"]
        batcher = client.resources.batcher
        with batcher.admit():  # the one place is taken
            for early in (True, False):  # refused before routing, or by admission in the route (the door was open)
                if not early:
                    batcher.refusal = lambda: None  # type: ignore[method-assign]
                response = await client.post("/predict", json={"inputs": "hi"})
                refused(response, 429, "Overloaded", "capacity")
                assert response.headers.get_list("connection") == ["close"]


async def test_a_failing_model_call_fails_its_requests_and_the_server_goes_on(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("text-classification")) as client:
        backend = client.resources.backend
        assert isinstance(backend, Backend)  # a worker's own sessions (no shared engine on a CPU)
        sessions = list(backend.sessions.values())

        def broken(feeds: Any, shrink: bool = False) -> np.ndarray:
            raise RuntimeError("CUDA fell over")

        for session in sessions:
            session.run = broken  # type: ignore[method-assign]
        responses = await asyncio.gather(*[client.post("/predict", json={"inputs": f"t{i}"}) for i in range(6)])
        for response in responses:
            refused(response, 500, "InferenceFailed", "CUDA fell over")
        for session in sessions:
            del session.run  # back to the class's method
        assert (await client.post("/predict", json={"inputs": "hi"})).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        assert 'hare_errors_total{type="InferenceFailed"} 6.0' in (await client.get("/metrics")).text


async def test_a_bug_answers_500_without_a_traceback(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("text-classification")) as client:
        pipeline = client.resources.pipeline

        def buggy(outputs: Outputs, params: Any, model: ModelInfo) -> Answer:
            return Answer(1 / 0)

        pipeline.task = dataclasses.replace(pipeline.task, postprocess=buggy)
        refused(await client.post("/predict", json={"inputs": "hi"}), 500, "InternalError", "server log")
        assert (await client.get("/health")).json() == {"status": "ok"}


async def test_a_waiting_request_whose_client_left_is_withdrawn(tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle("text-classification"), HARE_MAX_BATCH_SIZE="4") as client:
        res = client.resources
        gate = threading.Event()
        seen: list[int] = []

        def holding(session: Model) -> Callable[[Any, bool], np.ndarray]:
            model_run = session.run

            def held(feeds: Any, shrink: bool = False) -> np.ndarray:
                gate.wait(10)
                seen.append(len(feeds["input_ids"]))
                return model_run(feeds, shrink)

            return held

        assert isinstance(res.backend, Backend)
        for session in res.backend.sessions.values():
            session.run = holding(session)  # type: ignore[method-assign,assignment]
        busy = asyncio.ensure_future(client.post("/predict", json={"inputs": [f"t{i}" for i in range(12)]}))
        while res.batcher.backlog == 0:  # the first batch is on the model, 8 sequences wait
            await asyncio.sleep(0.001)

        async def gone() -> None:  # the client leaves 20 ms into its wait
            await asyncio.sleep(0.02)

        parsed = parse_predict(b'{"inputs": ["left", "early"]}', res.task, res.model, res.limits)
        with res.batcher.admit() as ticket, pytest.raises(ClientGone):
            await res.pipeline.run(ticket, parsed, gone)
        gate.set()
        assert (await busy).status_code == 200
        assert sum(seen) == 12 and max(seen) == 4  # the departed request's two sequences never reached the model


async def test_sentence_similarity_takes_as_many_sentences_as_its_schema_allows(tiny_bundle: ModelFactory) -> None:
    # The source sentence is not one of the `sentences` the OpenAPI schema bounds by max_inputs.
    async with serve(tiny_bundle("feature-extraction"), HARE_MAX_INPUTS="3") as client:
        spec = (await client.get("/openapi.json")).json()
        assert {s["maxItems"] for s in _named(spec, "sentences")} == {3}
        for path in ("/predict", "/similarity"):
            full = {"inputs": {"source_sentence": "a", "sentences": ["b", "c", "d"]}}
            answer = await client.post(path, json=full)
            assert answer.status_code == 200 and len(answer.json()) == 3
            over = {"inputs": {"source_sentence": "a", "sentences": ["b", "c", "d", "e"]}}
            refused(await client.post(path, json=over), 413, "InputTooLong", "4 texts; this server takes at most 3")


def _named(node: Any, name: str) -> list[Any]:
    """Every schema under a property called `name`, anywhere in an OpenAPI document."""
    if isinstance(node, list):
        return [found for item in node for found in _named(item, name)]
    if not isinstance(node, dict):
        return []
    own = [node["properties"][name]] if isinstance(node.get("properties"), dict) and name in node["properties"] else []
    return own + [found for value in node.values() for found in _named(value, name)]
