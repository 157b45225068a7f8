"""KServe's Open Inference Protocol v2 (REST), so hare is a KServe runtime and tritonclient / kserve clients
reach it unchanged. Text travels as BYTES tensors; the binary tensor extension (tritonclient's default) is
read and written.

    GET  /v2                                  {"name": "hare", "version", "extensions"}
    GET  /v2/health/live, /v2/health/ready    200 {"live": true} / {"ready": true} (503 when not ready)
    GET  /v2/models/{name}[/versions/1]       {"name", "versions", "platform", "inputs", "outputs"}
    GET  /v2/models/{name}[/versions/1]/ready 200 {"name", "ready": true}
    POST /v2/models/{name}[/versions/1]/infer {"id"?, "parameters"?, "inputs": [...], "outputs"?: [...]}

A text classifier also takes text pairs (inference, paraphrase) as two tensors, "text" and "text_pair", of as
many strings each.

Each task's tensors come from its spec (`TaskSpec.tensors`, in tasks/); docs/api.md lists them.
Request-level "parameters" are the task's parameters (`top_k`, `aggregation_strategy`, `normalize`...),
besides tritonclient's own `binary_data_output` (and `priority`, `timeout`, accepted and ignored); errors
are {"error": "..."} with the status of hare's table.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from importlib import metadata as package
from typing import Any

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from api.engine.pipeline import PredictRequest
from api.web import schemas
from api.web.errors import NotFound
from api.web.openapi_parts import (
    INFER_ERRORS,
    MODEL_ERRORS,
    Shapes,
    closed,
    errors,
    get,
    nullable,
    ok,
    post,
    response,
)
from api.web.protocols import base
from api.web.protocols.base import Call, guarded, json_response, reply
from api.web.state import Resources
from tasks import params
from tasks.base import Inputs, TaskSpec, Tensor
from tasks.errors import InvalidRequest

Endpoint = Callable[[Request], Awaitable[Response]]
VERSION = "1"
PLATFORM = "onnxruntime_onnx"
HEADER = "inference-header-content-length"
IGNORED = ("priority", "timeout")
EXAMPLE = '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["some text"]}]}'
PAIR = ("text", "text_pair")  # a pair classifier's two input tensors, as transformers' pipeline names them


def _model(request: Request) -> Resources:
    """The resources, once the path names this server's model (and version 1, when a version is given)."""
    res = guarded(request)
    name = request.path_params["name"]
    if name != res.model_name:
        raise NotFound(f"no model {name!r}; this server serves {res.model_name!r}")
    version = request.path_params.get("version", VERSION)
    if version != VERSION:
        raise NotFound(f"model {name!r} has no version {version!r}; its only version is {VERSION}")
    return res


async def server(request: Request) -> Response:
    return json_response({"name": "hare", "version": package.version("hare"), "extensions": ["binary_tensor_data"]})


async def live(request: Request) -> Response:
    res = getattr(request.app.state, "hare", None)
    broken = isinstance(res, Resources) and res.batcher.broken
    return json_response({"live": not broken}, 503 if broken else 200)


async def ready(request: Request) -> Response:
    res = getattr(request.app.state, "hare", None)
    up = isinstance(res, Resources) and res.ready and res.batcher.healthy
    return json_response({"ready": up}, 200 if up else 503)


async def metadata(request: Request) -> Response:
    res = _model(request)
    signature = res.task.tensors
    return json_response(
        {
            "name": res.model_name,
            "versions": [VERSION],
            "platform": PLATFORM,
            "inputs": signature.inputs,
            "outputs": signature.outputs,
        }
    )


async def model_ready(request: Request) -> Response:
    res = _model(request)
    up = res.ready and res.batcher.healthy
    return json_response({"name": res.model_name, "ready": up}, 200 if up else 503)


@dataclass(frozen=True, slots=True)
class Asked:
    """What the infer request asked of the answer: its id, and the outputs (name -> binary) it wants."""

    id: str | None
    outputs: dict[str, bool]


