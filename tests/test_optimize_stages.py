"""Every optimizer stage on a tiny random model of every task and tokenizer family, with parity per stage."""

from __future__ import annotations

import codecs
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from tokenizers import Encoding, Tokenizer

from container.optimize import export, fuse, masks, quantize, source, textset, tokenizer, validate
from container.runtime import OnnxModel
from tasks.errors import InputError
from tasks.ops import pad_batch
from tasks.registry import get_task
from tests.conftest import ExportFactory, ModelFactory, TorchWork
from tests.tiny_models import FAMILIES, FAST_PAIRS, SLOW_PAIRS

FP32_TOL = 1e-4  # the exported and fused fp32 graphs must match PyTorch to this (max |Δ output|)
# Dynamic int8 of a tiny random model with narrow per-channel weights (_int8_bound): largest |Δ| per unit of
# the outputs' largest magnitude (at least 1), 0.113 over the 110 pairs, and per unit of the magnitude itself
# 0.268 (both the OpenAI privacy filter's), Gemma 4's apart (AMD EPYC, VNNI; the same on every x86 kernel:
# exact integer sums). A wrong dequantization scale misses it by far (below).
INT8_TOL, INT8_SMALL = 0.15, 0.3
BLOCKWISE_TOL = 0.1  # blockwise int8 (one scale per 32 weights) of a tiny random model: outputs are O(1)
# Families whose tiny random model's int8 misses that bound with one activation scale per call (Gemma 4's:
# 0.68 of its outputs' magnitude, cosine_p1 0.953): the stage test asserts its gate refuses it instead.
INT8_MISSES = {"gemma4_text"}


@pytest.mark.parametrize(
    ("arch", "task_name"), [*FAST_PAIRS, *(pytest.param(*pair, marks=pytest.mark.slow) for pair in SLOW_PAIRS)]
)
def test_every_stage_keeps_parity(
    tiny_model: ModelFactory,
    tiny_export: ExportFactory,
    torch_work: TorchWork,
    tmp_path: Path,
    arch: str,
    task_name: str,
) -> None:
    task = get_task(task_name)
    src = source.inspect_source(tiny_model(task_name, arch), task)

    fp32, inputs = tiny_export(task_name, arch)  # a copy of export.export_onnx's graph (one export per model)
    masks.additive_masks(fp32, fp32)  # as the pipeline's export stage does
    # token_type_ids only where the model has segment embeddings to feed
    assert ("token_type_ids" in inputs) == FAMILIES[arch].segments

    tok_file = tokenizer.write_tokenizer(src, tmp_path / "tokenizer.json")
    tok = Tokenizer.from_file(str(tok_file))
    assert tok.padding is None
    assert tok.truncation is not None and tok.truncation["max_length"] == src.max_length

    fused = tmp_path / "fused.onnx"
    # The fusion itself, in this process: the child process fuse.fuse runs it in (under a memory cap) is
    # checked once, below, to fuse and count the same.
    counts = fuse._fuse_here(fp32, fused, "bert", False, fuse.attention_shape(src.config))
    # Something fused in every family (at least LayerNorm and Gelu per layer); the BERT-shaped ones get more.
    assert sum(counts.values()) >= 2, counts
    # Narrow weights (64 levels a side, one scale per output channel): their integer sums are exact on every
    # x86 int8 kernel (AVX2's saturating pair sums included, see container/machine.py), so this graph's
    # answers, and the bound below, are the same on every CPU.
    int8 = quantize.quantize_int8(fused, tmp_path / "int8.onnx", per_channel=True, reduce_range=True)

    samples = textset.builtin_samples(tok, task.pairs)
    encodings = validate.encode_samples(tok, samples)
    # validate.reference_outputs's (computed once per model and task: the model's bundles reuse it)
    ref = torch_work.reference(src, task, encodings, inputs, tmp_path / "ref.npz")
    parity = validate.Parity(ref, encodings, samples, task, src.pooling, pad_id=src.pad_id or 0)

    for graph in (fp32, fused):
        report = validate.validate(graph, graph.stem, "fp32", parity)
        assert report.metrics["max_abs_diff"] <= FP32_TOL, (graph.name, report.metrics)
        assert report.passed, report.gates
    report = validate.validate(int8, "int8", "int8", parity)
    assert set(report.gates) == {g.metric for g in task.gates}, report.gates
    bound = _int8_bound(ref)
    if arch in INT8_MISSES:  # refused by its gate, with the figure, on every CPU
        assert report.metrics["max_abs_diff"] > bound and not report.passed, report.metrics
        assert any(not g["passed"] and g["value"] < g["threshold"] for g in report.gates.values()), report.gates
    else:
        assert report.metrics["max_abs_diff"] <= bound, (report.metrics, bound)
    # Weights smaller than those of the graph it was quantized from (the fused graph: decoders' fused rotary
    # caches are sized for ORT's longest positions, more than a tiny model's own weights). Weights, not the
    # file: a tiny model's file is mostly nodes, and the quantizer adds nodes (Mistral 4's 16 routed-expert
    # MatMuls, 5 operators each in int8) and shape annotations, so its int8 file is the larger.
    assert _weight_bytes(int8) < _weight_bytes(fused)


