"""Compose the optimizer's stages into a bundle. Each stage is a function from file to file (see the
stage modules); this module only orders them, shows progress, and writes the bundle atomically."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from tokenizers import Encoding, Tokenizer

from container.bundle import DENSE_FILE, MANIFEST_FILE, MODEL_FILE, PARITY_FILE, TOKENIZER_FILE, Manifest
from container.machine import describe, physical_cores, versions
from container.optimize import (
    adapters,
    autotune,
    export,
    fuse,
    graphs,
    masks,
    mixed,
    quantize,
    source,
    textset,
    tokenizer,
    validate,
)
from container.optimize.errors import UnsupportedModel, ValidationFailed
from container.runtime import PROVIDERS, available_targets
from tasks import text_ranking
from tasks.base import TaskSpec
from tasks.errors import HareError, InputError

# ONNX Runtime's transformer optimizer has one encoder model_type: "bert". Its fusions match subgraph patterns,
# so they also fuse the BERT-shaped parts of other encoders (LayerNorm, Gelu, SkipLayerNorm; Attention where
# the attention is BERT's); the fused-operator counts in the manifest say what was found.
FUSION_MODEL_TYPE = "bert"


@dataclass(frozen=True)
class Variant:
    """A candidate graph: built from `parent` (None: the export) by `build(parent_file, out_file)`, or, for a
    calibrated one, after the reference by `calibrate(parent_file, out_file, parity)`, which returns what it
    chose (for the manifest) and raises mixed.Refused, with the figures, when no graph of its kind can pass."""

    name: str
    precision: str
    parent: str | None
    build: Callable[[Path, Path], object] | None = None
    calibrate: Callable[[Path, Path, validate.Parity], dict[str, Any]] | None = None


def variants_for(target: str, family: str = FUSION_MODEL_TYPE, attention: tuple[int, int] = (0, 0)) -> list[Variant]:
    """The candidates worth trying per target; the export itself is always the fp32 baseline. Every family
    gets every candidate: a fusion that does not match a family's graph fuses less (or fails its build), and
    the gates decide what ships."""
    fp32 = Variant("fp32", "fp32", None)
    if target == "gpu":
        return [
            fp32,
            Variant("fused-fp32", "fp32", "fp32", lambda p, o: fuse.fuse(p, o, family, True, attention)),
            Variant("fused-fp16", "fp16", "fused-fp32", fuse.to_fp16),
        ]
    return [
        fp32,
        Variant("fused-fp32", "fp32", "fp32", lambda p, o: fuse.fuse(p, o, family, False, attention)),
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
        Variant("int8-mixed", "int8", "fp32", calibrate=mixed.build),
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
    trust_remote_code: bool = False
    tune_lengths: Sequence[int] = (16, 128, 384)
    tune_batches: Sequence[int] = (1, 8)
    tune_threads: int = 1
    tune_seconds: float = 0.2
    tune_streams: int = 0  # model calls at once while measuring the batch budget (0: one per physical core)
    adapter: str | None = None  # the task adapter (LoRA) baked into the weights, for a folder that has several


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
    adapter = adapters.choose(opts.model_dir, opts.adapter)
    names = [v.name for v in variants_for(opts.target)]
    unknown = set(opts.only or ()) - set(names)
    if unknown:
        raise InputError(f"unknown variant(s) {sorted(unknown)}; for {opts.target}: {names}")
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}.partial-", dir=opts.out.parent))
    try:
        model_dir = adapters.merge(opts.model_dir, adapter, folder / "merged") if adapter else opts.model_dir
        src = source.inspect_source(model_dir, opts.task, opts.allow_pickle, opts.trust_remote_code)
        if adapter in src.prompts:  # sentence-transformers' prompt of the same name goes with the adapter
            src = replace(src, default_prompt_name=adapter)
        candidates = variants_for(opts.target, attention=fuse.attention_shape(src.config))
        work = Work(folder, opts, src, candidates)
        _run(work, Stages(console))
        assert work.manifest is not None
        if opts.out.exists():
            shutil.rmtree(opts.out)
        os.replace(folder / "bundle", opts.out)
        return work.manifest
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Work:
    """The build's work folder and what the stages have made so far; each stage reads and fills its part."""

    folder: Path
    opts: OptimizeOptions
    src: source.SourceModel
    candidates: list[Variant]
    inputs: list[str] = field(default_factory=list)
    tokenizer: Tokenizer | None = None
    samples: list[textset.Sample] = field(default_factory=list)
    encodings: list[Encoding] = field(default_factory=list)
    reference: Path | None = None
    additive_masks: int = 0  # attention masks the export stage made additive (container/optimize/masks.py)
    build_errors: dict[str, str] = field(default_factory=dict)
    builds: dict[str, dict[str, Any]] = field(default_factory=dict)  # what each calibrated build chose
    reports: list[validate.VariantReport] = field(default_factory=list)
    pick: autotune.Pick | None = None
    parity: validate.Parity | None = None  # what the variants were judged against (it ships with the bundle)
    token_rates: dict[int, float] = field(default_factory=dict)
    manifest: Manifest | None = None

    def file(self, variant: str) -> Path:
        return self.folder / f"{variant}.onnx"

    @property
    def best(self) -> validate.VariantReport:
        """The variant that ships: autotune's pick among those that passed."""
        assert self.pick is not None
        return next(r for r in self.reports if r.name == self.pick.winner)

    @property
    def streams(self) -> int:
        """Model calls at once while the batch budget is measured (recorded with the machine)."""
        return self.opts.tune_streams or physical_cores()

    @property
    def tokenizer_file(self) -> Path:
        return self.folder / TOKENIZER_FILE

    @property
    def chosen(self) -> list[Variant]:
        return [v for v in self.candidates if not self.opts.only or v.name in self.opts.only]

    @property
    def needed(self) -> list[Variant]:
        """The chosen variants and their parents, but not the export (built by its own stage)."""
        parents = {v.name: v.parent for v in self.candidates}
        needed = set()
        for v in self.chosen:
            name: str | None = v.name
            while name is not None:
                needed.add(name)
                name = parents[name]
        return [v for v in self.candidates if v.name in needed and v.parent is not None]

    @property
    def to_build(self) -> list[Variant]:
        """What the fuse + quantize stage builds: the needed variants that take no calibration."""
        return [v for v in self.needed if v.calibrate is None]

    @property
    def to_calibrate(self) -> list[Variant]:
        """What the calibrated stage builds, after the reference (int8-mixed)."""
        return [v for v in self.needed if v.calibrate is not None]


