"""`hare serve [BUNDLE_DIR] [--host H] [--port P] [--workers N] [--profile throughput|latency] ...`

Checks the settings and the bundle, then replaces itself with gunicorn (exec: no shell or Python parent
in between, so SIGTERM reaches gunicorn and in-flight requests drain). Every flag sets its HARE_* variable;
gunicorn and its workers read the same variables (api/config.py, api/process/gunicorn_conf.py).

With no BUNDLE_DIR (and no HARE_BUNDLE), serves bundles/all-MiniLM-L6-v2, building it first when missing
(that needs the optimizer extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.config import WORKERS_A_CPU, Settings, describe, parse_bool
from api.process.memory import memory_need, memory_warning
from container.bundle import Manifest, checked_bundle, model_bytes
from container.defaults import DEFAULT_BUNDLE, DEFAULT_TASK
from container.machine import memory_room, usable_cpus
from container.runtime import check_target
from tasks.errors import InputError

APP = "api.web.app:create_app_from_env()"
CONFIG = "python:api.process.gunicorn_conf"

# Settings without a flag: secrets, whose value a flag would show in `ps` and in the shell's history. Set
# them in the environment (or a Kubernetes Secret).
ENV_ONLY = ("admin_token", "api_key")
BUNDLE_DEST = "bundle_dir"  # the positional BUNDLE_DIR sets HARE_BUNDLE


def flags() -> dict[str, tuple[str, str]]:
    """Every flag `hare serve` takes, generated from the settings fields: argparse dest -> (flag, variable)."""
    out = {BUNDLE_DEST: ("BUNDLE_DIR", "HARE_BUNDLE")}
    for f in dataclasses.fields(Settings):
        if f.name != "bundle" and f.name not in ENV_ONLY:
            out[f.name] = ("--" + f.name.replace("_", "-"), f.metadata["env"])
    return out


def configure(p: argparse.ArgumentParser) -> None:
    """One flag per setting (api/config.py): its help and default are the setting's, its value is checked by
    the setting's own parser, and it only sets the setting's HARE_* variable."""
    p.add_argument(
        BUNDLE_DEST, nargs="?", metavar="BUNDLE_DIR", help=f"bundle from `hare optimize` (default {DEFAULT_BUNDLE})"
    )
    settings = {f.name: f for f in dataclasses.fields(Settings)}
    defaults = {variable: default for variable, default, _ in describe()}
    for dest, (flag, variable) in flags().items():
        if dest == BUNDLE_DEST:
            continue
        f = settings[dest]
        text = f"{f.metadata['help']} ({variable}; default {defaults[variable].replace('`', '')})".replace("%", "%%")
        if f.metadata["parse"] is parse_bool:  # a switch: `--public` alone turns it on, `--public 0` off
            p.add_argument(flag, dest=dest, nargs="?", const="1", metavar="0|1", type=_checked(f), help=text)
        else:
            p.add_argument(flag, dest=dest, metavar=dest.split("_")[-1].upper(), type=_checked(f), help=text)
    p.add_argument(
        "--check",
        action="store_true",
        help="make every check hare serve makes before it starts, say what it would serve and how, and exit "
        "(0: it would start; 2: why not), starting nothing: for a deploy pipeline or an init container",
    )


def _checked(f: dataclasses.Field[Any]) -> Callable[[str], str]:
    """The flag's text, once the setting's parser accepts it (argparse names the flag when it does not)."""

    def check(text: str) -> str:
        try:
            f.metadata["parse"](text.strip())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    check.__name__ = f.name  # argparse's message: "invalid <name> value"
    return check


def environment(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    """`base` with the flags given on the command line written over their HARE_* variables."""
    env = dict(base)
    for dest, (_, variable) in flags().items():
        value = getattr(args, dest, None)
        if value is not None:
            env[variable] = str(value)
    return env


def main(args: argparse.Namespace) -> int:
    env = environment(args, dict(os.environ))
    settings = Settings.from_env(env)
    for sentence in Settings.misspelled(env):
        print(f"hare serve: {sentence}", file=sys.stderr)
    check_workers(settings)
    check_addresses(settings)  # before minutes of building the default bundle
    check_engine_socket(settings)
    if not settings.bundle.exists() and "HARE_BUNDLE" not in env and args.bundle_dir is None:
        if args.check:
            print(f"hare serve --check: {settings.bundle} is not built yet; hare serve builds it first (1-3 min)")
            return 0
        build_default_bundle(settings.bundle)
        check_addresses(settings)  # again: the port may have been taken while it was built
    manifest, _ = checked_bundle(settings.bundle, whole=True)  # a broken bundle refused here, not in every worker
    graph, room = model_bytes(settings.bundle), memory_room()
    if (said := memory_warning(settings, manifest, graph, room)) is not None:
        print(f"hare serve: warning: {said}", file=sys.stderr)
    # Name the bundle's target when none was asked for: gunicorn sizes its workers for a GPU differently. One
    # that this onnxruntime cannot run failed in the shared engine's process, its traceback and an abort shown.
    target = settings.target or manifest.target
    check_target(target)
    if args.check:
        print(plan(settings, manifest, target, memory_need(settings, manifest, graph)[0], room))
        return 0
    env["HARE_BUNDLE"] = str(settings.bundle.resolve())
    env["HARE_TARGET"] = target
    # Fresh metrics for this run: gunicorn_conf makes (and later removes) the folder.
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    argv = [sys.executable, "-m", "gunicorn", "-c", CONFIG, APP]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)  # exec: gunicorn takes over this PID and receives its signals
    return 0  # not reached


def plan(settings: Settings, manifest: Manifest, target: str, need: int, room: int) -> str:
    """What `hare serve --check` says it would serve, and how."""
    probes = f", probes on port {settings.probe_port}" if settings.probe_port else ""
    memory = f"about {need / 2**30:.1f} GB of the {room / 2**30:.1f} GB free" if room and need else "not estimated"
    return (
        f"hare serve --check: it would serve {settings.bundle.resolve()} ({manifest.task}, "
        f"{manifest.variant}, {target}) on {settings.host}:{settings.port}{probes}\n"
        f"  {settings.workers} worker(s) x {settings.streams} model stream(s) x {settings.threads} thread(s), on "
        f"{settings.cores} shared cores; memory: {memory}"
    )


def check_workers(settings: Settings) -> None:
    """Refuse more workers (or model streams a worker) than WORKERS_A_CPU a CPU hare may use, and more cores
    than there are CPUs: each worker is a process holding its own model (on a GPU, its tokenizer), and past a
    few a CPU they only wait on each other; `--workers 500` on 2 cores asked for 500 copies of the model."""
    most = WORKERS_A_CPU * usable_cpus()
    if settings.workers > most:
        raise InputError(
            f"HARE_WORKERS={settings.workers} (--workers): hare may use {usable_cpus()} CPU(s) here, and workers "
            f"past {WORKERS_A_CPU} a CPU only share them, each with its own copy of the model; give at most {most}"
        )
    # The same bound for a worker's model threads: their calls take turns on the cores (api/engine/cores.py),
    # and an OpenVINO bundle compiles a copy of the model for each. --streams 1000 on 2 cores: no worker was
    # ready after 150 s, with nothing in the log; 32 took 20 s to start against 3.
    if settings.streams > most:
        raise InputError(
            f"HARE_STREAMS={settings.streams} (--streams): hare may use {usable_cpus()} CPU(s) here, and model "
            f"streams past {WORKERS_A_CPU} a CPU only take turns on them (an OpenVINO bundle compiles a copy of "
            f"the model for each, and warming them up takes minutes); give at most {most}"
        )
    # The core pool's size: more than the CPUs there are lets that many model threads run at once on them, and
    # admission and the refusals' pace count that many cores draining the queue. --cores 1000 on 2 CPUs: a
    # lone request took 15.5 ms against 9.3, and 64 greedy clients were refused 9,444 times in 10 s (497 with
    # the default), the pace gone.
    if settings.cores > usable_cpus():
        raise InputError(
            f"HARE_CORES={settings.cores} (--cores): hare may use {usable_cpus()} CPU(s) here, and the workers would "
            f"run up to {settings.cores} model threads at once on them, admission counting as many cores draining "
            f"its queue; give at most {usable_cpus()} (0: the physical cores)"
        )


def check_engine_socket(settings: Settings) -> None:
    """Refuse a HARE_ENGINE_SOCKET where no engine listens: every worker waited 5 s for it, then failed its start
    with a traceback each, and gunicorn stopped ('Worker failed to boot'); the sentence that said why, 'the
    model engine at ... does not answer', was the last line of the first traceback."""
    path = settings.engine_socket
    if path is None:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(5)
        try:
            probe.connect(str(path))  # an engine takes a connection that closes at once for a worker's last
        except OSError as exc:
            raise InputError(
                f"HARE_ENGINE_SOCKET={path} (--engine-socket): no model engine listens there "
                f"({exc.strerror or exc}); leave it empty: hare serve starts a shared engine itself where "
                "HARE_ENGINE asks for one"
            ) from None


