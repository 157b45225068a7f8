"""The images' HEALTHCHECK: GET /health where the server listens; exit 0 when it answers 200.

Python rather than curl, so that the slim image needs no extra package. The address comes from the server's
own settings (api/config.py), read from the server's environment where the check can see it: Docker runs the
check with the image's environment, not the server's, and `docker run hare:cpu --port 9000` sets the port
only in the server's (`hare serve` writes its flags over their HARE_* variables before it becomes gunicorn).
In a container gunicorn is PID 1, so its environment is /proc/1/environ; elsewhere (or under `--init`) the
check's own. That costs the settings module's imports (standard library and hare's small config helpers, no
numpy or onnxruntime).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from api.config import Settings
from tasks.errors import InputError

SERVER_CONFIG = b"api.process.gunicorn_conf"  # on hare's gunicorn command line (api/process/serve.py)
# Hosts that listen on every address: the check asks the loopback one.
ANY_ADDRESS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def server_environment(proc: Path = Path("/proc")) -> Mapping[str, str]:
    """PID 1's environment where PID 1 is hare's gunicorn (a container's server), else this process's."""
    try:
        if SERVER_CONFIG in (proc / "1" / "cmdline").read_bytes():
            entries = (proc / "1" / "environ").read_bytes().split(b"\0")
            return dict(e.decode(errors="replace").partition("=")[::2] for e in entries if b"=" in e)
    except OSError:  # another user's process, or no /proc: the check's own environment
        pass
    return os.environ


def main(proc: Path = Path("/proc")) -> int:
    try:
        settings = Settings.from_env(server_environment(proc))
    except InputError as exc:  # the server refuses the same value at start
        print(f"healthcheck: {exc.message}", file=sys.stderr)
        return 1
    host = ANY_ADDRESS.get(settings.host, settings.host)
    port = settings.probe_port or settings.port  # the probe port, where set, answers at once under a flood
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/health"
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"healthcheck: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
