"""`hare optimize` composed: the stages (container/optimize/stages.py) in order, each given what the ones before
it returned, under one progress bar a stage; the bundle is written atomically."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from container import locking
from container.bundle import MANIFEST_FILE, TOKENIZER_FILE, Manifest
from container.machine import describe, physical_cores, weight_levels
from container.openvino_runtime import available as openvino_available
from container.openvino_runtime import bf16_capable
from container.optimize import adapters, autotune, fuse, grouped_int8, source, stages, static_int8, variants
from container.optimize.errors import UnsupportedModel
from container.optimize.options import OptimizeOptions
from container.runtime import PROVIDERS, available_targets
from tasks.errors import HareError, InputError

__all__ = ["HINTS", "OptimizeOptions", "Stages", "optimize"]

PARTIAL = ".partial-"  # a build's folder beside its --out: .NAME.partial-XXXX, its bundle renamed to NAME

# What to try when a stage fails unexpectedly, by stage (its progress line's name), in the order they run.
HINTS = {
    "export": "check that transformers loads the folder with the task's Auto class; a model with its own code "
    "needs --trust-remote-code; an operator torch.onnx cannot export needs a newer torch",
    "tokenizer": "save a fast tokenizer (tokenizer.json) into the folder with transformers",
    "fuse + quantize": "pass --variants fp32 to skip optimized candidates",
    "reference (PyTorch)": "check the model's max length (max_position_embeddings, tokenizer_config's "
    "model_max_length)",
    "mixed int8": "leave int8-mixed out of --variants",
    "validate": "pass --variants fp32",
    "autotune": "pass --variants fp32",
    "batch budget": "pass --tune-streams 1, or set HARE_MAX_BATCH_TOKENS when serving",
    "bundle": "check free disk space at --out",
}


def optimize(opts: OptimizeOptions, console: Console | None = None) -> Manifest:
    """Build a bundle at `opts.out`; nothing is left there unless a variant passed every gate."""
    console = console or Console(stderr=True)
    check_out(opts.out, opts.model_dir)
    if opts.target not in PROVIDERS:
        raise InputError(f"unknown target {opts.target!r}; choose {' or '.join(PROVIDERS)}")
    if opts.target not in available_targets():
        # Every variant is validated on the hardware it targets, so a GPU bundle is built on a GPU machine.
        raise InputError(
            f"--target {opts.target} validates and tunes on {PROVIDERS[opts.target][0]}, which this machine's "
            "onnxruntime lacks; run it where the GPU is (onnxruntime-gpu installed, e.g. the hare:gpu image)"
        )
    adapter = adapters.choose(opts.model_dir, opts.adapter)
    bf16 = opts.target == "cpu" and bf16_capable()
    names = [v.name for v in variants.variants_for(opts.target, bf16=True, openvino=True)]
    unknown = set(opts.only or ()) - set(names)
    if unknown:
        raise InputError(f"unknown variant(s) {sorted(unknown)}; for {opts.target}: {names}")
    if "bf16" in (opts.only or ()) and not bf16:
        raise InputError(
            "variant bf16 runs on OpenVINO's CPU plugin, which computes bf16 only on CPUs with AMX or AVX512_BF16 "
            "and needs the openvino package (pip install 'hare[openvino]'): this machine lacks one of them"
        )
    for name in sorted({static_int8.NAME, grouped_int8.NAME} & set(opts.only or ())):
        if not openvino_available():
            raise InputError(f"variant {name} runs on OpenVINO: pip install 'hare[openvino]'")
    with ExitStack() as stack:
        try:
            opts.out.parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(holding(opts.out))
            # Under the lock no other build of this --out runs: a build folder beside it is a killed one's
            # (kill -9, docker stop's SIGKILL of a container optimizing at start), which no `finally` removed.
            for stale in opts.out.parent.glob(f".{opts.out.name}{PARTIAL}*"):
                shutil.rmtree(stale, ignore_errors=True)
            folder = Path(tempfile.mkdtemp(prefix=f".{opts.out.name}{PARTIAL}", dir=opts.out.parent))
        except OSError as exc:
            raise InputError(f"--out {opts.out}: cannot write in {opts.out.parent} ({exc.strerror})") from None
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        check_replaceable(opts.out, opts.force)  # under the lock: another build may have just written it
        model_dir = adapters.merge(opts.model_dir, adapter, folder / "merged") if adapter else opts.model_dir
        src = source.inspect_source(model_dir, opts.task, opts.allow_pickle, opts.trust_remote_code)
        if adapter in src.prompts:  # sentence-transformers' prompt of the same name goes with the adapter
            src = replace(src, default_prompt_name=adapter)
        check_memory(opts, src)
        tried = candidates(opts.target, fuse.attention_shape(src.config), opts.int8_levels)
        manifest = _compose(opts, src, variants.plan(tried, opts.only), folder, console)
        # The old bundle moved aside, then the new one in: two renames, never a moment without a bundle
        # that a deletion of the whole old one would take. The old one goes with the build's folder.
        if opts.out.exists():
            os.replace(opts.out, folder / "replaced")
        os.replace(folder / "bundle", opts.out)
        return manifest


def check_memory(opts: OptimizeOptions, src: source.SourceModel) -> None:
    """Refuse, before the export, timing calls this machine's memory cannot hold, by the model's hidden size
    (autotune.fitting_tokens): the budgets named for the batch budget's streams at once, and the largest of
    --tune-batches x --tune-lengths, one call at a time. A CPU build's only: a GPU's calls hold its memory."""
    if opts.target != "cpu":
        return
    hidden = fuse.attention_shape(src.config)[1]
    if opts.tune_budgets:
        streams = opts.tune_streams or physical_cores()
        autotune.checked_budgets(opts.tune_budgets, autotune.fitting_tokens(hidden, streams))
    autotune.check_tune_points(opts.tune_lengths, opts.tune_batches, src.max_length, autotune.fitting_tokens(hidden, 1))


def check_out(out: Path, model_dir: Path) -> None:
    """Refuse, before any work, an --out the build would fail on or that --force must never replace: a file,
    and the current folder, the model's, or a folder holding either (--force deleted them with all they held)."""
    where = out.resolve()
    for held, what in ((Path.cwd().resolve(), "the current folder"), (model_dir.resolve(), "the model folder")):
        if where == held or where in held.parents:
            raise InputError(f"--out {out} is or holds {what}; give the bundle a folder of its own")
    if out.exists() and not out.is_dir():  # --force would fail only after the whole build
        raise InputError(f"--out {out} is a file; give a folder for the bundle")
    if mount_point(out):  # the finished bundle replaces --out by a rename, which a mount point refuses
        raise InputError(
            f"--out {out} is a mount point (a volume), which the build cannot replace with its bundle; give a "
            f"folder inside it, such as {out / 'bundle'}"
        )