Step = Callable[..., None]


def _export(w: Work, step: Step) -> None:
    w.inputs = export.export_onnx(w.src, w.opts.task, w.file("fp32"))
    w.additive_masks = masks.additive_masks(w.file("fp32"), w.file("fp32"))
    step()


def _tokenizer(w: Work, step: Step) -> None:
    w.tokenizer = Tokenizer.from_file(str(tokenizer.write_tokenizer(w.src, w.tokenizer_file)))
    step()


def _build(w: Work, step: Step) -> None:
    """Fused and quantized candidates. A build that fails (a fusion the graph does not fit, an operator the
    quantizer cannot take) costs that variant and its children only; its error goes to the manifest."""
    for v in w.to_build:
        assert v.parent is not None
        if v.parent in w.build_errors:
            w.build_errors[v.name] = f"its parent {v.parent} failed to build"
            continue
        assert v.build is not None
        try:
            fused = v.build(w.file(v.parent), w.file(v.name))
        except Exception as exc:  # any failure of the fusion/quantization tools is this variant's failure
            w.build_errors[v.name] = f"{type(exc).__name__}: {exc}"
            fused = "failed"
        step(f"{v.name} {fused}" if isinstance(fused, dict | str) else v.name)


def _reference(w: Work, step: Step) -> None:
    assert w.tokenizer is not None
    task = w.opts.task
    validation = w.opts.validation_file
    w.samples = (
        textset.file_samples(validation, task.pairs) if validation else textset.builtin_samples(w.tokenizer, task.pairs)
    )
    if w.src.pair_template:  # an LM reranker is validated on pairs written as it will read them
        t = w.src.pair_template
        w.samples = [
            textset.Sample(text_ranking.write_pair(t["format"], t["instruction"], s.text, s.pair or ""), None, s.group)
            for s in w.samples
        ]
    w.encodings = validate.encode_samples(w.tokenizer, w.samples)
    w.reference = validate.reference_outputs(w.src, task, w.encodings, w.inputs, w.folder / "reference.npz")
    o = w.opts
    w.parity = validate.Parity(
        w.reference, w.encodings, w.samples, task, w.src.pooling, o.thresholds or {}, o.target, w.src.multi_label
    )
    step()


