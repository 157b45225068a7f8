"""The variants OpenVINO's CPU plugin runs (container/openvino_runtime.py): bf16, the export run in bf16, offered
where the plugin computes bf16; int8-grouped, int8 weights with activations quantized at run time, offered
wherever OpenVINO is installed; int8-static, only when named. Each is gated and raced like the others, and
served, tuned and checked like any bundle. On a CPU without bf16 units OpenVINO computes bf16 in fp32: the
tests force that offer, which checks the plumbing everywhere and the bf16 arithmetic where the CPU has it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from tokenizers import Tokenizer

from api.engine.backend import Backend
from container.bundle import MODEL_FILE, read_manifest
from container.models import open_model, open_models
from container.openvino_runtime import LENGTH_MULTIPLE, PROVIDER, STORED_BF16, OpenVinoModel, bf16_capable
from container.optimize import pipeline
from container.optimize.bf16 import bf16_bits, weights_to_bf16
from container.optimize.variants import variants_for
from tasks.errors import InputError
from tasks.ops import pad_batch
from tests.api_helpers import serve
from tests.conftest import ModelFactory, TorchWork, quick_bundle

pytest.importorskip("openvino")

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def assert_close_to_fp32(served: list[object], reference: list[object]) -> None:
    """Each served vector within cosine 0.99 of the fp32 bundle's."""
    for got, want in zip(served, reference, strict=True):
        a, b = np.asarray(got, np.float64).ravel(), np.asarray(want, np.float64).ravel()
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) > 0.99


TEXTS = ["a short one", "the weather in Paris is cold today and the river is high", "x", "numbers 12 34 56"]


@pytest.fixture(scope="module")
def bf16_bundle(tiny_model: ModelFactory, torch_work: TorchWork, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny embedding model built with the bf16 variant alone, the offer forced (see the module docstring)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline, "bf16_capable", lambda: True)
        out = tmp_path_factory.mktemp("bf16") / "bundle"
        return quick_bundle(tiny_model("feature-extraction"), "feature-extraction", out, ["bf16"], torch_work)


def test_opening_openvino_sends_no_telemetry(tmp_path: Path) -> None:
    """`import openvino` alone sends a Google Analytics event and leaves a client id under $HOME/intel; a worker
    that opens a bundle on OpenVINO (here, the plugin's own question) leaves nothing there."""
    probe = "from container.openvino_runtime import bf16_capable; bf16_capable()"
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", probe], check=True, env=env, cwd=Path(__file__).parent.parent)
    assert not (tmp_path / "intel").exists()


def test_the_bf16_variant_is_offered_only_where_openvino_computes_it() -> None:
    assert "bf16" not in [v.name for v in variants_for("cpu")]
    assert "bf16" in [v.name for v in variants_for("cpu", bf16=True)]
    assert "bf16" not in [v.name for v in variants_for("gpu", bf16=True)]


def test_asking_for_bf16_where_it_cannot_run_is_refused(
    tiny_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "bf16_capable", lambda: False)
    with pytest.raises(InputError, match="AMX or AVX512_BF16"):
        quick_bundle(tiny_model("feature-extraction"), "feature-extraction", tmp_path / "b", ["bf16"])
    assert not (tmp_path / "b").exists()


def test_a_bf16_bundle_passes_its_gates_and_ships_the_export_with_its_matmul_weights_in_bf16(
    bf16_bundle: Path,
) -> None:
    manifest = read_manifest(bf16_bundle)
    assert (manifest.variant, manifest.precision) == ("bf16", "bf16")
    (report,) = [v for v in manifest.variants if v["name"] == "bf16"]
    assert report["passed"] and report["gates"]
    assert report["timings_ms"]
    # One stream of one thread runs on the calling thread: timed by its CPU time, as ORT's variants are.
    assert manifest.pick["statistic"].endswith("thread CPU time")
    graph = onnx.load(str(bf16_bundle / MODEL_FILE)).graph
    kinds = {i.name: i.data_type for i in graph.initializer}
    weights = [kinds.get(n.input[1] + STORED_BF16) for n in graph.node if n.op_type == "MatMul" and n.input[1] not in
               {m.output[0] for m in graph.node if m.op_type != "Cast"}]  # fmt: skip
    assert weights and set(weights) == {onnx.TensorProto.BFLOAT16}
    tables = [kinds[n.input[0]] for n in graph.node if n.op_type == "Gather" and n.input[0] in kinds]
    assert tables and set(tables) == {onnx.TensorProto.FLOAT}  # read as they are: no copy to spare


