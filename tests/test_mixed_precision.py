"""int8-mixed (container/optimize/mixed.py) on tiny random models: smoothing keeps the function, the simulation
quantizes as the quantizer does, the most harmful MatMuls stay fp32 until the gates pass, and a gate no
quantized graph can meet refuses the variant with its figures.

What is asserted holds on any CPU: the simulation runs this CPU's own int8 kernels (whose errors differ by
ISA), so every threshold a test needs is set from figures the test measures here, or loose by construction."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic
from tokenizers import Tokenizer

from container.bundle import Manifest
from container.machine import NARROW_LEVELS, describe, weight_levels
from container.optimize import (
    export,
    graphs,
    int8,
    masks,
    mixed,
    pipeline,
    quantize,
    simulator,
    smoothing,
    source,
    textset,
    tokenizer,
    validate,
    variants,
)
from container.runtime import OnnxModel
from tasks.ops import pad_batch
from tasks.registry import get_task
from tests.clocked import clocked
from tests.conftest import ModelFactory
from tests.tiny_models import make_model

# The integer product of an int8 MatMul, by its activations' scales (int8.arithmetic): MatMulInteger with one
# scale per call, MatMulIntegerToFloat with one per token.
PRODUCT = {"tensor": "MatMulInteger", "token": "MatMulIntegerToFloat"}


@dataclasses.dataclass(frozen=True)
class Built:
    """A tiny model's fp32 export with its samples and PyTorch reference."""

    fp32: Path
    parity: validate.Parity


def _built(model: Path, task_name: str, folder: Path) -> Built:
    task = get_task(task_name)
    src = source.inspect_source(model, task)
    fp32 = folder / "fp32.onnx"
    inputs = export.export_onnx(src, task, fp32)
    masks.additive_masks(fp32, fp32)
    tok = Tokenizer.from_file(str(tokenizer.write_tokenizer(src, folder / "tokenizer.json")))
    samples = textset.builtin_samples(tok, task.pairs)
    encodings = validate.encode_samples(tok, samples)
    ref = validate.reference_outputs(src, task, encodings, inputs, folder / "ref.npz")
    parity = validate.Parity(
        ref, encodings, samples, task, src.pooling, multi_label=src.multi_label, pad_id=src.pad_id or 0
    )
    return Built(fp32, parity)