def _weight_bytes(graph: Path) -> int:
    return sum(len(t.SerializeToString()) for t in onnx.load(str(graph)).graph.initializer)


def _int8_bound(reference: Path) -> float:
    """The largest |Δ output| the stage test's int8 graph may have: INT8_TOL per unit of the reference
    outputs' largest magnitude (at least 1: decoders' final RMSNorm leaves states of a few units), and no more
    than INT8_SMALL of that magnitude itself (a tiny random classifier's logits can stay under 0.02)."""
    with np.load(reference) as stored:
        top = max(float(np.abs(stored[k]).max()) for k in stored.files)
    return min(INT8_TOL * max(1.0, top), INT8_SMALL * top)


def _correlation(reference: Path, model: OnnxModel, encodings: list[Encoding]) -> float:
    """Pearson correlation of every output value of `model` with the stored reference's: blind to a wrong
    scale or offset, so no parity check in itself."""
    with np.load(reference) as stored:
        ref = np.concatenate([stored[str(i)].ravel() for i in range(len(encodings))])
    cand = np.concatenate([c.ravel() for c in _alone(model, encodings)])
    return float(np.corrcoef(ref, cand)[0, 1])


def _alone(model: OnnxModel, encodings: list[Encoding]) -> list[np.ndarray]:
    """Each encoding's output at batch 1."""
    return [model.run(pad_batch([e], model.input_names))[0] for e in encodings]


@pytest.mark.slow
def test_blockwise_int8_keeps_parity(
    tiny_model: ModelFactory, tiny_export: ExportFactory, torch_work: TorchWork, tmp_path: Path
) -> None:
    task = get_task("feature-extraction")
    src = source.inspect_source(tiny_model("feature-extraction", "xlm-roberta"), task)
    fp32, inputs = tiny_export("feature-extraction", "xlm-roberta")
    tok = Tokenizer.from_file(str(tokenizer.write_tokenizer(src, tmp_path / "tokenizer.json")))
    samples = textset.builtin_samples(tok, task.pairs)
    encodings = validate.encode_samples(tok, samples)
    ref = torch_work.reference(src, task, encodings, inputs, tmp_path / "ref.npz")
    block = quantize.quantize_blockwise(fp32, tmp_path / "block.onnx")
    report = validate.validate(block, "int8-block32", "int8", validate.Parity(ref, encodings, samples, task, "mean"))
    assert report.metrics["max_abs_diff"] <= BLOCKWISE_TOL and report.passed, report.metrics