def mount_point(path: Path) -> bool:
    """Whether something is mounted at `path`: a volume, or a folder bound onto itself or another of the same
    file system, which os.path.ismount misses (it compares the device with the parent's)."""
    if os.path.ismount(path):
        return True
    try:
        with open("/proc/self/mountinfo") as table:  # Linux; field 5 is where each mount is, spaces as \040
            where = {re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4]) for line in table}
    except OSError:
        return False
    return str(path.resolve()) in where


def check_replaceable(out: Path, force: bool) -> None:
    """An existing --out is replaced only with --force, and only if it is a bundle or empty: --force replaces a
    bundle, and a folder of other things (a model, a project) is not one."""
    if not out.exists():
        return
    if not force:
        raise InputError(f"output folder {out} already exists; pass --force to replace it")
    if not (out / MANIFEST_FILE).is_file() and any(out.iterdir()):
        raise InputError(
            f"--out {out} holds files but no bundle ({MANIFEST_FILE}); --force replaces a bundle only: give a new "
            "or empty folder"
        )


def holding(out: Path) -> AbstractContextManager[None]:
    """Hold `out` while building it: a second `hare optimize` onto it is refused at once (two builds each
    replaced the other's bundle, the second without --force). The kernel's lock on a hidden file beside it."""
    busy = f"another hare optimize is building {out}; wait for it, or give another --out"
    return locking.holding(out.parent / f".{out.name}.optimize-lock", busy)


