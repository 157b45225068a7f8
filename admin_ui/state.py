"""What the pages share within one browser session: settings, the appliance list, the selected appliance,
and a guard that turns an unexpected error into a message instead of a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import streamlit as st

from admin_ui.client import ApplianceClient, Probe, normalize_url, probe
from admin_ui.settings import ConsoleSettings, SettingsError

log = logging.getLogger("hare.console")

APPLIANCES = "hare.appliances"
SELECTED = "hare.selected"


def settings() -> ConsoleSettings:
    """The environment's settings, read once per session; a bad value stops the page with its message."""
    if "hare.settings" not in st.session_state:
        try:
            st.session_state["hare.settings"] = ConsoleSettings.from_env()
        except SettingsError as exc:
            st.error(f"The console's configuration is invalid: {exc}")
            st.stop()
    value: ConsoleSettings = st.session_state["hare.settings"]
    return value


def appliances() -> list[str]:
    if APPLIANCES not in st.session_state:
        st.session_state[APPLIANCES] = list(settings().appliances)
    value: list[str] = st.session_state[APPLIANCES]
    return value


def add_appliance(url: str) -> str:
    """Add a URL to the session's list (normalized); raises ValueError with what is wrong with it."""
    url = normalize_url(url)
    urls = appliances()
    if url not in urls:
        urls.append(url)
    return url


def remove_appliance(url: str) -> None:
    urls = appliances()
    if url in urls:
        urls.remove(url)
    if st.session_state.get(SELECTED) == url:
        del st.session_state[SELECTED]


def selected() -> str | None:
    """The appliance the Playground, Live metrics and Benchmarks pages work on (chosen in the sidebar)."""
    urls = appliances()
    current = st.session_state.get(SELECTED)
    if current in urls:
        return str(current)
    return urls[0] if urls else None


def select(url: str) -> None:
    """Make `url` the appliance the pages work on."""
    st.session_state[SELECTED] = url


def client(url: str) -> ApplianceClient:
    s = settings()
    return ApplianceClient(url, s.appliance_token, s.timeout_s, api_key=s.appliance_api_key)


def describe(url: str) -> Probe:
    s = settings()
    return probe(url, s.appliance_token, min(s.timeout_s, 5.0))


def describe_all(urls: list[str]) -> list[Probe]:
    """Every appliance probed at once: a slow or unreachable one costs its own timeout, not the sum."""
    if len(urls) <= 1:
        return [describe(u) for u in urls]
    s = settings()
    timeout = min(s.timeout_s, 5.0)
    with ThreadPoolExecutor(max_workers=min(len(urls), 8)) as pool:
        return list(pool.map(lambda u: probe(u, s.appliance_token, timeout), urls))


def bench_db() -> Path:
    from bench.store import default_db_path

    return settings().bench_db or default_db_path()


def remember(key: str, default: Any) -> Any:
    """A per-session value under `hare.<key>`, created from `default` on first use."""
    full = f"hare.{key}"
    if full not in st.session_state:
        st.session_state[full] = default
    return st.session_state[full]


@contextmanager
def guard(what: str) -> Iterator[None]:
    """Show an unexpected error as one line on the page (the traceback goes to the console's log)."""
    try:
        yield
    except Exception as exc:  # the last line of defence: a page never shows a Python traceback
        log.exception("%s failed", what)
        st.error(f"{what} failed unexpectedly: {type(exc).__name__}: {exc}. The details are in the console's log.")