def test_an_int8_graph_with_a_wrong_dequantization_scale_misses_the_bound_by_its_figure(
    tiny_model: ModelFactory, tiny_export: ExportFactory, torch_work: TorchWork, tmp_path: Path
) -> None:
    """The stage test's int8 graph with the classifier's weight scales twice what they should be (as a mix-up
    of 7- and 8-bit scales would make them): its max |Δ| is past the stage test's bound, while a correlation
    with the reference, blind to scale, does not move. (The tiny model's logits are small enough that its
    gates still pass it: the bound is what catches it here.)"""
    from onnx import numpy_helper

    task = get_task("text-classification")
    src = source.inspect_source(tiny_model("text-classification"), task)
    fp32, inputs = tiny_export("text-classification")
    masks.additive_masks(fp32, fp32)
    tok = Tokenizer.from_file(str(tokenizer.write_tokenizer(src, tmp_path / "tokenizer.json")))
    samples = textset.builtin_samples(tok, task.pairs)
    encodings = validate.encode_samples(tok, samples)
    ref = torch_work.reference(src, task, encodings, inputs, tmp_path / "ref.npz")
    parity = validate.Parity(ref, encodings, samples, task, src.pooling, pad_id=src.pad_id or 0)
    int8 = quantize.quantize_int8(fp32, tmp_path / "int8.onnx", per_channel=True, reduce_range=True)
    built = validate.validate(int8, "int8", "int8", parity)
    assert built.metrics["max_abs_diff"] <= _int8_bound(ref), built.metrics

    model = onnx.load(str(int8))
    head = [n for n in model.graph.node if n.op_type == "MatMulInteger"][-1]  # the classifier's
    weights = head.input[1].removesuffix("_quantized")  # the quantizer names the weights' scales after them
    scales = next(t for t in model.graph.initializer if t.name == f"{weights}_scale")
    scales.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scales) * 2, scales.name))
    onnx.save(model, str(int8))
    broken = validate.validate(int8, "int8", "int8", parity)
    assert broken.metrics["max_abs_diff"] > 2 * _int8_bound(ref), broken.metrics
    assert _correlation(ref, OnnxModel(int8, output=task.output), encodings) > 0.999


def test_a_graph_exact_alone_and_wrong_in_a_batch_is_refused(
    tiny_model: ModelFactory, tiny_export: ExportFactory, torch_work: TorchWork, tmp_path: Path
) -> None:
    """The server batches sequences of near lengths, so a candidate is judged alone and in such batches: one
    whose answers change with the batch (as a dynamic int8 graph's do: one activation scale per batch) fails
    its gate even though each sample alone is the model's."""
    import onnx
    from onnx import helper, numpy_helper

    task = get_task("feature-extraction")
    src = source.inspect_source(tiny_model("feature-extraction"), task)
    fp32, inputs = tiny_export("feature-extraction", "bert")
    model = onnx.load(str(fp32))
    out = model.graph.output[0].name
    for node in model.graph.node:  # the model's output becomes "exact", then exact + 0.5 x (batch size - 1)
        node.output[:] = ["exact" if o == out else o for o in node.output]
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([0], np.int64), "first"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
        ]
    )
    model.graph.node.extend(
        [
            helper.make_node("Shape", ["exact"], ["shape"]),
            helper.make_node("Gather", ["shape", "first"], ["rows"]),
            helper.make_node("Cast", ["rows"], ["rows_f"], to=onnx.TensorProto.FLOAT),
            helper.make_node("Sub", ["rows_f", "one"], ["more"]),
            helper.make_node("Mul", ["more", "half"], ["shift"]),
            helper.make_node("Add", ["exact", "shift"], [out]),
        ]
    )
    model.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "one"))
    batchy = tmp_path / "batchy.onnx"
    onnx.save(model, str(batchy))
    tok = Tokenizer.from_file(str(tokenizer.write_tokenizer(src, tmp_path / "tokenizer.json")))
    samples = textset.builtin_samples(tok, task.pairs)
    encodings = validate.encode_samples(tok, samples)
    ref = torch_work.reference(src, task, encodings, inputs, tmp_path / "ref.npz")
    parity = validate.Parity(ref, encodings, samples, task, src.pooling)
    with np.load(ref) as stored:
        alone = _alone(OnnxModel(batchy, output=task.output), encodings)
        assert max(float(np.abs(stored[str(i)] - a).max()) for i, a in enumerate(alone)) < 1e-4  # alone: exact
    assert any(len(b) > 1 for b in validate.served_batches([len(e.ids) for e in encodings]))
    report = validate.validate(batchy, "batchy", "int8", parity)
    assert not report.passed and report.gates["cosine_p1"]["passed"] is False, report.gates
    assert validate.validate(fp32, "fp32", "fp32", parity).passed  # the same samples, batched the same way


def test_served_batches_group_near_lengths_within_the_limits() -> None:
    lengths = [5, 50, 6, 7, 300, 25, 30, 310, 6]
    batches = validate.served_batches(lengths)
    # From the oldest, its bucket's, then the nearest buckets' (25-30, then 50), while 7 x 50 stays within
    # SERVED_TOKENS; 300 and 310 would pass it (2 x 310 too), so each goes alone.
    assert batches == [[0, 2, 3, 8, 5, 6, 1], [4], [7]]
    many = validate.served_batches([8] * 80)
    assert [len(b) for b in many] == [32, 32, 16]  # at most SERVED_BATCH a batch


