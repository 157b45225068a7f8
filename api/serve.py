"""`hare serve [BUNDLE_DIR] [--host H] [--port P] [--workers N] [--profile throughput|latency] ...`

Checks the settings and the bundle, then replaces itself with gunicorn (exec: no shell or Python parent
in between, so SIGTERM reaches gunicorn and in-flight requests drain). Every flag sets its HARE_* variable;
gunicorn and its workers read the same variables (api/config.py, api/gunicorn_conf.py).

With no BUNDLE_DIR (and no HARE_BUNDLE), serves bundles/all-MiniLM-L6-v2, building it first when missing
(that needs the optimizer extra).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from api.config import PROFILES, Settings
from container.bundle import read_manifest
from container.defaults import DEFAULT_BUNDLE, DEFAULT_TASK
from tasks.errors import InputError

APP = "api.app:create_app_from_env()"
CONFIG = "python:api.gunicorn_conf"

# flag dest -> variable; flags left unset fall back to the environment, then to the defaults.
FLAGS = {
    "bundle_dir": "HARE_BUNDLE",
    "host": "HARE_HOST",
    "port": "HARE_PORT",
    "workers": "HARE_WORKERS",
    "streams": "HARE_STREAMS",
    "threads": "HARE_THREADS",
    "profile": "HARE_PROFILE",
    "target": "HARE_TARGET",
    "max_batch_size": "HARE_MAX_BATCH_SIZE",
    "max_batch_tokens": "HARE_MAX_BATCH_TOKENS",
    "max_wait_ms": "HARE_MAX_WAIT_MS",
    "queue_size": "HARE_QUEUE_SIZE",
    "max_queue_ms": "HARE_MAX_QUEUE_MS",
    "refusal_interval_ms": "HARE_REFUSAL_INTERVAL_MS",
    "refusals_per_answer": "HARE_REFUSALS_PER_ANSWER",
    "refuse_in_accept": "HARE_REFUSE_IN_ACCEPT",
    "inline_ms": "HARE_INLINE_MS",
    "cores": "HARE_CORES",
    "log_level": "HARE_LOG_LEVEL",
    "model_name": "HARE_MODEL_NAME",
}
# on/off flags -> the variable they set to 1
SWITCHES = {"public": "HARE_PUBLIC", "access_log": "HARE_ACCESS_LOG"}


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle_dir", nargs="?", type=Path, help=f"bundle from `hare optimize` (default {DEFAULT_BUNDLE})")
    p.add_argument("--host", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, help="port (default 8080)")
    p.add_argument("--workers", type=int, help="worker processes (default: one per physical core; latency: 1)")
    p.add_argument(
        "--streams", type=int, help="model calls at once per worker (default: 2, or the worker's share of the cores)"
    )
    p.add_argument("--threads", type=int, help="ONNX Runtime threads per stream (default: 1; latency: all cores)")
    p.add_argument("--profile", choices=PROFILES, help="throughput (default) or latency")
    p.add_argument("--target", choices=["cpu", "gpu"], help="execution provider (default: the bundle's target)")
    p.add_argument("--max-batch-size", type=int, help="sequences per model call (default 32)")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        help="padded tokens per model call (default: the bundle's measured budget, else 8192)",
    )
    p.add_argument("--max-wait-ms", type=float, help="longest a batch waits to fill (default 0.3; 0: never)")
    p.add_argument("--queue-size", type=int, help="requests per worker before 429 (default 256)")
    p.add_argument("--max-queue-ms", type=float, help="longest expected queue wait admitted (default 1000; 0: none)")
    p.add_argument(
        "--refusals-per-answer",
        type=float,
        help="while refusing, new connections a second per answer a second of capacity (default 3; 0: the interval)",
    )
    p.add_argument(
        "--inline-ms",
        type=float,
        help="a worker alone on one connection runs calls expected under this on its event loop (default 50; 0: off)",
    )
    p.add_argument(
        "--refusal-interval-ms", type=float, help="while refusing, the least time between new connections (default 0.5)"
    )
    p.add_argument(
        "--refuse-in-accept",
        choices=["0", "1"],
        help="while refusing, answer POSTs a prebuilt 429 from the accept loop (default 1; 0: through the app)",
    )
    p.add_argument("--cores", type=int, help="cores the workers share (default: the cgroup's physical cores)")
    p.add_argument(
        "--public", action="store_true", help="public demo profile (rate limit, caps; see docs/deployment.md)"
    )
    p.add_argument("--model-name", help="the name clients use for the model (default: the bundle's folder name)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="log level (default info)")
    p.add_argument("--access-log", action="store_true", help="log every request line (never bodies)")


def environment(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """`base` with the flags given on the command line written over their HARE_* variables."""
    env = dict(base)
    for dest, key in FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            env[key] = str(value)
    for dest, key in SWITCHES.items():
        if getattr(args, dest, False):
            env[key] = "1"
    return env


def main(args: argparse.Namespace) -> int:
    env = environment(args, dict(os.environ))
    settings = Settings.from_env(env)
    if not settings.bundle.exists() and "HARE_BUNDLE" not in env and args.bundle_dir is None:
        build_default_bundle(settings.bundle)
    manifest = read_manifest(settings.bundle)  # refuse a broken bundle here, with its reason, not in every worker
    env["HARE_BUNDLE"] = str(settings.bundle.resolve())
    # Name the bundle's target when none was asked for: gunicorn sizes its workers for a GPU differently.
    env["HARE_TARGET"] = settings.target or manifest.target
    # Fresh metrics for this run: gunicorn_conf makes (and later removes) the folder.
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    argv = [sys.executable, "-m", "gunicorn", "-c", CONFIG, APP]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)  # exec: gunicorn takes over this PID and receives its signals
    return 0  # not reached


def build_default_bundle(out: Path) -> None:
    """Build the embedded default model's bundle (the optimizer, in this process, before the exec)."""
    print(f"hare serve: {out} is missing; building it with `hare optimize` (about a minute)", file=sys.stderr)
    try:
        from container.defaults import default_model_dir
        from container.optimize.pipeline import OptimizeOptions, optimize
        from tasks.registry import get_task

        model_dir = default_model_dir()
    except ImportError as exc:
        raise InputError(
            f"building the default bundle needs the optimizer extra ({exc.name} is missing): "
            "pip install -e '.[optimize]', or pass a BUNDLE_DIR built elsewhere"
        ) from exc
    optimize(OptimizeOptions(model_dir=model_dir, task=get_task(DEFAULT_TASK), out=out))
