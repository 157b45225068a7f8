"""Compose the optimizer's stages into a bundle. Each stage is a function from file to file (see the
stage modules); this module only orders them, shows progress, and writes the bundle atomically."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from tokenizers import Tokenizer

from container.bundle import MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE, Manifest
from container.machine import describe
from container.optimize import autotune, export, fuse, quantize, source, textset, tokenizer, validate
from container.runtime import PROVIDERS, available_targets
from tasks.base import TaskSpec
from tasks.errors import InputError, ValidationFailed


@dataclass(frozen=True)
class Variant:
    """A candidate graph: built from `parent` (None: the export) by `build(parent_file, out_file)`."""

    name: str
    precision: str
    parent: str | None
    build: Callable[[Path, Path], object]


def variants_for(target: str, family: str) -> list[Variant]:
    """The candidates worth trying per target; the export itself is always the fp32 baseline."""
    fp32 = Variant("fp32", "fp32", None, lambda _p, _o: None)
    if target == "gpu":
        return [
            fp32,
            Variant("fused-fp32", "fp32", "fp32", lambda p, o: fuse.fuse(p, o, family, use_gpu=True)),
            Variant("fused-fp16", "fp16", "fused-fp32", fuse.to_fp16),
        ]
    return [
        fp32,
        Variant("fused-fp32", "fp32", "fp32", lambda p, o: fuse.fuse(p, o, family)),
        Variant("int8", "int8", "fp32", quantize.quantize_int8),
        Variant("int8-per-channel", "int8", "fp32", lambda p, o: quantize.quantize_int8(p, o, per_channel=True)),
        Variant("fused-int8", "int8", "fused-fp32", quantize.quantize_int8),
        Variant(
            "fused-int8-per-channel",
            "int8",
            "fused-fp32",
            lambda p, o: quantize.quantize_int8(p, o, per_channel=True),
        ),
        Variant("int8-block32", "int8", "fp32", quantize.quantize_blockwise),
        Variant("int8-block128", "int8", "fp32", lambda p, o: quantize.quantize_blockwise(p, o, block=128)),
        Variant("fused-int8-block32", "int8", "fused-fp32", quantize.quantize_blockwise),
    ]


@dataclass(frozen=True)
class OptimizeOptions:
    """What `hare optimize` takes. thresholds: gate overrides by metric name (see tasks' gates)."""

    model_dir: Path
    task: TaskSpec
    out: Path
    target: str = "cpu"
    force: bool = False
    allow_pickle: bool = False
    validation_file: Path | None = None
    thresholds: Mapping[str, float] | None = None
    only: Sequence[str] | None = None
    tune_lengths: Sequence[int] = (16, 128, 384)
    tune_batches: Sequence[int] = (1, 8)
    tune_threads: int = 1
    tune_seconds: float = 0.2


class Stages:
    """Rich progress with one line per stage and its duration."""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<28}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )

    @contextmanager
    def stage(self, name: str, total: int = 1) -> Iterator[Callable[..., None]]:
        task_id = self.progress.add_task(name, total=total)
        start = time.perf_counter()

        def step(detail: str = "") -> None:
            self.progress.update(task_id, advance=1, description=f"{name} {detail}".strip())

        yield step
        self.progress.update(task_id, completed=total, description=f"{name} ({time.perf_counter() - start:.1f}s)")