def strings(tensor: dict[str, Any], binary: memoryview, at: int) -> tuple[list[str], int]:
    """A BYTES input's strings, from its JSON data or its binary_data_size bytes of `binary` from `at`."""
    if not isinstance(tensor.get("name"), str):
        raise InvalidRequest(f"inputs[].name must be a string, got {params.kind(tensor.get('name'))}")
    name = f"inputs[{tensor['name']}]"
    unknown = sorted(set(tensor) - {"name", "shape", "datatype", "parameters", "data"})
    if unknown:
        raise InvalidRequest(f"{name} has unknown field(s) {', '.join(unknown)}")
    if tensor.get("datatype") != "BYTES":
        datatype = tensor.get("datatype")
        got = repr(datatype) if isinstance(datatype, str) and len(datatype) <= 16 else params.kind(datatype)
        raise InvalidRequest(f"{name} must have datatype BYTES (text), got {got}")
    shape = _shape(tensor.get("shape"), name)
    size = schemas.parameters(tensor.get("parameters"), f"{name}.parameters").get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or at + size > len(binary):
            raise InvalidRequest(f"{name}.parameters.binary_data_size does not match the binary part of the body")
        values, at = _unpack(binary[at : at + size], name), at + size
    else:
        values = _flat(tensor.get("data"), name)
    if math.prod(shape) != len(values):  # Python's integers: a product past int64 cannot wrap to a count
        raise InvalidRequest(f"{name} has {len(values)} element(s) but its shape {shape} says {math.prod(shape)}")
    return values, at


def _shape(value: object, name: str) -> list[int]:
    """A tensor's dimensions: non-negative integers (2.0 is one, as in JSON Schema and hare's parameters)."""
    dims: list[int] = []
    for d in value if isinstance(value, list) else [None]:
        whole = int(d) if isinstance(d, float) and d.is_integer() else d
        if not isinstance(whole, int) or isinstance(whole, bool) or not 0 <= whole <= params.INT64:
            raise InvalidRequest(f"{name}.shape must be a list of integers from 0 to {params.INT64}")
        dims.append(whole)
    return dims


def _unpack(data: memoryview, name: str) -> list[str]:
    """The binary BYTES layout: each element a 4-byte little-endian length, then its bytes."""
    values, i = [], 0
    while i < len(data):
        if i + 4 > len(data):
            raise InvalidRequest(f"{name}: the binary data ends inside an element's length")
        (n,) = struct.unpack_from("<I", data, i)
        if i + 4 + n > len(data):
            raise InvalidRequest(f"{name}: the binary data ends inside an element")
        try:
            values.append(bytes(data[i + 4 : i + 4 + n]).decode("utf-8"))
        except UnicodeDecodeError:
            raise InvalidRequest(f"{name}: an element is not UTF-8 text") from None
        i += 4 + n
    return values


def _flat(data: object, name: str) -> list[str]:
    if not isinstance(data, list):
        raise InvalidRequest(f"{name}.data must be a list of strings, got {params.kind(data)}")
    flat: list[str] = []
    stack: list[Any] = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            flat.append(item)
        else:
            raise InvalidRequest(f"{name}.data must hold strings, got {params.kind(item)}")
    return flat


def _texts(tensors: Sequence[dict[str, Any]], binary: memoryview, task: TaskSpec) -> Inputs:
    found: dict[str, list[str]] = {}
    at = 0
    for tensor in tensors:
        if not isinstance(tensor, dict):
            raise InvalidRequest(f"inputs must be a list of tensor objects, got {params.kind(tensor)} in it")
        texts, at = strings(tensor, binary, at)
        if tensor["name"] in found:
            raise InvalidRequest(f"inputs has two tensors named {tensor['name']!r}")
        found[tensor["name"]] = texts
    if at != len(binary):  # bytes no tensor claims: a binary_data_size that is short, or a body with more
        raise InvalidRequest(
            f"the body's binary part has {len(binary)} bytes and the inputs' binary_data_size add up to {at}"
        )
    if task.pairs:
        if set(found) != {"query", "documents"}:
            raise InvalidRequest('text-ranking takes two inputs, "query" (one string) and "documents"')
        if len(found["query"]) != 1:
            raise InvalidRequest('the "query" input holds exactly one string')
        documents = params.text_list(found["documents"], "documents")
        return Inputs(documents, False, params.text(found["query"][0], "query"), name="documents")
    if task.text_pairs and len(found) == 2:  # transformers' pipeline names a pair's members text and text_pair
        if set(found) != set(PAIR):
            raise InvalidRequest(f'text pairs are two inputs named "text" and "text_pair"; got {", ".join(found)}')
        first, second = (found[name] for name in PAIR)
        if len(first) != len(second):
            raise InvalidRequest(f'"text" holds {len(first)} strings and "text_pair" {len(second)}: one per pair')
        text, pair = (f"inputs[{name}]" for name in PAIR)
        texts, pairs = params.text_list(first, text), params.text_list(second, pair)
        return Inputs(texts, False, pairs=pairs, name=text, pair_name=pair)
    if len(found) != 1:
        pair = ', or two, "text" and "text_pair", for text pairs' if task.text_pairs else ""
        raise InvalidRequest(f'this model takes one BYTES input of texts (e.g. "text"){pair}; got {len(found)}')
    name, texts = next(iter(found.items()))
    if task.text_pairs and name == PAIR[1]:  # the second members alone: read as texts, they were classified so
        raise InvalidRequest(f'a "{PAIR[1]}" input needs a "{PAIR[0]}" input beside it, one string each per pair')
    return Inputs(params.text_list(texts, f"inputs[{name}]"), single=False, name=f"inputs[{name}]")


