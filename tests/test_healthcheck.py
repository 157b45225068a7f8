"""The images' health check asks the server's settings for the port, so it follows HARE_PORT as the server does:
against a real `hare serve` on loopback, healthy while it serves, unhealthy once it has stopped."""

from __future__ import annotations

import socket
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
