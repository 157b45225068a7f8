"""The images' health check asks the server's settings for the port, so it follows HARE_PORT as the server does:
against a real `hare serve` on loopback, healthy while it serves, unhealthy once it has stopped. In a container
it reads them from the server's environment (PID 1's), where `docker run IMAGE --port N` put them."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from api.process import healthcheck
from tests.conftest import ModelFactory
from tests.live_server import hare_serve


def test_healthy_on_the_port_hare_port_names_while_hare_serve_runs(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "server.log") as (url, _):
        monkeypatch.setenv("HARE_PORT", url.rsplit(":", 1)[1])
        assert healthcheck.main() == 0
    assert healthcheck.main() == 1  # stopped: nothing answers on that port
    assert "/health" in capsys.readouterr().err


def test_unhealthy_when_nothing_answers_or_the_port_is_bad(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as closed:  # a port nothing listens on once this closes
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    monkeypatch.setenv("HARE_PORT", str(free))
    assert healthcheck.main() == 1
    monkeypatch.setenv("HARE_PORT", "eighty")
    assert healthcheck.main() == 1
    assert "HARE_PORT='eighty' is invalid" in capsys.readouterr().err


def test_in_a_container_the_port_is_the_servers_not_the_images(
    tiny_bundle: ModelFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docker run hare:cpu --port N`: the image's HARE_PORT (the check's own) says 8080, the server listens on
    N; PID 1 is hare's gunicorn, whose environment `hare serve` wrote the flag into (a /proc laid out here)."""
    with hare_serve(tiny_bundle("feature-extraction"), tmp_path / "server.log") as (url, _):
        monkeypatch.setenv("HARE_PORT", "1")  # nothing listens there
        proc = tmp_path / "proc"
        (proc / "1").mkdir(parents=True)
        gunicorn = [sys.executable, "-m", "gunicorn", "-c", "python:api.process.gunicorn_conf", "app"]
        (proc / "1" / "cmdline").write_bytes(b"\0".join(a.encode() for a in gunicorn) + b"\0")
        (proc / "1" / "environ").write_bytes(f"PATH=/bin\0HARE_PORT={url.rsplit(':', 1)[1]}\0".encode())
        assert healthcheck.main(proc) == 0
        # PID 1 another program (outside a container, or under --init): the check's own settings.
        (proc / "1" / "cmdline").write_bytes(b"/sbin/init\0")
        assert healthcheck.main(proc) == 1