@pytest.fixture(scope="module")
def embedder(tiny_model: ModelFactory, tmp_path_factory: pytest.TempPathFactory) -> Built:
    return _built(tiny_model("feature-extraction"), "feature-extraction", tmp_path_factory.mktemp("mixed-fe"))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """A classifier int8 hurts: at 10x the usual initial weights each MatMul alone in int8 moves a score by
    0.007 to 0.03 (fp32: 2e-6), every one of them by 0.067, past the 0.02 gate."""
    folder = tmp_path_factory.mktemp("mixed-tc")
    model = make_model(folder / "model", "text-classification", initializer_range=0.3)
    return _built(model, "text-classification", folder)


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No smoothing, one activation scale per call, no margin and no splits: the exclusion order and stopping
    point are then the plain rule."""
    monkeypatch.setattr(mixed, "ALPHAS", (0.0,))
    monkeypatch.setattr(mixed, "SCALES", ("tensor",))
    monkeypatch.setattr(mixed, "MARGIN", 0.0)
    monkeypatch.setattr(mixed, "SPLIT_MORE", 0)
    yield


def _ops(graph: Path) -> dict[str, str]:
    return {n.name: n.op_type for n in onnx.load(str(graph)).graph.node}


def test_smoothing_keeps_the_function(embedder: Built, tmp_path: Path) -> None:
    model = onnx.load(str(embedder.fp32))
    names = [i.name for i in model.graph.input]
    feeds = [pad_batch([e], names) for e in embedder.parity.encodings[:8]]
    maxima = smoothing.activation_maxima(model, feeds, tmp_path)
    groups = smoothing.smoothing_groups(model)
    assert set(maxima) == set(groups) and len(groups) >= 4  # Q/K/V share one; then O, FFN in, FFN out per layer
    smoothed = smoothing.smooth(model, maxima, 0.7)
    assert sum(n.op_type == "Mul" and n.name.endswith("/hare_smooth") for n in smoothed.graph.node) == len(groups)
    onnx.save(smoothed, str(tmp_path / "smoothed.onnx"))
    before = OnnxModel(embedder.fp32, output="last_hidden_state")
    after = OnnxModel(tmp_path / "smoothed.onnx", output="last_hidden_state")
    for feed in feeds:
        assert np.allclose(before.run(feed), after.run(feed), atol=1e-4, rtol=1e-4)
    first = smoothing.targets(model)[0]
    weight = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}[first.input[1]]
    moved = {t.name: numpy_helper.to_array(t) for t in smoothed.graph.initializer}[first.input[1]]
    assert not np.allclose(weight, moved)  # the factors went into the weights


@pytest.mark.parametrize("levels", [127, 64])
def test_the_simulation_uses_the_quantizers_int8_weights(embedder: Built, tmp_path: Path, levels: int) -> None:
    """Full range, and narrow (64 levels a side: the quantizer's reduce_range, for CPUs whose int8 kernel
    saturates): the same values and scales as ONNX Runtime's quantizer stores."""
    out = tmp_path / "int8.onnx"
    quantize_dynamic(
        str(embedder.fp32),
        str(out),
        per_channel=True,
        reduce_range=levels == 64,
        weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul"],
        extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    model = onnx.load(str(embedder.fp32))
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    stored = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer}
    for node in smoothing.targets(model):
        w = node.input[1]
        values, scales = int8.quantized_weight(weights[w], levels)
        assert np.array_equal(values, stored[f"{w}_quantized"]) and not stored[f"{w}_zero_point"].any(), node.name
        assert np.array_equal(scales, stored[f"{w}_scale"]), node.name
        assert np.abs(values).max() == levels, node.name  # each column's largest weight takes the top level


@pytest.mark.parametrize("levels", [127, 64])
def test_dynamic_int8_variants_store_weights_of_the_levels_asked(embedder: Built, tmp_path: Path, levels: int) -> None:
    """What variants_for builds for a CPU whose int8 kernel saturates (64 levels a side) or not (127)."""
    built = {v.name: v for v in variants.variants_for("cpu", levels=levels)}
    for name in ("int8", "int8-per-channel"):
        build = built[name].build
        assert build is not None
        build(embedder.fp32, tmp_path / f"{name}.onnx")
        stored = onnx.load(str(tmp_path / f"{name}.onnx")).graph.initializer
        weights = [numpy_helper.to_array(t) for t in stored if t.data_type == TensorProto.INT8]
        assert weights and max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == levels, name


def test_per_token_int8_is_what_the_simulation_ran(embedder: Built, tmp_path: Path) -> None:
    model = onnx.load(str(embedder.fp32))
    names = [n.name for n in smoothing.targets(model)]
    built = tmp_path / "per-token.onnx"
    onnx.save(int8.per_token(copy.deepcopy(model), names), str(built))
    ops = _ops(built)
    for name in names:
        assert ops.get(f"{name}_quant") == PRODUCT["token"] and name not in ops
    sim = simulator.Simulator(model, names, tmp_path, embedder.parity, [])
    output = embedder.parity.task.output
    graph = OnnxModel(built, output=output)
    by_token = np.full(len(names), int8.TOKEN)
    for feed in sim.feeds[::5]:
        simulated = sim.session.run([output], feed | {int8.SWITCHES: by_token})[0]
        assert np.allclose(graph.run(feed), simulated, rtol=1e-5, atol=1e-6)  # the same operators, same kernel


