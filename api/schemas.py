"""Request bodies: read within limits, parse, check; every refusal names the field and says what to send.

    POST /predict          {"inputs": str | [str] | {"query", "documents"}, "parameters": {...}}
    POST /v1/embeddings    {"input": str | [str], "model"?, "encoding_format"?, "dimensions"?, "user"?}

Task parameters are the task's own (tasks/*.py `PARAMETERS`); `truncate`, `long_input` and `stride` are
common to every task and handled here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request

from tasks import params
from tasks.base import Inputs, ModelInfo, TaskSpec
from tasks.errors import ClientGone, InputTooLong, InvalidRequest

COMMON = {
    "truncate": "cut inputs longer than the model's maximum (default true); false answers 413 instead",
    "long_input": 'what to do with long inputs: "truncate" (default) or "window" to read all of the text in '
    "overlapping windows and merge the results (classification, token classification, embeddings)",
    "stride": "with long_input window: tokens shared by neighbouring windows (default: a quarter of a window)",
}
LONG_INPUT = ("truncate", "window")
BODY_FIELDS = ("inputs", "parameters", "options")  # "options" (Hugging Face's legacy wait_for_model...) is ignored
OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's caps on a request (settings), and the model's window size for the stride default."""

    max_body_bytes: int
    max_inputs: int
    max_input_chars: int
    truncate: bool
    content_length: int


@dataclass(frozen=True, slots=True)
class PredictRequest:
    """A checked request. stride: None unless long_input is "window"."""

    inputs: Inputs
    truncate: bool
    stride: int | None
    params: Any


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `limit` bytes: from Content-Length when
    given, else while streaming. Reads the ASGI messages directly: most bodies arrive in one."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _body_too_large(int(declared), limit)
    receive = request.receive
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client closed the connection before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _body_too_large(size, limit)
        if not message.get("more_body", False):
            if not chunks:
                return chunk
            chunks.append(chunk)
            return b"".join(chunks)
        chunks.append(chunk)


def _body_too_large(size: int, limit: int) -> InputTooLong:
    more = "or more " if size == limit + 1 else ""
    return InputTooLong(f"the body is {size} bytes {more}long; this server takes at most {limit}", limit=limit)


def parse_json(body: bytes) -> dict[str, Any]:
    """A JSON object (any Content-Type: `curl -d` sends form encoding for JSON bodies too)."""
    if not body.strip():
        raise InvalidRequest('the body is empty; send JSON such as {"inputs": "some text"}')
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the body is not valid JSON (UTF-8): {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            f'the body must be a JSON object such as {{"inputs": "some text"}}, got {params.kind(data)}'
        )
    return data


def parse_predict(body: bytes, task: TaskSpec, model: ModelInfo, limits: Limits) -> PredictRequest:
    data = parse_json(body)
    unknown = sorted(set(data) - set(BODY_FIELDS))
    if unknown:
        raise InvalidRequest(
            f'unknown field(s) {", ".join(unknown)}; the body is {{"inputs": ..., "parameters": {{...}}}}'
        )
    if "inputs" not in data:
        raise InvalidRequest('the body has no "inputs"; send {"inputs": "some text"}')
    inputs = task.parse_inputs(data["inputs"])
    raw = data.get("parameters")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidRequest(f"parameters must be an object, got {params.kind(raw)}")
    return _checked(inputs, raw, task, model, limits)


def parse_embeddings(body: bytes, task: TaskSpec, model: ModelInfo, limits: Limits) -> PredictRequest:
    """OpenAI's embeddings request, as a /predict request (inputs always a list: the answer is a list)."""
    data = parse_json(body)
    unknown = sorted(set(data) - set(OPENAI_FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(OPENAI_FIELDS)}")
    if "input" not in data:
        raise InvalidRequest('the body has no "input"; send {"input": "some text"}')
    value = data["input"]
    if isinstance(value, list) and value and not isinstance(value[0], str):
        raise InvalidRequest("input must be a string or a list of strings; token-id arrays are not accepted")
    single = params.texts(value, "input")
    raw = {k: data[k] for k in ("encoding_format", "dimensions") if data.get(k) is not None}
    return _checked(Inputs(single.texts, single=False), raw, task, model, limits)


def _checked(
    inputs: Inputs, raw: Mapping[str, object], task: TaskSpec, model: ModelInfo, limits: Limits
) -> PredictRequest:
    _check_limits(inputs, limits)
    unknown = sorted(k for k in raw if k not in task.parameters and k not in COMMON)
    if unknown:
        accepted = ", ".join([*task.parameters, *COMMON])
        raise InvalidRequest(f"unknown parameter(s) {', '.join(unknown)} for {task.name}; accepted: {accepted}")
    truncate = params.boolean(raw, "truncate", limits.truncate)
    long_input = params.choice(raw, "long_input", LONG_INPUT, "truncate")
    stride = None
    if long_input == "window":
        if not task.windows:
            raise InvalidRequest(f'long_input "window" is not available for {task.name}; use truncate')
        stride = params.integer(raw, "stride", limits.content_length // 4, minimum=0)
    elif "stride" in raw:
        raise InvalidRequest('parameters.stride applies to long_input "window" only; add "long_input": "window"')
    task_params = task.parse_params({k: v for k, v in raw.items() if k in task.parameters}, model)
    if task.prepare is not None:
        inputs = task.prepare(inputs, task_params)
    return PredictRequest(inputs, truncate, stride, task_params)


def _check_limits(inputs: Inputs, limits: Limits) -> None:
    if len(inputs.texts) > limits.max_inputs:
        raise InputTooLong(
            f"the request has {len(inputs.texts)} texts; this server takes at most {limits.max_inputs} per request",
            limit=limits.max_inputs,
        )
    cap = limits.max_input_chars
    if inputs.query is not None and len(inputs.query) > cap:
        raise InputTooLong(f"inputs.query is {len(inputs.query)} characters; the limit is {cap}", limit=cap)
    for i, text in enumerate(inputs.texts):
        if len(text) > cap:
            name = "inputs" if inputs.single else f"inputs.documents[{i}]" if inputs.query else f"inputs[{i}]"
            raise InputTooLong(f"{name} is {len(text)} characters; the limit is {cap}", limit=cap)
