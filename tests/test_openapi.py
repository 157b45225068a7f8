"""The OpenAPI document is exact: schemathesis (every phase, positive and negative modes, every check) against a
real `hare serve` per task finds no failure and no 5xx. Bounded examples per operation keep it to seconds a task.
Any parameter may also sit at the body's root of /predict (the Hugging Face client's habit): the document
says so in words, not in the schema, so the fuzzer leaves that alone (tests/test_clients.py covers it).

One status the document states but JSON Schema cannot tie to a body: 413 for a text whose tokens exceed the
model's maximum with truncate false (tokens are not characters), for a body over HARE_MAX_BODY_BYTES, and for
more inputs than HARE_MAX_INPUTS (a limit, not a malformed body); the checks accept 413 besides their defaults.
KServe's rule that a tensor's shape counts its data is beyond JSON Schema too: a hook states it
(tests/schemathesis_hooks.py), so the fuzzer's infer bodies reach the model.

The document's paths are the route table's (api/web/routes.py): every route is in it with its methods, or is
left out because the task has no such operation, and then answers 404 naming the task; nothing else is in it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from api.web.protocols import kserve
from api.web.routes import Documented
from tests.api_helpers import AppClient, serve
from tests.conftest import ModelFactory
from tests.test_clients import serve_tiny

ROOT = Path(__file__).resolve().parents[1]
CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "413", "429"]

[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
"""


TASKS = ["feature-extraction", "text-classification", "token-classification", "text-ranking"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# The quick run fuzzes the default task's document; the others' (30-60 s each on 2 cores) wait for CI's slow run.
@pytest.mark.parametrize("task", [TASKS[0], *(pytest.param(t, marks=pytest.mark.slow) for t in TASKS[1:])])
def test_schemathesis_finds_nothing(task: str, tiny_bundle: ModelFactory, tmp_path: Path) -> None:
    assert_schemathesis_finds_nothing(tiny_bundle(task), tmp_path)


def assert_schemathesis_finds_nothing(bundle: Path, tmp_path: Path) -> None:
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG)
    # Small caps: the document states them, and schemathesis probes their boundaries (a million-character
    # text at every boundary would take minutes).
    with serve_tiny(bundle, HARE_MAX_INPUT_CHARS="200", HARE_MAX_INPUTS="8") as url:
        done = subprocess.run(
            [
                str(ROOT / ".venv" / "bin" / "st"),
                "--config-file",
                str(config),
                "run",
                f"{url}/openapi.json",
                "--checks",
                "all",
                "--phases",
                "examples,coverage,fuzzing,stateful",
                "--mode",
                "all",
                "--max-examples",
                "15",
                "--seed",
                "1",
                "--continue-on-failure",
                # One worker: hypothesis parses source while it draws, and two workers failed a run here with
                # Python 3.11's spurious "AST constructor recursion depth mismatch" SystemError (CPython gh-106905).
                "--workers",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(ROOT)},
        )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


@pytest.mark.anyio
@pytest.mark.parametrize("task", TASKS)
async def test_the_paths_are_the_route_table(task: str, tiny_bundle: ModelFactory) -> None:
    async with serve(tiny_bundle(task)) as client:
        await assert_paths_are_the_route_table(client)


async def assert_paths_are_the_route_table(client: AppClient) -> None:
    """Every route the app serves is documented with its methods, or left out of the document because its owner
    states no operation for this task, and then answers 404 naming the task; every documented path is a route.
    A new route with no operation, or one whose operation is always None, fails here."""
    routes = client.app.routes
    assert all(isinstance(route, Documented) for route in routes), "a route /openapi.json cannot describe"
    spec = (await client.get("/openapi.json")).json()
    table = {route.path_format: route for route in routes if isinstance(route, Documented)}
    assert set(spec["paths"]) <= set(table), f"paths no route serves: {set(spec['paths']) - set(table)}"
    name = client.resources.model_name
    for path, route in table.items():
        documented = {method.upper() for method in spec["paths"].get(path, {}) if method != "parameters"}
        assert documented <= set(route.operations)
        url = path.format(name=name, model=name, version=kserve.VERSION)
        for method in route.operations:
            answer = await client.request(method, url, json={} if method == "POST" else None)
            error = answer.json().get("error") if answer.status_code == 404 else None
            message = error["message"] if isinstance(error, dict) else error  # OpenAI's routes nest it
            refused = message is not None and "this server answers" in message
            assert refused == (method not in documented), f"{method} {path} answers {answer.status_code}"
