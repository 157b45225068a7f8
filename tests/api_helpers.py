"""In-process serving for the API tests: the real app and lifespan over httpx's ASGI transport."""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from starlette.applications import Starlette

from api.config import Settings
from api.web.app import create_app
from api.web.errors import OPENAI_ROUTES, OPENAI_TYPE_NAMES
from api.web.state import Resources
from container.bundle import TOKENIZER_FILE


class AppClient(httpx.AsyncClient):
    """An httpx client bound to one app, with the app's resources at hand for white-box checks."""

    def __init__(self, app: Starlette) -> None:
        # raise_app_exceptions=False: a bug must answer 500 like under a server, not raise into the test.
        super().__init__(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://hare")
        self.app = app

    @property
    def resources(self) -> Resources:
        found = self.app.state.hare
        assert isinstance(found, Resources)
        return found


@asynccontextmanager
async def serve(bundle: Path, **env: str) -> AsyncIterator[AppClient]:
    """A client of a fresh app on `bundle` (HARE_* overrides in `env`), its lifespan run around it."""
    settings = Settings.from_env(
        {"HARE_BUNDLE": str(bundle), "HARE_WORKERS": "1", "HARE_STREAMS": "2", "HARE_THREADS": "1", **env}
    )
    app = create_app(settings)
    async with app.router.lifespan_context(app), AppClient(app) as client:
        yield client


def assert_ranked(ranked: list[dict[str, Any]], expected: npt.ArrayLike, tol: float) -> None:
    """A rerank answer is every document once, each with its reference score (within `tol`), best first. Not
    the reference's exact order: a tiny random model can score two documents within float noise of each other,
    and batching changes that noise."""
    scores = np.asarray(expected)
    assert sorted(r["index"] for r in ranked) == list(range(len(scores)))
    assert np.allclose([r["score"] for r in ranked], scores[[r["index"] for r in ranked]], atol=tol)
    assert all(a["score"] >= b["score"] for a, b in itertools.pairwise(ranked))


def error_of(response: httpx.Response) -> tuple[str, str]:
    """An error answer's message and type, in the shape its route must answer: OpenAI's on OpenAI's routes,
    hare's everywhere else (api/web/errors.py)."""
    return error_in(response.request.url.path, response.json())


def error_in(path: str, body: dict[str, Any]) -> tuple[str, str]:
    """`error_of` for the body of an answer to a request for `path`."""
    if path.startswith(OPENAI_ROUTES):
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
        assert body["error"]["type"] in OPENAI_TYPE_NAMES, body
        return body["error"]["message"], body["error"]["code"]
    assert set(body) == {"error", "type", "error_type"} and body["type"] == body["error_type"], body
    return body["error"], body["type"]


def without_special_tokens(bundle: Path, out: Path) -> Path:
    """A copy of `bundle` at `out` whose tokenizer adds no special tokens: a text of only whitespace (or of
    zero-width characters) has no tokens at all."""
    shutil.copytree(bundle, out)
    config = json.loads((out / TOKENIZER_FILE).read_text())
    (out / TOKENIZER_FILE).write_text(json.dumps(config | {"post_processor": None}))
    return out
