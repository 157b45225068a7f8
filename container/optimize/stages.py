"""`hare optimize`'s stages, in the order pipeline.py runs them. Each takes what it needs as values (the source
model, the options, paths, what earlier stages returned) and returns what it made; the graphs are files in
the build's folder, one per variant (`variant_file`). `step` advances the stage's progress bar: a no-op by
default, so a stage can be called alone."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from container.bundle import (
    DENSE_FILE,
    MANIFEST_FILE,
    MODEL_FILE,
    PARITY_FILE,
    TOKENIZER_FILE,
    Manifest,
    file_digests,
    file_sizes,
)
from container.machine import FULL_LEVELS, describe, versions
from container.optimize import (
    autotune,
    export,
    graphs,
    masks,
    mixed,
    regimes,
    rows,
    source,
    textset,
    tokenizer,
    validate,
)
from container.optimize.errors import ValidationFailed
from container.optimize.options import OptimizeOptions
from container.optimize.variants import FUSION_MODEL_TYPE, Variant
from tasks import text_ranking
from tasks.base import TaskSpec

Step = Callable[..., None]


def _no_step(*_args: object) -> None:
    pass


def variant_file(folder: Path, variant: str) -> Path:
    """Where a variant's graph is in the build's folder."""
    return folder / f"{variant}.onnx"


@dataclass(frozen=True)
class Exported:
    """The export's graph inputs, the attention masks it made additive (container/optimize/masks.py) and the
    MatMuls it moved onto the pooled row (container/optimize/rows.py)."""

    inputs: list[str]
    additive_masks: int
    pooled_row: int = 0


def export_fp32(src: source.SourceModel, task: TaskSpec, whole: Path, out: Path, step: Step = _no_step) -> Exported:
    """The fp32 graph at `out`: torch's export, its selected attention masks made additive, the end of its
    last layer on the row a first-token head reads. `whole` (in the same folder): the graph before that
    last rewrite, which the fusion reads (variants.fused)."""
    inputs = export.export_onnx(src, task, whole)
    additive = masks.additive_masks(whole, whole)
    pooled = rows.pooled_row(whole, out)
    step()
    return Exported(inputs, additive, pooled)


def write_tokenizer(src: source.SourceModel, out: Path, step: Step = _no_step) -> Tokenizer:
    """The bundle's tokenizer.json at `out`, loaded."""
    loaded = Tokenizer.from_file(str(tokenizer.write_tokenizer(src, out)))
    step()
    return loaded


def build_variants(variants: Sequence[Variant], folder: Path, step: Step = _no_step) -> dict[str, str]:
    """Fused and quantized candidates, each from its parent's graph in `folder`; returns why each one that
    failed did. A build that fails (a fusion the graph does not fit, an operator the quantizer cannot take)
    costs that variant and its children only; its error goes to the manifest."""
    failed: dict[str, str] = {}
    for v in variants:
        assert v.parent is not None
        if v.parent in failed:
            failed[v.name] = f"its parent {v.parent} failed to build"
            continue
        assert v.build is not None
        try:
            fused = v.build(variant_file(folder, v.reads or v.parent), variant_file(folder, v.name))
        except Exception as exc:  # any failure of the fusion/quantization tools is this variant's failure
            failed[v.name] = f"{type(exc).__name__}: {exc}"
            fused = "failed"
        step(f"{v.name} {fused}" if isinstance(fused, dict | str) else v.name)
    return failed


def reference(
    src: source.SourceModel,
    opts: OptimizeOptions,
    loaded: Tokenizer,
    inputs: Sequence[str],
    out: Path,
    step: Step = _no_step,
) -> validate.Parity:
    """PyTorch's outputs on the validation samples, stored at `out`: what every candidate is judged against."""
    task = opts.task
    validation = opts.validation_file
    samples = (
        textset.file_samples(validation, task.pairs) if validation else textset.builtin_samples(loaded, task.pairs)
    )
    # Either side of each length where the model's arithmetic changes (chunks, windows, rope, maximum).
    samples += textset.regime_samples(loaded, regimes.parity_lengths(src.config, src.max_length), task.pairs)
    parity = _parity(src, opts, loaded, inputs, samples, out)
    step()
    return parity


def calibration_reference(
    src: source.SourceModel, opts: OptimizeOptions, loaded: Tokenizer, inputs: Sequence[str], out: Path
) -> validate.Parity:
    """PyTorch's outputs on the calibration samples (textset.calibration_samples), stored at `out`: what a
    calibrated build fits to. Never the validation samples, so that those check it on texts it was not
    fitted to."""
    return _parity(src, opts, loaded, inputs, textset.calibration_samples(loaded, opts.task.pairs), out)


