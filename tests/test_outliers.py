"""Decoders with massive activations (tests/outliers.py injects them into a tiny random Qwen3 embedder): the
optimizer's promises hold on them. A variant that fails its gate is refused with its figures, int8-mixed
falls back to one activation scale per token and passes, and what ships passes every gate.

int8 kernels differ by ISA (VNNI, AMX, AVX2's saturating 16-bit sums), so the build here asks for narrow
weights (64 levels a side, `--int8-weights narrow`), whose integer sums are exact on every x86 kernel: what
int8-mixed chooses, and every figure, is then the same on every CPU. The massive activations are 20 times
the defaults (massive=1e5: 500,000x the median channel at the q/k/v inputs), so that one activation scale per
call leaves the other tokens next to no int8 levels: dynamic int8 lands near cosine 0.4. (Per MatMul, the
loss is asserted outright in test_mixed_precision.py: a token 1e4 times the others leaves them no levels at
all.)"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from container.bundle import Manifest
from container.machine import NARROW_LEVELS
from container.optimize import mixed, pipeline
from container.optimize.cli import variant_table
from tasks.registry import get_task
from tests.outliers import Injected, activation_ratios, embeddings, inject_massive_activations
from tests.tiny_models import make_model

QUICK = dict(tune_lengths=[8], tune_batches=[1], tune_seconds=0.01)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Injected]:
    """The tiny Qwen3 embedder with massive activations (module docstring); its 32 channels are few, so the
    outlier channels are read at an ordinary channel's weight (reads=1), or they would rule the embeddings."""
    folder = make_model(tmp_path_factory.mktemp("outliers") / "model", "feature-extraction", "qwen3")
    return folder, inject_massive_activations(folder, massive=1e5, reads=1.0)


def test_the_outliers_reach_the_projections_and_the_embeddings_still_tell_texts_apart(
    decoder: tuple[Path, Injected],
) -> None:
    folder, injected = decoder
    ratios = activation_ratios(folder, injected.delimiters)
    for kind in ("q/k/v", "gate/up"):  # behind layer 0, which writes them: largest channel / median channel
        for layer in ratios[kind][1:]:
            assert layer.typical > 30 and layer.largest > 1e5, (kind, layer)
    assert ratios["down"][0].largest > 1000  # layer 0's massive unit, on the delimiters
    vectors = embeddings(folder)
    cosines = vectors @ vectors.T
    assert np.isfinite(vectors).all()
    assert cosines[~np.eye(len(vectors), dtype=bool)].mean() < 0.5


def _optimize(
    folder: Path,
    out: Path,
    only: Sequence[str] = ("fp32", "int8", "int8-per-channel", "int8-mixed"),
    thresholds: Mapping[str, float] | None = None,
) -> Manifest:
    options = pipeline.OptimizeOptions(
        model_dir=folder,
        task=get_task("feature-extraction"),
        out=out,
        only=list(only),
        int8_levels=NARROW_LEVELS,  # exact on every x86 int8 kernel (module docstring)
        thresholds=dict(thresholds or {}),
        **QUICK,  # type: ignore[arg-type]
    )
    return pipeline.optimize(options)


def _table(manifest: Manifest) -> str:
    """The variant table `hare optimize` prints, as text."""
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(variant_table(manifest))
    return console.export_text()


def test_broken_int8_is_refused_with_its_figures_and_int8_mixed_takes_a_scale_per_token(
    decoder: tuple[Path, Injected], tmp_path: Path
) -> None:
    folder, _ = decoder
    manifest = _optimize(folder, tmp_path / "bundle")
    reports = {v["name"]: v for v in manifest.variants}
    for name in ("int8", "int8-per-channel"):  # one activation scale per call: refused, with the figure
        gate = reports[name]["gates"]["cosine_p1"]
        assert reports[name]["error"] is None and not reports[name]["passed"]
        assert not gate["passed"] and gate["value"] < gate["threshold"]
    # One scale per call misses the gate (as the two above do), so int8-mixed takes one per token, and passes.
    chosen = reports["int8-mixed"]
    assert chosen["error"] is None and chosen["build"]["scales"] == "token", chosen["build"]
    assert chosen["build"]["levels"] == NARROW_LEVELS
    assert chosen["passed"] and chosen["gates"]["cosine_p1"]["passed"], chosen["gates"]
    shipped = reports[manifest.variant]
    assert shipped["passed"] and all(g["passed"] for g in shipped["gates"].values())


def test_int8_mixed_splits_the_outlier_channels_where_no_matmul_may_stay_fp32(
    decoder: tuple[Path, Injected], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every MatMul int8 misses the gate on this decoder (a delimiter's massive channels take its row's levels),
    and here none may stay fp32 (as where the harm spreads over more MatMuls than the stage's cap). A split
    computes the injected outlier channels in fp32 and quantizes the rest of each token without them, so the
    inliers keep their levels: int8-mixed passes by splits alone. (Before, a split kept 1/48 of the rows by
    weight size, 1 of 32 here, and quantized the activations with the outliers in them; with no fp32 allowed
    the stage refused.)"""
    monkeypatch.setattr(mixed, "MAX_FP32", 0.0)
    folder, injected = decoder
    manifest = _optimize(folder, tmp_path / "bundle", ["fp32", "int8-mixed"])
    chosen = {v["name"]: v for v in manifest.variants}["int8-mixed"]
    build = chosen["build"]
    assert chosen["error"] is None and build["fp32"] == [] and build["split"], build
    assert chosen["passed"] and chosen["gates"]["cosine_p1"]["passed"], chosen["gates"]
    behind = [n for n in build["split"] if "layers.0/" not in n]  # behind layer 0, which writes the outliers
    assert behind and all(set(injected.channels) <= set(build["channels"][n]) for n in behind), build["channels"]


def test_a_refused_int8_mixed_says_its_figure_and_the_gate(
    decoder: tuple[Path, Injected], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no int8 choice meets the gate, every int8 variant's entry says why: its figure against the gate
    (int8-mixed's refusal starts with them, which the build's table shows), and fp32 ships."""
    monkeypatch.setattr(mixed, "MAX_FP32", 0.0)
    folder, _ = decoder
    manifest = _optimize(folder, tmp_path / "bundle", ["fp32", "int8", "int8-mixed"], {"cosine_p1": 0.99999})
    reports = {v["name"]: v for v in manifest.variants}
    assert manifest.variant == "fp32"
    gate = reports["int8"]["gates"]["cosine_p1"]
    assert not reports["int8"]["passed"] and gate["value"] < gate["threshold"] == 0.99999
    refusal = reports["int8-mixed"]["error"]
    assert not reports["int8-mixed"]["passed"] and refusal.startswith("refused: at best cosine_p1 0."), refusal
    assert "(gate 0.99999)" in refusal[:80] and "split instead" in refusal
    row = next(line for line in _table(manifest).splitlines() if "int8-mixed" in line)
    assert "(gate 0.99999)" in row