def _one_matmul(weight: np.ndarray, bias: np.ndarray) -> onnx.ModelProto:
    """x [1, tokens, K] @ weight + bias, the shape of an exported projection."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"], name="proj"), helper.make_node("Add", ["xw", "b"], ["y"])],
        "proj",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None, weight.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model: onnx.ModelProto | Path, x: np.ndarray, level: ort.GraphOptimizationLevel | None = None) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level or ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], {"x": x})[0])


def test_a_token_with_massive_activations_costs_only_its_own_row(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(64, 48)).astype(np.float32)
    bias = rng.normal(size=48).astype(np.float32)
    x = rng.normal(size=(1, 6, 64)).astype(np.float32)
    x[0, 2, 5] = 1e4  # one token, one channel: a massive activation
    fp32 = _one_matmul(weight, bias)
    token = int8.per_token(copy.deepcopy(fp32), ["proj"])
    by_token = _run(token, x)
    for row in range(x.shape[1]):  # each token's result is its own: the batch around it changes nothing
        assert np.array_equal(by_token[:, row], _run(token, x[:, row : row + 1])[:, 0])
    # ONNX Runtime's fusions (MatMulIntegerToFloat takes one activation scale) must leave the arithmetic alone.
    unfused = _run(token, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    assert np.allclose(by_token, unfused, rtol=1e-6, atol=1e-5)
    onnx.save(fp32, str(tmp_path / "fp32.onnx"))
    quantize_dynamic(
        str(tmp_path / "fp32.onnx"),
        str(tmp_path / "per-call.onnx"),
        per_channel=True,
        weight_type=QuantType.QInt8,
        extra_options={"MatMulConstBOnly": True},
    )
    per_call = _run(tmp_path / "per-call.onnx", x)
    exact = _run(fp32, x)
    others = [r for r in range(x.shape[1]) if r != 2]

    def error(y: np.ndarray) -> float:
        return float(np.abs(y[:, others] - exact[:, others]).max() / np.abs(exact[:, others] - bias).max())

    # One scale per call leaves the other tokens (inputs 1e4 times smaller) no int8 level at all: they quantize
    # to the zero point and their products are lost, on any CPU. Per token they keep theirs (how well depends
    # on the kernel: 0.009 of the output on AVX-512 VNNI, 0.26 on AVX2, whose 16-bit pair sums saturate).
    assert error(per_call) > 0.99 and error(by_token) < 0.5


@pytest.mark.parametrize("scales", ["tensor", "token"])
def test_a_split_takes_the_rows_that_would_take_every_columns_levels(scales: str) -> None:
    """A few weight rows 1000x the rest (what smoothing moves a massive activation channel into) size every
    column's int8 scale: the other rows quantize to zero. Split, those rows run in fp32 beside the int8 rest,
    and the built graph is the simulation's arithmetic."""
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(96, 48)).astype(np.float32)
    weight[[7, 50]] *= 1000
    bias = np.zeros(48, np.float32)
    x = rng.normal(size=(1, 6, 96)).astype(np.float32)
    assert list(int8.split_rows(weight)) == [7, 50]  # 96 / 48
    fp32 = _one_matmul(weight, bias)
    exact = _run(fp32, x)
    x_rest = x.copy()
    x_rest[..., [7, 50]] = 0
    scale = float(np.abs(x_rest @ weight).max())  # the size of what the other rows contribute

    def error(y: np.ndarray) -> float:
        return float(np.abs(y - exact).max()) / scale

    code = int8.TOKEN if scales == "token" else int8.TENSOR
    # 64 levels a side: sums exact on every x86 int8 kernel (127 saturate on AVX2: 0.24 of `scale` split)
    sim = int8.simulation(copy.deepcopy(fp32), ["proj"], NARROW_LEVELS)
    session = ort.InferenceSession(sim.SerializeToString(), providers=["CPUExecutionProvider"])

    def simulated(switch: int) -> np.ndarray:
        return np.asarray(session.run(["y"], {"x": x, int8.SWITCHES: np.array([switch], np.int64)})[0])

    whole, split = simulated(code), simulated(code + int8.SPLIT)
    assert error(whole) > 0.5 and error(split) < 0.1  # the rest keeps its levels
    built = int8.split(copy.deepcopy(fp32), ["proj"], scales, NARROW_LEVELS)
    ops = {n.op_type for n in built.graph.node}
    assert {PRODUCT[scales], "Gather"} <= ops and not any(n.name == "proj" for n in built.graph.node)
    assert np.allclose(_run(built, x), split, rtol=1e-5, atol=1e-3)  # the same operators, the same kernel