def _parity(
    src: source.SourceModel,
    opts: OptimizeOptions,
    loaded: Tokenizer,
    inputs: Sequence[str],
    samples: Sequence[textset.Sample],
    out: Path,
) -> validate.Parity:
    """`samples` as the model reads them, PyTorch's outputs on them (stored at `out`) and the gates."""
    task = opts.task
    if src.pair_template:  # an LM reranker is validated on pairs written as it will read them
        t = src.pair_template
        samples = [
            textset.Sample(text_ranking.write_pair(t["format"], t["instruction"], s.text, s.pair or ""), None, s.group)
            for s in samples
        ]
    encodings = validate.encode_samples(loaded, samples)
    stored = validate.reference_outputs(src, task, encodings, inputs, out)
    return validate.Parity(
        stored,
        encodings,
        samples,
        task,
        src.pooling,
        opts.thresholds or {},
        opts.target,
        src.multi_label,
        src.pad_id or 0,
        src.regression,
    )


@dataclass(frozen=True)
class Calibrated:
    """What each calibrated build chose (for the manifest), and why each one that failed or was refused did."""

    builds: dict[str, dict[str, Any]]
    failed: dict[str, str]


def calibrate(
    variants: Sequence[Variant],
    folder: Path,
    parity: Callable[[], validate.Parity],
    failed: Mapping[str, str],
    step: Step = _no_step,
) -> Calibrated:
    """Candidates fitted to the calibration samples against their reference (int8-mixed,
    container/optimize/mixed.py); `parity` makes those, once, if a variant needs them. One that cannot meet the
    gates there is refused with its figures, as a failed build; the rest go on. `failed`: the builds that
    failed before (a child of one is not built)."""
    fit: validate.Parity | None = None
    builds: dict[str, dict[str, Any]] = {}
    refused: dict[str, str] = {}
    for v in variants:
        assert v.parent is not None and v.calibrate is not None
        if v.parent in failed or v.parent in refused:
            refused[v.name] = f"its parent {v.parent} failed to build"
            continue
        try:
            fit = fit or parity()
            builds[v.name] = v.calibrate(variant_file(folder, v.parent), variant_file(folder, v.name), fit)
        except mixed.Refused as exc:
            refused[v.name] = f"refused: {exc}"
        except Exception as exc:  # any failure of the quantization tools is this variant's failure
            refused[v.name] = f"{type(exc).__name__}: {exc}"
        kept = builds.get(v.name, {}).get("fp32")
        step(f"{v.name} ({len(kept)} MatMuls fp32)" if kept is not None else v.name)
    return Calibrated(builds, refused)


def validate_all(
    variants: Sequence[Variant],
    folder: Path,
    parity: validate.Parity,
    failed: Mapping[str, str],
    builds: Mapping[str, dict[str, Any]],
    step: Step = _no_step,
) -> list[validate.VariantReport]:
    """Every variant's report against `parity` (one whose build `failed` is reported as such, with what its
    build chose from `builds` and its int8 weights' levels); raises ValidationFailed, with the figures, when
    none passed."""
    reports = []
    for v in variants:
        if v.name in failed:
            report = validate.VariantReport.failed_build(v.name, v.precision, failed[v.name])
        else:
            report = validate.validate(variant_file(folder, v.name), v.name, v.precision, parity)
        levels = {"levels": v.levels} if v.levels else {}
        reports.append(replace(report, build=levels | builds.get(v.name, {})))
        step(v.name)
    validate.refuse_departing_graphs(reports)
    if not any(r.passed for r in reports):
        failures = "; ".join(
            f"{r.name}: "
            + (r.error or ", ".join(f"{m}={g['value']:.4g}" for m, g in r.gates.items() if not g["passed"]))
            for r in reports
        )
        raise ValidationFailed(f"no variant passed the parity gates ({failures})")
    return reports


@dataclass(frozen=True)
class Tuned:
    """Autotune's pick, and every report, those that passed with their timings."""

    pick: autotune.Pick
    reports: list[validate.VariantReport]

    @property
    def best(self) -> validate.VariantReport:
        """The variant that ships."""
        return next(r for r in self.reports if r.name == self.pick.winner)


def pick_variant(
    reports: Sequence[validate.VariantReport],
    folder: Path,
    loaded: Tokenizer,
    opts: OptimizeOptions,
    step: Step = _no_step,
) -> Tuned:
    """Every variant that passed, timed against the others in rounds; a tie goes to the more accurate."""
    passed = [r for r in reports if r.passed]
    timings, pick = autotune.tune(
        {r.name: variant_file(folder, r.name) for r in passed},
        loaded,
        opts.tune_lengths,
        opts.tune_batches,
        opts.tune_threads,
        opts.target,
        opts.tune_seconds,
        prefer=by_accuracy(passed, opts.task),
        step=step,
    )
    return Tuned(pick, [replace(r, timings_ms=timings[r.name]) if r.passed else r for r in reports])


# Who takes a tie: the wider type first (bf16 keeps 8 bits of mantissa to fp16's 11), then the task's first
# gate metric.
PRECISIONS = ("fp32", "fp16", "bf16", "int8")