def _parse(body: bytes, res: Resources, header: int | None) -> tuple[PredictRequest, Asked]:
    if header is not None and not 0 < header <= len(body):
        raise InvalidRequest(f"Inference-Header-Content-Length is {header}; the body has {len(body)} bytes")
    data = schemas.parse_json(body[:header] if header is not None else body, EXAMPLE)
    schemas.only_fields(data, ("id", "parameters", "inputs", "outputs"))
    raw = dict(schemas.parameters(data.get("parameters")))
    binary_all = params.boolean(raw, "binary_data_output", False)
    for name in ("binary_data_output", *IGNORED):
        raw.pop(name, None)
    for name, spec in res.task.tensors.parameters.items():
        if name in raw:  # before the model runs: the answer could not be these tensors
            spec.read(raw, name, None)
    tensors = data.get("inputs")
    if not isinstance(tensors, list) or not tensors:
        raise InvalidRequest("inputs must be a non-empty list of tensors")
    inputs = _texts(tensors, memoryview(body)[header or len(body) :], res.task)
    known: list[str] = [o["name"] for o in res.task.tensors.outputs]
    asked: dict[str, bool] = {name: binary_all for name in known}
    if data.get("outputs") is not None:
        if not isinstance(data["outputs"], list):
            raise InvalidRequest("outputs must be a list of {name} objects")
        asked = {}
        for out in data["outputs"]:
            if isinstance(out, dict) and set(out) - {"name", "parameters"}:
                raise InvalidRequest("outputs entries take name and parameters only")
            wanted = out.get("name") if isinstance(out, dict) else None
            if not isinstance(wanted, str) or wanted not in known:
                raise InvalidRequest(f"outputs names {wanted!r}; this model's outputs are {', '.join(known)}")
            options = schemas.parameters(out.get("parameters"), f"outputs[{wanted}].parameters")
            asked[wanted] = params.boolean(options, "binary_data", binary_all)
    request_id = data.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"id must be a string, got {params.kind(request_id)}")
    return schemas.checked(inputs, raw, res.task, res.model, res.limits), Asked(request_id, asked)


async def infer(request: Request) -> Response:
    _model(request)
    declared = request.headers.get(HEADER)
    if declared is not None and not declared.isdigit():
        raise InvalidRequest(f"Inference-Header-Content-Length must be a number of bytes, got {declared!r}")
    call = await base.infer(request, partial(_parse, header=int(declared) if declared is not None else None))
    return _answer(call)


def _answer(call: Call[Asked]) -> Response:
    res, asked = call.res, call.extra
    tensors = [t for t in res.task.tensors.convert(call.served.answer.body) if t.name in asked.outputs]
    outputs, blobs = [], []
    for t in tensors:
        out: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        if asked.outputs[t.name]:
            blob = _pack(t)
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = t.data.ravel().tolist() if isinstance(t.data, np.ndarray) else t.data
        outputs.append(out)
    answer: dict[str, Any] = {"model_name": res.model_name, "model_version": VERSION, "outputs": outputs}
    if asked.id is not None:
        answer["id"] = asked.id
    head = orjson.dumps(answer)
    if not blobs:
        return reply(call, head)
    extra = [(b"inference-header-content-length", b"%d" % len(head))]
    return reply(call, b"".join([head, *blobs]), "application/octet-stream", extra)


def _pack(t: Tensor) -> bytes:
    if t.datatype == "BYTES":
        return b"".join(struct.pack("<I", len(b)) + b for b in (s.encode() for s in t.data))
    dtype = {"FP32": "<f4", "INT64": "<i8"}[t.datatype]
    return np.ascontiguousarray(t.data, dtype=dtype).tobytes()


