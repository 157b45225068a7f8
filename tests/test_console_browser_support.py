# ruff: noqa: E501  (the JavaScript below keeps its own line lengths)
"""What the console's browser test (tests/test_console_browser.py) runs beside its tests: the servers it starts,
the scripts it runs in the page, and how it reads what the page drew. The layout judge checks that no two
visible blocks overlap, nothing runs off the page and no text is cut, from boxes and drawn texts, never pixels.

- GRID_RECORDER, installed before the page's scripts, records every text a data frame draws on its canvas, with
  where it starts and how wide it is, and the vertical lines between the columns (the grid draws both);
- LAYOUT, run on the page, returns one sentence per problem it finds:
  overlap: two leaf blocks (or the tables, charts, canvases and figures drawn in them) share more than 2 x 2 px,
           each taken as much as one can see of it (a table in a box that scrolls sideways is seen in that box);
  off the page: a block reaches past the page's main column;
  cut: an element that hides what overflows it (an ellipsis, a clip) holds wider text than it shows, such as
       a button's label shrunk to "Re…" or a figure to "11.8 …"; a box that scrolls sideways is fine;
  chart text cut: Vega shortened a label, a title or a legend entry with "…", or drew it past its chart;
  table cell cut: a data frame's text runs past its column's line (a grid that scrolls sideways may run past
           its own right edge: one scrolls to read it).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
WIDTHS = (800, 1280, 1920)

GRID_RECORDER = """
(() => {
  const grid = (window.__hareGrid = { cells: [], lines: new Map() });
  grid.reset = () => { grid.cells.length = 0; grid.lines.clear(); };
  const P = CanvasRenderingContext2D.prototype;
  const fillText = P.fillText, moveTo = P.moveTo, lineTo = P.lineTo;
  const css = (ctx, x) => { const t = ctx.getTransform(); return (x * t.a + t.e) / (window.devicePixelRatio || 1); };
  P.fillText = function (text, x, y, ...rest) {
    if (this.canvas instanceof HTMLCanvasElement) {
      const width = this.measureText(String(text)).width * this.getTransform().a / (window.devicePixelRatio || 1);
      grid.cells.push([this.canvas, String(text), css(this, x), width, this.textAlign]);
    }
    return fillText.call(this, text, x, y, ...rest);
  };
  let last = null;
  P.moveTo = function (x, y) { last = [x, y]; return moveTo.call(this, x, y); };
  P.lineTo = function (x, y) {
    if (last && Math.abs(last[0] - x) < 0.01 && Math.abs(last[1] - y) > 10 && this.canvas instanceof HTMLCanvasElement) {
      if (!grid.lines.has(this.canvas)) grid.lines.set(this.canvas, new Set());
      grid.lines.get(this.canvas).add(css(this, x));
    }
    last = [x, y];
    return lineTo.call(this, x, y);
  };
})();
"""

LAYOUT = """
() => {
  const problems = [];
  const main = document.querySelector("[data-testid='stMain']");
  // Shown: not in a closed expander, a hidden tab, or anything else not drawn, and of some size.
  const visible = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width < 1 || r.height < 1) return false;
    return el.checkVisibility({ contentVisibilityAuto: true, opacityProperty: true, visibilityProperty: true })
      && !el.closest("[hidden], [aria-hidden='true']");
  };
  const name = (el) => (el.getAttribute("data-testid") || el.tagName.toLowerCase()) + ` "${(el.innerText || el.textContent || "").trim().slice(0, 40)}"`;
  // The part of an element one can see: its box within every ancestor that clips (a table in a box that
  // scrolls sideways is seen only inside that box).
  const seen = (el) => {
    let r = el.getBoundingClientRect();
    let box = { l: r.left, t: r.top, r: r.right, b: r.bottom };
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== "visible" || s.overflowY !== "visible") {
        const q = a.getBoundingClientRect();
        box = { l: Math.max(box.l, q.left), t: Math.max(box.t, q.top), r: Math.min(box.r, q.right), b: Math.min(box.b, q.bottom) };
      }
    }
    return box;
  };
  // 1. No two blocks overlap: the leaf element containers, and what is drawn inside them that could run out
  // of them (tables, charts, canvases).
  const leaves = [...main.querySelectorAll("[data-testid='stElementContainer']")]
    .filter((el) => !el.querySelector("[data-testid='stElementContainer']") && visible(el));
  const inner = [...main.querySelectorAll("table, canvas, svg.marks, [data-testid='stMetric']")].filter(visible);
  const blocks = [...leaves, ...inner].map((el) => [el, seen(el)]).filter(([, b]) => b.r - b.l > 1 && b.b - b.t > 1);
  for (let i = 0; i < blocks.length; i++) {
    for (let j = i + 1; j < blocks.length; j++) {
      const [a, p] = blocks[i], [b, q] = blocks[j];
      if (a.contains(b) || b.contains(a)) continue;
      const ca = a.closest("[data-testid='stElementContainer']"), cb = b.closest("[data-testid='stElementContainer']");
      if (ca && ca === cb) continue; // two layers of one element (a data frame's canvases)
      const w = Math.min(p.r, q.r) - Math.max(p.l, q.l), h = Math.min(p.b, q.b) - Math.max(p.t, q.t);
      if (w > 2 && h > 2) problems.push(`overlap: ${name(a)} and ${name(b)} (${Math.round(w)} x ${Math.round(h)} px)`);
    }
  }
  // 2. Nothing runs off the page's main column.
  const column = main.querySelector("[data-testid='stMainBlockContainer']") || main;
  const edge = column.getBoundingClientRect().right;
  for (const [el, b] of blocks) if (b.r > edge + 1) problems.push(`off the page by ${Math.round(b.r - edge)} px: ${name(el)}`);
  // 3. No text is cut: an element that hides what overflows it (an ellipsis, a clip) must not be wider inside
  // than out; a box that scrolls sideways is fine (one scrolls to read it).
  for (const el of main.querySelectorAll("*")) {
    if (!visible(el) || el.scrollWidth <= el.clientWidth + 1 || !el.clientWidth) continue;
    const s = getComputedStyle(el);
    if (s.overflowX === "auto" || s.overflowX === "scroll") continue;
    if (s.overflowX === "visible" && s.textOverflow !== "ellipsis") continue;
    if (el.matches("input, textarea, canvas, [data-testid='stDataFrame'] *")) continue;
    if (!(el.innerText || "").trim()) continue;
    problems.push(`cut: ${name(el)} (${el.scrollWidth} px of text in ${el.clientWidth} px)`);
  }
  // 4. Charts: Vega shortens a label, a title or a legend entry that does not fit with "…".
  for (const t of main.querySelectorAll("svg.marks text")) {
    if (!t.textContent.trim() || !visible(t)) continue;
    if (t.textContent.endsWith("…")) problems.push(`chart text cut: "${t.textContent}"`);
    const box = seen(t.closest("svg")), r = t.getBoundingClientRect();
    if (r.left < box.l - 4 || r.right > box.r + 4) problems.push(`chart text runs out of its chart: "${t.textContent}" (${Math.round(r.left)}-${Math.round(r.right)} px, chart ${Math.round(box.l)}-${Math.round(box.r)} px)`);
  }
  // 5. Data frames draw on a canvas: every text drawn since the last check fits between its column's lines.
  for (const [canvas, text, x, width, align] of window.__hareGrid.cells) {
    if (!document.contains(canvas) || !visible(canvas) || !text.trim()) continue;
    const lines = [...(window.__hareGrid.lines.get(canvas) || [])];
    const cw = canvas.getBoundingClientRect().width;
    const right_aligned = align === "right" || align === "end";
    const anchor = right_aligned ? x - 2 : x + 2;
    const colLeft = Math.max(0, ...lines.filter((l) => l < anchor));
    const colRight = Math.min(cw, ...lines.filter((l) => l > anchor));
    const left = right_aligned ? x - width : align === "center" ? x - width / 2 : x;
    if (left + width <= colRight + 0.5 && left >= colLeft - 0.5) continue;
    const scroller = canvas.closest("[data-testid='stDataFrame']")?.querySelector(".dvn-scroller");
    if (left + width > cw - 1 && scroller && scroller.scrollWidth > scroller.clientWidth + 1) continue; // scrolls
    problems.push(`table cell cut: "${text}" (${Math.round(left)}-${Math.round(left + width)} px in ${Math.round(colLeft)}-${Math.round(colRight)} px)`);
  }
  window.__hareGrid.reset();
  return [...new Set(problems)];
}
"""


MAIN_HEIGHT = """() => Math.max(1000, document.querySelector("[data-testid='stMain']").scrollHeight + 40)"""


def layout_problems_at_every_width(page: Any, name: str, shots: Path) -> dict[int, list[str]]:
    """The page as it is now, at 800, 1280 and 1920 pixels wide: a full-page screenshot of each under `shots`
    (`<name>-<width>.png`) and the problems LAYOUT finds, by width (empty when it reads well). The viewport is
    1400 x 1000 again afterwards."""
    problems: dict[int, list[str]] = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 1000})
        time.sleep(0.5)  # charts and grids redraw at the new width
        # The whole page in the window (Streamlit scrolls its main area itself, so a "full page" screenshot of
        # a short window shows its top only); then one more redraw at the final size, recorded alone, since a
        # grid first redraws at the widths in between.
        height = min(int(page.evaluate(MAIN_HEIGHT)), 8000)
        page.set_viewport_size({"width": width, "height": height})
        time.sleep(0.5)
        page.evaluate("() => window.__hareGrid.reset()")
        page.set_viewport_size({"width": width, "height": height + 1})
        time.sleep(0.4)
        page.screenshot(path=str(shots / f"{name}-{width}.png"))
        found = page.evaluate(LAYOUT)
        if found:
            problems[width] = found
    page.set_viewport_size({"width": 1400, "height": 1000})
    return problems


# -- the servers and what the page drew, for tests/test_console_browser.py ---------------------------------

RAW_FLOAT = re.compile(r"^-?[\d,]*\.\d{4,}$")  # "16.000000", "2.100000": a number nobody formatted


# Runs in every page before its own scripts: records every text drawn in a chart's SVG and on a canvas (the data
# frames draw their cells there), including texts a later redraw replaces, such as a first chart's axis.
RECORDER = """
(() => {
  const charts = new Set(), canvas = new Set();
  window.__hareChartTexts = charts;
  window.__hareCanvasTexts = canvas;
  const keep = (root) => root.querySelectorAll("text").forEach((t) => charts.add(t.textContent));
  new MutationObserver((records) => {
    for (const r of records) {
      const el = r.target.nodeType === 3 ? r.target.parentElement : r.target;
      if (el && el.closest && el.closest("svg.marks")) {
        if (el.tagName === "text") charts.add(el.textContent);
        keep(el);
      }
      r.addedNodes.forEach((n) => {
        if (n.nodeType !== 1) return;
        if (n.matches("svg.marks")) keep(n);
        n.querySelectorAll("svg.marks").forEach(keep);
      });
    }
  }).observe(document, { subtree: true, childList: true, characterData: true });
  const fillText = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
    canvas.add(String(text));
    return fillText.call(this, text, ...rest);
  };
})();
"""


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium() -> Iterator[Any]:
    """Debian's Chromium driven by Playwright, which never downloads a browser here."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (Playwright must not download a browser)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, ok: Callable[[httpx.Response], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if ok(httpx.get(url, timeout=2)):
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not come up:\n{log.read_text()[-3000:]}")


