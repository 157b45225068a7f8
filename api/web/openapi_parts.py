"""The parts every route's OpenAPI operation is built from. Each module that owns routes (routes.py, protocols/)
writes its operations beside its handlers with these, and api/web/openapi.py assembles them along the route
table; keeping the parts here lets the owners import them while openapi.py imports the owners, one way.

The parts come from the tables the code enforces: the task's parameter specs and COMMON (tasks/params.py:
types, choices, ranges), the server's limits (settings), and the error table (api/web/errors.py STATUS: every
status a route can answer). The /docs page is drawn from the finished document, as plain HTML with no external
assets: the appliance often runs offline.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from api.engine.errors import NotReady, Overloaded
from api.web.errors import STATUS, BodyTimeout, NotFound, Unauthorized, UnsupportedEncoding
from api.web.schemas import COMMON
from api.web.state import Resources
from container.runtime import InferenceFailed
from tasks import params
from tasks.base import max_stride
from tasks.errors import HareError, InputError, InputTooLong, InvalidRequest

ERROR = {"$ref": "#/components/schemas/Error"}
OPENAI_ERROR = {"$ref": "#/components/schemas/OpenAIError"}  # the error shape of OpenAI's routes
# What each kind of route can fail with (their statuses come from api/web/errors.py's table).
INFER_ERRORS: tuple[type[HareError], ...] = (
    InputError,
    Unauthorized,
    InputTooLong,
    InvalidRequest,
    UnsupportedEncoding,
    BodyTimeout,
    Overloaded,
    InferenceFailed,
    NotReady,
)
READ_ERRORS: tuple[type[HareError], ...] = (
    InputError,
    Unauthorized,
    InputTooLong,
    InvalidRequest,
    BodyTimeout,
    NotReady,
)
MODEL_ERRORS: tuple[type[HareError], ...] = (Unauthorized, NotFound, NotReady)
ADMIN_ERRORS: tuple[type[HareError], ...] = (Unauthorized, NotFound, NotReady)
WHY = {
    400: "an empty input (empty string or list)",
    401: "a missing or wrong bearer token (HARE_API_KEY, or HARE_ADMIN_TOKEN on admin routes)",
    404: "no such model or version, or a route off in public mode",
    413: "the body, the number of inputs, a text's characters, or its tokens with truncate false exceed a limit",
    408: "the body began and did not end within HARE_READ_TIMEOUT (a Content-Length over the bytes sent); the "
    "connection closes",
    415: "a Content-Encoding other than gzip, deflate or identity",
    422: "malformed JSON, a wrong type, an unknown field, parameter or value; the message names it",
    429: "the worker's queue is full, or the client's rate limit is spent: retry after Retry-After seconds",
    500: "the runtime failed (InferenceFailed) or a bug; the log has the trace",
    503: "the model is loading or the worker is draining",
}
COMPUTE_HEADERS = {
    "x-compute-time": "server time for the request in seconds (microsecond resolution)",
    "x-compute-type": "cpu+optimized or gpu+optimized",
    "x-compute-characters": "characters of the inputs",
    "x-compute-tokens": "tokens fed to the model",
    "server-timing": "tokenize, queue, inference and postprocess durations (ms)",
}


def response(schema: Mapping[str, Any], description: str) -> dict[str, Any]:
    """A JSON response object."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def errors(kinds: Iterable[type[HareError]], shape: Mapping[str, Any] = ERROR) -> dict[str, Any]:
    """The error responses for `kinds`, by the status the error table gives each (429 with Retry-After), their
    body of `shape`."""
    answers: dict[str, Any] = {}
    for status in sorted({STATUS[k] for k in kinds}):
        answer = response(shape, WHY[status])
        if status == STATUS[Overloaded]:
            answer["headers"] = {"retry-after": {"required": True, "schema": {"type": "string", "pattern": "^[0-9]+$"}}}
        answers[str(status)] = answer
    return answers


def ok(schema: Mapping[str, Any], description: str, compute: bool = True) -> dict[str, Any]:
    """A 200 response; `compute`: with the compute headers every inference answer carries."""
    answer = response(schema, description)
    if compute:
        answer["headers"] = {
            name: {"description": help, "required": True, "schema": {"type": "string"}}
            for name, help in COMPUTE_HEADERS.items()
        }
    return answer