def _calibrate(w: Work, step: Step) -> None:
    """Candidates chosen on the samples against the reference (int8-mixed, container/optimize/mixed.py). One
    that cannot meet the gates is refused with its figures, as a failed build; the rest go on."""
    for v in w.to_calibrate:
        assert v.parent is not None and v.calibrate is not None and w.parity is not None
        if v.parent in w.build_errors:
            w.build_errors[v.name] = f"its parent {v.parent} failed to build"
            continue
        try:
            w.builds[v.name] = v.calibrate(w.file(v.parent), w.file(v.name), w.parity)
        except mixed.Refused as exc:
            w.build_errors[v.name] = f"refused: {exc}"
        except Exception as exc:  # any failure of the quantization tools is this variant's failure
            w.build_errors[v.name] = f"{type(exc).__name__}: {exc}"
        kept = w.builds.get(v.name, {}).get("fp32")
        step(f"{v.name} ({len(kept)} MatMuls fp32)" if kept is not None else v.name)


def _validate(w: Work, step: Step) -> None:
    assert w.parity is not None
    parity = w.parity
    for v in w.chosen:
        if v.name in w.build_errors:
            report = validate.VariantReport.failed_build(v.name, v.precision, w.build_errors[v.name])
        else:
            report = validate.validate(w.file(v.name), v.name, v.precision, parity)
        report.build = w.builds.get(v.name, {})
        w.reports.append(report)
        step(v.name)
    if not any(r.passed for r in w.reports):
        failures = "; ".join(
            f"{r.name}: "
            + (r.error or ", ".join(f"{m}={g['value']:.4g}" for m, g in r.gates.items() if not g["passed"]))
            for r in w.reports
        )
        raise ValidationFailed(f"no variant passed the parity gates ({failures})")


def _autotune(w: Work, step: Step) -> None:
    """Every variant that passed, timed against the others in rounds; a tie goes to the more accurate."""
    assert w.tokenizer is not None
    o = w.opts
    passed = [r for r in w.reports if r.passed]
    timings, w.pick = autotune.tune(
        {r.name: w.file(r.name) for r in passed},
        w.tokenizer,
        o.tune_lengths,
        o.tune_batches,
        o.tune_threads,
        o.target,
        o.tune_seconds,
        prefer=by_accuracy(passed, o.task),
        step=step,
    )
    for r in passed:
        r.timings_ms = timings[r.name]


# Who takes a tie: the wider type first, then the task's first gate metric.
PRECISIONS = ("fp32", "fp16", "int8")


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


def _budget(w: Work, step: Step) -> None:
    # A GPU wants its batches large; on a CPU the rate by batch size decides (container/optimize/autotune.py).
    if w.opts.target == "cpu":
        assert w.tokenizer is not None
        o = w.opts
        w.token_rates = autotune.token_rates(
            w.file(w.best.name), w.tokenizer, w.streams, o.target, min_seconds=o.tune_seconds
        )
    step()