def start_process(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def expect_headers(pg: object, names: set[str]) -> None:
    """Data frames draw on a canvas; their accessible header cells show up once the grid has rendered."""
    from playwright.sync_api import Page

    assert isinstance(pg, Page)
    deadline = time.monotonic() + 30
    while True:
        seen = set(pg.locator("[data-testid='stDataFrame'] [role='columnheader']").all_inner_texts())
        if names <= seen:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"column headers {sorted(names - seen)} never appeared; saw {sorted(seen)}")
        time.sleep(0.3)


def no_traceback(pg: object) -> None:
    from playwright.sync_api import Page

    assert isinstance(pg, Page)
    assert pg.locator("[data-testid='stException']").count() == 0
    assert "Traceback" not in pg.inner_text("body")


def drawn(pg: object) -> tuple[set[str], set[str]]:
    """Every text drawn so far: (in charts, on canvases)."""
    from playwright.sync_api import Page

    assert isinstance(pg, Page)
    charts = set(pg.evaluate("() => [...window.__hareChartTexts]"))
    canvas = set(pg.evaluate("() => [...window.__hareCanvasTexts]"))
    return charts, canvas


def reads_well(pg: object) -> None:
    """No raw float in any chart drawn so far, no "None" in any table or on the page."""
    from playwright.sync_api import Page

    assert isinstance(pg, Page)
    charts, canvas = drawn(pg)
    assert not sorted(t for t in charts | canvas if RAW_FLOAT.match(t)), "unformatted numbers drawn"
    assert "None" not in canvas and "null" not in charts
    assert not re.search(r"\bNone\b", pg.inner_text("[data-testid='stMain']"))


