"""A differential test for every family and task head in the registry (marked differential: CI's full run,
`scripts/check --all`, in two processes; about 7.5 minutes in one): texts of random
lengths from 1 token to the bundle's maximum, each family's fp32 bundle against PyTorch two ways.

- The graph: random batch compositions, padded on the right (as the server pads) and, where the model's own
  tokenizer pads so (decoder-only models), on the left, each row's outputs (its real tokens) against the PyTorch model
  run on that text alone.
- Served: the texts sent as concurrent requests of random sizes (the server batches them together), the
  answers against the model's own library (transformers' pipelines, sentence-transformers) on each text.

A failure names the family, the task, the text's length and its batch.
"""

from __future__ import annotations

import asyncio
import json
import random
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Encoding, Tokenizer

from container.bundle import read_manifest
from container.optimize import export, source, textset
from tasks.registry import get_task
from tests.api_helpers import serve
from tests.conftest import ModelFactory
from tests.test_token_spans import without_edge_spaces
from tests.tiny_models import FAST_PAIRS, SLOW_PAIRS

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.differential]
TOL = 1e-4
TEXTS = 10


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def _texts(bundle: Path, rng: random.Random) -> tuple[list[str], list[int]]:
    """Prose at random lengths (special tokens included) from 1 to the maximum, the maximum among them."""
    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    most = read_manifest(bundle).max_length
    lengths = sorted({*rng.sample(range(1, most + 1), k=min(TEXTS - 1, most)), most})
    texts = [s.text for s in textset.regime_samples(tokenizer, lengths, pairs=False)]
    return texts, [len(tokenizer.encode(t).ids) for t in texts]


def _compositions(n: int, rng: random.Random) -> list[list[int]]:
    """The indices 0..n-1 shuffled and cut into batches of 1 to 4."""
    order = rng.sample(range(n), n)
    batches = []
    while order:
        k = rng.randint(1, 4)
        batches.append(order[:k])
        order = order[k:]
    return batches


def _padded(encodings: list[Encoding], names: list[str], pad_id: int, left: bool) -> dict[str, np.ndarray]:
    width = max(len(e.ids) for e in encodings)
    feeds = {n: np.zeros((len(encodings), width), dtype=np.int64) for n in names}
    feeds["input_ids"][:] = pad_id
    for row, e in enumerate(encodings):
        cols = slice(width - len(e.ids), width) if left else slice(0, len(e.ids))
        for name, values in (
            ("input_ids", e.ids),
            ("attention_mask", e.attention_mask),
            ("token_type_ids", e.type_ids),
        ):
            if name in feeds:
                feeds[name][row, cols] = values
    return feeds


def _graph_check(bundle: Path, folder: Path, task: str, texts: list[str], rng: random.Random, where: str) -> None:
    import torch

    spec = get_task(task)
    src = source.inspect_source(folder, spec)
    model = export.load_torch_model(src, spec)
    tokenizer = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    encodings = [tokenizer.encode(t) for t in texts]
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    pad_id = read_manifest(bundle).pad_id or 0
    with torch.inference_mode():
        alone = [
            export.reference_row(
                model, src, spec, {k: torch.from_numpy(v) for k, v in _padded([e], names, 0, False).items()}
            )
            .float()
            .numpy()
            for e in encodings
        ]
    # Left padding where the model's own tokenizer pads left and it is a decoder alone, whose positions follow
    # the mask. Under it an encoder's absolute positions move, and T5Gemma 2's decoder, fed the input shifted
    # right, starts at a pad: in PyTorch too (T5Gemma 2 batched there misses its text alone by 1e-2 either way).
    config = json.loads((folder / "tokenizer_config.json").read_text())
    left = config.get("padding_side") == "left" and not export.is_encoder_decoder(src)
    sides = (False, True) if left else (False,)
    for batch in _compositions(len(texts), rng):
        for left in sides:
            (out,) = session.run(None, _padded([encodings[i] for i in batch], names, pad_id, left))
            for row, i in enumerate(batch):
                got = out[row]
                if got.ndim == 2:  # token rows: the text's own positions
                    n = len(encodings[i].ids)
                    got = got[-n:] if left else got[:n]
                scale = max(1.0, float(np.abs(alone[i]).max()))
                side = "left" if left else "right"
                lengths = [len(encodings[j].ids) for j in batch]
                assert np.abs(got - alone[i]).max() <= TOL * scale, (
                    f"{where}: graph, text of {lengths[row]} tokens, {side}-padded batch of lengths {lengths}"
                )


