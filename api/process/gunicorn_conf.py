"""gunicorn's settings for `hare serve`
(`gunicorn -c python:api.process.gunicorn_conf api.web.app:create_app_from_env()`), from the same HARE_*
environment the app reads (api/config.py), so the CLI and a container entrypoint that calls gunicorn directly
behave the same.

- uvicorn workers (api/process/worker.py: uvicorn-worker's UvicornWorker, uvloop + httptools, with an accept loop
  that paces refusals), one per physical core by default,
  each running HARE_STREAMS model threads (api/engine/batching.py).
- Graceful drain: on SIGTERM gunicorn stops accepting, each worker finishes its in-flight requests (up to
  HARE_GRACEFUL_TIMEOUT seconds), then exits; gunicorn restarts a worker that dies.
- One core pool for the machine (api/engine/cores.py): a folder in /dev/shm made here, in the master, before the
  workers fork, named to them by HARE_CORE_POOL; a worker's model calls hold cores there, so all workers
  together never run more ONNX Runtime threads than HARE_CORES. When a worker dies, its slot is cleared
  (the kernel already dropped its core locks).
- Cheap refusal: a 429 closes its connection (api/web/errors.py); while admission refuses, a worker answers a new
  connection's POST with a prebuilt 429 from its accept loop, paced by the measured capacity (api/process/worker.py,
  api/process/refuser.py), so refusals keep up with arrivals and a greedy flood waits in the listen backlog.
- A shared engine where the settings ask for one (HARE_ENGINE; a GPU bundle with several workers by default):
  started here before the workers (api/process/engine.py), which reach it by HARE_ENGINE_SOCKET, and stopped
  after them (its stdin closed); the server does not start if the engine does not, and stops (its workers
  draining) if the engine dies, so that whatever runs it (Docker, Kubernetes) restarts the whole.
- SIGHUP (gunicorn's reload: new workers on the bundle on disk, the old ones drained) checks the bundle first, as
  `hare serve` does before it starts, and refuses the reload with its reason in the log when the bundle fails the
  check or a shared engine holds the model (the engine is not reloaded): the old workers serve on. Unchecked, a
  bundle replaced by a broken one stopped the whole server ("Worker failed to boot"). On a CPU the old workers
  serve until the new ones accept (the core pool's page says when): gunicorn's own reload stopped them at once,
  and nothing accepted while the new ones loaded and warmed their model (the default MiniLM: clients waited up to
  1.9 s; a SIGTERM in that window reset every request waiting in the listen backlog).
- Prometheus multiprocess mode: every worker writes its samples under PROMETHEUS_MULTIPROC_DIR, a fresh
  folder made here (before prometheus_client is imported anywhere, since it reads the variable on import)
  and removed when gunicorn exits; a dead worker's live gauges are dropped.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from api.config import Settings
from api.engine.cores import accepting, forget
from api.process import scratch
from api.process.memory import memory_need
from container.bundle import checked_bundle, model_bytes, read_manifest  # its tokenizers and tasks only when called
from container.machine import memory_room

ENGINE_START_SECONDS = 600  # a big model's load and its graphs' capture

_settings = Settings.from_env()

_SHM = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
scratch.sweep()  # what a master killed outright left (api/process/scratch.py)
if _SHM is not None:
    scratch.sweep(_SHM)
_owned_metrics_dir: str | None = None
if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    _owned_metrics_dir = scratch.make("metrics")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = _owned_metrics_dir
_owned_core_pool: str | None = None
_core_pool: Path
if _settings.core_pool is None:
    _owned_core_pool = scratch.make("cores", _SHM)
    os.environ["HARE_CORE_POOL"] = _owned_core_pool  # the workers' Settings read it
    _core_pool = Path(_owned_core_pool)
else:
    _core_pool = _settings.core_pool
# Workers inherit this environment: keep each one's libraries to its share of the cores.
os.environ.setdefault("OMP_NUM_THREADS", str(_settings.threads))
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
if _settings.threads == 1:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Every connection is a descriptor: the soft limit, 1,024 by default under systemd, is raised to the hard one
# (as Go's runtime does) in the master, whose workers inherit it. Idle connections cost only memory then.
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if 0 <= _soft < _hard:  # (never unlimited: the kernel caps descriptors at fs.nr_open)
    with contextlib.suppress(ValueError, OSError):  # refused: serve at the soft one
        resource.setrlimit(resource.RLIMIT_NOFILE, (_hard, _hard))

_host = f"[{_settings.host}]" if ":" in _settings.host else _settings.host
bind = [f"{_host}:{port}" for port in (_settings.port, _settings.probe_port) if port is not None]
workers = _settings.workers
worker_class = "api.process.worker.HareWorker"
graceful_timeout = _settings.graceful_timeout
# heartbeat: a serving worker silent this long is replaced. Not one loading its model: gunicorn counts from the
# first heartbeat, which uvicorn sends once serving (a load held 130 s was left to finish, and served).
timeout = 120
keepalive = 5
backlog = 256  # connections waiting for accept(); beyond it the kernel makes clients retry
loglevel = _settings.log_level
errorlog = "-"
accesslog = "-" if _settings.access_log else None
forwarded_allow_ips = _settings.forwarded_allow_ips
proc_name = "hare"
preload_app = False  # each worker loads its own ONNX Runtime session after the fork
control_socket_disable = True  # gunicorn 25+ control socket: one fixed path per user would collide between servers
if Path("/dev/shm").is_dir():
    worker_tmp_dir = "/dev/shm"  # heartbeat files off the (possibly slow, possibly read-only) disk


_engine: subprocess.Popen[bytes] | None = None
_engine_dir: str | None = None
_stopping = False  # on_exit stops the engine: not a death to report
_engine_died = False  # then the server exits with status 1, not a clean stop's 0


def on_starting(server: Any) -> None:
    """Start from an empty metrics folder (samples of a previous run must not leak into this one), and start
    the shared engine if there is to be one."""
    folder = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.db"):
        stale.unlink()
    if _settings.engine_socket is None and _settings.shared_engine(read_manifest(_settings.bundle)):
        start_engine(server)


def start_engine(server: Any) -> None:
    """The engine process, listening before this returns; RuntimeError if it exits or does not listen."""
    global _engine, _engine_dir
    _engine_dir = scratch.make("engine")
    socket = Path(_engine_dir) / "engine.sock"
    os.environ["HARE_ENGINE_SOCKET"] = str(socket)  # the workers, forked after this, read it
    # Its stdin: the engine runs until this pipe's write end is closed everywhere (on_exit, or the master and the
    # workers, who inherit it, dying).
    _engine = subprocess.Popen([sys.executable, "-m", "api.process.engine"], stdin=subprocess.PIPE)
    deadline = time.monotonic() + ENGINE_START_SECONDS
    while not socket.exists():
        if _engine.poll() is not None:
            raise RuntimeError(f"the shared engine exited with status {_engine.returncode} before it listened")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the shared engine did not listen within {ENGINE_START_SECONDS} s")
        time.sleep(0.05)
    threading.Thread(target=_watch_engine, args=(_engine, server), daemon=True).start()


def _watch_engine(engine: subprocess.Popen[bytes], server: Any) -> None:
    """Stop the server if its engine dies: every worker's calls would fail from then on."""
    global _engine_died
    engine.wait()  # its status is not to be trusted: gunicorn's reaping of its workers may take it first
    if not _stopping:
        server.log.error("the shared engine (pid %d) is gone: stopping the server", engine.pid)
        _engine_died = True
        os.kill(os.getpid(), signal.SIGTERM)


