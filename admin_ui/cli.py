"""`hare console`: start the Streamlit admin console (headless, no usage statistics, loopback by default)."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from admin_ui.auth import needs_token
from admin_ui.client import normalize_url
from admin_ui.settings import ConsoleSettings, SettingsError
from bench.store import Store
from tasks.errors import InputError

APP = Path(__file__).with_name("app.py")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8501, help="port to listen on (default 8501)")
    p.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); any other needs HARE_CONSOLE_TOKEN set",
    )
    p.add_argument(
        "--appliance",
        action="append",
        metavar="URL",
        help="an appliance to watch (repeatable; default http://localhost:8080)",
    )
    p.add_argument("--db", type=Path, help="the bench result store (default: $HARE_BENCH_DB or the user data dir)")
    p.add_argument(
        "--bundles",
        action="append",
        type=Path,
        metavar="DIR",
        help="a folder of bundles (repeatable; default ./bundles): Benchmarks offers the one an appliance serves",
    )


def console_env(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the Streamlit process gets: the flags turned into HARE_CONSOLE_* settings."""
    env = dict(environ)
    if args.appliance:
        try:
            env["HARE_CONSOLE_APPLIANCES"] = ",".join(normalize_url(u) for u in args.appliance)
        except ValueError as exc:
            raise InputError(f"--appliance: {exc}") from None
    if args.db:
        env["HARE_CONSOLE_BENCH_DB"] = str(args.db.expanduser().resolve())
    if args.bundles:
        env["HARE_CONSOLE_BUNDLE_DIRS"] = ",".join(str(d.expanduser().resolve()) for d in args.bundles)
    elif "HARE_CONSOLE_BUNDLE_DIRS" not in env:
        env["HARE_CONSOLE_BUNDLE_DIRS"] = str(Path("bundles").resolve())  # Streamlit's working folder may differ
    if needs_token(args.address) and not env.get("HARE_CONSOLE_TOKEN"):
        raise InputError(
            f"the console would listen on {args.address}, beyond this machine: set HARE_CONSOLE_TOKEN to a "
            "secret first (and put TLS in front), or keep the default --address 127.0.0.1"
        )
    return env


def streamlit_command(args: argparse.Namespace, python: str = sys.executable) -> list[str]:
    """`python -m admin_ui.launch run admin_ui/app.py` (Streamlit's command line, with the pages' imports
    started in the background) with the console's server options."""
    if not 1 <= args.port <= 65535:
        raise InputError(f"--port {args.port} is outside 1..65535")
    return [
        python, "-m", "admin_ui.launch", "run", str(APP),
        "--server.port", str(args.port),
        "--server.address", args.address,
        "--server.headless", "true",
        "--browser.gatherUsageStats", "false",
        "--server.fileWatcherType", "none",
        "--server.runOnSave", "false",
        "--client.toolbarMode", "minimal",
        "--client.showErrorDetails", "none",
        "--theme.base", "light",
    ]  # fmt: skip


def check_listen(address: str, port: int) -> None:
    """Refuse an address this machine cannot listen on, which Streamlit reported after the console's URL was
    shown (a port in use) or with a traceback (a name that is no address)."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise InputError(f"--address {address} is not an address ({exc.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Streamlit's server binds
        try:
            probe.bind(where)
        except OSError as exc:
            raise InputError(
                f"cannot listen on {address}:{port} ({exc.strerror}); give a free --port, or an --address of this "
                "machine"
            ) from None


def check_settings(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Refuse now what the console's pages would refuse once a browser came: a bad HARE_CONSOLE_* value, a
    --bundles that is no folder, a --db that is not a result store or where none can be made."""
    for folder in args.bundles or ():
        if not folder.is_dir():
            raise InputError(f"--bundles {folder} is not a folder; give the folder that holds the bundles")
    try:
        settings = ConsoleSettings.from_env(env)
    except SettingsError as exc:
        raise InputError(str(exc)) from None
    if settings.bench_db is not None:
        Store(settings.bench_db)  # opened (made if new) as the Benchmarks page will


def main(args: argparse.Namespace) -> int:
    command = streamlit_command(args)
    check_listen(args.address, args.port)
    env = console_env(args, os.environ)
    check_settings(args, env)
    host = f"[{args.address}]" if ":" in args.address else args.address
    print(f"hare console: http://{host}:{args.port} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    # Become Streamlit rather than wait for it: a stop signal (Ctrl-C, docker stop, systemd) reaches the server
    # itself, and no orphan is left listening on the port.
    os.execve(command[0], command, env)
    return 0  # not reached