def test_calibration_takes_the_shortest_samples_and_whole_queries() -> None:
    lengths = [30, 3, 10, 100, 5]
    assert mixed.calibration(lengths, [0] * 5, False, 20) == [1, 2, 4]
    assert mixed.calibration(lengths, [0] * 5, False, 1) == [1]  # at least one, whatever the budget
    # pairs: whole query groups, the cheapest first
    assert mixed.calibration(lengths, [0, 0, 1, 1, 2], True, 10) == [4]
    assert mixed.calibration(lengths, [0, 0, 1, 1, 2], True, 40) == [0, 1, 4]


@pytest.mark.parametrize("levels", [127, 64])
def test_a_loose_gate_quantizes_every_matmul(embedder: Built, tmp_path: Path, levels: int) -> None:
    out = tmp_path / "int8-mixed.onnx"
    loose = dataclasses.replace(embedder.parity, thresholds={"cosine_p1": 0.5})  # int8 noise of any ISA is inside
    plan = mixed.build(embedder.fp32, out, loose, levels)
    names = [n.name for n in smoothing.targets(onnx.load(str(embedder.fp32)))]
    assert plan["fp32"] == [] and plan["harm"] == {}  # no sensitivity pass was needed
    assert plan["matmuls"] == len(names) and plan["alpha"] in mixed.ALPHAS and plan["levels"] == levels
    stored = [
        numpy_helper.to_array(t) for t in onnx.load(str(out)).graph.initializer if t.data_type == TensorProto.INT8
    ]
    assert stored and max(int(np.abs(w).max()) for w in stored) == levels  # the weights the plan names
    assert plan["figures"]["cosine_p1"] >= 0.5 and plan["calibration"] > 0
    ops = _ops(out)
    for name in names:
        assert ops.get(f"{name}_quant") == PRODUCT[plan["scales"]] and name not in ops
    assert not (tmp_path / "int8-mixed.work").exists()  # the simulation's files are gone


# Top-1 agreement out of the way (tiny random classifiers score near-uniformly, so int8 noise may flip a label):
# a room this wide makes its share of harm nil, so max_score_diff alone orders the MatMuls, at any threshold.
NO_TOP1 = {"top1_agreement": -1e9}