def when_ready(server: Any) -> None:
    reload = server.handle_hup  # the arbiter calls handle_<signal> by name: the instance's attribute wins

    def checked_reload() -> None:
        refusal = _reload_refusal()
        if refusal is not None:
            server.log.error("SIGHUP: not reloaded, the workers serve on the bundle they loaded: %s", refusal)
            return
        if _handing_over.is_set():
            server.log.warning("SIGHUP: a reload is under way; send it again once the new workers are ready")
            return
        manifest = read_manifest(_settings.bundle)
        # A GPU worker keeps no core pool, whose page says when it accepts: gunicorn's own reload.
        if (_settings.target or manifest.target) == "gpu":
            reload()
            return
        # The new workers beside the old: where they may not fit in the memory left, the kernel would kill
        # workers, old and new; gunicorn's own reload stops the old ones first (nothing accepts meanwhile).
        need, _ = memory_need(_settings, manifest, model_bytes(_settings.bundle))
        if need > (room := memory_room()) > 0:
            server.log.warning(
                "SIGHUP: the new workers may need %.1f GB beside the old ones, and %.1f GB is free: the old ones "
                "stop first, and nothing accepts until the new ones are ready",
                need / 2**30,
                room / 2**30,
            )
            reload()
            return
        _overlapping_reload(server)

    server.handle_hup = checked_reload


_handing_over = threading.Event()  # new workers are loading while the old ones serve (_overlapping_reload)


def _overlapping_reload(server: Any) -> None:
    """New workers on the bundle on disk beside the old ones, which are stopped (and drain) once the new ones
    accept: the arbiter's manage_workers spawns up to num_workers and stops the oldest beyond it."""
    old, wanted = set(server.WORKERS), server.num_workers
    server.log.info(
        "SIGHUP: starting %d worker(s) on %s; the old ones serve until they are ready", wanted, _settings.bundle
    )
    _handing_over.set()
    server.num_workers = 2 * wanted
    server.manage_workers()
    threading.Thread(target=_hand_over, args=(server, old, wanted), daemon=True).start()


def _hand_over(server: Any, old: set[int], wanted: int) -> None:
    """Once `wanted` workers not in `old` accept (or every old one is gone, or `timeout` passed: new workers
    loading longer than that are not stopped, gunicorn's heartbeat counting from the first, so the old ones are
    then, as gunicorn's own reload stopped them at once), back to `wanted` workers: the old ones are stopped."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            workers = set(server.WORKERS)
            if sum(accepting(_core_pool, pid) for pid in workers - old) >= wanted or not workers & old:
                break
            time.sleep(0.05)
    finally:
        server.num_workers = wanted
        _handing_over.clear()
        server.wakeup()


def _reload_refusal() -> str | None:
    """Why a reload must not start workers on the bundle on disk now, or None."""
    if _engine is not None:
        return "the shared engine holds the model and is not reloaded; restart the server to serve a new bundle"
    from tasks.errors import InputError

    try:
        checked_bundle(_settings.bundle, whole=True)
    except InputError as exc:
        return str(exc)
    return None


def child_exit(server: Any, worker: Any) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
    forget(_core_pool, worker.pid)


def on_exit(server: Any) -> None:
    """After the workers: stop the engine, remove what this config made."""
    global _stopping
    _stopping = True
    if _engine is not None and _engine.stdin is not None:
        _engine.stdin.close()  # the workers are gone: the engine's end of file (api/process/engine.py)
        try:
            _engine.wait(10)
        except subprocess.TimeoutExpired:
            _engine.kill()
    for owned in (_owned_metrics_dir, _owned_core_pool, _engine_dir):
        if owned:
            shutil.rmtree(owned, ignore_errors=True)
    if _engine_died:
        sys.stderr.flush()
        os._exit(1)