async def _served(client: httpx.AsyncClient, inputs: list[Any], rng: random.Random, **parameters: Any) -> list[Any]:
    """Each input's answer, the inputs sent as concurrent requests of random sizes (batched by the server)."""
    batches = _compositions(len(inputs), rng)

    async def post(batch: list[int]) -> Any:
        body = {"inputs": [inputs[i] for i in batch], "parameters": parameters}
        response = await client.post("/predict", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    answers: list[Any] = [None] * len(inputs)
    for batch, got in zip(batches, await asyncio.gather(*(post(b) for b in batches)), strict=True):
        for i, answer in zip(batch, got, strict=True):
            answers[i] = answer
    return answers


async def _served_check(
    client: httpx.AsyncClient, folder: Path, task: str, texts: list[str], rng: random.Random
) -> None:
    from transformers import pipeline

    if task == "feature-extraction":
        from sentence_transformers import SentenceTransformer

        vectors = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=1)
        served = np.array(await _served(client, texts, rng), dtype=np.float32)
        for text, vector, got in zip(texts, vectors, served, strict=True):
            assert np.abs(vector - got).max() < TOL, text[:40]
    elif task == "text-classification":
        classify: Any = pipeline("text-classification", model=str(folder), top_k=None)
        reference = classify(texts, batch_size=1)
        for text, ref, got in zip(texts, reference, await _served(client, texts, rng, top_k=None), strict=True):
            assert {r["label"]: r["score"] for r in ref}.keys() == {g["label"] for g in got}, text[:40]
            scores = {g["label"]: g["score"] for g in got}
            assert max(abs(r["score"] - scores[r["label"]]) for r in ref) < TOL, text[:40]
    elif task == "token-classification":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tagger: Any = pipeline("token-classification", model=str(folder), aggregation_strategy="simple")
            reference = [tagger(t, ignore_labels=[]) for t in texts]
        ours = await _served(client, texts, rng, aggregation_strategy="simple", ignore_labels=[])
        for text, ref, got in zip(texts, reference, ours, strict=True):
            assert [without_edge_spaces(text, e) for e in ref] == [
                {k: v for k, v in e.items() if k != "score"} for e in got
            ], text[:40]
            assert np.allclose([e["score"] for e in ref], [e["score"] for e in got], atol=TOL), text[:40]
    else:  # text-ranking: each text a document for one query
        from sentence_transformers import CrossEncoder

        query = "capital of France"
        expected = CrossEncoder(str(folder), device="cpu").predict([(query, t) for t in texts], batch_size=1)
        # One request: the server batches its pairs by length.
        response = await client.post("/predict", json={"inputs": {"query": query, "documents": texts}})
        assert response.status_code == 200, response.text
        scores = {r["index"]: r["score"] for r in response.json()}
        assert max(abs(scores[i] - float(e)) for i, e in enumerate(expected)) < TOL


@pytest.mark.parametrize(("arch", "task"), [*FAST_PAIRS, *SLOW_PAIRS])
async def test_every_family_equals_pytorch_at_random_lengths_and_batches(
    fp32_bundle: ModelFactory, tiny_model: ModelFactory, arch: str, task: str
) -> None:
    bundle, folder = fp32_bundle(task, arch), tiny_model(task, arch)
    rng = random.Random(f"{arch}/{task}")
    texts, lengths = _texts(bundle, rng)
    where = f"{arch} {task}"
    _graph_check(bundle, folder, task, texts, rng, where)
    async with serve(bundle) as client:
        try:
            await _served_check(client, folder, task, texts, rng)
        except AssertionError as exc:
            raise AssertionError(f"{where}: served, texts of {lengths} tokens: {exc}") from exc
