"""The loop-free gated delta rule (container/optimize/delta_rule.py) against transformers' own chunked function,
at lengths within one chunk, at its edges and over several chunks, on a model's kind of inputs and on the kind
that breaks a whole-sequence product form (alike keys, beta near 1, slow decay); and as an ONNX graph run at
lengths other than the one it was traced at."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from container.optimize import delta_rule

# Outputs are O(0.1 - 1); the two functions sum in different orders (measured: 5.4e-7 at most, up to 600 tokens).
TOL = 1e-5
LENGTHS = [1, 3, 37, 63, 64, 65, 130, 200, 333, 600]


def _inputs(length: int, hard: bool, batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """query, key, value, g, beta as a Qwen3.5 layer passes them: 2 query/key heads serving 4 value heads."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(batch, length, 2, 16, generator=gen) for _ in range(2))
    v = torch.randn(batch, length, 4, 16, generator=gen)
    if hard:
        k = torch.randn(1, 1, 2, 16, generator=gen) + 0.05 * k
        beta = torch.full((batch, length, 4), 0.99)
        g = -1e-3 * torch.rand(batch, length, 4, generator=gen)
    else:  # the layer's g = -exp(A_log) * softplus(a + dt_bias), A ~ U(0.01, 16) as transformers initializes it
        decay = torch.empty(4).uniform_(0.01, 16, generator=gen)
        g = -decay * torch.nn.functional.softplus(torch.randn(batch, length, 4, generator=gen) + 1)
        beta = torch.randn(batch, length, 4, generator=gen).sigmoid()
    return q, k, v, g, beta


def _transformers(*inputs: torch.Tensor) -> torch.Tensor:
    from transformers.models.qwen3_5 import modeling_qwen3_5

    return modeling_qwen3_5.torch_chunk_gated_delta_rule(*inputs, use_qk_l2norm_in_kernel=True)[0]


@pytest.mark.parametrize("hard", [False, True], ids=["model-like", "alike-keys"])
@pytest.mark.parametrize("length", LENGTHS)
def test_the_loop_free_rule_equals_transformers(length: int, hard: bool) -> None:
    inputs = _inputs(length, hard, batch=2)
    # The fewest scan steps that reach this length: a step too few would leave the last chunks' states short.
    ours, state = delta_rule.gated_delta_rule(
        *inputs, steps=delta_rule.scan_steps(length), use_qk_l2norm_in_kernel=True
    )
    assert state is None
    assert torch.abs(ours - _transformers(*inputs)).max() < TOL


def test_scan_steps_reach_every_chunk() -> None:
    # Up to 2 chunks: the second chunk's state is the first's map alone. Then one step per doubling.
    assert [delta_rule.scan_steps(n) for n in (1, 64, 128, 129, 192, 193, 320, 321, 32768)] == [
        0,
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        9,
    ]
    length = delta_rule.CHUNK * 4 + 1  # 5 chunks: the last state composes 4 maps, 2 steps' worth
    inputs = _inputs(length, hard=True)  # slow decay: the first chunk still counts in the last
    short = delta_rule.gated_delta_rule(*inputs, steps=1, use_qk_l2norm_in_kernel=True)[0]
    assert torch.abs(short - _transformers(*inputs)).max() > 1e-3  # what the steps are for


def test_it_takes_no_state() -> None:
    q, k, v, g, beta = _inputs(3, hard=False)
    with pytest.raises(ValueError, match="without a cache"):
        delta_rule.gated_delta_rule(q, k, v, g, beta, steps=0, initial_state=torch.zeros(1, 4, 16, 16))