def _dense_graph(folder: Path) -> tuple[Path, Path]:
    """A graph of two 1024 x 2048 MatMuls after a lookup table (16 MB of fp32 weights, enough to see a copy of
    them in a process's memory), and the same with its weights in bf16, as the bf16 variant's build writes it."""
    rng = np.random.default_rng(0)
    weights = {"table": rng.standard_normal((1000, 1024)), "w1": rng.standard_normal((1024, 2048)) / 32,
               "w2": rng.standard_normal((2048, 1024)) / 45}  # fmt: skip
    nodes = [
        onnx.helper.make_node("Gather", ["table", "input_ids"], ["x"]),
        onnx.helper.make_node("MatMul", ["x", "w1"], ["h"]),
        onnx.helper.make_node("Relu", ["h"], ["r"]),
        onnx.helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "dense",
        [onnx.helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "tokens"])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "tokens", 1024])],
        [onnx.numpy_helper.from_array(w.astype(np.float32), name) for name, w in weights.items()],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    in_bf16 = onnx.ModelProto()
    in_bf16.CopyFrom(model)
    assert weights_to_bf16(in_bf16.graph) == 2
    paths = folder / "fp32.onnx", folder / "bf16.onnx"
    for path, saved in zip(paths, (model, in_bf16), strict=True):
        onnx.save(saved, str(path), save_as_external_data=True, location=f"{path.name}.data")
    return paths


@pytest.mark.skipif(not bf16_capable(), reason="OpenVINO computes bf16 on this CPU in fp32")
def test_a_compiled_copy_of_bf16_weights_holds_them_once_and_answers_as_the_fp32_graph(tmp_path: Path) -> None:
    """The plugin rounds fp32 weights to bf16 in each compiled copy and repacks them again for its kernels: the
    bf16 variant stores them rounded, which the runtime hands over as they are, so each copy (a worker keeps
    two) holds one repacked copy fewer, with the same answers to the bit. Measured in a fresh process each:
    two compiled copies, run once each."""
    script = """
import ctypes, sys, threading
from pathlib import Path
import numpy as np
from container.openvino_runtime import OpenVinoModel

def anon() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(Path("/proc/self/status").read_text().split("RssAnon:")[1].split()[0]) / 1024

feeds = {"input_ids": np.random.default_rng(1).integers(0, 1000, (2, 16))}
OpenVinoModel(Path(sys.argv[1]), threads=1).run(feeds)  # the plugin's own first load, not counted
before = anon()
model = OpenVinoModel(Path(sys.argv[1]), threads=1, callers=2)
answers = []
calls = [threading.Thread(target=lambda: answers.append(model.run(feeds))) for _ in range(2)]
for call in calls:
    call.start()
for call in calls:
    call.join()
np.save(sys.argv[2], answers[0])
print(anon() - before)
"""
    grown = {}
    for path in _dense_graph(tmp_path):
        done = subprocess.run(
            [sys.executable, "-c", script, str(path), str(path.with_suffix(".npy"))],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        grown[path.stem] = float(done.stdout.split()[-1])
    # 8 MB of bf16 weights a copy: 35.2-35.4 against 18.7-19.4 MB on AMX (unmarked, bf16 cost 67: more than fp32).
    assert grown["fp32"] - grown["bf16"] > 0.75 * 2 * 8, grown
    np.testing.assert_array_equal(np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "bf16.npy"))


def test_only_weights_that_only_matmuls_read_are_stored_in_bf16() -> None:
    """A weight something else reads too stays fp32: the plugin may run that reader in fp32 (four of a tiny
    DeBERTa-v2 ranker's weights, read through an Identity too, moved its scores when rounded)."""
    w = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    shared = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "shared")
    nodes = [
        onnx.helper.make_node("MatMul", ["x", "w"], ["a"]),
        onnx.helper.make_node("MatMul", ["a", "shared"], ["b"]),
        onnx.helper.make_node("Identity", ["shared"], ["c"]),
        onnx.helper.make_node("Add", ["b", "c"], ["y"]),
    ]
    vector = [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4, 4]) for n in ("x", "y")]
    graph = onnx.helper.make_graph(nodes, "g", vector[:1], vector[1:], [w, shared])
    assert weights_to_bf16(graph) == 1
    kinds = {i.name: i.data_type for i in graph.initializer}
    assert kinds == {"w" + STORED_BF16: onnx.TensorProto.BFLOAT16, "shared": onnx.TensorProto.FLOAT}
    assert graph.node[0].op_type == "Cast" and graph.node[0].output == ["w"]  # every reader still finds "w"