def test_selected_attention_masks_become_additive_with_the_same_outputs(tmp_path: Path) -> None:
    """A masked_fill attention (DistilBERT's under transformers 4.x): the full-size Expand + Where per layer
    become a broadcast Add, and a padded batch (the rows' lengths differ, so the masks matter) gives the very
    same outputs."""
    import onnx

    exported, additive = _selected_masks_made_additive(tmp_path)
    ops = [n.op_type for n in onnx.load(str(additive)).graph.node]
    assert "Expand" not in ops and ops.count("Where") == 2  # the Wheres left select on the small mask

    feeds = _padded_batch()
    before, after = OnnxModel(exported).run(feeds), OnnxModel(additive).run(feeds)
    assert np.array_equal(before, after)


def test_additive_masks_read_the_same_in_fp16(tmp_path: Path) -> None:
    """The GPU chain (fused for CUDA, then fp16, where the fill becomes -65504) run here on the CPU: with and
    without the rewrite, every real token's output is the same."""
    import onnxruntime as ort

    feeds = _padded_batch()
    real = feeds["attention_mask"] == 1
    outputs = []
    for graph in _selected_masks_made_additive(tmp_path):
        fuse.fuse(graph, tmp_path / f"{graph.stem}-fused.onnx", use_gpu=True)
        fp16 = fuse.to_fp16(tmp_path / f"{graph.stem}-fused.onnx", tmp_path / f"{graph.stem}-fp16.onnx")
        session = ort.InferenceSession(str(fp16), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, feeds)[0][real])
    assert np.isfinite(outputs[1]).all()
    assert np.array_equal(outputs[0], outputs[1])


