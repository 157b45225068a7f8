"""`hare console`, its settings and token gate, and the app's entry script."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from admin_ui import auth, cli
from admin_ui.settings import ConsoleSettings, SettingsError
from hare.cli import main as hare
from tests.live_server import free_port
from tests.test_console_support import fake_appliance

APP = str(Path(__file__).resolve().parents[1] / "admin_ui" / "app.py")


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli.configure(p)
    return p.parse_args(list(argv))


def test_streamlit_command_is_headless_without_usage_stats() -> None:
    argv = cli.streamlit_command(_args("--port", "8600"), python="py")
    assert argv[:5] == ["py", "-m", "admin_ui.launch", "run", str(cli.APP)]
    options = dict(zip(argv[5::2], argv[6::2], strict=True))
    assert options["--server.port"] == "8600" and options["--server.address"] == "127.0.0.1"
    assert options["--server.headless"] == "true" and options["--browser.gatherUsageStats"] == "false"


def test_flags_become_settings() -> None:
    argv = (
        "--appliance",
        "h1:8080",
        "--appliance",
        "http://h2:9/",
        "--db",
        "x.db",
        "--bundles",
        "b1",
        "--bundles",
        "b2",
    )
    settings = ConsoleSettings.from_env(cli.console_env(_args(*argv), {}))
    assert settings.appliances == ("http://h1:8080", "http://h2:9")
    assert settings.bench_db == Path("x.db").resolve()
    assert settings.bundle_dirs == (Path("b1").resolve(), Path("b2").resolve())
    assert ConsoleSettings.from_env(cli.console_env(_args(), {})).bundle_dirs == (Path("bundles").resolve(),)


def test_listening_beyond_loopback_needs_a_token() -> None:
    with pytest.raises(Exception, match="set HARE_CONSOLE_TOKEN"):
        cli.console_env(_args("--address", "0.0.0.0"), {})
    assert cli.console_env(_args("--address", "0.0.0.0"), {"HARE_CONSOLE_TOKEN": "t"})["HARE_CONSOLE_TOKEN"] == "t"
    assert hare(["console", "--address", "0.0.0.0"]) == 2  # InputError: exit status 2, no Streamlit started


def test_main_starts_streamlit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append(argv)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.delenv("HARE_CONSOLE_TOKEN", raising=False)
    monkeypatch.setenv("HARE_CONSOLE_BENCH_DB", str(tmp_path / "bench.db"))
    port = str(free_port())
    assert hare(["console", "--port", port, "--appliance", "localhost:8080"]) == 0
    assert calls[0][calls[0].index("--server.port") + 1] == port
    assert hare(["console", "--appliance", "ftp://x"]) == 2


@pytest.mark.parametrize(
    ("argv", "env", "said"),
    [
        # Each started Streamlit: a traceback, a misleading "beyond this machine" or the console's URL printed
        # before Streamlit said the port was taken; the others on the first page a browser opened, or never.
        (["--address", "notanaddress"], {}, "--address notanaddress is not an address"),
        (["--port", "{taken}"], {}, "cannot listen on 127.0.0.1:{taken} (Address already in use); give a free --port"),
        (["--bundles", "{tmp}/nope"], {}, "--bundles {tmp}/nope is not a folder"),
        (["--db", "{tmp}/a-file"], {}, "{tmp}/a-file is not a result store this user can open"),
        ([], {"HARE_CONSOLE_TIMEOUT": "abc"}, "HARE_CONSOLE_TIMEOUT must be a positive number of seconds, not 'abc'"),
        ([], {"HARE_CONSOLE_APPLIANCES": "ftp://x"}, "HARE_CONSOLE_APPLIANCES: 'ftp://x'"),
    ],
)
def test_what_the_console_cannot_use_is_refused_before_streamlit_starts(
    argv: list[str],
    env: dict[str, str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    started: list[list[str]] = []
    monkeypatch.setattr(os, "execve", lambda path, command, environ: started.append(command))
    monkeypatch.delenv("HARE_CONSOLE_TOKEN", raising=False)
    for name, value in {"HARE_CONSOLE_BENCH_DB": str(tmp_path / "bench.db"), **env}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "a-file").write_text("not a store")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        values = {"tmp": str(tmp_path), "taken": str(taken.getsockname()[1])}
        command = ["console", "--port", str(free_port()), *(a.format(**values) for a in argv)]
        assert hare(command) == 2
    assert said.format(**values) in " ".join(capsys.readouterr().err.split()) and started == []


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.1.1.1", False),
        ("host", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert auth.is_loopback(address) is loopback


def test_settings_from_env_and_errors() -> None:
    s = ConsoleSettings.from_env({})
    assert s.appliances == ("http://localhost:8080",) and s.token is None and s.timeout_s == 5.0
    s = ConsoleSettings.from_env({"HARE_ADMIN_TOKEN": "a", "HARE_CONSOLE_IMAGE": "hare:gpu"})
    assert s.appliance_token == "a" and s.image == "hare:gpu"
    assert (
        ConsoleSettings.from_env({"HARE_ADMIN_TOKEN": "a", "HARE_CONSOLE_APPLIANCE_TOKEN": "b"}).appliance_token == "b"
    )
    assert ConsoleSettings.from_env({"HARE_API_KEY": "k"}).appliance_api_key == "k"
    assert (
        ConsoleSettings.from_env({"HARE_API_KEY": "k", "HARE_CONSOLE_APPLIANCE_API_KEY": "c"}).appliance_api_key == "c"
    )
    with pytest.raises(SettingsError, match="HARE_CONSOLE_TIMEOUT must be a positive number"):
        ConsoleSettings.from_env({"HARE_CONSOLE_TIMEOUT": "-1"})
    with pytest.raises(SettingsError, match="HARE_CONSOLE_APPLIANCES: 'ftp://x'"):
        ConsoleSettings.from_env({"HARE_CONSOLE_APPLIANCES": "ftp://x"})


def test_app_opens_on_the_overview(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARE_CONSOLE_TOKEN", raising=False)
    with fake_appliance("feature-extraction") as fake:
        monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", fake.url)
        at = AppTest.from_file(APP, default_timeout=30).run()
    assert not at.exception
    assert at.title[0].value == "Overview"
    assert any(fake.url in h.value for h in at.subheader) and not at.sidebar.selectbox  # no sidebar: full width


def test_app_asks_for_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARE_CONSOLE_TOKEN", "correct horse")
    monkeypatch.setenv("HARE_CONSOLE_APPLIANCES", "http://127.0.0.1:9")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert [t.value for t in at.title] == ["hare console"] and not at.dataframe
    at.text_input[0].input("wrong")
    at.button[0].click().run()
    assert at.error[0].value == "That is not the console token." and at.title[0].value == "hare console"
    at.text_input[0].input("correct horse")
    at.button[0].click().run()
    assert at.title[0].value == "Overview" and not at.exception


def test_app_reports_a_bad_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HARE_CONSOLE_TOKEN", raising=False)
    monkeypatch.setenv("HARE_CONSOLE_TIMEOUT", "soon")
    at = AppTest.from_file(APP, default_timeout=30).run()
    assert "HARE_CONSOLE_TIMEOUT must be a positive number" in at.error[0].value and not at.exception


def test_console_imports_no_model_code() -> None:
    code = (
        "import sys, admin_ui.app, admin_ui.cli, admin_ui.launch\n"
        "admin_ui.launch.import_all()  # what `hare console` imports ahead of the first visit\n"
        "assert all(m in sys.modules for m in admin_ui.launch.MODULES)\n"
        "heavy = [m for m in ('onnxruntime', 'torch', 'transformers', 'tokenizers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
