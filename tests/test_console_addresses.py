"""The console's pages by their addresses, in a real browser (Debian's Chromium driven by Playwright), behind
its sign-in: a page typed or bookmarked is the page shown, after the token if one is set. A console of its own
(with a token, no appliance to reach), apart from tests/test_console_browser.py's walk."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest

from tests.test_console_browser_support import (
    chromium,
    free_port,
    no_traceback,
    start_process,
    stop_process,
    wait_for,
)

pytestmark = pytest.mark.browser

TOKEN = "correct horse"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module", params=[TOKEN, ""], ids=["token", "no-token"])
def console(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A console with a sign-in, and one without: (URL, token)."""
    tmp = tmp_path_factory.mktemp("console")
    port, log = free_port(), tmp / "console.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARE_CONSOLE_")}
    env["HARE_CONSOLE_BENCH_DB"] = str(tmp / "bench.db")
    if request.param:
        env["HARE_CONSOLE_TOKEN"] = request.param
    argv = ["console", "--port", str(port), "--appliance", "http://127.0.0.1:9"]
    proc = start_process([sys.executable, "-m", "hare.cli", *argv], log, env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url + "/_stcore/health", lambda r: r.text == "ok", proc, log)
        yield url, request.param
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with chromium() as browser:
        yield browser


def _settled(pg: object) -> None:
    """Wait until the page is connected and Streamlit has finished its current run."""
    from playwright.sync_api import Page

    assert isinstance(pg, Page)
    time.sleep(0.3)
    pg.wait_for_selector("[data-test-connection-state='CONNECTED'][data-test-script-state='notRunning']")


@pytest.mark.parametrize(
    ("path", "heading"),
    [
        ("/benchmarks", "Benchmarks"),  # signing in showed the Overview, under /benchmarks
        ("/overview", "Overview"),  # drawn under a "Page not found" dialog
        ("/", "Overview"),
    ],
)
def test_the_page_an_address_names_is_the_page_shown_after_any_sign_in(
    browser: object, console: tuple[str, str], path: str, heading: str
) -> None:
    from playwright.sync_api import Browser, expect

    assert isinstance(browser, Browser)
    expect.set_options(timeout=TIMEOUT_MS)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        pg = context.new_page()
        pg.set_default_timeout(TIMEOUT_MS)
        url, token = console
        pg.goto(url + path)
        main = pg.locator("[data-testid='stMain']")
        if token:
            expect(main.get_by_role("heading", name="hare console")).to_be_visible()
            expect(pg.get_by_role("link", name="Benchmarks")).to_have_count(0)  # no pages' menu before the token
            _settled(pg)  # a token typed while the first run draws is lost with its form
            pg.get_by_role("textbox", name="Console token").fill(token)
            pg.get_by_role("button", name="Sign in").click()
        expect(main.get_by_role("heading", name=heading, exact=True)).to_be_visible()
        _settled(pg)
        expect(pg.get_by_text("Page not found")).to_have_count(0)
        expect(pg.get_by_role("link", name="Benchmarks")).to_be_visible()
        no_traceback(pg)
    finally:
        context.close()