def _sensitivity(classifier: Built) -> tuple[simulator.Simulator, list[str], list[int]]:
    """The classifier's simulation, its MatMuls, and their order by harm, as the stage ranks them."""
    parity = dataclasses.replace(classifier.parity, thresholds=NO_TOP1)
    model = onnx.load(str(classifier.fp32))
    names = [n.name for n in smoothing.targets(model)]
    sim = simulator.Simulator(model, names, classifier.fp32.parent, parity, [])
    lengths = [len(e.ids) for e in parity.encodings]
    ranking = mixed.calibration(lengths, [0] * len(lengths), False, max(1, mixed.RANKING_TOKENS // len(names)))
    off = np.zeros(len(names), np.int64)
    base = sim.judge(off, ranking).figures
    alone = [sim.judge(np.eye(len(names), dtype=np.int64)[i], ranking, base) for i in range(len(names))]
    return sim, names, sorted(range(len(names)), key=lambda i: (-alone[i].harm, -alone[i].error))


def test_the_most_harmful_matmuls_stay_fp32_until_the_gates_pass(
    classifier: Built, tmp_path: Path, plain: None
) -> None:
    sim, names, order = _sensitivity(classifier)
    everything = list(range(len(classifier.parity.encodings)))
    switches = np.ones(len(names), np.int64)
    figures = []  # max_score_diff with the k most harmful kept fp32, k = 0, 1, ...
    for k in range(len(names) // 2 + 1):
        figures.append(sim.judge(switches, everything).figures["max_score_diff"])
        if k < len(names) // 2:
            switches[order[k]] = 0
    # The first k >= 1 that does better than every smaller one: a threshold there needs exactly k kept fp32.
    keep = next(k for k in range(1, len(figures)) if figures[k] < min(figures[:k]))
    parity = dataclasses.replace(classifier.parity, thresholds=NO_TOP1 | {"max_score_diff": figures[keep]})
    out = tmp_path / "int8-mixed.onnx"
    plan = mixed.build(classifier.fp32, out, parity)
    expected = [names[i] for i in order[:keep]]
    assert plan["fp32"] == expected
    assert list(plan["harm"]) == [names[i] for i in order]  # the report ranks all of them, most harmful first
    assert plan["figures"]["max_score_diff"] <= figures[keep] + 1e-5  # the plan records 5 decimals
    ops = _ops(out)
    for name in names:
        if name in expected:  # kept: the exported float MatMul, untouched
            assert ops.get(name) == "MatMul" and f"{name}_quant" not in ops
        else:
            assert ops.get(f"{name}_quant") == PRODUCT[plan["scales"]] and name not in ops


def test_a_split_replaces_fp32_where_it_passes(
    classifier: Built, tmp_path: Path, plain: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One MatMul's input channels divided by 1000 and its weight rows multiplied by as much on two of them (what
    smoothing does to a massive activation channel; the function stays the same): int8 loses that weight's other
    rows, so the stage keeps it fp32, then finds that split (those rows fp32) passes too and ships that."""
    monkeypatch.setattr(mixed, "SPLIT_MORE", 3)
    model = onnx.load(str(classifier.fp32))
    names = [n.name for n in smoothing.targets(model)]
    target = names[len(names) // 2]
    node = next(n for n in model.graph.node if n.name == target)
    inits = {t.name: t for t in model.graph.initializer}
    weight = numpy_helper.to_array(inits[node.input[1]]).copy()
    rows = int8.split_rows(weight)
    weight[rows] *= 1000
    inits[node.input[1]].CopyFrom(numpy_helper.from_array(weight, node.input[1]))
    inverse = np.ones(weight.shape[0], np.float32)
    inverse[rows] = 1e-3
    model.graph.initializer.append(numpy_helper.from_array(inverse, "inverse"))
    scale = helper.make_node("Mul", [node.input[0], "inverse"], ["scaled"])
    node.input[0] = "scaled"
    model.graph.node.insert(list(model.graph.node).index(node), scale)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(model, str(fp32))
    parity = dataclasses.replace(classifier.parity, thresholds=NO_TOP1)
    # 64 levels a side, exact on every x86 int8 kernel: with 127, AVX2's saturated sums alone fail this gate.
    sim = simulator.Simulator(copy.deepcopy(model), names, tmp_path, parity, [], NARROW_LEVELS)
    everything = list(range(len(parity.encodings)))

    def score_diff(switch: int) -> float:  # every other MatMul int8, this one as `switch` says
        switches = np.full(len(names), int8.TENSOR)
        switches[names.index(target)] = switch
        return sim.judge(switches, everything).figures["max_score_diff"]

    whole, kept_fp32, split = score_diff(int8.TENSOR), score_diff(0), score_diff(int8.TENSOR + int8.SPLIT)
    threshold = 1.5 * max(kept_fp32, split)
    assert whole > 2 * threshold  # int8 of that MatMul fails the gate, by far
    gate = dataclasses.replace(parity, thresholds=NO_TOP1 | {"max_score_diff": threshold})
    plan = mixed.build(fp32, tmp_path / "int8-mixed.onnx", gate, NARROW_LEVELS)
    assert plan["fp32"] == [] and plan["split"] == [target]
    ops = _ops(tmp_path / "int8-mixed.onnx")
    assert ops.get(f"{target}_quant") == PRODUCT[plan["scales"]] and target not in ops
    assert [op for name, op in ops.items() if name.startswith(f"{target}_quant")].count("Gather") == 1


def test_a_gate_no_int8_matmul_can_meet_refuses_the_variant_with_figures(classifier: Built, plain: None) -> None:
    sim, names, _ = _sensitivity(classifier)
    everything = list(range(len(classifier.parity.encodings)))
    fp32 = sim.judge(np.zeros(len(names), np.int64), everything).figures["max_score_diff"]
    one = [sim.judge(np.eye(len(names), dtype=np.int64)[i], everything) for i in range(len(names))]
    best_int8 = min(j.figures["max_score_diff"] for j in one)
    assert fp32 * 100 < best_int8  # any int8 MatMul moves the scores far more than fp32's rounding does
    impossible = NO_TOP1 | {"max_score_diff": fp32 + (best_int8 - fp32) / 10}
    never = classifier.fp32.parent / "never.onnx"
    with pytest.raises(mixed.Refused) as refused:
        mixed.build(classifier.fp32, never, dataclasses.replace(classifier.parity, thresholds=impossible))
    message = str(refused.value)
    cap = int(len(names) * mixed.MAX_FP32)
    assert f"with {cap} of {len(names)} MatMuls in fp32" in message  # it kept up to the cap, then gave up
    assert "max_score_diff=" in message  # with the figures
    assert not never.exists()


def test_the_pipeline_records_the_choice_and_reports_a_refusal(
    tiny_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(out: Path) -> Manifest:
        options = pipeline.OptimizeOptions(
            model_dir=tiny_model("feature-extraction"),
            task=get_task("feature-extraction"),
            out=out,
            only=["fp32", "int8", "int8-mixed"],
            tune_lengths=[8],
            tune_batches=[1],
            tune_seconds=0.01,
            thresholds={"cosine_p1": 0.5},  # loose: no MatMul stays fp32, on any ISA
        )
        return pipeline.optimize(options)

    built = build(tmp_path / "bundle")
    report = next(v for v in built.variants if v["name"] == "int8-mixed")
    assert report["build"]["fp32"] == [] and report["build"]["matmuls"] > 0 and report["error"] is None
    # The weights this CPU adds exactly (narrow where its int8 kernel saturates), per variant and, for the
    # server, the shipped one's (fp32 and blockwise int8 are not narrowed: 127).
    levels = weight_levels(describe()["int8_path"])
    assert report["build"]["levels"] == levels
    assert next(v for v in built.variants if v["name"] == "int8")["build"] == {"levels": levels}
    shipped = next(v for v in built.variants if v["chosen"])
    assert built.int8_levels == (levels if shipped["name"] != "fp32" else 127)
    assert set(report["gates"]) == {"cosine_p1"}  # validated like every variant

    def refuse(*_args: object) -> dict[str, object]:
        raise mixed.Refused("with 6 of 12 MatMuls in fp32, cosine_p1=0.5")

    original = variants.variants_for
    monkeypatch.setattr(
        variants,
        "variants_for",
        lambda *args, **kwargs: [
            dataclasses.replace(v, calibrate=refuse) if v.name == "int8-mixed" else v for v in original(*args, **kwargs)
        ],
    )
    # The others go on, and the faster of them ships: int8, on a counted clock (tests/clocked.py) where it is
    # twice as fast, although a tie would go to fp32 (the more accurate).
    clocked(monkeypatch, lambda _model, path, tokens: (50 if path.stem == "int8" else 100) * tokens // 8)
    manifest = build(tmp_path / "refused")
    report = next(v for v in manifest.variants if v["name"] == "int8-mixed")
    assert report["error"] == "refused: with 6 of 12 MatMuls in fp32, cosine_p1=0.5" and not report["passed"]
    assert {v["name"] for v in manifest.variants if v["passed"]} == {"fp32", "int8"}
    assert (manifest.variant, manifest.pick["fastest"], manifest.pick["tie"]) == ("int8", "int8", False)


def test_a_graph_too_big_for_the_memory_is_refused_before_anything_runs(
    embedder: Built, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mixed, "available_bytes", lambda: 1000)
    with pytest.raises(mixed.Refused, match=r"the simulation would need about .* GiB available"):
        mixed.build(embedder.fp32, tmp_path / "int8-mixed.onnx", embedder.parity)
    assert not list(tmp_path.iterdir())


def test_a_simulation_past_protobufs_limit_replaces_its_weights_file_instead_of_growing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph past 2 GiB goes to the ONNX Runtime session through a file, one simulation per smoothing alpha;
    onnx appends external data to an existing file, which filled a 0.6B model's build disk with copies."""
    weight = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 32])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setattr(graphs, "too_big", lambda _: True)
    data = tmp_path / "hare-int8-simulation.onnx.data"
    sizes = []
    for _ in range(3):
        session = simulator.cpu_session(copy.deepcopy(model), tmp_path)  # as each alpha builds its own graph
        sizes.append(data.stat().st_size)
        x = np.ones((2, 64), np.float32)
        assert np.allclose(session.run(None, {"x": x})[0], x @ weight, atol=1e-4)
    assert sizes[0] >= weight.nbytes and sizes == [sizes[0]] * 3


def test_lookup_tables_store_int8_rows_and_a_tied_head_stays_fp32() -> None:
    rng = np.random.default_rng(0)
    words = rng.normal(size=(300, 1024)).astype(np.float32)  # 1.2 MB, past TABLE_BYTES
    words[7] = 0  # a row of zeros (a padding id's) stays zeros
    tied = rng.normal(size=(300, 1024)).astype(np.float32)  # also the weight of an output head
    small = rng.normal(size=(4, 8)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["words", "ids"], ["y"], name="embed"),
            helper.make_node("Gather", ["tied", "ids"], ["t"]),
            helper.make_node("MatMul", ["t", "tied_t"], ["logits"]),
            helper.make_node("Gather", ["small", "few"], ["s"]),
        ],
        "tables",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None]),
            helper.make_tensor_value_info("few", TensorProto.INT64, [None]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "logits", "s")],
        [
            numpy_helper.from_array(words, "words"),
            numpy_helper.from_array(tied, "tied"),
            numpy_helper.from_array(small, "small"),
        ],
    )
    # The head reads `tied` through a Transpose: a table any other node reads is not one to store as rows.
    graph.node.insert(2, helper.make_node("Transpose", ["tied"], ["tied_t"]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert int8.tables(model) == ["words"]
    overridable = copy.deepcopy(model)  # an initializer listed as an input too (older exports): a caller may feed it
    overridable.graph.input.append(helper.make_tensor_value_info("words", TensorProto.FLOAT, list(words.shape)))
    assert int8.tables(overridable) == []
    stored = int8.int8_tables(copy.deepcopy(model), ["words"])
    assert stored.ByteSize() < model.ByteSize() - 0.7 * words.nbytes  # a quarter of the table's bytes
    ids = np.array([[0, 7, 299, 0]], np.int64)
    feeds = {"ids": ids, "few": np.array([1, 3], np.int64)}

    def run(m: onnx.ModelProto) -> list[np.ndarray]:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)

    (y, logits, s), (y8, logits8, s8) = run(model), run(stored)
    step = np.abs(words[ids[0]]).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(y8[0] - y[0]) <= step / 2 + 1e-6)  # each row within half its own int8 step
    assert not y8[0, 1].any() and np.array_equal(logits8, logits) and np.array_equal(s8, s)


