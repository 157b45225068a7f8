"""CUDA graphs (container/cudagraphs.py): which padded shape a batch runs at, and the fixed-buffer path giving
every batch the rows a plain run gives, on a real session of a tiny model. On a CPU the path runs without
capture (device "cpu": the same padding, bound buffers, reuse and trimming); where a GPU is, the captured
graphs are checked against plain GPU runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from numpy.typing import NDArray
from tokenizers import Encoding, Tokenizer

from api.engine.backend import Backend
from container.bundle import MODEL_FILE, TOKENIZER_FILE, read_manifest
from container.cudagraphs import GRAPH_TOKENS, CudaGraphs, graph_shapes, pick
from container.pooling import DTYPES, POOLINGS, build, path
from container.runtime import OnnxModel
from tasks.ops import pad_batch, pool_tokens
from tests.conftest import ModelFactory

TEXTS = [
    "a short one",
    "a somewhat longer sentence than the first, with a clause",
    "three",
    "the fourth text says a little more about nothing at all, at some length, for the padding",
    "five",
]


def test_a_batch_runs_at_the_smallest_shape_that_holds_it() -> None:
    shapes = graph_shapes(max_batch_size=32, max_batch_tokens=16384, max_length=256)
    assert pick(shapes, 3, 100) == (4, 128)
    assert pick(shapes, 1, 9) == (1, 16)
    assert pick(shapes, 1, 256) == (1, 256)  # the model's longest sequence has its shape
    assert pick(shapes, 64, 16) is None  # more sequences than a call takes: a plain run
    assert max(b * n for b, n in shapes) <= GRAPH_TOKENS  # big batches spend their time in kernels, not launches
    assert pick(shapes, 32, 256) is None
    # A bundle whose longest sequence is not a listed length still has shapes up to it.
    assert pick(graph_shapes(8, 4096, 100), 2, 90) == (2, 100)
    # The batch budget bounds the shapes too.
    assert max(b * n for b, n in graph_shapes(64, 512, 512)) <= 512


@dataclass(frozen=True)
class CpuGraphs:
    """A bundle's tokenizer, its plain CPU session, and the fixed-buffer path over it (shapes of up to 4 rows)."""

    tokenizer: Tokenizer
    model: OnnxModel
    graphs: CudaGraphs
    pad_id: int

    @classmethod
    def of(cls, bundle: Path) -> CpuGraphs:
        manifest = read_manifest(bundle)
        model = OnnxModel(bundle / MODEL_FILE, "cpu", 1, manifest.output)
        graphs = CudaGraphs(model, graph_shapes(4, 4096, manifest.max_length), manifest.pad_id, device="cpu")
        return cls(Tokenizer.from_file(str(bundle / TOKENIZER_FILE)), model, graphs, manifest.pad_id)

    def feeds(self, texts: list[str]) -> tuple[list[Encoding], dict[str, NDArray[np.int64]]]:
        batch = self.tokenizer.encode_batch(texts)
        return batch, pad_batch(batch, self.model.input_names, self.pad_id)

    def batches(self) -> Iterator[tuple[list[Encoding], dict[str, NDArray[np.int64]]]]:
        """Batches of 1 to 5 sequences with their feeds: 5 is above every shape (a plain run); 3 is padded to 4
        rows, and each shape's buffers are reused by later batches with other texts (no stale ids or rows)."""
        for size in (1, 3, 2, 5, 3, 1):
            yield self.feeds(TEXTS[:size] if size != 3 else TEXTS[2:5])


@pytest.mark.parametrize("task", ["feature-extraction", "token-classification"])
def test_every_batch_gets_the_rows_a_plain_run_gives(fp32_bundle: ModelFactory, task: str) -> None:
    # fp32: a dynamic int8 variant's one activation scale per call would see the padding rows.
    cpu = CpuGraphs.of(fp32_bundle(task))
    for _, feeds in cpu.batches():
        got = cpu.graphs.run(feeds)
        want = cpu.model.run(feeds)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="needs a CUDA GPU")
