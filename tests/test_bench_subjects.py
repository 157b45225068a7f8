"""The bench's own bundles: a model folder is optimized once into the cache and reused while it is current."""

from __future__ import annotations

import json
from pathlib import Path

from bench.subjects import bundle_for_model
from container.bundle import read_manifest
from tests.conftest import ModelFactory


def test_a_cached_bundle_is_reused_unless_it_predates_the_batch_budget_or_additive_masks(
    tiny_model: ModelFactory, tmp_path: Path
) -> None:
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