def test_blockwise_int8_stores_its_lookup_tables_as_int8_rows(tmp_path: Path) -> None:
    """int8-block32/128 store the word embedding as int8 rows too (all-MiniLM-L6-v2: 47 of its 56 MB)."""
    rng = np.random.default_rng(1)
    words = rng.normal(size=(300, 1024)).astype(np.float32)  # 1.2 MB, past TABLE_BYTES
    weight = rng.normal(size=(1024, 64)).astype(np.float32) / 32
    graph = helper.make_graph(
        [helper.make_node("Gather", ["words", "ids"], ["y"]), helper.make_node("MatMul", ["y", "w"], ["z"])],
        "embed-and-project",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(words, "words"), numpy_helper.from_array(weight, "w")],
    )
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(fp32))
    block = quantize.quantize_blockwise(fp32, tmp_path / "block32.onnx")
    built = onnx.load(str(block))
    assert {n.op_type for n in built.graph.node} >= {"MatMulNBits", "Gather", "Mul"}
    assert "words" not in {t.name for t in built.graph.initializer} and block.stat().st_size < 0.3 * fp32.stat().st_size
    ids = {"ids": np.array([[0, 5, 299]], np.int64)}

    def run(path: Path) -> np.ndarray:
        return np.asarray(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, ids)[0])

    expected, got = run(fp32), run(block)
    assert np.abs(got - expected).max() <= 0.02 * np.abs(expected).max()