def test_bf16_weights_round_to_nearest_even() -> None:
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -3.0e-5, 65504.0], np.float32)
    got = (bf16_bits(values).astype(np.uint32) << 16).view(np.float32)
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1; 1 + 3 * 2^-8 to 1 + 2^-6 (even).
    np.testing.assert_array_equal(got[:4], [1.0, 1.0, 1 + 2**-6, 1 + 2**-7])
    assert abs(got[4] / values[4] - 1) < 2**-8 and got[5] == 65536.0


def test_calls_from_many_threads_each_get_their_own_answer(bf16_bundle: Path) -> None:
    """A one-thread model called by several model threads at once (a stream and an infer request each, or
    taking turns past its streams) answers each as it answers alone."""
    tok = Tokenizer.from_file(str(bf16_bundle / "tokenizer.json"))
    model = open_model(bf16_bundle / MODEL_FILE, "bf16", threads=1, callers=3)
    feeds = [pad_batch([tok.encode(t)], model.input_names) for t in TEXTS * 3]
    alone = [model.run(f) for f in feeds]
    together: dict[int, np.ndarray] = {}

    def call(i: int) -> None:
        for _ in range(5):
            together[i] = model.run(feeds[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(feeds))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, expected in enumerate(alone):
        np.testing.assert_allclose(together[i], expected, rtol=0, atol=1e-6)


async def test_a_bf16_bundle_serves_close_to_fp32(bf16_bundle: Path, fp32_bundle: ModelFactory) -> None:
    async with serve(fp32_bundle("feature-extraction")) as client:
        reference = [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]
    async with serve(bf16_bundle, HARE_STREAMS="2") as client:
        info = (await client.get("/info")).json()
        assert info["providers"] == [PROVIDER] and info["variant"] == "bf16"
        alone = [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]
        at_once = await asyncio.gather(*(client.post("/predict", json={"inputs": t}) for t in TEXTS * 4))
    assert_close_to_fp32(alone, reference)
    for i, response in enumerate(at_once):
        # Batched with others, padded otherwise: bf16 products summed in another order (AMX tiles), not 1e-5.
        np.testing.assert_allclose(response.json(), alone[i % len(TEXTS)], atol=1e-4)


async def test_served_calls_are_padded_to_the_runtimes_multiple_and_answer_as_unpadded_ones(
    bf16_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OpenVINO compiles kernels for each input shape and keeps them: a served call is padded to a multiple of
    LENGTH_MULTIPLE tokens, so that a mix of lengths makes a few shapes, not one per length."""
    lengths: list[int] = []
    run = OpenVinoModel.run

    def recorded(self: OpenVinoModel, feeds: dict[str, np.ndarray], shrink: bool = False) -> np.ndarray:
        lengths.append(feeds["input_ids"].shape[1])
        return run(self, feeds, shrink)

    async def answers() -> list[object]:
        lengths.clear()
        async with serve(bf16_bundle) as client:
            return [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]

    monkeypatch.setattr(OpenVinoModel, "run", recorded)
    longest = read_manifest(bf16_bundle).max_length
    padded = await answers()
    assert lengths and all(n % LENGTH_MULTIPLE == 0 or n == longest for n in lengths), lengths
    monkeypatch.setattr(OpenVinoModel, "length_multiple", 1)
    unpadded = await answers()
    assert any(n % LENGTH_MULTIPLE for n in lengths), lengths  # the texts' own lengths are not all multiples
    # The padding is masked: the same answers, bf16 products summed in another order.
    np.testing.assert_allclose(np.array(padded), np.array(unpadded), atol=1e-4)


def test_tune_check_replays_a_bf16_bundle(bf16_bundle: Path) -> None:
    from container.optimize.tune import check

    assert check(bf16_bundle, read_manifest(bf16_bundle)) == 0


def test_a_bf16_bundle_without_openvino_says_what_to_install(
    bf16_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
    with pytest.raises(InputError, match=r"hare\[openvino\]"):
        open_model(bf16_bundle / MODEL_FILE, "bf16")


async def test_the_bulk_job_runs_a_bf16_bundle_as_the_server_answers(bf16_bundle: Path, tmp_path: Path) -> None:
    """`hare run`'s model threads share the one-thread model (a stream each): every row as /predict gives it."""
    import dataclasses

    import orjson
    import pyarrow.parquet as pq

    from api.bulk.job import BulkOptions, run_job
    from api.config import Settings

    rows = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(200)]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(orjson.dumps({"id": i, "text": t}) + b"\n" for i, t in enumerate(rows)))
    settings = dataclasses.replace(Settings.from_env({}), bundle=bf16_bundle, cores=2)
    run_job(settings, BulkOptions(source, tmp_path / "out.parquet", chunk_rows=64))
    got = np.stack(pq.read_table(tmp_path / "out.parquet").column("embeddings").to_numpy(zero_copy_only=False))
    async with serve(bf16_bundle) as client:
        served = (await client.post("/predict", json={"inputs": rows})).json()
    np.testing.assert_allclose(got, np.asarray(served, np.float32), atol=1e-4)


