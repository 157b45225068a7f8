"""Servers the bench starts itself, on loopback: `hare serve` for a bundle, the vanilla and comet baselines,
and the trivial endpoint. Each runs in its own process group, so stopping it stops its workers too, and its
CPU time can be read from /proc for the whole group."""

from __future__ import annotations

import ctypes
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import uvloop

from bench.client import fetch
from tasks.errors import HareError, InputError

HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0  # a baseline loads torch and transformers in every worker; 2 cores are slow at it
STOP_TIMEOUT_S = 15.0


class ServerNotReady(HareError):
    """A server the bench started did not answer /ready in time, or the run was cancelled while it waited."""


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def group_cpu_seconds(pgid: int) -> dict[int, float] | None:
    """User + system CPU seconds of each live process in a process group, by pid (None where /proc is missing).

    Per process, so a point can show how the load spread over the server's workers."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces) start after the last ')'.
        rest = stat[stat.rfind(")") + 2 :].split()
        if int(rest[2]) == pgid:  # pgrp
            out[int(entry.name)] = (int(rest[11]) + int(rest[12])) / tick  # utime + stime
    return out


def group_rss_mb(pgid: int) -> dict[int, float]:
    """Resident memory (MB) of each live process in a process group, by pid (empty where /proc is missing)."""
    page = os.sysconf("SC_PAGE_SIZE")
    return {pid: int(statm.split()[1]) * page / 2**20 for pid, statm in _group_read(pgid, "statm")}


def group_pss_mb(pgid: int) -> dict[int, float]:
    """Proportional set size (MB) of each live process in a process group, by pid: its own pages plus its share
    of those it shares with other processes (libraries' code, mapped weights, what the workers inherited from
    the master), so the sum is what the group holds of the machine's memory; each process's RSS counts every
    shared page in full (a served OpenVINO worker's is about half libraries). Empty where /proc is missing."""
    out: dict[int, float] = {}
    for pid, rollup in _group_read(pgid, "smaps_rollup"):
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                out[pid] = int(line.split()[1]) / 1024  # kB
                break
    return out


def _group_read(pgid: int, name: str) -> Iterator[tuple[int, str]]:
    """(pid, the text of /proc/PID/`name`) of each live process in a process group; one that exits meanwhile, or
    whose file cannot be read, is left out."""
    proc = Path("/proc")
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rfind(")") + 2 :].split()[2]) != pgid:
                continue
            text = (entry / name).read_text()
        except OSError:
            continue
        yield int(entry.name), text