def _bundle(w: Work, step: Step) -> None:
    best = w.best
    bundle = w.folder / "bundle"
    bundle.mkdir()
    graphs.ship(w.file(best.name), bundle / MODEL_FILE)
    shutil.copyfile(w.tokenizer_file, bundle / TOKENIZER_FILE)
    if w.src.dense:
        # The Dense modules run in numpy after pooling (tasks/ops.Dense): their weights travel as plain arrays.
        np.savez(bundle / DENSE_FILE, **source.dense_weights(w.src.dense))  # type: ignore[arg-type]
    assert w.parity is not None
    validate.save_parity(bundle / PARITY_FILE, w.parity)
    w.manifest = _manifest(w, best)
    (bundle / MANIFEST_FILE).write_text(w.manifest.to_json())
    step()


@dataclass(frozen=True)
class Stage:
    """One stage of the build: its progress line, its function, and what to try when it fails."""

    name: str
    run: Callable[[Work, Step], None]
    hint: str
    steps: Callable[[Work], int] = lambda _w: 1


STAGES = (
    Stage(
        "export",
        _export,
        "check that transformers loads the folder with the task's Auto class; a model with its own code needs "
        "--trust-remote-code; an operator torch.onnx cannot export needs a newer torch",
    ),
    Stage("tokenizer", _tokenizer, "save a fast tokenizer (tokenizer.json) into the folder with transformers"),
    Stage(
        "fuse + quantize",
        _build,
        "pass --variants fp32 to skip optimized candidates",
        lambda w: len(w.to_build),
    ),
    Stage(
        "reference (PyTorch)",
        _reference,
        "check the model's max length (max_position_embeddings, tokenizer_config's model_max_length)",
    ),
    Stage(
        "mixed int8",
        _calibrate,
        "leave int8-mixed out of --variants",
        lambda w: len(w.to_calibrate),
    ),
    Stage("validate", _validate, "pass --variants fp32", lambda w: len(w.chosen)),
    Stage("autotune", _autotune, "pass --variants fp32", lambda _w: autotune.MAX_ROUNDS),
    Stage("batch budget", _budget, "pass --tune-streams 1, or set HARE_MAX_BATCH_TOKENS when serving"),
    Stage("bundle", _bundle, "check free disk space at --out"),
)


def _run(w: Work, stages: Stages) -> None:
    """Each stage in order. An unexpected failure stops the build with the stage, the cause and what to try;
    hare's own errors (gates not met, a refused input) pass through as they are."""
    with stages.progress:
        for stage in STAGES:
            with stages.stage(stage.name, stage.steps(w)) as step:
                try:
                    stage.run(w, step)
                except HareError:
                    raise
                except Exception as exc:
                    raise UnsupportedModel(
                        f"stage {stage.name} failed for {w.src.model_type} ({w.src.architecture}): "
                        f"{type(exc).__name__}: {_first_line(exc)}; try: {stage.hint}"
                    ) from exc


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "(no message)"


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


def _manifest(w: Work, best: validate.VariantReport) -> Manifest:
    opts, src = w.opts, w.src
    return Manifest(
        task=opts.task.name,
        architecture=src.architecture,
        model_type=src.model_type,
        labels=src.labels,
        multi_label=src.multi_label,
        pooling=src.pooling,
        normalize=src.normalize,
        max_length=src.max_length,
        inputs=w.inputs,
        output=opts.task.output,
        target=opts.target,
        variant=best.name,
        precision=best.precision,
        variants=[asdict(r) | {"chosen": r.name == best.name} for r in w.reports],
        machine=describe() | {"tune_threads": opts.tune_threads},
        pick=asdict(w.pick) if w.pick else {},
        versions=versions(("hare", "onnxruntime", "onnx", "tokenizers", "transformers", "torch")),
        source={
            "path": str(opts.model_dir.resolve()),
            "adapter": src.config.get("hare_adapter"),
            "weights": [p.name for p in src.weights],
            "weights_sha256": src.weights_sha256,
            "trust_remote_code": src.trust_remote_code,
            "fusion_model_type": FUSION_MODEL_TYPE,
            "fused_operators": _fused_counts(w.file("fused-fp32")),
            "additive_masks": w.additive_masks,
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
        heads=src.sparse.outputs if src.sparse else [],
        **(autotune.budget_fields(w.token_rates, w.streams) if w.token_rates else {}),
    )