def candidates(target: str, attention: tuple[int, int] = (0, 0), levels: int | None = None) -> list[variants.Variant]:
    """The variants a build for `target` can try on this machine (variants.variants_for): OpenVINO's where it is
    installed and the CPU computes bf16 or has int8 dot-product units, int8 weights of `levels` a side (None:
    what this CPU's int8 kernel adds exactly). `attention`: the model's (heads, hidden) for the fusion."""
    int8_path = describe()["int8_path"]
    on_cpu = target == "cpu"
    return variants.variants_for(
        target,
        attention=attention,
        levels=levels or weight_levels(int8_path),
        bf16=on_cpu and bf16_capable(),
        openvino=on_cpu and openvino_available(),
        int8_units=int8_path in grouped_int8.RUNS_ON,
    )


def _compose(
    opts: OptimizeOptions, src: source.SourceModel, plan: variants.Plan, folder: Path, console: Console
) -> Manifest:
    """The stages in order, each given what the ones before it returned; graphs and the bundle go in `folder`."""
    graph = partial(stages.variant_file, folder)
    with Stages(console, f"{src.model_type} ({src.architecture})") as stage:
        with stage("export") as step:
            exported = stages.export_fp32(src, opts.task, graph(variants.EXPORT), graph("fp32"), step)
        with stage("tokenizer") as step:
            tokenizer = stages.write_tokenizer(src, folder / TOKENIZER_FILE, step)
        with stage("fuse + quantize", len(plan.to_build)) as step:
            unbuilt = stages.build_variants(plan.to_build, folder, step)
        with stage("reference (PyTorch)") as step:
            parity = stages.reference(src, opts, tokenizer, exported.inputs, folder / "reference.npz", step)
        with stage("mixed int8", len(plan.to_calibrate)) as step:
            fit = partial(stages.calibration_reference, src, opts, tokenizer, exported.inputs, folder / "fit.npz")
            calibrated = stages.calibrate(plan.to_calibrate, folder, fit, unbuilt, step)
        with stage("validate", len(plan.chosen)) as step:
            failed = unbuilt | calibrated.failed
            reports = stages.validate_all(plan.chosen, folder, parity, failed, calibrated.builds, step)
        with stage("autotune", autotune.MAX_ROUNDS) as step:
            tuned = stages.pick_variant(reports, folder, tokenizer, opts, step)
        with stage("batch budget", len(opts.tune_budgets or autotune.BUDGETS) + autotune.MAX_ROUNDS) as step:
            streams = opts.tune_streams or physical_cores()  # model calls at once (recorded with the machine)
            rates = stages.budget(graph(tuned.best.name), tokenizer, streams, opts, step, tuned.best.name)
        with stage("bundle") as step:
            manifest = stages.manifest(opts, src, exported, tuned, rates, streams, graph("fused-fp32"))
            stages.write_bundle(folder / "bundle", folder, src, parity, manifest, step)
    return manifest


class Stages:
    """Rich progress with one line per stage and its duration. A stage's unexpected failure stops the build
    with the stage, the model, the cause and what to try (HINTS) as UnsupportedModel; hare's own errors (gates
    not met, a refused input) pass through as they are."""

    def __init__(self, console: Console, model: str) -> None:
        self.model = model
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<28}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        )

    def __enter__(self) -> Stages:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    @contextmanager
    def __call__(self, name: str, total: int = 1) -> Iterator[stages.Step]:
        hint = HINTS[name]
        task_id = self.progress.add_task(name, total=total)
        start = time.perf_counter()

        def step(detail: str = "") -> None:
            self.progress.update(task_id, advance=1, description=f"{name} {detail}".strip())

        try:
            yield step
        except HareError:
            raise
        except Exception as exc:
            raise UnsupportedModel(
                f"stage {name} failed for {self.model}: {type(exc).__name__}: {_first_line(exc)}; try: {hint}"
            ) from exc
        self.progress.update(task_id, completed=total, description=f"{name} ({time.perf_counter() - start:.1f}s)")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "(no message)"
