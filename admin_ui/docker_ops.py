"""The Containers page's logic: list, start and stop hare containers with the Docker SDK.

Containers the console starts carry the labels below, so they are found again after a restart; containers
started some other way are listed when their image is a hare image. No Docker engine is not an error for the
console: `connect()` raises `DockerUnavailable` with a sentence the page shows, and the other pages go on.
"""

from __future__ import annotations

import gc
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LABEL_TASK = "dev.hare.task"
LABEL_SOURCE = "dev.hare.source"
LABEL_CONSOLE = "dev.hare.console"
MOUNT = "/bundle"  # where the images read their bundle (HARE_BUNDLE) or raw model folder
CONTAINER_PORT = 8080
DEFAULT_SOCKET = "unix:///var/run/docker.sock"


class DockerUnavailable(Exception):
    """No Docker engine answered; the message says where the console looked."""


def connect(env: Mapping[str, str] | None = None, timeout: float = 3.0) -> Any:
    """A docker.DockerClient that answered a ping, or DockerUnavailable."""
    try:
        import docker
    except ImportError:
        raise DockerUnavailable("the Docker SDK is not installed: pip install -e '.[console]'") from None
    environ = os.environ if env is None else env
    host = environ.get("DOCKER_HOST") or DEFAULT_SOCKET
    if host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists():
        raise DockerUnavailable(f"no Docker engine is reachable ({host.removeprefix('unix://')} does not exist)")
    client = None
    try:
        client = docker.from_env(environment=dict(environ), timeout=int(timeout) or 1)
        client.ping()
    except Exception as exc:  # DockerException, requests' connection errors, a bad DOCKER_HOST: no engine here
        if client is not None:
            client.close()
        # A client that failed in its constructor leaves its socket to the garbage collector: reclaim it now,
        # quietly, rather than as a ResourceWarning at some later point.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        raise DockerUnavailable(f"no Docker engine is reachable ({_first_line(exc)})") from None
    return client


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


@dataclass(frozen=True)
class ContainerSpec:
    """A hare container to start: the image, the host folder to serve, its task and the host port.

    source: a bundle from `hare optimize`, or a Hugging Face model folder, which only the optimizer images
    (hare:cpu-optimizer) can serve: they optimize it for `task` at start.
    """

    image: str
    source: Path
    task: str
    port: int
    name: str = ""
    token: str = ""

    def check(self) -> None:
        """Raise ValueError naming the first problem an operator can fix before Docker sees it."""
        if not self.image.strip():
            raise ValueError("give an image name (for example hare:cpu)")
        if not self.source.is_absolute():
            raise ValueError(f"{self.source}: give an absolute folder path (Docker mounts host paths)")
        if not self.source.is_dir():
            raise ValueError(f"{self.source} is not a folder on this machine")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"port {self.port} is outside 1..65535")

    def run_kwargs(self) -> dict[str, Any]:
        """Arguments for `client.containers.run`: detached, the folder mounted read-only, loopback port."""
        env = {"HARE_TASK": self.task, "HARE_BUNDLE": MOUNT}
        if self.token:
            env["HARE_ADMIN_TOKEN"] = self.token
        kwargs: dict[str, Any] = {
            "image": self.image,
            "detach": True,
            "environment": env,
            "volumes": {str(self.source): {"bind": MOUNT, "mode": "ro"}},
            "ports": {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", self.port)},
            "labels": {LABEL_TASK: self.task, LABEL_SOURCE: str(self.source), LABEL_CONSOLE: "1"},
        }
        if self.name:
            kwargs["name"] = self.name
        return kwargs


def is_hare(container: Any) -> bool:
    """Started by the console (labelled), or running a hare image."""
    labels = getattr(container, "labels", None) or {}
    if LABEL_TASK in labels:
        return True
    tags = getattr(getattr(container, "image", None), "tags", None) or []
    return any(t.split("/")[-1].split(":")[0].startswith("hare") for t in tags)


def container_row(container: Any) -> dict[str, Any]:
    """One table row: name, id, image, status, task, source and the URL it answers on."""
    labels = getattr(container, "labels", None) or {}
    tags = getattr(getattr(container, "image", None), "tags", None) or []
    return {
        "name": container.name,
        "id": container.short_id,
        "image": tags[0] if tags else "",
        "status": container.status + (f" ({health})" if (health := container_health(container)) else ""),
        "task": labels.get(LABEL_TASK, ""),
        "source": labels.get(LABEL_SOURCE, ""),
        "url": container_url(container) or "",
    }


def container_health(container: Any) -> str:
    """The image HEALTHCHECK's verdict (starting, healthy, unhealthy), or "" without one."""
    state = (getattr(container, "attrs", None) or {}).get("State") or {}
    return str((state.get("Health") or {}).get("Status") or "")


def container_url(container: Any) -> str | None:
    """http://host:port of the published appliance port, when there is one."""
    ports = (getattr(container, "attrs", None) or {}).get("NetworkSettings", {}).get("Ports") or {}
    for binding in ports.get(f"{CONTAINER_PORT}/tcp") or []:
        host = binding.get("HostIp") or "127.0.0.1"
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{binding.get('HostPort')}"
    return None


def list_hare(client: Any) -> list[Any]:
    """Running hare containers, by name."""
    return sorted((c for c in client.containers.list() if is_hare(c)), key=lambda c: c.name)


def start(client: Any, spec: ContainerSpec) -> Any:
    """Start a container for `spec` (checked first) and return it."""
    spec.check()
    return client.containers.run(**spec.run_kwargs())


def stop(client: Any, container_id: str, timeout: int = 10) -> None:
    """Stop a container (it drains in-flight requests on SIGTERM) and remove it if the console started it."""
    container = client.containers.get(container_id)
    container.stop(timeout=timeout)
    if (container.labels or {}).get(LABEL_CONSOLE):
        container.remove()
