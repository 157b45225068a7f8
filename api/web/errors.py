"""The HTTP face's errors, the one table from hare's whole error tree to HTTP statuses, and the one way an
error becomes an answer: {"error": "<what to fix>", "type": "<ErrorClass>"} (plus "error_type", the same name,
as issue 3 spelled the field; on OpenAI's routes OpenAI's {"error": {"message", "type", "param", "code"}}, its type
by status, the class in "code"), with the headers its class calls for.

HareError (tasks/errors.py)                       500
├── InputError (tasks/errors.py)                  400
│   ├── InvalidRequest (tasks/errors.py)          422
│   ├── InputTooLong (tasks/errors.py)            413
│   ├── NotFound                                  404
│   ├── UnsupportedEncoding                       415
│   ├── HeadTooLarge                              431
│   ├── BodyTimeout                               408 (Connection: close)
│   ├── ClientGone (api/engine/errors.py)         499
│   └── UnsupportedModel (container/optimize/)    (the optimizer's; exit code 2)
├── Unauthorized                                  401 (WWW-Authenticate: Bearer)
├── Overloaded (api/engine/errors.py)             429 (Retry-After)
│   └── RateLimited                               429 (Retry-After)
├── NotReady (api/engine/errors.py)               503
├── InferenceFailed (container/runtime.py)        500
└── ValidationFailed (container/optimize/)        (the optimizer's; exit code 3)

Every 429 is built by `answer` below: the handler's, RefuseEarly's before routing, and the bytes the accept
loop's refuser sends from the socket (api/process/refuser.py, through `raw_answer`). A bug answers 500 with
no traceback in the body; the server logs the trace.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

import orjson
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.engine.errors import ClientGone, NotReady, Overloaded
from container.runtime import InferenceFailed
from tasks.errors import HareError, InputError, InputTooLong, InvalidRequest

log = logging.getLogger("hare.errors")
JSON = "application/json"


class NotFound(InputError):
    """An unknown route; a route of another task (the message names this server's task); a KServe model name
    or version that is not this server's; admin routes in public mode."""


class UnsupportedEncoding(InputError):
    """A body sent with a `Content-Encoding` other than `gzip` (or `x-gzip`), `deflate` or `identity`."""


class HeadTooLarge(InputError):
    """A request whose head (its request line and headers) is over 32 kB (MAX_HEAD_BYTES, api/process/worker.py):
    refused once that much is read, and the connection closed."""


class BodyTimeout(InputError):
    """A request whose body began and did not end within `HARE_READ_TIMEOUT` of its head (a Content-Length
    larger than the body sent, counted in characters rather than bytes, say): the message says how much came,
    and the connection closes after the answer. A body that never begins gets no answer: its connection is
    closed as long after its head."""


class Unauthorized(HareError):
    """An inference route without `HARE_API_KEY`'s bearer token (when one is set), `/metrics` or `/info` without
    the admin token (when one is set); answered with `WWW-Authenticate: Bearer`."""


class RateLimited(Overloaded):
    """This client sent more than its share (public mode); answered with `Retry-After`."""


STATUS: dict[type[HareError], int] = {
    InvalidRequest: 422,
    InputTooLong: 413,
    NotFound: 404,
    UnsupportedEncoding: 415,
    HeadTooLarge: 431,
    BodyTimeout: 408,
    ClientGone: 499,  # nginx's "client closed request": nobody reads it, but metrics tell it from a 400
    InputError: 400,
    Unauthorized: 401,
    Overloaded: 429,
    NotReady: 503,
    InferenceFailed: 500,
    HareError: 500,
}


def status_of(exc: HareError) -> int:
    """The status of the nearest class in `exc`'s ancestry that the table lists."""
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]  # type: ignore[index]
    return 500


# OpenAI's routes. Its clients read an error's text from {"error": {"message"}} alone (openai 3.54 raised
# "Error code: 400" and nothing more on hare's shape), so these answer OpenAI's shape, the same message and type.
OPENAI_ROUTES = ("/v1/embeddings", "/v1/models")


# OpenAI's error types, by status: what its clients' users branch on (APIError.type). hare's class goes in `code`.
OPENAI_TYPES = {429: "rate_limit_error", 503: "service_unavailable_error"}


def openai_type(status: int) -> str:
    return OPENAI_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


OPENAI_TYPE_NAMES = sorted({*OPENAI_TYPES.values(), openai_type(400), openai_type(500)})  # the OpenAPI enum


def body(message: str, kind: str, status: int, path: str = "") -> bytes:
    """The JSON of an error answer: hare's one shape, or on OpenAI's routes (`path`) OpenAI's."""
    if path.startswith(OPENAI_ROUTES):
        error = {"message": message, "type": openai_type(status), "param": None, "code": kind}
        return orjson.dumps({"error": error})
    return orjson.dumps({"error": message, "type": kind, "error_type": kind})