def test_captured_graphs_answer_as_plain_gpu_runs(fp32_bundle: ModelFactory) -> None:
    bundle = fp32_bundle("feature-extraction")
    manifest = read_manifest(bundle)
    tokenizer = Tokenizer.from_file(str(bundle / TOKENIZER_FILE))
    shapes = graph_shapes(8, 4096, manifest.max_length)
    args = (bundle / MODEL_FILE, "gpu", (1,), manifest.output)
    graphed = Backend(*args, pad_id=manifest.pad_id, graph_shapes=shapes, max_length=manifest.max_length)
    plain = Backend(*args, pad_id=manifest.pad_id, max_length=manifest.max_length)
    assert graphed.graphs is not None and plain.graphs is None
    for size in (1, 3, 5, 2, 5, 1):
        batch = tokenizer.encode_batch(TEXTS[-size:])
        for got, want in zip(graphed.run(batch), plain.run(batch), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-4)
        # Pooled on the device, from the graph's buffers: the vectors the host pools from plain rows.
        for got, want in zip(graphed.run(batch, pooling="mean"), plain.run(batch), strict=True):
            np.testing.assert_allclose(got, pool_tokens(want, "mean"), atol=1e-4)


def test_shapes_with_big_outputs_run_plainly_with_the_same_rows(
    fp32_bundle: ModelFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = CpuGraphs.of(fp32_bundle("feature-extraction"))
    one_row = 16 * int(cpu.model.session.get_outputs()[0].shape[-1]) * 4  # a (1, 16) shape's token states, in bytes
    monkeypatch.setattr("container.cudagraphs.GRAPH_OUTPUT_BYTES", one_row)  # read as each shape is bound
    cpu.graphs.capture()
    shapes = cpu.graphs.shapes
    assert cpu.graphs.captured == shapes  # every shape has its graph, for pooled calls
    assert set(shapes) - set(cpu.graphs.states_plainly) == {(1, 16)}  # every other shape's output is bigger
    for texts in (TEXTS[:1], TEXTS[:3]):
        _, feeds = cpu.feeds(texts)
        np.testing.assert_allclose(cpu.graphs.run(feeds), cpu.model.run(feeds), atol=1e-4)
        lengths = feeds["attention_mask"].sum(axis=1)
        pooled = cpu.graphs.run(feeds, "mean")  # through the graph even where token states are not
        want = [pool_tokens(rows[:n], "mean") for rows, n in zip(cpu.model.run(feeds), lengths, strict=True)]
        np.testing.assert_allclose(pooled, np.stack(want), atol=1e-5)


@pytest.mark.parametrize("pool", [*POOLINGS, "max"])
def test_pooled_calls_get_the_vectors_the_host_pools_from_the_same_rows(fp32_bundle: ModelFactory, pool: str) -> None:
    """The device pools a batch on the graph's own buffers (container/pooling.py): the rows of any batch size,
    padded rows and columns left out, equal pool_tokens over each sequence's token states; a pooling with no
    device graph (max), or a batch no shape holds, comes back as token states for the host to pool."""
    cpu = CpuGraphs.of(fp32_bundle("feature-extraction"))
    for batch, feeds in cpu.batches():
        size = len(batch)
        got = cpu.graphs.run(feeds, pool)
        states = cpu.model.run(feeds)
        if pool == "max" or size == 5:  # no pooler, or above every shape: a plain run's token states
            np.testing.assert_allclose(got, states, atol=1e-4)
            continue
        want = np.stack([pool_tokens(rows[: len(e)], pool) for rows, e in zip(states, batch, strict=True)])
        assert got.shape == want.shape == (size, states.shape[-1])
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("pool", POOLINGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_pooler_files_are_what_their_builder_makes(pool: str, dtype: str) -> None:
    pytest.importorskip("onnx")  # the optimizer's extra, which builds them; serving only reads them
    found = path(pool, dtype)
    assert found is not None and found.read_bytes() == build(pool, dtype), "run python -m container.pooling"