def by_accuracy(reports: Sequence[validate.VariantReport], task: TaskSpec) -> list[str]:
    """Variant names, most accurate first: by precision (fp32, fp16, int8), then by the task's first gate metric
    (how far inside its threshold), then by the largest output difference from PyTorch (top-1 agreement is 1
    for every variant of a good classifier); equal ones keep their order."""
    gate = task.gates[0]

    def key(r: validate.VariantReport) -> tuple[int, float, float]:
        rank = PRECISIONS.index(r.precision) if r.precision in PRECISIONS else len(PRECISIONS)
        value = float(r.gates[gate.metric]["value"]) if gate.metric in r.gates else 0.0
        return rank, -value if gate.higher_is_better else value, r.metrics.get("max_abs_diff", 0.0)

    return [r.name for r in sorted(reports, key=key)]


def budget(
    model: Path, loaded: Tokenizer, streams: int, opts: OptimizeOptions, step: Step = _no_step, variant: str = "fp32"
) -> dict[int, float]:
    """Tokens a second by batch budget for the graph at `model` (of `variant`), with `streams` model calls at
    once (CPU; a GPU wants its batches large, so {} there): container/optimize/autotune.py."""
    if opts.target != "cpu":
        return {}
    return autotune.token_rates(
        model,
        loaded,
        streams,
        opts.target,
        budgets=opts.tune_budgets or autotune.BUDGETS,
        min_seconds=opts.tune_seconds,
        step=step,
        variant=variant,
    )


def write_bundle(
    out: Path,
    folder: Path,
    src: source.SourceModel,
    parity: validate.Parity,
    manifest: Manifest,
    step: Step = _no_step,
) -> Path:
    """The bundle at `out`: the graph of `manifest.variant` (weights mapped where they must be), the tokenizer,
    the Dense weights, the parity set and hare.json."""
    out.mkdir()
    graphs.ship(variant_file(folder, manifest.variant), out / MODEL_FILE)
    shutil.copyfile(folder / TOKENIZER_FILE, out / TOKENIZER_FILE)
    if src.dense:
        # The Dense modules run in numpy after pooling (tasks/ops.Dense): their weights travel as plain arrays.
        np.savez(out / DENSE_FILE, **source.dense_weights(src.dense))  # type: ignore[arg-type]
    validate.save_parity(out / PARITY_FILE, parity)
    manifest = replace(manifest, files=file_sizes(out), sha256=file_digests(out))
    (out / MANIFEST_FILE).write_text(manifest.to_json())
    step()
    return out


def manifest(
    opts: OptimizeOptions,
    src: source.SourceModel,
    exported: Exported,
    tuned: Tuned,
    token_rates: dict[int, float],
    streams: int,
    fused: Path,
) -> Manifest:
    """The bundle's hare.json: the model, every variant's report and the chosen one, autotune's pick, the
    batch budget, and the machine and versions it was built with. `fused`: the fused-fp32 graph, if built."""
    best = tuned.best
    return Manifest(
        task=opts.task.name,
        architecture=src.architecture,
        model_type=src.model_type,
        labels=src.labels,
        multi_label=src.multi_label,
        regression=src.regression,
        pooling=src.pooling,
        normalize=src.normalize,
        max_length=src.max_length,
        inputs=exported.inputs,
        output=opts.task.output,
        target=opts.target,
        variant=best.name,
        precision=best.precision,
        variants=[asdict(r) | {"chosen": r.name == best.name} for r in tuned.reports],
        machine=describe() | {"tune_threads": opts.tune_threads},
        pick=asdict(tuned.pick),
        int8_levels=int(best.build.get("levels", FULL_LEVELS)),  # blockwise int8 and fp32: not narrowed
        versions=versions(("hare", "onnxruntime", "onnx", "tokenizers", "transformers", "torch")),
        source={
            "path": str(opts.model_dir.resolve()),
            "adapter": src.config.get("hare_adapter"),
            "weights": [p.name for p in src.weights],
            "weights_sha256": src.weights_sha256,
            "trust_remote_code": src.trust_remote_code,
            "fusion_model_type": FUSION_MODEL_TYPE,
            "fused_operators": _fused_counts(fused),
            "additive_masks": exported.additive_masks,
            "pooled_row_matmuls": exported.pooled_row,
        },
        dense=[
            {"in_features": d.in_features, "out_features": d.out_features, "bias": d.bias, "activation": d.activation}
            for d in src.dense
        ],
        prompts=src.prompts,
        default_prompt_name=src.default_prompt_name,
        activation=src.activation,
        pad_id=src.pad_id or 0,
        pair_template=src.pair_template,
        name=opts.out.resolve().name,
        heads=src.sparse.outputs if src.sparse else [],
        max_active_dims=src.sparse.max_active_dims if src.sparse else None,
        truncate_dim=src.truncate_dim,
        **(autotune.budget_fields(token_rates, streams) if token_rates else {}),
    )


def _fused_counts(fused: Path) -> dict[str, int]:
    """Fused operator counts of the fused graph (what the fusion stage achieved)."""
    import onnx

    if not fused.exists():
        return {}
    counts: dict[str, int] = {}
    for node in onnx.load(str(fused), load_external_data=False).graph.node:
        if node.domain == "com.microsoft":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
