"""The bench's own bundles: a model folder is optimized once into the cache and reused while it is current."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from bench.subjects import bundle_for_model
from container.bundle import read_manifest
from container.optimize import export, pipeline, validate
from tests.conftest import ModelFactory, TorchWork


def test_a_cached_bundle_is_reused_unless_it_predates_the_batch_budget_or_additive_masks(
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
