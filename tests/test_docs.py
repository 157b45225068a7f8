"""The docs pages stay true to the code: generated tables match what the code enforces, every relative link
and anchor resolves, a reference page stays a reference (at most 300 lines; dated runs go to docs/history/),
and the README stays a front door (short, pointing at every page)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hare import docs

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
HISTORY = sorted((ROOT / "docs" / "history").glob("*.md"))
LINK = re.compile(r"\]\(([^)\s]*)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


@pytest.mark.parametrize("name", docs.TABLES)
def test_generated_tables_match_the_code(name: str) -> None:
    page, make = docs.TABLES[name]
    text = (docs.DOCS / page).read_text()
    assert docs.render(text, name, make()) == text, f"docs/{page} is out of date: run python -m hare.docs"


def test_a_drifted_table_is_caught(tmp_path: Path) -> None:
    for page, _ in docs.TABLES.values():
        text = (docs.DOCS / page).read_text().replace("| `HARE_PORT` |", "| `HARE_PORTS` |")
        text = text.replace("| 503 | `NotReady` |", "| 500 | `NotReady` |")
        (tmp_path / page).write_text(text)
    assert docs.drifted(tmp_path) == ["configuration.md (configuration)", "api.md (errors)"]


def test_every_error_class_has_a_status_row() -> None:
    table = docs.errors_table()
    for name in ("InvalidRequest", "InputTooLong", "NotFound", "Unauthorized", "Overloaded", "NotReady"):
        assert f"`{name}`" in table


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens, a
    repeated one numbered (-1, -2, ...)."""
    found: set[str] = set()
    for title in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", path.read_text()), re.M):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = unique = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def broken_links(path: Path) -> list[str]:
    """Every relative link in `path` whose file, or whose heading anchor in a Markdown file, is not there."""
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if not target or re.match(r"[a-z]+:", target):
            continue  # a web or mail address: not ours to check offline
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES, *HISTORY], ids=lambda p: p.name)
def test_relative_links_and_anchors_resolve(path: Path) -> None:
    assert not broken_links(path), f"{path.name} links to what is not there: {broken_links(path)}"


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A page\n\n## The tail at users = cores\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#the-tail-at-users--cores) [here](#b) [gone](a.md#the-tail) [no](c.md)\n# B\n")
    assert broken_links(page) == ["a.md#the-tail (no such heading)", "c.md (no such file)"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_reference_page_is_at_most_300_lines(page: Path) -> None:
    """Reference pages say what is and how to reproduce it; dated runs live in docs/history/."""
    assert len(page.read_text().splitlines()) <= 300, f"docs/{page.name}: move dated runs to docs/history/"


def test_the_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for page in PAGES:
        assert f"(docs/{page.name})" in readme, f"the README does not point at docs/{page.name}"
    for command in ("scripts/run", "scripts/check", "curl "):
        assert command in readme