def _inflated_table(classifier: Built, folder: Path) -> Path:
    """The classifier with one column of its word embedding 1000x and a Mul by 1/1000 after the lookup: the same
    function in fp32 (its reference stays), but each int8 row's scale is then set by that column, which leaves
    the row's other values a level or two."""
    model = onnx.load(str(classifier.fp32))
    name = max(int8.tables(model), key=lambda t: next(i.dims[0] for i in model.graph.initializer if i.name == t))
    inits = {t.name: t for t in model.graph.initializer}
    table = numpy_helper.to_array(inits[name]).copy()
    table[:, 0] *= 1000
    inits[name].CopyFrom(numpy_helper.from_array(table, name))
    inverse = np.ones(table.shape[1], np.float32)
    inverse[0] = 1e-3
    model.graph.initializer.append(numpy_helper.from_array(inverse, "inverse"))
    lookup = next(n for n in model.graph.node if n.op_type == "Gather" and n.input[0] == name)
    scaled = lookup.output[0]
    lookup.output[0] = f"{scaled}_inflated"
    model.graph.node.insert(
        list(model.graph.node).index(lookup) + 1, helper.make_node("Mul", [f"{scaled}_inflated", "inverse"], [scaled])
    )
    fp32 = folder / "fp32.onnx"
    onnx.save(model, str(fp32))
    return fp32