class ServerProcess:
    """A server command started in its own process group, with its output in a log file."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        port: int,
        env: Mapping[str, str] | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        self.name = name
        self.command = list(command)
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.env = {**os.environ, **(env or {})}
        self.cpus = cpus  # the CPUs it may run on (None: this process's); a server sizes itself to them
        self.log = Path(tempfile.mkstemp(prefix=f"hare-bench-{name}-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
                preexec_fn=dies_with_parent(self.cpus),
            )
        return self

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float = READY_TIMEOUT_S, stop: threading.Event | None = None) -> None:
        """Poll GET /ready until 200; fail with the server's log if it exits or the time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if stop is not None and stop.is_set():
                raise ServerNotReady(f"{self.name}: cancelled while waiting for the server")
            if self.proc.poll() is not None:
                raise HareError(
                    f"{self.name} server exited with status {self.proc.returncode} before it was ready:\n"
                    + self.log_tail()
                )
            if wait_ready_once(self.url):
                return
            time.sleep(0.25)
        raise ServerNotReady(f"{self.name} server was not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def cpu_seconds(self) -> dict[int, float] | None:
        """CPU seconds so far of each process of the server (gunicorn's arbiter and its workers)."""
        return group_cpu_seconds(self.proc.pid) if self.proc is not None else None

    def stop(self) -> None:
        """SIGTERM to the group (gunicorn drains its workers), SIGKILL if it is still there after a while."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)
        except ProcessLookupError:
            pass

    def __enter__(self) -> ServerProcess:
        return self

    def close(self) -> None:
        """Stop the server and remove its log (a server used without `with`)."""
        self.stop()
        self.log.unlink(missing_ok=True)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def dies_with_parent(cpus: set[int] | None = None) -> Callable[[], None]:
    """A child's `preexec_fn`: the kernel sends it SIGTERM when this process dies, however it dies (SIGKILL, the
    OOM killer), and it runs on `cpus` (None: this process's). A server whose bench was killed was orphaned,
    holding its port, its cores and its memory; a `hare serve` keeps the signal across its exec into gunicorn,
    which drains its workers on it."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork: the child only calls it
    parent = os.getpid()

    def setup() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # this process died before the line above took effect
            os.kill(os.getpid(), signal.SIGTERM)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return setup


def split_url(url: str) -> tuple[str, int]:
    """`http://127.0.0.1:8000` -> ("127.0.0.1", 8000); loopback only, plain HTTP."""
    if not url.startswith("http://"):
        raise InputError(f"{url}: the bench speaks plain HTTP to a loopback address (http://127.0.0.1:PORT)")
    hostport = url[len("http://") :].split("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"{url}: give the host and a port from 1 to 65535, e.g. http://127.0.0.1:8000")
    if host not in ("127.0.0.1", "localhost", "[::1]") and not host.startswith("127."):
        raise InputError(f"{url}: the bench only loads servers on this machine (127.0.0.0/8, localhost)")
    return ("127.0.0.1" if host == "localhost" else host.strip("[]")), int(port)


TOKEN_VARS = ("HARE_BENCH_TOKEN", "HARE_ADMIN_TOKEN")  # the bench's bearer token for /info and /metrics, first set


def bench_token(env: Mapping[str, str] | None = None) -> str | None:
    """The admin token the bench sends hare's /info and /metrics: $HARE_BENCH_TOKEN, else $HARE_ADMIN_TOKEN (the
    one a `hare serve` the bench starts inherits and asks for). From the environment, not a flag: a flag's value
    is on every `ps` listing of the machine. The one place the bench reads it."""
    env = os.environ if env is None else env
    return next((env[name] for name in TOKEN_VARS if env.get(name)), None)


def bench_api_key(env: Mapping[str, str] | None = None) -> str | None:
    """The API key the bench sends with its POST /predict to hare: $HARE_API_KEY, the variable the server reads
    (so a `hare serve` the bench starts, which inherits it, is answered too)."""
    env = os.environ if env is None else env
    return env.get("HARE_API_KEY") or None


def get_json(url: str, path: str, timeout: float = 5.0, token: str | None = None) -> tuple[int, bytes]:
    host, port = split_url(url)

    async def go() -> tuple[int, bytes]:
        answer = await fetch(host, port, "GET", path, timeout=timeout, token=token)
        return answer.status, answer.body

    return uvloop.run(go())


LOOP_CPU = b"hare_loop_cpu_seconds_total "  # api/web/metrics.py: the event loops' own CPU seconds


def loop_cpu_seconds(url: str, token: str | None = None) -> float | None:
    """The CPU seconds a hare server's event loops have spent on their own work so far (the model calls they
    ran left out), from its /metrics: None from a server without that counter, such as a baseline, or one
    that does not answer. Blocking, for a load generator's window edges: it runs inside their event loop,
    where get_json's own loop cannot."""
    host, port = split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=5.0)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
        answer = conn.getresponse()
        body = answer.read()
    except OSError:
        return None
    finally:
        conn.close()
    if answer.status != 200:
        return None
    for line in body.splitlines():
        if line.startswith(LOOP_CPU):
            return float(line[len(LOOP_CPU) :])
    return None


def wait_ready_once(url: str) -> bool:
    try:
        status, _ = get_json(url, "/ready", timeout=2.0)
    except Exception:  # refused, reset, timed out, half-started: not ready yet
        return False
    return status == 200


def hare_server(
    bundle: Path,
    workers: int | None = None,
    threads: int | None = None,
    extra: Sequence[str] = (),
    cpus: set[int] | None = None,
) -> ServerProcess:
    """`hare serve BUNDLE` on a free loopback port (workers/threads None: the server's own defaults; cpus: the
    CPUs it runs on, None: this process's)."""
    port = free_port()
    command = [sys.executable, "-m", "hare.cli", "serve", str(bundle), "--host", HOST, "--port", str(port)]
    if workers:
        command += ["--workers", str(workers)]
    if threads:
        command += ["--threads", str(threads)]
    return ServerProcess("hare", [*command, *extra], port, cpus=cpus)


def baseline_server(model_dir: Path, task: str, mode: str, workers: int) -> ServerProcess:
    """The Starlette + transformers pipeline baseline under gunicorn (see bench/baseline_app.py)."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "bench.baseline_app:create_app()",
        "--worker-class",
        "uvicorn_worker.UvicornWorker",
        "--bind",
        f"{HOST}:{port}",
        "--workers",
        str(workers),
    ]
    env = {
        "HARE_BASELINE_MODEL": str(model_dir),
        "HARE_BASELINE_TASK": task,
        "HARE_BASELINE_MODE": mode,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    return ServerProcess(mode, command, port, env)


def trivial_server() -> ServerProcess:
    port = free_port()
    return ServerProcess("trivial", [sys.executable, "-m", "bench.trivial", "--port", str(port)], port)