def check_addresses(settings: Settings) -> None:
    """Refuse the serving and probe addresses if this machine cannot listen on them (check_address)."""
    check_address(settings.host, settings.port)
    if settings.probe_port is not None:
        check_address(settings.host, settings.probe_port, "HARE_PROBE_PORT (--probe-port)")


def check_address(host: str, port: int, setting: str = "HARE_PORT (--port)") -> None:
    """Refuse an address this machine cannot listen on (a port in use, a host that is not one of its
    addresses) with the settings to change: gunicorn retried for five seconds, then exited naming neither."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise InputError(f"HARE_HOST={host!r} (--host) is not an address ({exc.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds: a closing socket is no bar
        try:
            probe.bind(address)
        except OSError as exc:
            raise InputError(
                f"cannot listen on {host}:{port} ({exc.strerror}); set {setting} to a free port, or "
                "HARE_HOST (--host) to an address of this machine"
            ) from None


def build_default_bundle(out: Path) -> None:
    """Build the embedded default model's bundle (the optimizer, in this process, before the exec)."""
    print(f"hare serve: {out} is missing; building it with `hare optimize` (a few minutes)", file=sys.stderr)
    try:
        from container.defaults import default_model_dir
        from container.optimize.cli import exit_on_signal
        from container.optimize.pipeline import OptimizeOptions, optimize
        from tasks.registry import get_task

        model_dir = default_model_dir()
    except ImportError as exc:
        raise InputError(
            f"building the default bundle needs the optimizer extra ({exc.name} is missing): "
            "pip install -e '.[optimize]', or pass a BUNDLE_DIR built elsewhere"
        ) from exc
    # As `hare optimize`: docker stop, Kubernetes or a timeout (SIGTERM) removes the build's folder and its lock.
    signal.signal(signal.SIGTERM, exit_on_signal)
    try:
        optimize(OptimizeOptions(model_dir=model_dir, task=get_task(DEFAULT_TASK), out=out))
    except (KeyboardInterrupt, SystemExit):
        print(f"hare serve: stopped; {out} is not built, and the build's working folder is removed", file=sys.stderr)
        raise
