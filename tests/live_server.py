"""A real `hare serve` (gunicorn, its workers, the CLI) on a loopback port, for the tests that need the whole
process tree: signals, killed workers, real clients over HTTP."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def hare_serve(
    bundle: Path,
    log: Path,
    workers: int = 1,
    env: Mapping[str, str] | None = None,
    own_group: bool = False,
    port: int | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`hare serve BUNDLE` with `workers` workers and the HARE_* variables in `env` (the caller's own HARE_*
    left out), ready; yields its URL and process, and stops it afterwards. The log goes to `log`: a pipe that
    nobody reads would stall a chatty server. `own_group`: the server's processes in a process group of their
    own (its id the server's pid), for a signal to all of them at once. `port`: the port to serve on (default: a
    free one)."""
    port = port or free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HARE_", "PROMETHEUS_"))}
    environ.update(env or {})
    argv = [sys.executable, "-m", "hare.cli", "serve", str(bundle), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--workers", str(workers)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=own_group
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log)
        yield url, process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def wait_ready(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, f"hare serve exited:\n{log.read_text(errors='replace')}"
        assert time.monotonic() < deadline, f"hare serve was not ready in {timeout:.0f} s:\n{log.read_text()}"
        time.sleep(0.2)


def group(pgid: int) -> set[int]:
    """The running processes of process group `pgid` (a server started with `own_group`: its pid). A zombie is
    not one: a worker that has ended stays one until the master reaps it, which a test may get ahead of."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == pgid and alive(int(entry)):
                    pids.add(int(entry))
    return pids


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