def test_its_onnx_graph_answers_at_any_length(tmp_path: Path) -> None:
    """Traced at 8 tokens (as export.py traces), run by ONNX Runtime at others, batch 2."""
    import onnxruntime as ort

    class Rule(torch.nn.Module):  # type: ignore[misc]
        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return delta_rule.gated_delta_rule(*inputs, steps=3, use_qk_l2norm_in_kernel=True)[0]

    names = ["query", "key", "value", "g", "beta"]
    path = tmp_path / "rule.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's warnings about shapes the dynamic axes cover
        torch.onnx.export(
            Rule(),
            _inputs(8, hard=False, batch=2),
            str(path),
            input_names=names,
            output_names=["out"],
            dynamic_axes={n: {0: "batch", 1: "sequence"} for n in [*names, "out"]},
            opset_version=17,
            dynamo=False,
        )
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for length in (1, 37, 130, 333):
        for hard in (False, True):
            inputs = _inputs(length, hard, batch=2, seed=length)
            (out,) = session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
            assert np.abs(out - _transformers(*inputs).numpy()).max() < TOL, (length, hard)


def test_a_qwen3_5_graph_equals_pytorch_past_the_first_chunk(tmp_path: Path) -> None:
    """A tiny Qwen3.5 (one gated-delta-rule layer, one attention layer) exported as the optimizer exports it,
    against transformers at lengths around the chunk edges up to its maximum, alone and beside a 3-token text
    in a batch padded on the right and on the left (the padded row's real tokens compared)."""
    import onnxruntime as ort

    from container.optimize import export, source
    from tasks.registry import get_task
    from tests.tiny_models import make_model

    positions = 256
    folder = make_model(tmp_path / "model", "feature-extraction", "qwen3_5_text", max_position_embeddings=positions)
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": positions}))
    tokenizer_config = folder / "tokenizer_config.json"
    tokenizer_config.write_text(json.dumps(json.loads(tokenizer_config.read_text()) | {"model_max_length": positions}))
    task = get_task("feature-extraction")
    src = source.inspect_source(folder, task)
    assert src.max_length == positions
    graph = tmp_path / "model.onnx"
    export.export_onnx(src, task, graph)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    model = export.load_torch_model(src, task)
    rng = np.random.default_rng(0)
    vocab = src.config["vocab_size"]
    for length in (2, 63, 64, 65, 70, 128, 129, 200, positions):
        ids = rng.integers(3, vocab, size=(1, length))
        with torch.inference_mode():
            reference = model(input_ids=torch.from_numpy(ids)).last_hidden_state[0].numpy()
        (alone,) = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        assert np.abs(alone[0] - reference).max() < 1e-4, (length, "alone")
        short = rng.integers(3, vocab, size=min(3, length))
        for side in ("right", "left"):
            batch = np.zeros((2, length), dtype=np.int64)
            mask = np.zeros_like(batch)
            batch[0], mask[0] = ids[0], 1
            cols = slice(0, len(short)) if side == "right" else slice(length - len(short), length)
            batch[1, cols], mask[1, cols] = short, 1
            (out,) = session.run(None, {"input_ids": batch, "attention_mask": mask})
            assert np.abs(out[0] - reference).max() < 1e-4, (length, side)
            with torch.inference_mode():
                short_ref = model(input_ids=torch.from_numpy(short[None])).last_hidden_state[0].numpy()
            assert np.abs(out[1, cols] - short_ref).max() < 1e-4, (length, side, "short row")


def test_tensor_split_as_slices_cuts_as_torch_does() -> None:
    """What loop_free puts in torch.tensor_split's place answers as it does: at indices within, at and past the
    dimension's size (transformers 5.25 cuts a sequence at its own length), on any dimension; sections as they
    are."""
    x = torch.arange(2 * 5 * 3).reshape(2, 5, 3)
    split = delta_rule.split_as_slices(torch.tensor_split)
    for indices, dim in [([5], 1), ([2], 1), ([0, 3], 1), ([7], 1), ([1], -1), ([1], 0)]:
        expected = torch.tensor_split(x, indices, dim=dim)
        got = split(x, indices, dim=dim)
        assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(split(x, 2, dim=1), torch.tensor_split(x, 2, dim=1), strict=True))
