"""The bench's own bundles: a model folder is optimized once into the cache and reused while it is current."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from bench import headline
from bench.subjects import bundle_for_model
from container.bundle import read_manifest
from container.optimize import export, pipeline, validate
from tests.conftest import ModelFactory, TorchWork


def test_a_cached_bundle_is_reused_unless_it_predates_the_batch_budget_or_additive_masks_or_lacks_a_variant(
    tiny_model: ModelFactory, torch_work: TorchWork, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What is under test is when the cache is rebuilt: its builds tune quickly (one point, one stream) and share
    # the session's export and reference outputs of the model.
    quick = functools.partial(
        pipeline.OptimizeOptions, tune_lengths=[8], tune_batches=[1], tune_seconds=0.01, tune_streams=1
    )
    monkeypatch.setattr(pipeline, "OptimizeOptions", quick)
    monkeypatch.setattr(export, "export_onnx", torch_work.export)
    monkeypatch.setattr(validate, "reference_outputs", torch_work.reference)
    model, out = tiny_model("feature-extraction"), tmp_path / "cached"
    manifest_file = out / "hare.json"
    assert bundle_for_model(model, "feature-extraction", out, ["fp32"]) == out
    built = manifest_file.stat().st_mtime_ns
    bundle_for_model(model, "feature-extraction", out, ["fp32"])
    assert manifest_file.stat().st_mtime_ns == built  # reused as it is
    # As a bundle built before the batch-budget stage: the bench would serve it at the old fixed budget.
    manifest_file.write_text(json.dumps(json.loads(manifest_file.read_text()) | {"max_batch_tokens": None}))
    bundle_for_model(model, "feature-extraction", out, ["fp32"])
    assert read_manifest(out).max_batch_tokens is not None
    # As a bundle built before masks were made additive: rebuilt, and the new one says how many it made.
    manifest = json.loads(manifest_file.read_text())
    del manifest["source"]["additive_masks"]
    manifest_file.write_text(json.dumps(manifest))
    bundle_for_model(model, "feature-extraction", out, ["fp32"])
    assert read_manifest(out).source["additive_masks"] == 0  # BERT adds its mask already
    # Asked for a variant its build did not race (a headline that now races OpenVINO's too): rebuilt with it.
    bundle_for_model(model, "feature-extraction", out, ["fp32", "int8"])
    assert {v["name"] for v in read_manifest(out).variants} == {"fp32", "int8"}


@pytest.mark.parametrize(
    ("openvino", "bf16", "int8_path", "expected"),
    [
        (False, False, "avx512-vnni", ["int8", "fused-int8", "fused-int8-per-channel"]),
        (True, False, "avx512-vnni", ["int8", "fused-int8", "fused-int8-per-channel", "int8-grouped"]),
        (True, True, "amx", ["int8", "fused-int8", "fused-int8-per-channel", "bf16", "int8-grouped"]),
        (True, False, "avx2", ["int8", "fused-int8", "fused-int8-per-channel"]),  # int8-grouped is slower there
    ],
)
def test_the_headline_races_openvinos_variants_where_a_default_build_would(
    monkeypatch: pytest.MonkeyPatch, openvino: bool, bf16: bool, int8_path: str, expected: list[str]
) -> None:
    monkeypatch.setattr(pipeline, "openvino_available", lambda: openvino)
    monkeypatch.setattr(pipeline, "bf16_capable", lambda: bf16 and openvino)
    monkeypatch.setattr(pipeline, "describe", lambda: {"int8_path": int8_path})
    assert headline.classifier_variants() == expected