def test_a_graph_openvino_cannot_take_fails_the_bf16_variant_only(
    tiny_model: ModelFactory, torch_work: TorchWork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from container import openvino_runtime

    def refuses(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("Exception from src/frontends/onnx: OpenVINO does not support this operation")

    monkeypatch.setattr(pipeline, "bf16_capable", lambda: True)
    monkeypatch.setattr(openvino_runtime, "OpenVinoModel", refuses)
    out = quick_bundle(
        tiny_model("feature-extraction"), "feature-extraction", tmp_path / "b", ["fp32", "bf16"], torch_work
    )
    manifest = read_manifest(out)
    assert manifest.variant == "fp32"
    (report,) = [v for v in manifest.variants if v["name"] == "bf16"]
    assert not report["passed"] and "does not support this operation" in report["error"]


async def test_static_int8_is_built_only_when_named_and_served_by_openvino(
    tiny_model: ModelFactory, torch_work: TorchWork, fp32_bundle: ModelFactory, tmp_path: Path
) -> None:
    """int8-static: smoothed, its activation scales fixed on the calibration samples, as many MatMuls kept
    fp32 as the gates need (container/optimize/static_int8.py); left out of a default build."""

    from container.optimize.variants import plan

    assert "int8-static" not in [v.name for v in variants_for("cpu")]
    assert "int8-static" not in [v.name for v in plan(variants_for("cpu", openvino=True)).chosen]
    model = tiny_model("feature-extraction")
    out = quick_bundle(model, "feature-extraction", tmp_path / "b", ["int8-static"], torch_work)
    manifest = read_manifest(out)
    assert (manifest.variant, manifest.precision) == ("int8-static", "int8")
    chose = manifest.variants[0]["build"]
    assert chose["alpha"] in (0.5, 0.7, 0.85) and len(chose["fp32"]) < chose["matmuls"]
    ops = [n.op_type for n in onnx.load(str(out / MODEL_FILE), load_external_data=False).graph.node]
    assert ops.count("QuantizeLinear") >= chose["matmuls"] - len(chose["fp32"])  # each int8 MatMul's input
    async with serve(fp32_bundle("feature-extraction")) as client:
        reference = [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]
    async with serve(out) as client:
        assert (await client.get("/info")).json()["providers"] == [PROVIDER]
        served = [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]
    assert_close_to_fp32(served, reference)


@pytest.mark.parametrize(
    ("variant", "refusal"),
    [
        ("int8-static", r"int8-static: refused: no static int8 graph.*closest"),
        ("int8-grouped", r"int8-grouped: refused: no activation group.*closest groups of \d+.*: cosine_p1="),
    ],
)
def test_a_calibrated_openvino_variant_that_cannot_meet_the_gates_is_refused_with_its_closest_figures(
    tiny_model: ModelFactory, torch_work: TorchWork, tmp_path: Path, variant: str, refusal: str
) -> None:
    from container.optimize.errors import ValidationFailed
    from container.optimize.pipeline import OptimizeOptions, optimize
    from tasks.registry import get_task

    options = OptimizeOptions(
        model_dir=tiny_model("feature-extraction"),
        task=get_task("feature-extraction"),
        out=tmp_path / "b",
        only=["fp32", variant],
        tune_lengths=[8],
        tune_batches=[1],
        tune_seconds=0.01,
        tune_streams=1,
        thresholds={"cosine_p1": 1.0},  # nothing is exact, fp32 neither: the build names each refusal
    )
    with (
        torch_work.reused(),
        pytest.raises(ValidationFailed, match=refusal),
    ):
        optimize(options)
    assert not (tmp_path / "b").exists()


def test_int8_grouped_joins_the_default_race_where_openvino_is_installed_and_the_cpu_has_vnni() -> None:
    from container.optimize.variants import plan

    assert "int8-grouped" in [v.name for v in plan(variants_for("cpu", openvino=True)).chosen]
    assert "int8-grouped" not in [v.name for v in variants_for("cpu")]
    # Without int8 dot-product units (AVX2's kernels) it runs slower than fp32: there, only when named.
    without = variants_for("cpu", openvino=True, int8_units=False)
    assert "int8-grouped" not in [v.name for v in plan(without).chosen]
    assert "int8-grouped" in [v.name for v in plan(without, ["int8-grouped"]).chosen]
    assert "int8-grouped" not in [v.name for v in variants_for("gpu", openvino=True)]


def test_int8_grouped_weights_give_back_each_weight_within_half_a_step(tmp_path: Path) -> None:
    """Every MatMul weight becomes uint8 behind a DequantizeLinear under the weight's own name (a scale and a
    zero point per output channel); other initializers stay as they were; the graph still runs, close to fp32."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from container.optimize.grouped_int8 import weights_to_int8

    rng = np.random.default_rng(0)
    weight = rng.normal(size=(64, 24)).astype(np.float32)
    weight[:, 3] *= 50  # one channel far wider than the rest: its own scale keeps the others fine
    bias = rng.normal(size=24).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y0"]), helper.make_node("Add", ["y0", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 24])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert weights_to_int8(model.graph) == 1
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert "w" not in inits and inits["w_uint8"].dtype == np.uint8 and inits["w_scale"].shape == (24,)
    np.testing.assert_array_equal(inits["b"], bias)
    restored = (inits["w_uint8"].astype(np.float32) - inits["w_zero"]) * inits["w_scale"]
    assert np.all(np.abs(restored - weight) <= inits["w_scale"] / 2 + 1e-6)
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp_path / "m.onnx"))
    x = rng.normal(size=(5, 64)).astype(np.float32)
    plain = ort.SessionOptions()  # the graph as written: ORT would fuse the pair into its own int8 kernel
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), plain, providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ restored + bias, rtol=1e-4, atol=1e-4)


async def test_an_int8_grouped_bundle_passes_its_gates_and_serves_close_to_fp32(
    tiny_model: ModelFactory, torch_work: TorchWork, fp32_bundle: ModelFactory, tmp_path: Path
) -> None:
    """The widest activation group that passes with room to spare, named in the graph for the runtime."""

    from container.optimize.grouped_int8 import GROUP_KEY, GROUPS

    out = quick_bundle(
        tiny_model("feature-extraction"), "feature-extraction", tmp_path / "b", ["int8-grouped"], torch_work
    )
    manifest = read_manifest(out)
    assert (manifest.variant, manifest.precision) == ("int8-grouped", "int8")
    assert manifest.variants[0]["passed"] and manifest.pick["statistic"].endswith("thread CPU time")
    chose = manifest.variants[0]["build"]
    assert chose["group"] in GROUPS and chose["passes"] > GROUPS.index(chose["group"])  # wider ones tried first
    model = onnx.load(str(out / MODEL_FILE), load_external_data=False)
    assert {p.key: p.value for p in model.metadata_props}[GROUP_KEY] == str(chose["group"])
    graph = model.graph
    weights = {n.input[1] for n in graph.node if n.op_type == "MatMul"} & {
        o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output
    }
    assert weights, "no MatMul reads an int8 weight"
    async with serve(fp32_bundle("feature-extraction")) as client:
        reference = [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]
    async with serve(out, HARE_STREAMS="2") as client:
        assert (await client.get("/info")).json()["providers"] == [PROVIDER]
        served = [(await client.post("/predict", json={"inputs": t})).json() for t in TEXTS]
        at_once = await asyncio.gather(*(client.post("/predict", json={"inputs": t}) for t in TEXTS * 3))
    assert_close_to_fp32(served, reference)
    for i, response in enumerate(at_once):
        # Activations are quantized per token, so a text's answer does not depend on the batch it rode in.
        np.testing.assert_allclose(response.json(), served[i % len(TEXTS)], atol=1e-4)


def test_int8_grouped_stores_the_word_embedding_as_int8_rows_where_that_passes(
    tiny_model: ModelFactory, torch_work: TorchWork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As int8-mixed does: a quarter of the bytes in the file and in each copy OpenVINO compiles."""

    from container.optimize import int8

    monkeypatch.setattr(int8, "TABLE_BYTES", 0)  # the tiny model's tables are far under the real threshold
    out = quick_bundle(
        tiny_model("feature-extraction"), "feature-extraction", tmp_path / "b", ["int8-grouped"], torch_work
    )
    (report,) = read_manifest(out).variants
    assert report["passed"] and report["build"]["tables"]
    names = {i.name for i in onnx.load(str(out / MODEL_FILE), load_external_data=False).graph.initializer}
    assert {f"{t}_rowscale" for t in report["build"]["tables"]} <= names
    assert not set(report["build"]["tables"]) & names  # the fp32 tables are gone


def test_a_workers_models_of_one_graph_map_its_weights_once(bf16_bundle: Path, tmp_path: Path) -> None:
    """A worker's one-thread and two-thread models (api/engine/backend.py) read the graph once: each read maps
    the weights file, and the mapping lives as long as the models compiled from it (the default MiniLM's 86 MB
    held twice in a worker's RSS before). They answer as models opened alone do."""

    onnx.save(onnx.load(bf16_bundle / MODEL_FILE), tmp_path / MODEL_FILE, save_as_external_data=True,
              location="weights.data", size_threshold=0)  # fmt: skip
    weights = str(tmp_path / "weights.data")

    def mappings() -> int:
        return sum(line.endswith(weights) for line in Path("/proc/self/maps").read_text().splitlines())

    shared = open_models(tmp_path / MODEL_FILE, "bf16", "cpu", {1: 1, 2: 1})
    once = mappings()
    alone = {threads: open_model(tmp_path / MODEL_FILE, "bf16", threads=threads) for threads in (1, 2)}
    assert once >= 1 and mappings() - once == 2 * once
    tok = Tokenizer.from_file(str(bf16_bundle / "tokenizer.json"))
    feeds = pad_batch(tok.encode_batch(TEXTS), shared[1].input_names)
    for threads, model in shared.items():
        np.testing.assert_array_equal(model.run(feeds), alone[threads].run(feeds))


@pytest.mark.parametrize("streams", [1, 2])
async def test_a_worker_compiles_one_copy_a_model_thread_and_its_event_loop_shares_them(
    bf16_bundle: Path, streams: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compiled copy costs a served worker 30-35 MB once it has run (the default MiniLM, int8-grouped): a
    worker keeps one a model thread at one thread a call, and one for a lone request's two-thread call; its
    event loop, which runs a call only while no other runs, shares them. Two threads that do call one copy at
    once still each get their own answer."""
    compiled: list[int] = []
    init = OpenVinoModel.__init__

    def counted(self: OpenVinoModel, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        compiled.append(len(self._copies))

    monkeypatch.setattr(OpenVinoModel, "__init__", counted)
    async with serve(bf16_bundle, HARE_STREAMS=str(streams), HARE_CORES="2", HARE_LONE_THREADS="2") as client:
        assert sorted(compiled) == sorted([streams, 1])
        answered = (await client.post("/predict", json={"inputs": TEXTS})).json()
        backend = client.resources.backend
        assert isinstance(backend, Backend)
        model = backend.sessions[1]
        assert isinstance(model, OpenVinoModel)
        # The event loop's thread and a model thread on one copy at once (a worker's rare overlap).
        tok = Tokenizer.from_file(str(bf16_bundle / "tokenizer.json"))
        feeds = [pad_batch([tok.encode(t)], model.input_names) for t in TEXTS]
        alone = [model.run(f) for f in feeds]
        with ThreadPoolExecutor(4) as pool:
            for _ in range(5):
                for got, want in zip(pool.map(model.run, feeds), alone, strict=True):
                    np.testing.assert_array_equal(got, want)
    assert len(answered) == len(TEXTS)


def test_an_idle_backend_gives_back_the_buffers_of_its_biggest_batch(bf16_bundle: Path) -> None:
    """OpenVINO keeps each compiled copy's intermediate buffers at the biggest shape it has run: a burst of big
    batches left a worker that much bigger for good. The backend's idle trim (api/engine/backend.py, a second
    after the last batch) frees them, and the next calls answer as before."""
    from container.runtime import bound_malloc

    # As a worker does (api/engine/opened.py): big buffers in mappings of their own, handed back when freed.
    # Otherwise glibc may have raised its threshold on earlier tests' frees and keep them in its heap.
    bound_malloc()

    def rss_mb() -> float:
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmRSS:")[1].split()[0]) / 1024

    manifest = read_manifest(bf16_bundle)
    backend = Backend(
        bf16_bundle / MODEL_FILE, "cpu", (1, 2), manifest.output, variant="bf16", max_length=manifest.max_length
    )
    small = {name: np.ones((1, 8), np.int64) for name in backend.input_names}
    big = {name: np.ones((1024, manifest.max_length), np.int64) for name in backend.input_names}
    before = [backend.run_padded(small, width) for width in (1, 2)]
    start = rss_mb()
    for width in (1, 2):
        backend.run_padded(big, width)
    grown = rss_mb()
    backend.trim()
    # Measured on AMX: 170 MB grown, 64 given back (the rest stays with the compiled copies).
    assert grown - rss_mb() > (grown - start) / 4, (start, grown, rss_mb())
    for width, answer in zip((1, 2), before, strict=True):
        np.testing.assert_array_equal(backend.run_padded(small, width), answer)


def test_a_worker_serving_an_openvino_bundle_never_loads_onnx_runtime(bf16_bundle: Path) -> None:
    """ONNX Runtime's library is about 9 MB of a served worker's RSS (19 MB imported alone): a worker whose
    bundle runs on OpenVINO has no use for it, and its lifespan (model, warm-up, answers) leaves it unloaded."""
    script = """
import asyncio, sys
from api.config import Settings
from api.web.app import create_app

async def main() -> None:
    app = create_app(Settings.from_env({"HARE_BUNDLE": sys.argv[1]}))
    async with app.router.lifespan_context(app):
        assert app.state.hare.backend.providers == [sys.argv[2]]
    print(sorted(m for m in sys.modules if m.split(".")[0] == "onnxruntime"))

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(bf16_bundle), PROVIDER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_long_text_alone_does_not_cost_the_next_request_an_allocation(
    bf16_bundle: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Allocating OpenVINO's buffers again after a trim costs the next call 7-21%: a worker trims only after a call
    bigger than any one request (OpenVinoModel.trim_above), so a quiet hour's long texts do not each pay it, and
    only the model that ran it."""
    from container.runtime import OnnxModel

    trims: list[int] = []
    trim = OpenVinoModel.trim

    def counted(self: OpenVinoModel) -> bool:
        trims.append(1)
        return trim(self)

    monkeypatch.setattr(OpenVinoModel, "trim", counted)
    manifest = read_manifest(bf16_bundle)
    backend = Backend(
        bf16_bundle / MODEL_FILE, "cpu", (1, 2), manifest.output, variant="bf16", max_length=manifest.max_length
    )
    long = {name: np.ones((16, manifest.max_length), np.int64) for name in backend.input_names}
    assert long["input_ids"].size > OnnxModel.trim_above  # ONNX Runtime would trim after it (two 512-token texts)
    backend.run_padded(long, 2)
    backend.trim()
    assert trims == []
    burst = {name: np.ones((64, manifest.max_length), np.int64) for name in backend.input_names}
    assert burst["input_ids"].size > OpenVinoModel.trim_above
    backend.run_padded(burst, 1)
    backend.trim()
    assert len(trims) == 1  # the model that ran it: the two-thread one did not grow
    backend.trim()
    assert len(trims) == 1  # not again until another big call
    backend.run_padded(burst, 1)
    backend.run_padded(burst, 2)
    backend.trim()
    assert len(trims) == 3  # both
