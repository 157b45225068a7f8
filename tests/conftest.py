"""Shared fixtures: tiny random models and their bundles, built once per test session, offline."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn
from unittest import mock

import pytest

if TYPE_CHECKING:
    from tokenizers import Encoding

    from container.optimize.source import SourceModel
    from tasks.base import TaskSpec

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Models with their own code (tests/test_remote_code.py) are copied here by transformers, not into ~/.cache;
# removed when this process exits (each test run, and each pytest-xdist worker, made its own and left it).
if "HF_MODULES_CACHE" not in os.environ:
    os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp(prefix="hare-hf-modules-")
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], ignore_errors=True)
# PyTorch on one thread, here and in the processes the tests start (set before torch is first imported). Its
# OpenMP pool buys nothing on models this tiny, and on a shared machine it costs most of the suite's time: a
# worker that waits for a core spins, and every operator waits for it (a tiny BERT's 51 reference rows took
# 10 s with two threads beside other work, 0.4 s with one). Results are the same within the tests' 1e-4.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ModelFactory = Callable[..., Path]


def unavailable(reason: str) -> NoReturn:
    """Skip a test that needs what this machine lacks (a Docker engine, its base image), or fail it where
    the run asked for everything (HARE_REQUIRE_ALL=1: `scripts/check --all`, CI), so that CI cannot go green
    by skipping what it installed."""
    if os.environ.get("HARE_REQUIRE_ALL") == "1":
        pytest.fail(f"{reason} (HARE_REQUIRE_ALL=1: this run needs it)", pytrace=False)
    pytest.skip(reason)


ExportFactory = Callable[..., tuple[Path, list[str]]]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    """tiny_model(task, arch="bert") -> a Hugging Face folder with random weights (cached per session)."""
    from tests.tiny_models import make_model

    cache: dict[tuple[str, str], Path] = {}

    def get(task: str, arch: str = "bert") -> Path:
        if (task, arch) not in cache:
            cache[task, arch] = make_model(tmp_path_factory.mktemp(f"{arch}-{task}"), task, arch)
        return cache[task, arch]

    return get


class TorchWork:
    """What the optimizer asks of PyTorch for a model folder and task, done once per session: its ONNX export
    (export.export_onnx) and its reference outputs on the validation samples (validate.reference_outputs).
    A tiny model's stage test (tests/test_optimize_stages.py), its fp32 bundle, its fp32+int8 bundle... each
    needed both; both are deterministic (the same bytes from the same files), so the first call runs the real
    function and keeps what it wrote, and later calls for the same folder (same files, sizes and times), task
    and inputs copy it."""

    def __init__(self, folder: Path) -> None:
        from container.optimize import export, validate

        self.folder = folder
        self.kept: dict[tuple[object, ...], tuple[Path, list[str]]] = {}
        self.real_export = export.export_onnx
        self.real_reference = validate.reference_outputs

    def export(self, source: SourceModel, task: TaskSpec, out: Path) -> list[str]:
        """export.export_onnx's answer."""
        key = ("export", *self._model(source, task))
        if key not in self.kept:
            before = set(out.parent.iterdir())
            inputs = self.real_export(source, task, out)
            if set(out.parent.iterdir()) - before != {out}:  # external data files beside it: not kept
                return inputs
            self._keep(key, out, inputs)
        graph, inputs = self.kept[key]
        shutil.copyfile(graph, out)
        return list(inputs)

    def reference(
        self, source: SourceModel, task: TaskSpec, encodings: Sequence[Encoding], inputs: Sequence[str], out: Path
    ) -> Path:
        """validate.reference_outputs's answer."""
        digest = hashlib.sha256()
        for enc in encodings:
            for ids in (enc.ids, enc.type_ids, enc.attention_mask):
                digest.update(repr(ids).encode())
        key = ("reference", *self._model(source, task), tuple(inputs), digest.hexdigest())
        if key not in self.kept:
            self._keep(key, self.real_reference(source, task, encodings, inputs, out), [])
        shutil.copyfile(self.kept[key][0], out)
        return out

    @contextmanager
    def reused(self) -> Iterator[None]:
        """Within: the optimizer's export and reference go through `export` and `reference` (the build is
        otherwise the real one)."""
        from container.optimize import export, validate

        with (
            mock.patch.object(export, "export_onnx", self.export),
            mock.patch.object(validate, "reference_outputs", self.reference),
        ):
            yield

    @staticmethod
    def _model(source: SourceModel, task: TaskSpec) -> tuple[object, ...]:
        files = tuple(
            (str(p.relative_to(source.path)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(source.path.rglob("*"))
            if p.is_file()
        )
        return source.path.resolve(), task.name, source.trust_remote_code, files

    def _keep(self, key: tuple[object, ...], written: Path, inputs: list[str]) -> None:
        kept = self.folder / f"{len(self.kept)}{written.suffix}"
        shutil.copyfile(written, kept)
        self.kept[key] = kept, list(inputs)


@pytest.fixture(scope="session")
def torch_work(tmp_path_factory: pytest.TempPathFactory) -> TorchWork:
    return TorchWork(tmp_path_factory.mktemp("torch-work"))


@pytest.fixture(scope="session")
def tiny_export(
    tiny_model: ModelFactory, torch_work: TorchWork, tmp_path_factory: pytest.TempPathFactory
) -> ExportFactory:
    """tiny_export(task, arch="bert") -> (the raw fp32 export of tiny_model(task, arch), as export.export_onnx
    wrote it before any other stage, and its input names); shared with the bundle fixtures' builds. Copy the
    graph before changing it."""
    from container.optimize import source
    from tasks.registry import get_task

    def get(task: str, arch: str = "bert") -> tuple[Path, list[str]]:
        spec = get_task(task)
        out = tmp_path_factory.mktemp(f"export-{arch}-{task}") / "fp32.onnx"
        inputs = torch_work.export(source.inspect_source(tiny_model(task, arch), spec), spec, out)
        return out, inputs

    return get


def quick_bundle(
    model: Path, task: str, out: Path, variants: Sequence[str] = ("fp32",), torch_work: TorchWork | None = None
) -> Path:
    """`model` through the real optimizer into `out`, limited to `variants`, with quick tuning (one point, and
    the batch budget measured with one stream); its export and reference shared through `torch_work` if given."""
    from container.optimize.pipeline import OptimizeOptions, optimize
    from tasks.registry import get_task

    options = OptimizeOptions(
        model_dir=model,
        task=get_task(task),
        out=out,
        only=list(variants),
        tune_lengths=[8],
        tune_batches=[1],
        tune_seconds=0.01,
        tune_streams=1,
    )
    if torch_work is None:
        optimize(options)
    else:
        with torch_work.reused():
            optimize(options)
    return out


def _bundle_factory(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: ModelFactory, torch_work: TorchWork, variants: list[str]
) -> ModelFactory:
    """Bundles of tiny models from the real optimizer, limited to `variants`, with quick tuning; cached, and
    built from the session's one export (and reference outputs) of each model."""
    cache: dict[tuple[str, str], Path] = {}

    def get(task: str, arch: str = "bert") -> Path:
        if (task, arch) not in cache:
            out = tmp_path_factory.mktemp("bundles") / f"{arch}-{task}"
            cache[task, arch] = quick_bundle(tiny_model(task, arch), task, out, variants, torch_work)
        return cache[task, arch]

    return get


@pytest.fixture(scope="session")
def tiny_bundle(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: ModelFactory, torch_work: TorchWork
) -> ModelFactory:
    """tiny_bundle(task, arch="bert") -> a bundle from the real optimizer (fp32 and int8 candidates, quick tuning)."""
    return _bundle_factory(tmp_path_factory, tiny_model, torch_work, ["fp32", "int8"])


@pytest.fixture(scope="session")
def fp32_bundle(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: ModelFactory, torch_work: TorchWork
) -> ModelFactory:
    """fp32_bundle(task, arch="bert") -> a bundle of the fp32 export only, for exact parity with transformers
    (tiny random models score near-uniformly, so int8 noise could flip their labels)."""
    return _bundle_factory(tmp_path_factory, tiny_model, torch_work, ["fp32"])
