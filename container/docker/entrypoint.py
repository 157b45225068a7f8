"""The images' entrypoint: decide what to serve, then become `hare serve`.

It replaces itself with `hare serve` (exec, no shell or Python parent left behind), so gunicorn's master is
the container's main process and `docker stop`'s SIGTERM reaches it: in-flight requests drain.

What is served, from `HARE_BUNDLE` (default /bundle, where the image keeps its default model's bundle and
where users mount theirs):
- a hare bundle (hare.json): served as is;
- a raw Hugging Face model folder (config.json, no hare.json): `HARE_TASK` names the task and the optimizer
  runs once into `HARE_CACHE_DIR` (default /cache, meant to be a volume), keyed by the folder's content, the
  task, the target (`HARE_TARGET`, else gpu where onnxruntime has CUDA) and `HARE_OPTIMIZE_ARGS`; later
  starts serve the cached bundle, named as the folder (`HARE_MODEL_NAME` wins). Only the optimizer images
  (hare:cpu-optimizer, hare:gpu-optimizer) carry torch for that; the serving images refuse with a message.

`docker run IMAGE optimize|tune|bench ...` runs that `hare` subcommand instead; other arguments go to `hare serve`.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

DEFAULT_BUNDLE = "/bundle"
DEFAULT_CACHE = "/cache"
OTHER_COMMANDS = ("optimize", "tune", "bench", "console")


class SetupError(Exception):
    """The container cannot start as configured; the message says what to change."""


def is_bundle(folder: Path) -> bool:
    return (folder / "hare.json").is_file()


def is_hf_model(folder: Path) -> bool:
    return (folder / "config.json").is_file() and not is_bundle(folder)


def model_digest(folder: Path) -> str:
    """sha256 over the folder's file names and contents: a changed model gets a new cache entry."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue  # .git, .cache and the like say nothing about the model
        digest.update(str(rel).encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def optimizer_available() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


def detect_target() -> str:
    """gpu where this onnxruntime has the CUDA provider (the GPU images), else cpu."""
    import onnxruntime

    return "gpu" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "cpu"


def cached_bundle(model: Path, env: Mapping[str, str]) -> Path:
    """The bundle for raw model folder `model`, built by the optimizer the first time."""
    task = env.get("HARE_TASK", "")
    if not task:
        raise SetupError(
            f"{model} is a Hugging Face model folder, not a hare bundle: set HARE_TASK to its task "
            "(feature-extraction, text-classification, token-classification, text-ranking) so it can be optimized"
        )
    if not optimizer_available():
        raise SetupError(
            f"{model} is a Hugging Face model folder, and this image serves bundles only (no torch/transformers). "
            "Use the hare:cpu-optimizer (or hare:gpu-optimizer) image to optimize it at start, or build a bundle "
            "with `hare optimize` and mount that at /bundle"
        )
    target = env.get("HARE_TARGET") or detect_target()
    extra = shlex.split(env.get("HARE_OPTIMIZE_ARGS", ""))
    key = hashlib.sha256(f"{model_digest(model)}|{task}|{target}|{extra}".encode()).hexdigest()[:16]
    cache = Path(env.get("HARE_CACHE_DIR", DEFAULT_CACHE)) / "bundles"
    out = cache / f"{model.name or 'model'}-{task}-{target}-{key}"
    cache.mkdir(parents=True, exist_ok=True)
    # Replicas sharing the cache volume: one optimizes, the others wait and then reuse its bundle.
    with (cache / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_bundle(out):
            print(f"hare: serving the cached bundle {out} for {model}", file=sys.stderr)
            return out
        # A child process, not an import: the deploy files sit below the `hare` command line (hare/cli.py).
        args = ["optimize", str(model), "--task", task, "--target", target, "--out", str(out), "--force", *extra]
        child = subprocess.Popen([sys.executable, "-m", "hare.cli", *args])
        # PID 1 ignores a signal it has no handler for: docker stop's SIGTERM reached neither this process nor
        # the optimizer, and its SIGKILL cut the build short 10 s later. Passed on, it stops the build now (the
        # next start's build removes what it left in the cache).
        for stop in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop, lambda signum, _: child.send_signal(signum))
        print(f"hare: optimizing {model} for {task} on {target} into {out} (once; cached)", file=sys.stderr)
        code = child.wait()
        if code < 0:
            raise SetupError(f"stopped ({signal.Signals(-code).name}) while optimizing {model}; nothing is served")
        if code != 0:
            raise SetupError(f"the optimizer could not build a bundle from {model} (see above)")
    return out


def resolve(env: Mapping[str, str]) -> dict[str, str]:
    """Environment overrides for `hare serve`: HARE_BUNDLE pointing at a bundle."""
    folder = Path(env.get("HARE_BUNDLE", DEFAULT_BUNDLE))
    if is_hf_model(folder):
        # The cached bundle's folder name carries the model's hash, which changes with every new model file:
        # clients name the model (OpenAI's `model`, KServe's URL) by the mounted folder's name instead.
        return {
            "HARE_BUNDLE": str(cached_bundle(folder, env)),
            "HARE_MODEL_NAME": env.get("HARE_MODEL_NAME") or folder.name,
        }
    if folder.is_dir() and not is_bundle(folder) and not any(folder.iterdir()):
        raise SetupError(f"{folder} is empty: mount a hare bundle or a Hugging Face model folder there")
    return {"HARE_BUNDLE": str(folder)}


def command(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The `hare` command line to exec and the environment to exec it with."""
    args = list(argv)
    if args and args[0] in OTHER_COMMANDS:
        return ["hare", *args], dict(env)
    if args and args[0] == "serve":
        args = args[1:]
    return ["hare", "serve", *args], {**env, **resolve(env)}


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cmd, env = command(sys.argv[1:] if argv is None else argv, os.environ)
    except SetupError as exc:
        print(f"hare: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    sys.exit(main())
