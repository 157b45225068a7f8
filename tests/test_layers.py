"""The rooms of the house and which way their imports point (the README's Architecture picture, and
docs/architecture.md).

Read from the source with `ast`, so a new import in the wrong direction fails here before anyone reads it:
`tasks` is the floor, `container` (optimizer, runtime, bundle format, deploy files) stands on it, the server
(`api`) and the benchmarks (`bench`) stand on both, the console (`admin_ui`) reads the bench's result store,
and `hare` (the command line) is the roof that loads each subcommand from its room.

Inside the server, the same again (api/__init__.py): `api/config.py` is the floor, the inference engine
(`api/engine/`) stands on it and never sees HTTP, the HTTP face (`api/web/`) on the engine, and the process
machinery (`api/process/`) hosts the app in gunicorn's processes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("tasks", "container", "api", "bench", "admin_ui", "hare")
# package -> the other packages of ours it may import
ALLOWED: dict[str, set[str]] = {
    "tasks": set(),
    "container": {"tasks"},
    "api": {"tasks", "container"},
    "bench": {"tasks", "container"},
    "admin_ui": {"tasks", "bench"},
    "hare": {"tasks", "container", "api", "bench", "admin_ui"},  # the roof: every room below
}
# Third-party packages a room must never load: per-task code runs over numpy and tokenizer encodings only.
FORBIDDEN: dict[str, set[str]] = {"tasks": {"onnxruntime", "starlette", "torch", "transformers"}}
# api's rooms -> the rooms of api each may import. config is a module (the one Settings), the others folders.
API_ALLOWED: dict[str, set[str]] = {
    "config": set(),
    "engine": {"config"},
    "web": {"config", "engine"},
    "process": {"config", "engine", "web"},
    "bulk": {"config", "engine"},  # offline jobs over a corpus: the engine's model call, no HTTP
}
SERVING = {"starlette", "uvicorn", "uvicorn_worker", "gunicorn", "prometheus_client"}
API_FORBIDDEN: dict[str, set[str]] = {
    "engine": SERVING,  # no HTTP: plain callables in, its own errors out (the web room maps them to statuses)
    "bulk": SERVING,
    "config": SERVING | {"onnxruntime", "numpy", "tokenizers"},  # the images' health check imports it
}


def imported(path: Path) -> set[str]:
    """The top-level package of every import in the file, at any depth (functions import lazily too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", OURS)
def test_imports_point_down(package: str) -> None:
    wrong = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in imported(path):
            if (name in OURS and name != package and name not in ALLOWED[package]) or name in FORBIDDEN.get(
                package, set()
            ):
                wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "imports against the dependency direction:\n" + "\n".join(wrong)


def test_the_checker_sees_lazy_imports(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f() -> None:\n    from api.config import Settings\n    import bench.store\n")
    assert imported(source) == {"api", "bench"}


def api_room(path: Path) -> str | None:
    """The room of api a file lives in: its folder under api/, or "config" (None: api/ itself, or astray)."""
    parts = path.relative_to(ROOT / "api").parts
    if len(parts) > 1:
        return parts[0]
    return "config" if parts[0] == "config.py" else None


def api_rooms_imported(path: Path) -> set[str]:
    """The room of api behind every import of ours in the file (`from api import config` included)."""
    rooms: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            dotted = [node.module] if node.module != "api" else [f"api.{alias.name}" for alias in node.names]
        else:
            continue
        rooms.update(name.split(".")[1] for name in dotted if name.startswith("api."))
    return rooms


def test_every_api_module_lives_in_a_room() -> None:
    astray = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "api").rglob("*.py"))
        if path != ROOT / "api" / "__init__.py" and api_room(path) not in API_ALLOWED
    ]
    assert not astray, "modules of api outside its rooms (" + ", ".join(API_ALLOWED) + "):\n" + "\n".join(astray)


@pytest.mark.parametrize("room", API_ALLOWED)
def test_api_rooms_import_downward(room: str) -> None:
    files = [p for p in sorted((ROOT / "api").rglob("*.py")) if api_room(p) == room]
    assert files
    wrong = []
    for path in files:
        for other in api_rooms_imported(path) - {room} - API_ALLOWED[room]:
            wrong.append(f"{path.relative_to(ROOT)} imports api.{other}")
        for name in imported(path) & API_FORBIDDEN.get(room, set()):
            wrong.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not wrong, "imports against api's direction:\n" + "\n".join(wrong)


def test_the_api_checker_sees_every_form(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from api import config\nimport api.web.app\n"
        "def f() -> None:\n    from api.engine.cores import CorePool\n    from api.process import serve\n"
    )
    assert api_rooms_imported(source) == {"config", "web", "engine", "process"}
