"""What a run measures: a server URL, a bundle, or a Hugging Face model folder (optimized into a cached bundle
first), and the facts the bench needs about it (task, tokenizer, the model folder for the baselines)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.servers import split_url
from bench.store import default_db_path
from container.bundle import MANIFEST_FILE, TOKENIZER_FILE, read_manifest
from tasks.errors import InputError

VERSIONED = ("hare", "onnxruntime", "tokenizers", "numpy", "starlette", "uvicorn", "gunicorn", "transformers", "torch")


@dataclass(frozen=True)
class Subject:
    """url: a server to load as is (None: the bench starts `hare serve BUNDLE`).
    bundle: the bundle served (for the tokenizer, the manifest hash and the model-only figure).
    model_dir: the Hugging Face folder the baselines load."""

    task: str
    url: str | None = None
    bundle: Path | None = None
    model_dir: Path | None = None
    tokenizer: Path | None = None

    @property
    def label(self) -> str:
        return self.url or str(self.bundle)


def cache_dir() -> Path:
    """Where the bench keeps bundles it built: beside the result store."""
    return default_db_path().parent / "bench-cache"


def manifest_hash(bundle: Path | None) -> str:
    if bundle is None or not (bundle / MANIFEST_FILE).is_file():
        return ""
    return hashlib.sha256((bundle / MANIFEST_FILE).read_bytes()).hexdigest()


def is_bundle(path: Path) -> bool:
    return (path / MANIFEST_FILE).is_file()


def _current(bundle: Path, variants: list[str] | None) -> bool:
    """A cached bundle as this hare builds it from `variants` (None: the default build's), or the bench would
    measure a server no user of this hare runs: one from before the optimizer measured a batch budget is served
    at the old fixed one, one from before masks were made additive keeps DistilBERT's slower attention, and
    one that did not race every variant asked for may have missed the faster."""
    if not is_bundle(bundle):
        return False
    manifest = read_manifest(bundle)
    budget = manifest.target != "cpu" or manifest.max_batch_tokens is not None
    raced = {v["name"] for v in manifest.variants}
    return budget and "additive_masks" in manifest.source and set(variants or ()) <= raced


def bundle_for_model(model_dir: Path, task: str, out: Path | None = None, variants: list[str] | None = None) -> Path:
    """`hare optimize` a model folder into the bench cache (reused while the weights are the same)."""
    from container.optimize.pipeline import OptimizeOptions, optimize
    from container.optimize.source import inspect_source
    from tasks.registry import get_task

    spec = get_task(task)
    source = inspect_source(model_dir, spec)
    out = out or cache_dir() / f"{source.weights_sha256[:16]}-{task}"
    if _current(out, variants):
        return out
    optimize(OptimizeOptions(model_dir=model_dir, task=spec, out=out, force=True, only=variants))
    return out


def resolve(
    target: str,
    task: str | None = None,
    model_dir: Path | None = None,
    bundle: Path | None = None,
    tokenizer: Path | None = None,
) -> Subject:
    """Turn the CLI's TARGET (URL, bundle or model folder) and options into a Subject."""
    if target.startswith("http://") or target.startswith("https://"):
        split_url(target)  # a URL the bench cannot load, refused before a run is stored as failed
        if bundle is not None:
            task = task or read_manifest(bundle).task
            model_dir = model_dir or _source_dir(bundle)
        if task is None:
            raise InputError("with a URL, say the task (--task) or the bundle it serves (--bundle)")
        tok = tokenizer or (bundle / TOKENIZER_FILE if bundle is not None else None)
        return Subject(task=task, url=target.rstrip("/"), bundle=bundle, model_dir=model_dir, tokenizer=tok)
    path = Path(target)
    if is_bundle(path):
        manifest = read_manifest(path)
        if task is not None and task != manifest.task:
            raise InputError(f"{path} serves {manifest.task}, not {task}")
        return Subject(
            task=manifest.task,
            bundle=path,
            model_dir=model_dir or _source_dir(path),
            tokenizer=tokenizer or path / TOKENIZER_FILE,
        )
    if (path / "config.json").is_file():
        if task is None:
            raise InputError(f"{path} is a model folder: say which task to serve it for (--task)")
        built = bundle_for_model(path, task)
        return Subject(task=task, bundle=built, model_dir=path, tokenizer=built / TOKENIZER_FILE)
    raise InputError(f"{target} is neither a URL, a hare bundle (hare.json) nor a model folder (config.json)")


def check_model_dir(model_dir: Path, bundle: Path | None) -> None:
    """InputError unless `model_dir` is a Hugging Face folder of the bundle's model type: the baselines loaded
    what they were given after hare's points had run (a missing folder failed them minutes into the run, and
    another model was measured as hare's baseline)."""
    config = model_dir / "config.json"
    if not config.is_file():
        raise InputError(f"--model {model_dir} is not a Hugging Face model folder (no config.json)")
    if bundle is None:
        return
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (ValueError, AttributeError):
        raise InputError(f"{config} is not a JSON object of a model's configuration") from None
    served = read_manifest(bundle).model_type
    if model_type != served:
        raise InputError(
            f"--model {model_dir} is a {model_type!r} model, and {bundle} serves a {served!r} one: the baselines "
            "must run the model the bundle was built from"
        )


def _source_dir(bundle: Path) -> Path | None:
    """The model folder the bundle was built from, if it is still there (the baselines need it)."""
    source: dict[str, Any] = read_manifest(bundle).source
    path = Path(str(source.get("path", "")))
    return path if source.get("path") and (path / "config.json").is_file() else None


def info_json(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
