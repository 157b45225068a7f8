"""`hare optimize` as a user runs it: the bundle it writes, the variants it refuses, the inputs it rejects."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from container.bundle import read_manifest
from container.machine import describe
from container.openvino_runtime import available as openvino_available
from container.openvino_runtime import bf16_capable
from container.optimize import autotune, grouped_int8, variants
from container.runtime import InferenceFailed, OnnxModel
from hare.cli import main
from tests.clocked import clocked
from tests.conftest import ModelFactory

QUICK = ["--tune-lengths", "8", "--tune-batches", "1", "--tune-seconds", "0.02"]


def run(*args: object) -> int:
    return main(["optimize", *map(str, args)])


def test_bundle_has_manifest_with_every_variant(tiny_model: ModelFactory, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    assert run(tiny_model("text-classification"), "--task", "text-classification", "--out", out, *QUICK) == 0
    manifest = read_manifest(out)
    assert manifest.task == "text-classification"
    assert manifest.labels == {0: "negative", 1: "neutral", 2: "positive"}
    assert manifest.inputs == ["input_ids", "attention_mask", "token_type_ids"]
    names = [v["name"] for v in manifest.variants]
    # bf16 joins where OpenVINO computes it (AMX, AVX512_BF16), int8-grouped where it is installed (VNNI, AMX): the
    # machine decides what is offered; the opt-in ones (int8-static) only when named.
    units = describe()["int8_path"] in grouped_int8.RUNS_ON
    offered = variants.variants_for("cpu", "bert", bf16=bf16_capable(), openvino=openvino_available(), int8_units=units)
    assert names == [v.name for v in variants.plan(offered).chosen]
    assert ("int8-grouped" in names) == (openvino_available() and units)
    chosen = [v for v in manifest.variants if v["chosen"]]
    assert [v["name"] for v in chosen] == [manifest.variant]
    passed = [v for v in manifest.variants if v["passed"]]
    # The chosen variant is autotune's pick of those that passed, on this machine: the fastest when its lead
    # was clear, else the more accurate of those it tied with (tests/test_autotune.py).
    pick = manifest.pick
    assert pick["winner"] == manifest.variant and pick["statistic"] == "p10 of thread CPU time"
    # runner_up is None when every other variant fell over 1.5x behind in the first round (Pick.dropped).
    contenders = {pick["fastest"], *pick["tied"], *([pick["runner_up"]] if pick["runner_up"] else pick["dropped"])}
    assert contenders <= {v["name"] for v in passed}
    if pick["tie"]:
        assert manifest.variant in pick["tied"]
    else:
        assert chosen[0]["timings_ms"]["s8xb1"] == min(v["timings_ms"]["s8xb1"] for v in passed)
    assert manifest.source["weights_sha256"] and manifest.versions["onnxruntime"]
    assert "avx2" in manifest.machine["flags"] or manifest.machine["cpu"]
    assert sorted(p.name for p in out.iterdir()) == ["hare.json", "model.onnx", "parity.npz", "tokenizer.json"]
    assert not list(tmp_path.glob(".bundle.partial-*"))


def test_the_bundle_carries_the_batch_budget_measured_with_every_core_busy(
    tiny_model: ModelFactory, tmp_path: Path
) -> None:
    out = tmp_path / "bundle"
    args = ("--task", "feature-extraction", "--out", out, "--variants", "fp32", "--tune-streams", "2", *QUICK)
    assert run(tiny_model("feature-extraction"), *args) == 0
    manifest = read_manifest(out)
    rates = {int(budget): rate for budget, rate in manifest.token_rates.items()}
    # Smallest first, up to the server's default or until the rate is past its peak.
    assert list(rates) == list(autotune.BUDGETS[: len(rates)]) and len(rates) >= 3 and min(rates.values()) > 0
    assert manifest.max_batch_tokens == autotune.batch_budget(rates)
    assert manifest.budget_machine["streams"] == 2 and manifest.budget_machine["cpu"] == manifest.machine["cpu"]


def test_the_budgets_tried_can_be_named_and_a_budget_under_one_sequence_is_refused(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, out = tiny_model("feature-extraction"), tmp_path / "bundle"
    args = ("--task", "feature-extraction", "--variants", "fp32", *QUICK)
    assert run(model, *args, "--out", out, "--tune-budgets", "512,128") == 0
    manifest = read_manifest(out)
    assert sorted(int(budget) for budget in manifest.token_rates) == [128, 512]  # only these, whatever the peak
    assert manifest.max_batch_tokens in (128, 512)
    assert run(model, *args, "--out", tmp_path / "other", "--tune-budgets", "64,256") == 2
    assert "each at least 128" in capsys.readouterr().err and not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("rates", "budget"),
    [
        ({128: 5000, 256: 9300, 512: 8400, 1024: 7700, 8192: 5100}, 256),  # falls once the cache is outgrown
        ({128: 100, 256: 180, 512: 196, 1024: 200}, 512),  # 196 is within 5% of the best: no need to wait for 1024
        ({128: 100, 256: 100, 512: 100}, 128),  # flat: the smallest, so no request waits behind a big batch
    ],
)
def test_the_batch_budget_is_the_smallest_batch_near_the_best_rate(rates: dict[int, float], budget: int) -> None:
    assert autotune.batch_budget(rates) == budget


def test_a_batch_too_big_for_the_machine_ends_the_climb_and_the_bundle_still_ships(
    tiny_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_model = OnnxModel.run

    def out_of_memory_past_512(self: OnnxModel, feeds: Any, shrink: bool = False) -> Any:
        if feeds["input_ids"].size > 512:
            raise InferenceFailed("inference failed: Failed to allocate memory")  # as ORT's arena words it
        return run_model(self, feeds, shrink)

    monkeypatch.setattr(OnnxModel, "run", out_of_memory_past_512)
    # Counted, not timed (tests/clocked.py): 256-token batches take half as long a token as 128's, 512's 80%,
    # so the budget is 256, neither the first measured nor the last before the failure.
    per_8_tokens = {128: 100, 256: 50, 512: 80}
    clocked(monkeypatch, lambda _model, _path, tokens: per_8_tokens.get(tokens, 100) * tokens // 8)
    out = tmp_path / "bundle"
    args = ("--task", "feature-extraction", "--out", out, "--variants", "fp32", *QUICK)
    assert run(tiny_model("feature-extraction"), *args) == 0
    manifest = read_manifest(out)
    assert list(manifest.token_rates) == ["128", "256", "512"] and manifest.max_batch_tokens == 256


def test_the_budget_climb_stops_before_a_budget_that_would_not_fit_in_memory(
    tiny_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    peaks = iter(range(0, 100 * 2**30, 2**30))  # every budget takes 1 GiB more...
    monkeypatch.setattr(autotune, "resident_bytes", lambda: next(peaks))
    monkeypatch.setattr(autotune, "available_bytes", lambda: 2 * 2**30)  # ...and 2 GiB are left: 2 more won't fit
    out = tmp_path / "bundle"
    args = ("--task", "feature-extraction", "--out", out, "--variants", "fp32", *QUICK)
    assert run(tiny_model("feature-extraction"), *args) == 0
    manifest = read_manifest(out)
    assert list(manifest.token_rates) == ["128"] and manifest.max_batch_tokens == 128
    assert autotune.fits_next(2**30, 0)  # available memory unknown: no limit


def test_the_budget_climb_stops_once_two_budgets_in_a_row_fall_well_below_the_best() -> None:
    assert not autotune.past_peak({128: 100, 256: 140, 512: 120})  # one step down may be noise
    assert autotune.past_peak({128: 100, 256: 140, 512: 120, 1024: 110})
    assert not autotune.past_peak({128: 100, 256: 140, 512: 120, 1024: 130})  # within 10% of the best


def test_the_budget_rounds_revisit_only_budgets_near_the_best_until_the_pick_holds_twice() -> None:
    rates = {128: 6700.0, 256: 6900.0, 512: 6850.0, 1024: 6500.0, 2048: 6100.0, 4096: 5600.0, 8192: 5400.0}
    assert autotune.contenders(rates) == [128, 256, 512, 1024]  # 2048 and up are past the peak
    assert not autotune.settled([256, 256])  # MIN_ROUNDS first: two rounds can agree by chance
    assert autotune.settled([128, 256, 256]) and not autotune.settled([256, 256, 128])


def test_a_budget_rate_is_every_streams_tokens_per_a_low_percentile_of_its_call_times() -> None:
    feeds = {128: {"input_ids": np.zeros((1, 128))}, 512: {"input_ids": np.zeros((4, 128))}}
    # Per-call milliseconds of each stream's own CPU time: the 10th percentile stands for the budget, and
    # two streams ran at once, so the rate is twice one stream's.
    samples = {128: [10.0] * 9 + [500.0], 512: [40.0, 41.0, 80.0, 400.0]}
    assert autotune.rates_of(samples, feeds, 2) == {128: 25600.0, 512: pytest.approx(2 * 512 / 40.3e-3, rel=1e-3)}


def test_bundle_loads_without_torch_or_transformers(tiny_bundle: ModelFactory) -> None:
    bundle = tiny_bundle("feature-extraction")
    code = f"""
