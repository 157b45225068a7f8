"""Mixture-of-experts layers as hare exports them (container/optimize/experts.py): each routed expert is a MatMul
on its own weights, which every int8 variant quantizes, and the graph answers as transformers does at any
routing, experts with no tokens included."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from numpy.typing import NDArray

from container.optimize import export, int8, quantize, smoothing, source
from tasks.registry import get_task
from tests.conftest import ExportFactory, ModelFactory

# The tiny families with experts and one task of each: 4 routed experts, top-2, 2 layers (tests/tiny_models.py).
MOE = [("mistral4", "feature-extraction"), ("openai_privacy_filter", "token-classification")]
TOL = 1e-4


def _experts(model: Path) -> tuple[int, int]:
    """(layers, routed experts per layer) from config.json."""
    config = json.loads((model / "config.json").read_text())
    return config["num_hidden_layers"], config.get("n_routed_experts") or config["num_local_experts"]


def _inputs(vocab: int) -> list[tuple[NDArray[np.int64], NDArray[np.int64]]]:
    """(input_ids, attention_mask) batches the export's dummy (2 x 8 ones) never routed: one token (top-2 of 4
    experts: two experts get no rows in every layer), random texts of several lengths, and a padded batch."""
    rng = np.random.default_rng(7)
    batches = [(np.array([[5]]), np.ones((1, 1), np.int64))]
    for length in (2, 3, 17, 40):
        batches.append((rng.integers(3, vocab, (1, length)), np.ones((1, length), np.int64)))
    ids, mask = rng.integers(3, vocab, (3, 23)), np.ones((3, 23), np.int64)
    mask[1, 9:] = 0
    mask[2, 1:] = 0
    return [*batches, (ids, mask)]


def _session(graph: Path | onnx.ModelProto) -> ort.InferenceSession:
    data = graph.SerializeToString() if isinstance(graph, onnx.ModelProto) else str(graph)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(("arch", "task_name"), MOE)
def test_routed_experts_are_matmuls_on_their_own_weights_and_int8_quantizes_them(
    tiny_model: ModelFactory, tiny_export: ExportFactory, tmp_path: Path, arch: str, task_name: str
) -> None:
    layers, experts = _experts(tiny_model(task_name, arch))
    fp32, _ = tiny_export(task_name, arch)
    graph = onnx.load(str(fp32))
    # No stacked [experts, ...] weights are left to gather per token: each expert's up (gate+up) and down
    # projections are 2-D initializers that one MatMul reads.
    assert not [t.name for t in graph.graph.initializer if len(t.dims) == 3]
    on_weights = smoothing.targets(graph)
    routed = [n for n in on_weights if "/experts/" in n.name]
    assert len(routed) == layers * experts * 2, [n.name for n in routed]
    # ...each the expert's own parameter (experts.split_weights), not a slice of the stack folded at export:
    # the exporter's shape inference reads a node's constant inputs whole, so slicing the stack in the graph
    # made the export quadratic in the experts (minutes for a layer of 128).
    assert all(".experts.hare_" in n.input[1] for n in routed), [n.input[1] for n in routed]
    # The int8 variants quantize them: transformers' batched_mm export left these experts fp32 (a Gather of
    # their stacked weights feeding a batched MatMul), so its int8 graphs had layers x experts x 2 MatMuls fewer.
    names = {n.name for n in routed}
    dynamic = onnx.load(str(quantize.quantize_int8(fp32, tmp_path / "q.onnx")))
    assert names <= {n.name.removesuffix("_quant") for n in dynamic.graph.node if n.op_type == "MatMulInteger"}
    blockwise = onnx.load(str(quantize.quantize_blockwise(fp32, tmp_path / "b.onnx")))
    assert names <= {n.name.removesuffix("_Q8") for n in blockwise.graph.node if n.op_type == "MatMulNBits"}
    per_token = int8.per_token(graph, [n.name for n in on_weights])
    assert names <= {n.name.removesuffix("_quant") for n in per_token.graph.node if n.op_type == "MatMulIntegerToFloat"}


@pytest.mark.parametrize(("arch", "task_name"), MOE)
def test_moe_graphs_answer_as_transformers_at_routings_the_export_never_saw(
    tiny_model: ModelFactory, tiny_export: ExportFactory, tmp_path: Path, arch: str, task_name: str
) -> None:
    """transformers' own experts (eager loop over the experts hit, grouped_mm) trace the dummy's routing; the
    routed graph is right at any, in fp32 and in every int8 form, including for experts that get no token."""
    import transformers

    task = get_task(task_name)
    folder = tiny_model(task_name, arch)
    src = source.inspect_source(folder, task)
    fp32, _ = tiny_export(task_name, arch)
    # The model as transformers runs it by default (its own experts implementation, not hare's).
    reference = getattr(transformers, task.head).from_pretrained(str(folder), attn_implementation="eager").eval()
    batches = _inputs(reference.config.vocab_size)

    graph = _session(fp32)
    for ids, mask in batches:
        (out,) = graph.run([task.output], {"input_ids": ids, "attention_mask": mask})
        for row in range(len(ids)):
            n = int(mask[row].sum())
            feeds = {
                "input_ids": torch.tensor(ids[row : row + 1, :n]),
                "attention_mask": torch.tensor(mask[row, :n])[None],
            }
            with torch.no_grad():
                expected = export.reference_row(reference, src, task, feeds).numpy()
            assert np.abs(out[row, :n] - expected).max() < TOL, (ids.shape, row)

    # int8: per-call scales (the dynamic quantizer's operators, fused by ONNX Runtime), per-token scales
    # (int8-mixed's own arithmetic), blockwise; each runs on the experts' empty selections and follows fp32.
    names = [n.name for n in smoothing.targets(onnx.load(str(fp32)))]
    variants = {
        "per-call": _session(quantize.quantize_int8(fp32, tmp_path / "int8.onnx", per_channel=True)),
        "per-token": _session(int8.per_token(onnx.load(str(fp32)), names)),
        "blockwise": _session(quantize.quantize_blockwise(fp32, tmp_path / "block.onnx")),
    }
    for ids, mask in batches:
        (want,) = graph.run([task.output], {"input_ids": ids, "attention_mask": mask})
        for name, session in variants.items():
            (got,) = session.run([task.output], {"input_ids": ids, "attention_mask": mask})
            assert got.shape == want.shape and np.isfinite(got).all(), name
            real = mask.astype(bool)
            assert np.corrcoef(got[real].ravel(), want[real].ravel())[0, 1] > 0.95, (name, ids.shape)


def test_int8_mixed_smooths_the_experts_that_calibration_reached_and_leaves_the_others(
    tiny_export: ExportFactory, tmp_path: Path
) -> None:
    """int8-mixed's smoothing factors come from the calibration samples' activations; a routed expert that no
    calibration token picked has none (its activation is [0, hidden]), and its MatMul is left unsmoothed."""
    fp32, _ = tiny_export("feature-extraction", "mistral4")
    graph = onnx.load(str(fp32))
    one_token = {"input_ids": np.array([[5]]), "attention_mask": np.ones((1, 1), np.int64)}
    maxima = smoothing.activation_maxima(graph, [one_token], tmp_path)
    groups = smoothing.smoothing_groups(graph)
    unreached = [name for name in groups if name not in maxima]
    assert unreached and all("/experts/" in name for name in unreached)  # top-2 of 4: two experts a layer idle
    smoothed = smoothing.smooth(graph, maxima, 0.7)
    assert sum(n.name.endswith("/hare_smooth") for n in smoothed.graph.node) == len(groups) - len(unreached)
    base, scaled = _session(graph), _session(smoothed)
    for ids, mask in _inputs(400):
        feeds = {"input_ids": ids, "attention_mask": mask}
        assert np.abs(base.run(None, feeds)[0] - scaled.run(None, feeds)[0]).max() < TOL
