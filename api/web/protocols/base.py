"""The one way every protocol runs a request: the API key, the rate limit, admission, reading and parsing the
body, the pipeline; and the one way it answers, with hare's compute headers:

    x-compute-time        server time for the request in seconds, microsecond resolution (read body to
                          serialized answer), as Hugging Face's Inference API reports it
    x-compute-type        cpu+optimized or gpu+optimized
    x-compute-characters  characters of the inputs
    x-compute-tokens      tokens fed to the model (special tokens and every window included)
    server-timing         tokenize, queue, inference and postprocess durations in milliseconds (W3C)
    x-truncated           "true" when an input was cut to the model's maximum length; the answer's objects
                          for that input (labels, entities, ranked documents) then also carry "truncated": true
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive

from api.engine.errors import Overloaded
from api.engine.pipeline import PredictRequest, Served
from api.web import schemas
from api.web.errors import NotFound, drop_body
from api.web.metrics import SERVED
from api.web.public import check_api_key
from api.web.state import Resources, resources
from tasks.base import TaskSpec

JSON = "application/json"
T = TypeVar("T")
# A protocol's parser: the body and the worker's resources -> the checked request, and whatever the protocol
# needs to shape its answer.
Parser = Callable[[bytes, Resources], tuple[PredictRequest, T]]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """An answered request: what the pipeline served, when the request started, and the parser's extra."""

    res: Resources
    request: PredictRequest
    served: Served
    start: float
    extra: T


def guarded(request: Request, needs: Callable[[TaskSpec], bool] | None = None, what: str = "") -> Resources:
    """The worker's resources once the API key checks out; `needs` says which bundles a route serves."""
    res = resources(request)
    check_api_key(request, res.settings)
    if needs is not None and not needs(res.task):
        raise NotFound(f"{request.url.path} needs {what}; this server answers {res.task.name} (see /docs)")
    return res


async def infer(
    request: Request, parse: Parser[T], needs: Callable[[TaskSpec], bool] | None = None, what: str = ""
) -> Call[T]:
    """Run one inference request of any protocol: admitted before its body is read (a full worker answers 429
    at once), parsed within the body limit, then tokenized, batched and post-processed."""
    start = time.perf_counter()
    res = guarded(request, needs, what)
    if res.limiter is not None:
        res.limiter.check(request)
    try:
        admitted = res.batcher.admit()
    except Overloaded:
        await drop_body(request.scope, request.receive, res.limits.max_body_bytes)  # see RefuseEarly
        raise
    with admitted as ticket:
        body = await schemas.read_body(request, res.limits)
        parsed, extra = parse(body, res)
        served = await res.pipeline.run(ticket, parsed, partial(_gone, request.receive))
    request.scope[SERVED] = served
    return Call(res, parsed, served, start, extra)


async def _gone(receive: Receive) -> None:
    """Returns once the client has closed the connection (its body is read, so that is all receive says)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def reply(call: Call[Any], body: Any, media_type: str = JSON, headers: Iterable[tuple[bytes, bytes]] = ()) -> Response:
    """The answer with the compute headers; `body` is JSON-serialized unless it is bytes already."""
    served = call.served
    content = body if isinstance(body, bytes) else orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    tokenize, queue, inference, postprocess = served.phases
    response = Response(content, media_type=media_type)
    # Raw header bytes: no per-request header parsing; the metrics middleware records `served` afterwards.
    response.raw_headers += [
        (b"x-compute-time", b"%.6f" % (time.perf_counter() - call.start)),
        (b"x-compute-type", call.res.compute_type_header),
        (b"x-compute-characters", b"%d" % served.characters),
        (b"x-compute-tokens", b"%d" % served.tokens),
        (
            b"server-timing",
            b"tokenize;dur=%.3f, queue;dur=%.3f, inference;dur=%.3f, postprocess;dur=%.3f"
            % (tokenize * 1e3, queue * 1e3, inference * 1e3, postprocess * 1e3),
        ),
        *headers,
    ]
    if any(served.truncated):
        response.raw_headers.append((b"x-truncated", b"true"))
    return response


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


def embeddings(task: TaskSpec) -> bool:
    return task.embeddings


def pairs(task: TaskSpec) -> bool:
    return task.pairs


def sparse(task: TaskSpec) -> bool:
    return task.sparse
