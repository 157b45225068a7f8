"""docs/architecture.md is drawn as the code is: every path it names exists, it shows every room (the top
level's and api's), and its build path names `hare optimize`'s stages as the pipeline orders them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layers import API_ALLOWED, OURS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
ROOMS = "|".join(OURS)
PATH = re.compile(rf"(?<![\w./-])((?:{ROOMS}|tests|docs)/[\w./]*)")


def named_paths(text: str) -> set[str]:
    """Every repository path in `text` (a room's folder or a file under it)."""
    return {match.rstrip(".") for match in PATH.findall(text)}


def test_every_path_on_the_page_exists() -> None:
    paths = named_paths(PAGE.read_text())
    assert len(paths) > 30  # the page does name the modules
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_modules_in_apis_rooms_exist() -> None:
    """The api table names modules by their bare names, each in the row of its room."""
    table = PAGE.read_text().split("Inside `api/`", 1)[1].split("```")[1]
    room, named = "", []
    for line in table.splitlines():
        if line.startswith(" api/config.py"):
            continue
        if match := re.match(r" (api/\w+/)", line):
            room, line = match.group(1), line[match.end() :]
        named += [room + name for name in re.findall(r"(?<![\w/.])(\w+\.py|\w+/)", line)]
    assert len(named) > 20
    missing = [path for path in named if not (ROOT / path).exists()]
    assert not missing, f"docs/architecture.md's api table names modules that are not there: {missing}"


def test_the_page_shows_every_room() -> None:
    text = PAGE.read_text()
    rooms = [f"{room}/" for room in OURS] + [f"api/{room}/" for room in API_ALLOWED if room != "config"]
    assert [room for room in rooms if f" {room}" not in text] == []
    assert "api/config.py" in text


def test_the_build_path_names_the_pipelines_stages_in_order() -> None:
    tree = ast.parse((ROOT / "container" / "optimize" / "pipeline.py").read_text())
    (hints,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HINTS" for t in node.targets)
    ]
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "stage"
    ]
    names = [ast.literal_eval(call.args[0]) for call in sorted(calls, key=lambda call: call.lineno)]
    assert names == list(ast.literal_eval(hints))  # every stage run has its hint, in the order they run
    build = PAGE.read_text().split("## One build", 1)[1]
    drawn = [re.split(r"\s{2,}", line.strip())[0] for line in build.splitlines() if line.startswith("   ")]
    assert [name for name in drawn if name in names] == names


def test_the_path_finder_reads_paths_in_prose() -> None:
    text = "the app (api/web/app.py), `tasks/ops.py`. Rooms: tasks/ and bench/; not xapi/web/app.py"
    assert named_paths(text) == {"api/web/app.py", "tasks/ops.py", "tasks/", "bench/"}