import sys
from pathlib import Path
from tokenizers import Tokenizer
from container.bundle import read_manifest
from container.runtime import OnnxModel
from tasks.ops import pad_batch
b = Path({str(bundle)!r})
m = read_manifest(b)
model = OnnxModel(b / "model.onnx", output=m.output)
enc = Tokenizer.from_file(str(b / "tokenizer.json")).encode_batch(["hello world", "a longer text here"])
out = model.run(pad_batch(enc, model.input_names))
assert out.shape[0] == 2, out.shape
assert "torch" not in sys.modules and "transformers" not in sys.modules, "serving must not load torch"
print("ok")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.stdout.strip() == "ok", result.stderr


def _broken(parent: Path, out: Path) -> None:
    """A variant as fast as its parent and wrong: every weight matrix negated."""
    model = onnx.load(str(parent))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.ndim == 2:
            init.CopyFrom(numpy_helper.from_array(-array, init.name))
    onnx.save(model, str(out))


def test_a_variant_that_fails_the_gate_is_never_chosen(
    tiny_model: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = variants.variants_for
    monkeypatch.setattr(
        variants,
        "variants_for",
        lambda *args, **kwargs: [
            *original(*args, **kwargs)[:2],
            variants.Variant("broken", "int8", "fp32", _broken),
        ],
    )
    out = tmp_path / "bundle"
    assert run(tiny_model("feature-extraction"), "--task", "feature-extraction", "--out", out, *QUICK) == 0
    manifest = read_manifest(out)
    broken = next(v for v in manifest.variants if v["name"] == "broken")
    assert not broken["passed"] and not broken["chosen"]
    assert broken["timings_ms"] == {}  # never even timed
    assert manifest.variant in ("fp32", "fused-fp32")


def test_no_variant_passing_leaves_nothing_behind(tiny_model: ModelFactory, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    # No int8 can meet a cosine of 1 exactly; fp32 is excluded, so nothing may ship (a cosine over 1 is refused
    # before the build).
    code = run(
        tiny_model("feature-extraction"), "--task", "feature-extraction", "--out", out,
        "--variants", "int8,fused-int8", "--min-cosine", "1", *QUICK,
    )  # fmt: skip
    assert code == 3
    assert not out.exists()
    assert not list(tmp_path.iterdir())


def _folder_to_file(folder: Path) -> None:
    shutil.rmtree(folder)
    folder.write_text("")


def _copy(model: Path, dst: Path) -> Path:
    shutil.copytree(model, dst)
    return dst


@pytest.mark.parametrize(
    ("mutate", "task", "message"),
    [
        (lambda d: shutil.rmtree(d), "text-classification", "does not exist"),
        (_folder_to_file, "text-classification", "is a file; give the model's folder"),
        (lambda d: (d / "model.safetensors").unlink(), "text-classification", "has no weights"),
        (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "text-classification", "pickle"),
        (lambda d: None, "token-classification", "has no token-classification head"),
        (lambda d: _edit_config(d, auto_map={"AutoModel": "x.Y"}), "text-classification", "--trust-remote-code"),
        # No family list: a type transformers does not know fails its first stage, which the message names.
        (lambda d: _edit_config(d, model_type="hare-unknown"), "text-classification", "stage export failed"),
        (
            lambda d: [(d / f).unlink() for f in ("tokenizer.json", "tokenizer_config.json")],
            "text-classification",
            "tokenizer",
        ),
    ],
)
def test_bad_model_folders_are_refused_with_a_reason(
    tiny_model: ModelFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mutate: object,
    task: str,
    message: str,
) -> None:
    folder = _copy(tiny_model("text-classification"), tmp_path / "model")
    mutate(folder)  # type: ignore[operator]
    out = tmp_path / "bundle"
    assert run(folder, "--task", task, "--out", out, *QUICK) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def _edit_config(folder: Path, **changes: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def test_pickle_weights_accepted_when_allowed(tiny_model: ModelFactory, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    folder = _copy(tiny_model("text-classification"), tmp_path / "model")
    torch.save(load_file(str(folder / "model.safetensors")), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    out = tmp_path / "bundle"
    args = [folder, "--task", "text-classification", "--out", out, "--variants", "fp32", *QUICK]
    assert run(*args, "--allow-pickle") == 0
    assert read_manifest(out).source["weights"] == ["pytorch_model.bin"]


def test_existing_output_needs_force(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    args = [tiny_model("text-ranking"), "--task", "text-ranking", "--out", out, "--variants", "fp32", *QUICK]
    assert run(*args) == 0
    (out / "hare.json").write_text((out / "hare.json").read_text().replace("text-ranking", "stale"))
    assert run(*args) == 2
    assert "--force" in capsys.readouterr().err
    assert "stale" in (out / "hare.json").read_text()
    assert run(*args, "--force") == 0
    assert read_manifest(out).task == "text-ranking"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]  # the old bundle went with the build's folder


def test_model_dir_without_task_is_an_error(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(tiny_model("text-classification")) == 2
    assert "--task is required" in capsys.readouterr().err
    assert run(tmp_path / "typo") == 2  # a folder that is not there is said first: no --task makes it a model
    assert f"model folder {tmp_path / 'typo'} does not exist" in capsys.readouterr().err


def test_the_summary_names_what_int8_mixed_kept_fp32_and_split() -> None:
    from types import SimpleNamespace
    from typing import cast

    from container.bundle import Manifest
    from container.optimize.cli import build_lines

    base = {"alpha": 0.6, "smoothed": 24, "scales": "token", "levels": 64, "matmuls": 36, "calibration": 58}
    base |= {"passes": 59, "seconds": 43.6}
    split = {"name": "int8-mixed", "build": base | {"fp32": [], "split": ["a/MatMul", "b/MatMul"]}}
    kept = {"name": "int8-mixed", "build": base | {"fp32": ["a/MatMul"]}}  # a bundle from before splits
    lines = build_lines(cast(Manifest, SimpleNamespace(variants=[split, kept, {"name": "fp32", "build": {}}])))
    assert lines == [
        "int8-mixed: smoothing alpha 0.6 on 24 activations, one activation scale per token, int8 weights of 64 "
        "levels a side; 0 of 36 MatMuls kept fp32; 2 split, their outlier channels fp32 (a/MatMul, b/MatMul); "
        "chosen on 58 samples, 59 simulated passes, 43.6 s",
        "int8-mixed: smoothing alpha 0.6 on 24 activations, one activation scale per token, int8 weights of 64 "
        "levels a side; 1 of 36 MatMuls kept fp32 (a/MatMul); chosen on 58 samples, 59 simulated passes, 43.6 s",
    ]


def test_an_out_that_is_a_file_is_refused_before_any_work(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # With --force it failed only after the whole build ("Not a directory"), the build's minutes lost.
    out = tmp_path / "a-file"
    out.write_text("")
    assert run(tiny_model("text-classification"), "--task", "text-classification", "--out", out, "--force") == 2
    assert "is a file; give a folder for the bundle" in capsys.readouterr().err


def test_an_out_that_is_a_mount_point_is_refused_before_any_work(
    tiny_model: ModelFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A volume mounted where the bundle goes: the build ran whole, then its rename over --out failed (EBUSY).
    out = tmp_path / "volume"
    out.mkdir()
    if subprocess.run(["mount", "--bind", str(out), str(out)], capture_output=True).returncode != 0:
        pytest.skip("no bind mount here (root and mount(8) are needed)")
    try:
        assert run(tiny_model("text-classification"), "--task", "text-classification", "--out", out, "--force") == 2
        assert f"--out {out} is a mount point (a volume)" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(out)], check=True)


def test_an_out_where_no_file_can_be_made_is_refused_not_waited_on(
    tiny_model: ModelFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # /proc takes no new files: the lock beside the bundle could not be created, which the build took for a
    # lock removed by its holder and looked again, at 100% of a core, for ever.
    assert run(tiny_model("text-classification"), "--task", "text-classification", "--out", "/proc/hare-nope") == 2
    assert "cannot create /proc/.hare-nope.optimize-lock" in capsys.readouterr().err