def post(
    summary: str,
    body: Mapping[str, Any],
    done: dict[str, Any],
    kinds: Iterable[type[HareError]],
    shape: Mapping[str, Any] = ERROR,
) -> dict[str, Any]:
    """An operation taking a required JSON body, answering `done` (200) or the errors of `kinds` (`shape`)."""
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {"200": done, **errors(kinds, shape)},
    }


def get(
    summary: str, done: dict[str, Any], kinds: Iterable[type[HareError]] = (), shape: Mapping[str, Any] = ERROR
) -> dict[str, Any]:
    """An operation without a body, answering `done` (200) or the errors of `kinds` (`shape`)."""
    return {"summary": summary, "responses": {"200": done, **errors(kinds, shape)}}


def closed(properties: Mapping[str, Any], required: Iterable[str] = (), **extra: Any) -> dict[str, Any]:
    """An object schema with exactly these properties: hare refuses unknown fields (422)."""
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


def nullable(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"anyOf": [dict(schema), {"type": "null"}]}


class Shapes:
    """The JSON Schema building blocks for one server: its texts within its limits, its parameters, and the
    resources the rest is read from. `width`: the served vectors' size (api/web/protocols/cohere_embed.py's),
    passed in so that this module imports no protocol."""

    def __init__(self, res: Resources, width: int | None) -> None:
        self.res = res
        self.task = res.task
        limits = res.limits
        self.text = {"type": "string", "minLength": 1, "maxLength": limits.max_input_chars}
        self.texts = {"type": "array", "items": self.text, "minItems": 1, "maxItems": limits.max_inputs}
        self.bounds: dict[str, Any] = {"stride": max_stride(limits.window_tokens), **params.model_bounds(res.model)}
        self.max_length = res.model.max_length
        if width is not None:
            self.bounds["width"] = width
        specs = {**self.task.parameters, **COMMON}
        if not self.task.windows:  # ranking reads pairs whole: no windows, so no stride and no window choice
            specs.pop("stride")
            specs["long_input"] = params.Choice(COMMON["long_input"].help, options=("truncate",))
        described = {name: spec.schema(self.bounds) for name, spec in specs.items()}
        self.params = {name: schema for name, schema in described.items() if schema is not None}

    def parameters(self, names: Iterable[str] | None = None, nullable: bool = False) -> dict[str, Any]:
        """The schemas of the parameters `names` (all by default) this server accepts, each nullable if asked."""
        chosen = {n: s for n, s in self.params.items() if names is None or n in names}
        return {n: {"anyOf": [dict(s), {"type": "null"}]} if nullable else s for n, s in chosen.items()}


# A route's operation for one method, written by the module that owns the route; None: this server's task has
# no such operation (the route answers 404 naming the task), so the document leaves it out.
Operation = Callable[[Shapes], dict[str, Any] | None]


def docs_page(document: dict[str, Any]) -> str:
    """A self-contained HTML page listing the routes and /predict's parameters."""
    e = html.escape
    rows = []
    for path, methods in document["paths"].items():
        for method, op in methods.items():
            if method == "parameters":
                continue
            rows.append(f"<tr><td><code>{method.upper()} {e(path)}</code></td><td>{e(op.get('summary', ''))}</td></tr>")
    body = document["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    items = body["properties"]["parameters"]["anyOf"][0]["properties"]
    plist = "".join(f"<li><code>{e(k)}</code>: {e(v.get('description', ''))}</li>" for k, v in items.items())
    title = e(document["info"]["title"])
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body style='font-family:sans-serif;max-width:60em;margin:2em auto'><h1>{title}</h1>"
        f"<p>{e(document['info']['description'])} Machine-readable: <a href='/openapi.json'>/openapi.json</a>.</p>"
        f"<table>{''.join(rows)}</table><h2>/predict parameters</h2><ul>{plist}</ul>"
        "<h2>Try it</h2><pre>curl -i -X POST localhost:8080/predict -H 'content-type: application/json' "
        '-d \'{"inputs": "I like you. I love you"}\'</pre></body></html>'
    )