def _versions() -> dict[str, str]:
    names = ("hare", "onnxruntime", "onnx", "tokenizers", "transformers", "torch")
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def optimize(opts: OptimizeOptions, console: Console | None = None) -> Manifest:
    """Build a bundle at `opts.out`; nothing is left there unless a variant passed every gate."""
    console = console or Console(stderr=True)
    if opts.out.exists() and not opts.force:
        raise InputError(f"output folder {opts.out} already exists; pass --force to replace it")
    if opts.target not in PROVIDERS:
        raise InputError(f"unknown target {opts.target!r}; choose {' or '.join(PROVIDERS)}")
    if opts.target not in available_targets():
        # Every variant is validated on the hardware it targets, so a GPU bundle is built on a GPU machine.
        raise InputError(
            f"--target {opts.target} validates and tunes on {PROVIDERS[opts.target][0]}, which this machine's "
            "onnxruntime lacks; run it where the GPU is (onnxruntime-gpu installed, e.g. the hare:gpu image)"
        )
    task = opts.task
    src = source.inspect_source(opts.model_dir, task, opts.allow_pickle)
    family = source.SUPPORTED_MODEL_TYPES[src.model_type]
    candidates = variants_for(opts.target, family)
    if opts.only:
        unknown = set(opts.only) - {v.name for v in candidates}
        if unknown:
            raise InputError(f"unknown variant(s) {sorted(unknown)}; for {opts.target}: {[v.name for v in candidates]}")
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}.partial-", dir=opts.out.parent))
    try:
        manifest = _run(opts, src, family, candidates, work, console)
        if opts.out.exists():
            shutil.rmtree(opts.out)
        os.replace(work / "bundle", opts.out)
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(
    opts: OptimizeOptions,
    src: source.SourceModel,
    family: str,
    candidates: list[Variant],
    work: Path,
    console: Console,
) -> Manifest:
    task = opts.task
    files = {v.name: work / f"{v.name}.onnx" for v in candidates}
    stages = Stages(console)
    with stages.progress:
        with stages.stage("export") as step:
            inputs = export.export_onnx(src, task, files["fp32"])
            step()
        with stages.stage("tokenizer") as step:
            tok_file = tokenizer.write_tokenizer(src, work / TOKENIZER_FILE)
            tok = Tokenizer.from_file(str(tok_file))
            step()
        built = [v for v in candidates if v.parent is not None]
        with stages.stage("fuse + quantize", total=len(built)) as step:
            for v in built:
                assert v.parent is not None
                fused = v.build(files[v.parent], files[v.name])
                step(f"{v.name} {fused}" if isinstance(fused, dict) else v.name)
        fused_ops = _fused_counts(files)
        samples = (
            textset.file_samples(opts.validation_file, task.pairs)
            if opts.validation_file
            else textset.builtin_samples(tok, task.pairs)
        )
        encodings = validate.encode_samples(tok, samples)
        with stages.stage("reference (PyTorch)") as step:
            ref = validate.reference_outputs(src, task, encodings, inputs, work / "reference.npz")
            step()
        chosen_names = [v.name for v in candidates if not opts.only or v.name in opts.only]
        reports: list[validate.VariantReport] = []
        with stages.stage("validate", total=len(chosen_names)) as step:
            for v in candidates:
                if v.name not in chosen_names:
                    continue
                reports.append(
                    validate.validate(
                        files[v.name], v.name, v.precision, ref, encodings, samples, task,
                        src.pooling, opts.thresholds or {}, opts.target,
                    )
                )  # fmt: skip
                step(v.name)
        passed = [r for r in reports if r.passed]
        if not passed:
            failures = "; ".join(
                f"{r.name}: " + ", ".join(f"{m}={g['value']:.4g}" for m, g in r.gates.items() if not g["passed"])
                for r in reports
            )
            raise ValidationFailed(f"no variant passed the parity gates ({failures})")
        with stages.stage("autotune", total=len(passed)) as step:
            for r in passed:
                r.timings_ms = autotune.time_variant(
                    files[r.name], tok, opts.tune_lengths, opts.tune_batches, opts.tune_threads,
                    opts.target, opts.tune_seconds,
                )  # fmt: skip
                step(r.name)
        best = min(passed, key=lambda r: autotune.score(r.timings_ms))
        with stages.stage("bundle") as step:
            bundle = work / "bundle"
            bundle.mkdir()
            shutil.copyfile(files[best.name], bundle / MODEL_FILE)
            shutil.copyfile(tok_file, bundle / TOKENIZER_FILE)
            manifest = _manifest(opts, src, inputs, best, reports, fused_ops)
            (bundle / MANIFEST_FILE).write_text(manifest.to_json())
            step()
    return manifest


def _fused_counts(files: Mapping[str, Path]) -> dict[str, int]:
    """Fused operator counts of the fused graph (what the fusion stage achieved)."""
    import onnx

    fused = files.get("fused-fp32")
    if fused is None or not fused.exists():
        return {}
    counts: dict[str, int] = {}
    for node in onnx.load(str(fused), load_external_data=False).graph.node:
        if node.domain == "com.microsoft":
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def _manifest(
    opts: OptimizeOptions,
    src: source.SourceModel,
    inputs: list[str],
    best: validate.VariantReport,
    reports: list[validate.VariantReport],
    fused_ops: dict[str, int],
) -> Manifest:
    return Manifest(
        task=opts.task.name,
        architecture=src.architecture,
        model_type=src.model_type,
        labels=src.labels,
        multi_label=src.multi_label,
        pooling=src.pooling,
        normalize=src.normalize,
        max_length=src.max_length,
        inputs=inputs,
        output=opts.task.output,
        target=opts.target,
        variant=best.name,
        precision=best.precision,
        variants=[asdict(r) | {"chosen": r.name == best.name} for r in reports],
        machine=describe() | {"tune_threads": opts.tune_threads},
        versions=_versions(),
        source={
            "path": str(src.path.resolve()),
            "weights": [p.name for p in src.weights],
            "weights_sha256": src.weights_sha256,
            "fused_operators": fused_ops,
        },
    )
