"""Containers: the Docker SDK calls behind the page, with a stand-in client, and the page without an engine.
The same calls against a real engine and a real hare:cpu: tests/test_containers.py (marker `container`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import docker_ops
from tests.test_console_support import containers_page


@dataclass
class StubImage:
    tags: list[str]


@dataclass
class StubContainer:
    name: str
    image: StubImage
    labels: dict[str, str] = field(default_factory=dict)
    status: str = "running"
    id: str = "0123456789abcdef"
    attrs: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False
    removed: bool = False

    @property
    def short_id(self) -> str:
        return self.id[:10]

    def stop(self, timeout: int = 10) -> None:
        self.stopped = True

    def remove(self) -> None:
        self.removed = True


class StubContainers:
    def __init__(self, items: list[StubContainer]) -> None:
        self.items = items
        self.runs: list[dict[str, Any]] = []

    def list(self) -> list[StubContainer]:
        return [c for c in self.items if not c.stopped]

    def get(self, cid: str) -> StubContainer:
        return next(c for c in self.items if c.id == cid)

    def run(self, **kwargs: Any) -> StubContainer:
        self.runs.append(kwargs)
        c = StubContainer(kwargs.get("name") or "hare-new", StubImage([kwargs["image"]]), kwargs["labels"], id="f" * 16)
        self.items.append(c)
        return c


class StubDocker:
    def __init__(self, items: list[StubContainer]) -> None:
        self.containers = StubContainers(items)

    def close(self) -> None:
        pass


def _ports(port: int) -> dict[str, Any]:
    return {"NetworkSettings": {"Ports": {"8080/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(port)}]}}}


def _stub() -> StubDocker:
    return StubDocker(
        [
            StubContainer(
                "hare-ner",
                StubImage(["hare:cpu"]),
                {docker_ops.LABEL_TASK: "token-classification", docker_ops.LABEL_CONSOLE: "1"},
                attrs=_ports(8081) | {"State": {"Health": {"Status": "healthy"}}},
                id="a" * 16,
            ),
            StubContainer("postgres", StubImage(["postgres:16"]), id="b" * 16),
            StubContainer("manual", StubImage(["registry.local/hare:gpu"]), attrs=_ports(9000), id="c" * 16),
        ]
    )


def test_list_finds_hare_containers_only() -> None:
    client = _stub()
    found = docker_ops.list_hare(client)
    assert [c.name for c in found] == ["hare-ner", "manual"]
    row = docker_ops.container_row(found[0])
    assert row == {
        "name": "hare-ner",
        "id": "aaaaaaaaaa",
        "image": "hare:cpu",
        "status": "running (healthy)",
        "task": "token-classification",
        "source": "",
        "url": "http://127.0.0.1:8081",
    }


def test_spec_checks_and_run_arguments(tmp_path: Path) -> None:
    spec = docker_ops.ContainerSpec("hare:cpu", tmp_path, "text-ranking", 8090, "r", "tok")
    spec.check()
    kwargs = spec.run_kwargs()
    assert kwargs["volumes"] == {str(tmp_path): {"bind": "/bundle", "mode": "ro"}}
    assert kwargs["ports"] == {"8080/tcp": ("127.0.0.1", 8090)}
    assert kwargs["environment"] == {"HARE_TASK": "text-ranking", "HARE_BUNDLE": "/bundle", "HARE_ADMIN_TOKEN": "tok"}
    assert kwargs["labels"][docker_ops.LABEL_TASK] == "text-ranking" and kwargs["detach"] is True
    for bad, why in [
        (docker_ops.ContainerSpec("", tmp_path, "t", 1), "image name"),
        (docker_ops.ContainerSpec("i", Path("rel"), "t", 1), "absolute"),
        (docker_ops.ContainerSpec("i", tmp_path / "nope", "t", 1), "not a folder"),
        (docker_ops.ContainerSpec("i", tmp_path, "t", 70000), "outside"),
    ]:
        with pytest.raises(ValueError, match=why):
            bad.check()


def test_stop_removes_only_what_the_console_started() -> None:
    client = _stub()
    docker_ops.stop(client, "a" * 16)
    docker_ops.stop(client, "c" * 16)
    ours, theirs = client.containers.get("a" * 16), client.containers.get("c" * 16)
    assert ours.stopped and ours.removed and theirs.stopped and not theirs.removed


def test_connect_without_an_engine_says_so(tmp_path: Path) -> None:
    with pytest.raises(docker_ops.DockerUnavailable, match=r"/nonexistent/docker\.sock does not exist"):
        docker_ops.connect({"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    sock = tmp_path / "docker.sock"
    sock.write_text("")  # there, but not a socket an engine listens on
    with pytest.raises(docker_ops.DockerUnavailable, match="no Docker engine is reachable"):
        docker_ops.connect({"DOCKER_HOST": f"unix://{sock}"})
    with pytest.raises(docker_ops.DockerUnavailable, match="no Docker engine is reachable"):
        docker_ops.connect({"DOCKER_HOST": "tcp://127.0.0.1:9"}, timeout=1)


def test_page_without_docker_is_a_plain_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    at = AppTest.from_function(containers_page, default_timeout=30).run()
    assert not at.exception and not at.error
    assert at.info[0].value.startswith("Docker is not available here: no Docker engine is reachable")
    assert "every other page works without it" in at.info[0].value


def test_page_lists_starts_and_stops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    client = _stub()
    monkeypatch.setattr(docker_ops, "connect", lambda env=None, timeout=3.0: client)
    at = AppTest.from_function(containers_page, default_timeout=30).run()
    assert not at.exception
    listed = [m.value for m in at.markdown if m.value.startswith("**")]
    assert len(listed) == 2 and "hare-ner" in listed[0] and "http://127.0.0.1:8081" in listed[0]
    at.button(key="hare-watch-aaaaaaaaaa").click().run()
    assert "http://127.0.0.1:8081" in at.session_state["hare.appliances"]
    at.button(key="hare-stop-cccccccccc").click().run()
    assert client.containers.get("c" * 16).stopped

    at.text_input[1].input(str(tmp_path))  # the folder
    at.selectbox[0].select("feature-extraction")
    at.number_input[0].set_value(8099)
    at.button[-1].click().run()  # Start
    assert not at.error, [e.value for e in at.error]
    assert client.containers.runs[-1]["environment"]["HARE_TASK"] == "feature-extraction"
    assert "http://127.0.0.1:8099" in at.session_state["hare.appliances"]
    assert at.success[0].value.startswith("Started hare-new")

    at.text_input[1].input("relative/folder")
    at.button[-1].click().run()
    assert "absolute folder path" in at.error[0].value and not at.exception