def _selected_masks_made_additive(folder: Path) -> tuple[Path, Path]:
    """An encoder whose attention selects its mask as transformers 4.x's DistilBERT did (transformers 5's adds
    a prebuilt mask, so no family of the tests exports the pattern now; models' own code still writes it),
    and the same graph with its masks made additive (one per layer)."""
    import torch

    class Layer(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.qkv = torch.nn.Linear(32, 96)
            self.out = torch.nn.Linear(32, 32)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            b, n, _ = x.shape
            q, k, v = (t.view(b, n, 4, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
            scores = q @ k.transpose(2, 3) / 8**0.5
            hidden = (mask == 0).view(b, 1, 1, n).expand_as(scores)  # DistilBERT 4.x's MultiHeadSelfAttention
            scores = scores.masked_fill(hidden, torch.finfo(scores.dtype).min)
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, 32)
            return torch.nn.functional.layer_norm(x + self.out(context), (32,))

    class Encoder(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(100, 32)
            self.layers = torch.nn.ModuleList([Layer(), Layer()])

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            x = self.embed(input_ids)
            for layer in self.layers:
                x = layer(x, attention_mask)
            return x

    torch.manual_seed(0)
    exported, additive = folder / "exported.onnx", folder / "additive.onnx"
    dummy = {"input_ids": torch.ones((2, 8), dtype=torch.long), "attention_mask": torch.ones((2, 8), dtype=torch.long)}
    axes = {name: {0: "batch", 1: "sequence"} for name in ["input_ids", "attention_mask", "last_hidden_state"]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation, as export.export_onnx does
        torch.onnx.export(
            Encoder().eval(),
            (),
            str(exported),
            kwargs=dummy,
            input_names=list(dummy),
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=export.OPSET,
            dynamo=False,
        )
    assert masks.additive_masks(exported, additive) == 2
    return exported, additive


def _padded_batch() -> dict[str, np.ndarray]:
    """Four rows of 12, 7, 3 and 1 real tokens: the masks matter."""
    ids = np.arange(5, 5 + 4 * 12, dtype=np.int64).reshape(4, 12) % 90 + 5
    mask = (np.arange(12)[None, :] < np.array([12, 7, 3, 1])[:, None]).astype(np.int64)
    return {"input_ids": ids, "attention_mask": mask}


def test_a_graph_without_selected_masks_is_left_alone(tiny_export: ExportFactory) -> None:
    """BERT adds its mask already: nothing to rewrite, and the file is not written again."""
    graph, _ = tiny_export("feature-extraction")
    written = graph.stat().st_mtime_ns
    assert masks.additive_masks(graph, graph) == 0
    assert graph.stat().st_mtime_ns == written


def test_outputs_have_dynamic_batch_and_sequence_axes(tiny_export: ExportFactory) -> None:
    path, _ = tiny_export("token-classification")
    model = OnnxModel(path)
    for batch, length in [(1, 3), (5, 40)]:
        feeds = {n: np.ones((batch, length), dtype=np.int64) for n in model.input_names}
        assert model.run(feeds).shape[:2] == (batch, length)


def test_builtin_validation_set_spans_lengths(tiny_model: ModelFactory, tmp_path: Path) -> None:
    src = source.inspect_source(tiny_model("text-classification"), get_task("text-classification"))
    tok = Tokenizer.from_file(str(tokenizer.write_tokenizer(src, tmp_path / "t.json")))
    lengths = [len(e.ids) for e in validate.encode_samples(tok, textset.builtin_samples(tok, pairs=False))]
    assert min(lengths) <= 4
    assert max(lengths) == src.max_length  # the longest prose is truncated at the model's maximum, as served
    pairs = textset.builtin_samples(tok, pairs=True)
    assert len({s.group for s in pairs}) == len(textset.RANKING)
    assert all(s.pair for s in pairs)


def test_validation_file_formats(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_text("first text\n\nsecond text\n")
    assert [s.text for s in textset.file_samples(plain, pairs=False)] == ["first text", "second text"]
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"query": "q1", "documents": ["a", "b"]}\n{"query": "q2", "document": "c"}\n')
    samples = textset.file_samples(jsonl, pairs=True)
    assert [(s.text, s.pair, s.group) for s in samples] == [("q1", "a", 0), ("q1", "b", 0), ("q2", "c", 1)]
    with pytest.raises(Exception, match="ranking needs JSONL"):
        textset.file_samples(plain, pairs=True)
    # Saved by a Windows tool: the byte order mark does not begin the first text (nor hide its JSON).
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(codecs.BOM_UTF8 + b'{"text": "first"}\n{"text": "second"}\n')
    assert [s.text for s in textset.file_samples(marked, pairs=False)] == ["first", "second"]
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(InputError, match="is not UTF-8 text"):
        textset.file_samples(tmp_path / "latin1.txt", pairs=False)


@pytest.mark.parametrize("arch", ["bert", "distilbert"])
def test_the_fused_graph_has_one_attention_kernel_per_layer(
    tiny_model: ModelFactory, tmp_path: Path, arch: str
) -> None:
    """transformers 5 exports q/k/v reshapes with -1 heads; told the heads by the config, ORT's fusion turns a
    BERT-shaped encoder's attention into its Attention kernel, layer by layer (without it, a fused graph was
    ~200 small nodes: on an H200 a batch-1 call cost ~1 ms of launches whatever the length)."""
    task = get_task("feature-extraction")
    src = source.inspect_source(tiny_model("feature-extraction", arch), task)
    export.export_onnx(src, task, tmp_path / "fp32.onnx")
    counts = fuse.fuse(tmp_path / "fp32.onnx", tmp_path / "fused.onnx", attention=fuse.attention_shape(src.config))
    assert counts.get("Attention") == src.config.get("num_hidden_layers", src.config.get("n_layers"))
    assert fuse.attention_shape({"n_heads": 4, "dim": 32}) == (4, 32)  # DistilBERT's names
    assert fuse.attention_shape({"num_attention_heads": 16, "head_dim": 128, "hidden_size": 1024}) == (16, 2048)
    assert fuse.attention_shape({"hidden_size": 32}) == (0, 0)  # nothing to tell: ORT reads the graph


def test_gpu_fp16_graph_keeps_its_io_types(tiny_export: ExportFactory, tmp_path: Path) -> None:
    """The fp16 conversion runs anywhere; running it needs a GPU (the test below)."""
    import onnx

    fp32, _ = tiny_export("text-classification")
    fuse.fuse(fp32, tmp_path / "fused.onnx", use_gpu=True)
    graph = onnx.load(str(fuse.to_fp16(tmp_path / "fused.onnx", tmp_path / "fp16.onnx"))).graph
    assert {i.type.tensor_type.elem_type for i in graph.input} == {onnx.TensorProto.INT64}
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    weights = [w for w in graph.initializer if len(w.dims) == 2]
    assert weights and all(w.data_type == onnx.TensorProto.FLOAT16 for w in weights)


def test_gpu_fp16_graph_answers_as_the_fp32_graph_on_a_gpu(tiny_export: ExportFactory, tmp_path: Path) -> None:
    """Where CUDA is (scripts/gpu-check's machines): the fp16 graph runs on it and answers as the fp32 graph
    does on the CPU, within fp16's precision. Skipped without one: the only thing a machine here cannot have."""
    from container.runtime import available_targets

    if "gpu" not in available_targets():
        pytest.skip("no CUDA on this machine (scripts/gpu-check runs this chain on a GPU)")
    fp32, _ = tiny_export("text-classification")
    fuse.fuse(fp32, tmp_path / "fused.onnx", use_gpu=True)
    fp16 = fuse.to_fp16(tmp_path / "fused.onnx", tmp_path / "fp16.onnx")
    ids = np.random.default_rng(0).integers(5, 100, (2, 12))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    expected = OnnxModel(fp32).run(feeds)
    got = OnnxModel(fp16, target="gpu").run(feeds)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-2 * max(1.0, np.abs(expected).max())


def test_gpu_target_without_cuda_is_refused_before_any_work(tiny_model: ModelFactory, tmp_path: Path) -> None:
    from container.optimize.pipeline import OptimizeOptions, optimize
    from container.runtime import available_targets
    from tasks.errors import InputError

    if "gpu" in available_targets():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "bundle"
    with pytest.raises(InputError, match="CUDAExecutionProvider"):
        optimize(OptimizeOptions(tiny_model("text-classification"), get_task("text-classification"), out, "gpu"))
    assert not out.exists() and not list(tmp_path.iterdir())


def test_the_fusion_runs_in_a_process_of_its_own_and_reports_what_it_fused(
    tiny_export: ExportFactory, tmp_path: Path
) -> None:
    """fuse.fuse as the optimizer calls it: a child process (under a memory cap) writes the fused graph and
    reports its fused-operator counts, the same graph and counts as the fusion run here. For CPUs the
    residual Add stays apart from its LayerNormalization (ORT's CPU SkipLayerNormalization is the slower);
    for GPUs they fuse."""
    import onnx

    fp32, _ = tiny_export("text-classification")
    heads = (4, 32)  # the tiny BERT's, as the optimizer passes them from its config
    counts = fuse.fuse(fp32, tmp_path / "child.onnx", attention=heads)
    assert counts == fuse._fuse_here(fp32, tmp_path / "here.onnx", "bert", False, heads)
    assert counts.get("Attention", 0) >= 2 and counts.get("LayerNormalization", 0) >= 4, counts
    assert "SkipLayerNormalization" not in counts, counts
    gpu = fuse._fuse_here(fp32, tmp_path / "gpu.onnx", "bert", True, heads)
    assert gpu.get("SkipLayerNormalization", 0) >= 2, gpu
    child, here = onnx.load(str(tmp_path / "child.onnx")), onnx.load(str(tmp_path / "here.onnx"))
    assert child.graph.SerializeToString() == here.graph.SerializeToString()


def test_a_fusion_out_of_memory_fails_only_the_fused_variants(
    tiny_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ORT's fusions can outgrow the machine (a DeBERTa-v3-base geometry took over 24 GiB): they run in a
    process of their own under a memory cap, so running out costs the fused variants, not the whole build."""
    from container.bundle import read_manifest
    from container.optimize.pipeline import OptimizeOptions, optimize

    monkeypatch.setattr(fuse, "MEMORY_SHARE", 1e-6)  # a cap of a few kB: the fusion cannot allocate its graph
    task = get_task("text-classification")
    out = tmp_path / "bundle"
    optimize(
        OptimizeOptions(
            tiny_model("text-classification"),
            task,
            out,
            only=["fp32", "fused-fp32"],
            tune_lengths=[8],
            tune_batches=[1],
        )
    )
    manifest = read_manifest(out)
    assert manifest.variant == "fp32"
    fused = next(v for v in manifest.variants if v["name"] == "fused-fp32")
    assert not fused["passed"] and "transformer optimizer failed" in str(fused.get("error")), fused


def test_a_graph_past_protobufs_limit_ships_with_one_data_file(
    tiny_export: ExportFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0.6B decoder's fp32 graph (2.4 GB) cannot be one protobuf: its weights travel in `model.onnx.data`,
    however many files the exporter scattered them into, and the bundle's graph answers as before."""
    import onnx

    from container.optimize import graphs

    inline, _ = tiny_export("feature-extraction", "qwen3")
    scattered = tmp_path / "export" / "fp32.onnx"
    scattered.parent.mkdir()
    onnx.save(onnx.load(str(inline)), str(scattered), save_as_external_data=True, all_tensors_to_one_file=False)
    assert len(list(scattered.parent.iterdir())) > 2

    monkeypatch.setattr(graphs, "LIMIT_BYTES", 1000)
    monkeypatch.setattr(graphs, "MAP_BYTES", 1000)  # the tiny model's weights stand in for a real one's
    assert graphs.too_big(onnx.load(str(scattered))) and graphs.too_big(onnx.load(str(inline)))
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    graphs.ship(scattered, bundle / "model.onnx")
    assert sorted(p.name for p in bundle.iterdir()) == ["model.onnx", "model.onnx.data"]
    ids = np.array([[5, 6, 7, 8]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    assert np.allclose(OnnxModel(bundle / "model.onnx").run(feeds), OnnxModel(inline).run(feeds), atol=1e-6)


def test_a_shipped_graph_keeps_its_big_weights_page_aligned_in_the_data_file(
    tiny_export: ExportFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ONNX Runtime maps a weight of the data file (shared by sessions and workers, not copied into each) only
    when its offset is a multiple of the allocation granularity: every weight from MAP_BYTES up sits there,
    smaller ones stay in the graph, and the shipped graph answers as the exported one."""
    import onnx

    from container.optimize import graphs

    inline, _ = tiny_export("feature-extraction", "bert")
    monkeypatch.setattr(graphs, "MAP_BYTES", 2048)
    graphs.ship(inline, tmp_path / "model.onnx")

    shipped = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    sizes = {t.name: len(t.raw_data) for t in onnx.load(str(inline)).graph.initializer}
    external = {t.name: {e.key: e.value for e in t.external_data} for t in shipped.graph.initializer if t.external_data}
    assert external and set(external) == {name for name, size in sizes.items() if size >= 2048}
    for name, info in external.items():
        assert int(info["offset"]) % graphs.ALIGN == 0 and int(info["length"]) == sizes[name]
        assert info["location"] == "model.onnx.data"
    ids = np.array([[5, 6, 7, 8], [9, 10, 0, 0]], dtype=np.int64)
    feeds = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64), "token_type_ids": np.zeros_like(ids)}
    expected = OnnxModel(inline).run(feeds)
    assert np.allclose(OnnxModel(tmp_path / "model.onnx").run(feeds), expected, atol=1e-6)


def test_a_build_makes_the_chosen_variants_and_their_parents_only() -> None:
    from container.optimize.variants import Variant, plan, variants_for

    def names(variants: tuple[Variant, ...]) -> list[str]:
        return [v.name for v in variants]

    fused = plan(variants_for("cpu"), ["fused-int8"])
    assert names(fused.chosen) == ["fused-int8"]
    assert names(fused.to_build) == ["fused-fp32", "fused-int8"] and not fused.to_calibrate
    assert names(plan(variants_for("cpu"), ["fp32", "int8-mixed"]).to_calibrate) == ["int8-mixed"]
    assert names(plan(variants_for("gpu")).chosen) == ["fp32", "fused-fp32", "fused-fp16"]


def test_a_failed_build_costs_that_variant_and_its_children_only(tmp_path: Path) -> None:
    """The fuse + quantize stage alone, on stand-in builds: it returns why each failed variant did."""
    import shutil

    from container.optimize.stages import build_variants
    from container.optimize.variants import Variant

    def unfit(_parent: Path, _out: Path) -> None:
        raise RuntimeError("the pattern does not match")

    (tmp_path / "fp32.onnx").write_bytes(b"graph")
    copy = shutil.copyfile
    made = [Variant("a", "fp32", "fp32", unfit), Variant("b", "int8", "a", copy), Variant("c", "int8", "fp32", copy)]
    failed = build_variants(made, tmp_path)
    assert failed == {"a": "RuntimeError: the pattern does not match", "b": "its parent a failed to build"}
    assert (tmp_path / "c.onnx").read_bytes() == b"graph" and not (tmp_path / "b.onnx").exists()