@pytest.mark.parametrize("inflated", [False, True])
def test_lookup_tables_go_int8_only_where_the_chosen_graph_still_passes(
    classifier: Built, tmp_path: Path, plain: None, monkeypatch: pytest.MonkeyPatch, inflated: bool
) -> None:
    monkeypatch.setattr(int8, "TABLE_BYTES", 0)  # the tiny model's tables are far under the real threshold
    fp32 = _inflated_table(classifier, tmp_path) if inflated else classifier.fp32
    model = onnx.load(str(fp32))
    names, found = [n.name for n in smoothing.targets(model)], int8.tables(model)
    parity = dataclasses.replace(classifier.parity, thresholds=NO_TOP1)
    everything = list(range(len(parity.encodings)))
    every_int8 = np.full(len(names), int8.TENSOR)
    # Weights of 64 levels, exact on every int8 kernel: with 127 a CPU without VNNI saturates, and that error
    # (max score difference 0.67 on the AVX2 kernels) swamps what the tables do.
    levels = NARROW_LEVELS
    plain_sim = simulator.Simulator(copy.deepcopy(model), names, tmp_path, parity, [], levels)
    plain_figure = plain_sim.judge(every_int8, everything)
    tabled = simulator.Simulator(int8.int8_tables(copy.deepcopy(model), found), names, tmp_path, parity, [], levels)
    tabled_figure = tabled.judge(every_int8, everything)
    a, b = plain_figure.figures["max_score_diff"], tabled_figure.figures["max_score_diff"]
    threshold = 1.5 * (a if inflated else max(a, b))  # every MatMul int8 passes; with the tables too unless inflated
    if inflated:
        assert b > 2 * threshold  # the inflated tables alone break the gate, by far
    gate = dataclasses.replace(parity, thresholds=NO_TOP1 | {"max_score_diff": threshold})
    out = tmp_path / "int8-mixed.onnx"
    plan = mixed.build(fp32, out, gate, levels)
    assert plan["fp32"] == [] and plan["split"] == []  # the MatMuls' choice is the same either way
    built = onnx.load(str(out))
    stored = {t.name for t in built.graph.initializer}
    if inflated:
        assert plan["tables"] == [] and set(found) <= stored  # left fp32, as they were
    else:
        assert plan["tables"] == found and {f"{t}_int8" for t in found} <= stored and not set(found) & stored
