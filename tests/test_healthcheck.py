"""The images' health check asks the server's settings for the port, so it follows HARE_PORT as the server does."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from api.process import healthcheck


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_healthy_on_the_port_hare_port_names(port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARE_PORT", str(port))
    assert healthcheck.main() == 0


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
