"""The console's one settings object, read from the environment (`hare console` turns its flags into these)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from admin_ui.client import normalize_url
from bench.store import default_db_path

DEFAULT_APPLIANCE = "http://localhost:8080"


class SettingsError(ValueError):
    """A HARE_CONSOLE_* value is invalid; the message names the variable."""


@dataclass(frozen=True)
class ConsoleSettings:
    """Everything the console reads from its environment.

    appliances: HARE_CONSOLE_APPLIANCES, comma-separated appliance URLs shown first (default http://localhost:8080).
    token: HARE_CONSOLE_TOKEN, the password the console asks for; required when it listens beyond localhost.
    appliance_token: HARE_CONSOLE_APPLIANCE_TOKEN, else HARE_ADMIN_TOKEN: the appliances' admin token, sent as
        `Authorization: Bearer` (they require it on /info and /metrics when they have one).
    appliance_api_key: HARE_CONSOLE_APPLIANCE_API_KEY, else HARE_API_KEY: the appliances' API key, sent as
        `Authorization: Bearer` on POST /predict (the Playground's and the bench's) where they have one; unset,
        the admin token is sent there too.
    bench_db: HARE_CONSOLE_BENCH_DB, the bench SQLite store (default: the store's own, from HARE_BENCH_DB).
    timeout_s: HARE_CONSOLE_TIMEOUT, seconds an appliance call may take (default 5).
    image: HARE_CONSOLE_IMAGE, the Docker image the Containers page starts (default hare:cpu).
    bundle_dirs: HARE_CONSOLE_BUNDLE_DIRS, comma-separated folders holding bundles (default: bundles): the
        Benchmarks page offers the bundle named like the appliance's model, for exact token lengths.
    """

    appliances: tuple[str, ...] = (DEFAULT_APPLIANCE,)
    token: str | None = None
    appliance_token: str | None = None
    appliance_api_key: str | None = None
    bench_db: Path | None = None
    timeout_s: float = 5.0
    image: str = "hare:cpu"
    bundle_dirs: tuple[Path, ...] = (Path("bundles"),)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ConsoleSettings:
        env = os.environ if env is None else env
        urls: list[str] = []
        for raw in env.get("HARE_CONSOLE_APPLIANCES", "").split(","):
            if raw.strip():
                try:
                    urls.append(normalize_url(raw))
                except ValueError as exc:
                    raise SettingsError(f"HARE_CONSOLE_APPLIANCES: {exc}") from None
        timeout_raw = env.get("HARE_CONSOLE_TIMEOUT", "5")
        try:
            timeout = float(timeout_raw)
            if timeout <= 0:
                raise ValueError
        except ValueError:
            raise SettingsError(
                f"HARE_CONSOLE_TIMEOUT must be a positive number of seconds, not {timeout_raw!r}"
            ) from None
        db = env.get("HARE_CONSOLE_BENCH_DB", "").strip()
        return cls(
            appliances=tuple(dict.fromkeys(urls)) or (DEFAULT_APPLIANCE,),
            token=env.get("HARE_CONSOLE_TOKEN") or None,
            appliance_token=env.get("HARE_CONSOLE_APPLIANCE_TOKEN") or env.get("HARE_ADMIN_TOKEN") or None,
            appliance_api_key=env.get("HARE_CONSOLE_APPLIANCE_API_KEY") or env.get("HARE_API_KEY") or None,
            bench_db=Path(db) if db else default_db_path(env),
            timeout_s=timeout,
            image=env.get("HARE_CONSOLE_IMAGE", "").strip() or "hare:cpu",
            bundle_dirs=tuple(
                Path(d.strip()) for d in env.get("HARE_CONSOLE_BUNDLE_DIRS", "bundles").split(",") if d.strip()
            ),
        )
