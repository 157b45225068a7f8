"""The pooled-row stage (container/optimize/rows.py) on real exports of tiny models: a first-token classifier's
last layer ends on one row with the same answers; graphs it does not fit, or a rewrite that disagrees, stay
as they were. (Every family's classification and ranking bundles go through it in test_families.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from container.optimize import fuse, rows, source, variants
from tasks.registry import get_task
from tests.conftest import ExportFactory, ModelFactory


def _outputs(path: Path, lengths: tuple[int, ...]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    width = max(lengths)
    ids = np.array([[2, *range(5, 5 + n - 2), 3] + [0] * (width - n) for n in lengths], np.int64)
    mask = (np.arange(width) < np.array(lengths)[:, None]).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


def _copy(export: Path, folder: Path) -> Path:
    folder.mkdir()
    return Path(shutil.copy(export, folder / "model.onnx"))


@pytest.mark.parametrize("task", ["text-classification", "text-ranking"])
def test_a_first_token_head_runs_the_end_of_the_last_layer_on_one_row(
    tiny_export: ExportFactory, tmp_path: Path, task: str
) -> None:
    original = _copy(tiny_export(task)[0], tmp_path / "original")
    rewritten = original.with_name("pooled.onnx")
    assert rows.pooled_row(original, rewritten) == 3  # attention output, intermediate and output projections
    graph = onnx.load(str(rewritten))
    slices = [n for n in graph.graph.node if n.op_type == "Slice" and n.name.endswith("/hare_row")]
    assert len(slices) == 2  # the attention context and the residual, where the tail reads them
    for lengths in ((7,), (9, 4, 6)):
        for before, after in zip(_outputs(original, lengths), _outputs(rewritten, lengths), strict=True):
            assert np.abs(before - after).max() < 1e-6


@pytest.mark.parametrize("use_gpu", [False, True], ids=["cpu", "gpu"])
@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_the_fused_classifier_keeps_every_attention_kernel_and_its_row(
    tiny_model: ModelFactory, tiny_export: ExportFactory, tmp_path: Path, arch: str, use_gpu: bool
) -> None:
    """The row is cut after the fusion: cut before it, the last layer's attention no longer matched ORT's
    pattern and stayed a hundred small nodes (on an H100, DistilBERT-base's batch-1 call took 0.89 ms
    against 0.55, its shape nodes on the CPU). The GPU fusion's SkipLayerNormalization is row-wise too."""
    task = "text-classification"
    original = _copy(tiny_export(task, arch)[0], tmp_path / "original")
    config = source.inspect_source(tiny_model(task, arch), get_task(task)).config
    layers = int(config.get("num_hidden_layers") or config["n_layers"])
    fused = original.with_name("fused.onnx")
    counts = variants.fused("bert", use_gpu, fuse.attention_shape(config))(original, fused)
    assert counts.get("Attention") == layers
    assert counts.get("SkipLayerNormalization", 0) == (2 * layers if use_gpu else 0)
    assert counts.get("pooled-row MatMuls") == 3
    for lengths in ((7,), (9, 4, 6)):
        for before, after in zip(_outputs(original, lengths), _outputs(fused, lengths), strict=True):
            assert np.abs(before - after).max() < 1e-5


def test_a_graph_that_answers_every_token_is_left_as_it_was(tiny_export: ExportFactory, tmp_path: Path) -> None:
    original = _copy(tiny_export("feature-extraction")[0], tmp_path / "original")
    rewritten = original.with_name("pooled.onnx")
    assert rows.pooled_row(original, rewritten) == 0
    assert onnx.load(str(rewritten)).graph == onnx.load(str(original)).graph


def test_a_rewrite_that_disagrees_with_the_original_is_dropped(
    tiny_export: ExportFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rows, "MAX_DIFF", -1.0)  # no rewrite can agree
    original = _copy(tiny_export("text-classification")[0], tmp_path / "original")
    assert rows.pooled_row(original, original) == 0
    assert not any(n.op_type == "Slice" and n.name.endswith("/hare_row") for n in onnx.load(str(original)).graph.node)
    assert sorted(p.name for p in original.parent.iterdir()) == ["model.onnx"]


def test_a_tensor_a_subgraph_reads_keeps_all_its_rows() -> None:
    """Only the head may read the tail's rows: an If branch reading the MatMul's output needs every row, so the
    MatMul stays whole (and with it the only MatMul there was to move)."""
    from onnx import TensorProto, helper, numpy_helper

    def graph(branch_reads: str | None) -> onnx.GraphProto:
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            helper.make_node("LayerNormalization", ["y", "gamma"], ["z"], axis=-1),
            helper.make_node("Gather", ["z", "zero"], ["first"], axis=1),
        ]
        outputs = [helper.make_tensor_value_info("first", TensorProto.FLOAT, None)]
        if branch_reads:
            branch = helper.make_graph(
                [helper.make_node("Identity", [branch_reads], ["copy"])],
                "branch",
                [],
                [helper.make_tensor_value_info("copy", TensorProto.FLOAT, None)],
            )
            nodes.append(helper.make_node("If", ["flag"], ["kept"], then_branch=branch, else_branch=branch))
            outputs.append(helper.make_tensor_value_info("kept", TensorProto.FLOAT, None))
        return helper.make_graph(
            nodes,
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4]),
                helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            ],
            outputs,
            [
                numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
                numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
                numpy_helper.from_array(np.array(0, np.int64), "zero"),
            ],
        )

    assert rows.rewrite(graph(None)) == 1
    assert rows.rewrite(graph("y")) == 0