def answer(exc: HareError, path: str = "") -> tuple[int, dict[str, str], bytes]:
    """What `exc` answers on `path`: its status, the headers its class calls for, and the body."""
    headers = {}
    if isinstance(exc, Overloaded):
        # A refused client that hammers on must reconnect (accept() is cheap, and the backlog bounds it)
        # rather than keep a worker reading its requests.
        headers = {"retry-after": str(exc.details.get("retry_after", 1)), "connection": "close"}
    elif isinstance(exc, BodyTimeout):
        headers = {"connection": "close"}  # the rest of the body may still come: it is no next request
    elif isinstance(exc, Unauthorized):
        headers = {"www-authenticate": "Bearer"}
    status = status_of(exc)
    return status, headers, body(exc.message, type(exc).__name__, status, path)


def error_response(exc: HareError, path: str = "") -> Response:
    """`answer` as a Starlette response."""
    status, headers, content = answer(exc, path)
    return Response(content, status_code=status, headers=headers, media_type=JSON)


class JsonCors(CORSMiddleware):
    """Starlette's CORS, its refused preflight answered in the one error shape (it was plain text) with the
    CORS headers it had, and saying what this server allows."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code == 200:
            return response
        allowed = (
            f"origins {', '.join(sorted(self.allow_origins))} (HARE_CORS_ORIGINS), methods "
            f"{', '.join(sorted(self.allow_methods))}, headers {', '.join(sorted(set(self.allow_headers)))}"
        )
        said = f"{bytes(response.body).decode()}: this server allows {allowed}"
        kept = {k: v for k, v in response.headers.items() if k not in ("content-length", "content-type")}
        refused = error_response(InputError(said))
        refused.headers.update(kept)
        return refused


def raw_answer(exc: HareError, path: str = "", close: bool = False) -> bytes:
    """`answer` as a whole HTTP/1.1 response, for a raw socket (the accept loop's refuser, the HTTP parser's
    refusal); `close`: it says the connection closes after it."""
    status, headers, content = answer(exc, path)
    if close:
        headers["connection"] = "close"
    head = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        f"content-type: {JSON}",
        f"content-length: {len(content)}",
    ]
    head += [f"{name}: {value}" for name, value in headers.items()]
    return "\r\n".join([*head, "", ""]).encode("latin-1") + content


def _count(request: Request, kind: str) -> None:
    resources = getattr(request.app.state, "hare", None)
    if resources is not None:
        resources.metrics.errors.labels(kind).inc()


class RefuseEarly:
    """Refuses an inference request (every POST) before routing, middleware or parsing its body, when
    admission would refuse it anyway: under a flood the refusals must cost the cores as little as possible.
    The same 429 as the handler below; requests that get past this still meet the admission check in their
    route. The body is read and dropped first: the 429 closes the connection, and one closed with bytes
    unread is reset by the kernel, which a client still sending its body sees instead of the 429."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            res = getattr(scope["app"].state, "hare", None)
            refusal = res.batcher.refusal() if res is not None else None
            if res is not None and refusal is not None:
                res.metrics.refused(scope["app"].routes, scope["path"])
                await drop_body(scope, receive, res.limits.max_body_bytes)
                await error_response(refusal, scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)


# What the probe port answers: liveness, readiness (hare's and KServe's) and the metrics scrape.
PROBE_PATHS = ("/health", "/ready", "/metrics", "/v2/health/live", "/v2/health/ready")


class ProbesOnly:
    """The probe port (HARE_PROBE_PORT) answers its probe routes alone: its connections are accepted at once,
    past the overload pacing (api/process/worker.py), so work sent there would skip it."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        self.app = app
        self.port = port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server") if scope["type"] == "http" else None
        if server is not None and server[1] == self.port and scope["path"] not in PROBE_PATHS:
            refusal = NotFound(
                f"port {self.port} (HARE_PROBE_PORT) answers GET {', '.join(PROBE_PATHS)} only; send other "
                "requests to HARE_PORT"
            )
            await error_response(refusal, scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def drop_body(scope: Scope, receive: Receive, limit: int) -> None:
    """Read a request's body and drop it, up to `limit` bytes (past that the client hears a reset, as a body
    over the limit would anyway), before a 429 that closes the connection. A body that came with its head is
    already read: one call. A client that asked `Expect: 100-continue` has sent none and sends none unless
    asked (uvicorn asks on the first read): it gets its 429 at once."""
    if any(name == b"expect" and value.lower() == b"100-continue" for name, value in scope["headers"]):
        return
    read = 0
    while read <= limit:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        read += len(message.get("body", b""))


async def on_hare_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HareError)
    kind = type(exc).__name__
    if status_of(exc) >= 500:
        log.error("%s %s: %s: %s", request.method, request.url.path, kind, exc.message, exc_info=exc.__cause__)
    _count(request, kind)
    return error_response(exc, request.url.path)


async def on_http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (unknown route, wrong method) in the same shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no route {request.url.path}; see /docs for this server's API"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}; see /docs"
    else:
        message = exc.detail
    kind = HTTPStatus(exc.status_code).phrase.replace(" ", "")
    _count(request, kind)
    content = body(message, kind, exc.status_code, request.url.path)
    return Response(content, status_code=exc.status_code, headers=exc.headers, media_type=JSON)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: 500 without details (Starlette re-raises afterwards, so the server logs the traceback)."""
    _count(request, "InternalError")
    content = body("internal error; the server log has the details", "InternalError", 500, request.url.path)
    return Response(content, 500, media_type=JSON)


HANDLERS = {HareError: on_hare_error, HTTPException: on_http_error, Exception: on_unexpected}