LIVE = response({"type": "object", "properties": {"live": {"type": "boolean"}}}, "live")
READY = response({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "ready")
NOT_READY = response({"type": "object", "properties": {"ready": {"type": "boolean"}}}, "not ready")


def server_operation(s: Shapes) -> dict[str, Any]:
    server = {"type": "object", "required": ["name", "version", "extensions"]}
    return get("KServe v2 server metadata", response(server, "name, version, extensions"))


def live_operation(s: Shapes) -> dict[str, Any]:
    return {"summary": "KServe v2 liveness", "responses": {"200": LIVE, "503": LIVE}}


def ready_operation(s: Shapes) -> dict[str, Any]:
    return {"summary": "KServe v2 readiness", "responses": {"200": READY, "503": NOT_READY}}


def metadata_operation(s: Shapes) -> dict[str, Any]:
    io = {"type": "array", "items": {"type": "object"}}
    meta = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "versions": {"type": "array"},
            "platform": {"type": "string"},
            "inputs": io,
            "outputs": io,
        },
        "required": ["name", "versions", "platform", "inputs", "outputs"],
    }
    return get("KServe v2 model metadata", response(meta, "the model's tensors"), MODEL_ERRORS)


def model_ready_operation(s: Shapes) -> dict[str, Any]:
    responses = {"200": READY, "503": NOT_READY, **errors(MODEL_ERRORS)}
    return {"summary": "KServe v2 model ready", "responses": responses}


def infer_operation(s: Shapes) -> dict[str, Any]:
    signature = s.task.tensors
    # The request's parameters are the task's, besides tritonclient's: binary_data_output and the ignored ones.
    extra = {"binary_data_output": {"type": "boolean"}, **{name: {"description": "ignored"} for name in IGNORED}}
    narrowed = {name: spec.schema(s.bounds) for name, spec in signature.parameters.items()}
    request_parameters = nullable(closed({**s.parameters(), **narrowed, **extra}))
    # An output's binary_data: its tensor follows the JSON in a binary answer; other parameters are ignored.
    output_parameters = {"type": ["object", "null"], "properties": {"binary_data": {"type": "boolean"}}}
    if s.task.pairs:  # exactly a "query" tensor of one text and a "documents" tensor, in either order
        query = _tensor(s, {"const": "query"}, 1)
        documents = _tensor(s, {"const": "documents"}, s.res.limits.max_inputs)
        named = [{"contains": {"properties": {"name": {"const": n}}}} for n in ("query", "documents")]
        inputs = {"type": "array", "items": {"oneOf": [query, documents]}, "minItems": 2, "maxItems": 2, "allOf": named}
    else:
        inputs = {"type": "array", "items": _tensor(s, {"type": "string"}, s.res.limits.max_inputs), "minItems": 1}
        inputs["maxItems"] = 1
        if s.task.text_pairs:  # or a pair: "text" and "text_pair" (of as many strings: 422 when not)
            named = [{"contains": {"properties": {"name": {"const": n}}}} for n in PAIR]
            inputs |= {"maxItems": 2, "anyOf": [{"maxItems": 1}, {"allOf": named}]}
    body = {
        "type": "object",
        "required": ["inputs"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": ["string", "null"]},
            "parameters": request_parameters,
            "inputs": inputs,
            "outputs": {
                "type": ["array", "null"],
                "items": closed(
                    {"name": {"enum": [t["name"] for t in signature.outputs]}, "parameters": output_parameters},
                    ["name"],
                ),
            },
        },
        "description": "inputs: "
        + ", ".join(f"{t['name']} {t['datatype']} {t['shape']}" for t in signature.inputs)
        + "; outputs: "
        + ", ".join(f"{t['name']} {t['datatype']} {t['shape']}" for t in signature.outputs)
        + "; a tensor's shape must count its data's elements (JSON Schema cannot say so: 422 when it does not); "
        "data may also be nested row-major lists, or, with the binary tensor extension (an "
        f"{HEADER} header), sit after the JSON in the body (parameters.binary_data_size); parameters are the task's",
    }
    done = ok({"type": "object", "required": ["model_name", "outputs"]}, "the output tensors")
    done["content"]["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    summary = "KServe v2 infer (BYTES text tensors; binary tensor extension)"
    return post(summary, body, done, (*INFER_ERRORS, NotFound))


def _tensor(s: Shapes, name: dict[str, Any], most: int) -> dict[str, Any]:
    """A request tensor of the Open Inference Protocol: name, shape, datatype and data are required (data holds
    at most `most` texts); parameters are optional."""
    dimension = {"type": "integer", "minimum": 0, "maximum": params.INT64}
    properties = {
        "name": name,
        "shape": {"type": "array", "items": {"const": 1} if most == 1 else dimension},
        "datatype": {"const": "BYTES"},
        # binary_data_size points into the binary part of a body with the binary extension, which a JSON
        # body has not (the description says so); other tensor parameters are ignored.
        "parameters": {"type": ["object", "null"], "properties": {"binary_data_size": False}},
        "data": {"type": "array", "items": s.text, "minItems": 1, "maxItems": most},
    }
    return closed(properties, ["name", "shape", "datatype", "data"])