def legends(pg: object) -> list[list[tuple[str, str, str]]]:
    """The legends of the charts on the page now: (label, colour, dash) per entry, as drawn."""
    from playwright.sync_api import Page

    assert isinstance(pg, Page)
    script = """() => [...document.querySelectorAll("[data-testid='stVegaLiteChart'] svg.marks")].map((svg) => {
        const labels = [...svg.querySelectorAll(".role-legend-label text")].map((t) => t.textContent);
        const symbols = [...svg.querySelectorAll(".role-legend-symbol path")];
        return labels.map((label, i) => [label, ((symbols[i] && (symbols[i].getAttribute("stroke") ||
            symbols[i].getAttribute("fill"))) || "").toLowerCase(),
            (symbols[i] && symbols[i].getAttribute("stroke-dasharray")) || ""]);
    })"""
    return [[(str(a), str(b), str(c)) for a, b, c in legend] for legend in pg.evaluate(script)]


def distinct_colours(legend: list[tuple[str, str, str]]) -> bool:
    """Every entry its own colour, none black (the old legends drew every series as a black dot)."""
    colours = [c for _, c, _ in legend]
    return len(set(colours)) == len(colours) and not {"#000", "#000000", "black", ""} & set(colours)


def only_local(requests: list[str], console: str) -> None:
    outside = sorted({u for u in requests if not u.startswith((console, "data:", "blob:", "about:"))})
    assert not outside, f"the browser fetched from outside the console: {outside}"


def grid(page: object, index: int) -> list[dict[str, str]]:
    """The rows of a data frame as its accessible grid holds them (what its canvas shows), by column header."""
    from playwright.sync_api import Page

    assert isinstance(page, Page)
    script = """(i) => [...document.querySelectorAll("[data-testid='stDataFrame']")[i].querySelectorAll("[role='row']")]
        .map((r) => [...r.querySelectorAll("[role='gridcell'], [role='columnheader']")].map((c) => c.innerText))"""
    header, *rows = page.evaluate(script, index)
    return [dict(zip(header, row, strict=True)) for row in rows]
