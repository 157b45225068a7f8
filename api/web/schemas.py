"""Request bodies: read within limits, parse, check; every refusal names the field and says what to send.

    POST /predict   {"inputs": str | [str] | {"query", "documents"} | {"source_sentence", "sentences"}
                               | {"text", "text_pair"} | [{"text", "text_pair"} | [str, str]],
                     "parameters": {...}, <any parameter at the root>}

The protocol modules (api/web/protocols/) turn their own bodies into the same PredictRequest through `checked`.
Task parameters are the task's own (tasks/*.py `PARAMETERS`); COMMON ones are handled here. A parameter may
also sit at the body's root, as the Hugging Face client sends feature-extraction's options (TEI style).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.types import Message, Receive

from api.engine.errors import ClientGone
from api.engine.pipeline import PredictRequest
from api.web.errors import BodyTimeout, UnsupportedEncoding
from tasks import params
from tasks.base import SIDES, Inputs, LongInput, ModelInfo, Side, TaskSpec
from tasks.errors import InputTooLong, InvalidRequest

LONG_INPUT = ("truncate", "window")
# truncation_direction's values: TEI's names (Right, Left), and the huggingface_hub client's (right, left).
DIRECTIONS: dict[str, Side] = {name: side for key, side in SIDES.items() for name in (key.capitalize(), key)}
COMMON: dict[str, params.Spec] = {
    "truncate": params.Boolean("cut inputs longer than the model's maximum (default true); false answers 413 instead"),
    "truncation_direction": params.Choice(
        "which end a too-long input loses: Right (default: its end, as transformers' tokenizers cut) or Left "
        "(its start: the text's last tokens are read); a pair loses tokens from the same end of each text",
        options=tuple(DIRECTIONS),
    ),
    "long_input": params.Choice(
        'what to do with long inputs: "truncate" (default) or "window" to read all of the text in overlapping '
        "windows and merge the results (classification, token classification, embeddings); stride alone "
        "implies window, as in transformers",
        options=LONG_INPUT,
    ),
    "stride": params.Integer(
        "tokens shared by neighbouring windows (default: a quarter of a window), at most half a window's "
        'content tokens; given alone it implies long_input "window", and long_input "truncate" ignores it',
        minimum=0,
        bound="stride",
    ),
}
# Embedding parameters that shape the vectors of an answer. A sentence-similarity answer is cosines, always
# of float sentence vectors, so they are checked and then set aside (see for_cosines).
VECTOR_SHAPE = ("encoding_format", "output_value")
JSON_DEPTH = 1024  # orjson's bound on nesting: deeper JSON is refused as "depth limit exceeded"
BODY_FIELDS = ("inputs", "parameters", "options")  # "options" (Hugging Face's legacy wait_for_model...) is ignored


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's caps on a request (settings), and a window's content tokens (the stride's bound)."""

    max_body_bytes: int
    max_inputs: int
    max_input_chars: int
    truncate: bool
    window_tokens: int
    read_timeout: float  # seconds the body gets to come whole (0: no limit)


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body, refused (413) as soon as it is known to exceed the limit: from Content-Length when given,
    else while streaming, and once decompressed (`Content-Encoding`); refused (408) when it has not all come
    within the read timeout. Reads the ASGI messages directly: most bodies arrive in one."""
    limit = limits.max_body_bytes
    headers = request.headers
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _body_too_large(int(declared), limit)
    encoding = headers.get("content-encoding")
    body = await _read(request.receive, limit, limits.read_timeout, declared)
    return body if encoding is None else decoded(body, encoding, limit)


def _body_timeout(size: int, declared: str | None, timeout: float) -> BodyTimeout:
    # Said, not only closed: a client whose Content-Length counts characters, not bytes, is left to guess.
    came = f"{size:,} bytes"
    if declared is not None and declared.isdigit():
        came = f"{size:,} of the {int(declared):,} bytes its Content-Length announces"
    return BodyTimeout(
        f"the body did not come whole within {timeout:g} s (HARE_READ_TIMEOUT): {came} came; send the "
        "whole body, and a Content-Length that counts its bytes (not characters)"
    )


def decoded(body: bytes, encoding: str, limit: int) -> bytes:
    """`body` undone from `encoding` (a Content-Encoding header: gzip, deflate, identity, or a list of them in
    the order applied), at most `limit` bytes of it (413 past that: a few KB of gzip can hold GBs)."""
    for name in reversed([e.strip().lower() for e in encoding.split(",")]):
        if name in ("", "identity"):
            continue
        if name not in DECODERS:
            known = ", ".join(DECODERS)
            raise UnsupportedEncoding(
                f"Content-Encoding {name} is not supported; send the body as it is (identity), or as one of {known}"
            )
        body = _inflate(body, name, limit)
    return body


# zlib's window bits for each encoding: gzip's header and trailer; deflate as HTTP defines it (zlib's format).
DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _inflate(data: bytes, name: str, limit: int) -> bytes:
    out = bytearray()
    while data:  # a gzip body may be several members one after another
        inflater = zlib.decompressobj(DECODERS[name])
        try:
            out += inflater.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise InvalidRequest(f"the body is not valid {name} (Content-Encoding {name}): {exc}") from None
        if len(out) > limit:
            raise InputTooLong(
                f"the body decompresses to more than {limit} bytes; this server takes at most {limit}", limit=limit
            )
        if not inflater.eof:
            raise InvalidRequest(f"the body ends before its {name} stream does (Content-Encoding {name})")
        data = inflater.unused_data
    return bytes(out)


async def _read(receive: Receive, limit: int, timeout: float, declared: str | None) -> bytes:
    """The body as sent, refused (413) once it exceeds `limit` bytes, and (408) when it has not all come
    `timeout` seconds (0: no limit) after the first read. The first message is not timed: most bodies come in
    one, and a timer cost 4 us a request. A body that never begins is left to the worker's look for slow
    reads (api/process/worker.py), which closes the connection without a word."""
    began = asyncio.get_running_loop().time()
    chunk, more = _chunk(await receive(), 0, limit)
    if not more:
        return chunk
    chunks = [chunk]
    size = len(chunk)
    try:
        async with asyncio.timeout_at(began + timeout if timeout else None):
            while more:
                chunk, more = _chunk(await receive(), size, limit)
                chunks.append(chunk)
                size += len(chunk)
    except TimeoutError:
        raise _body_timeout(size, declared, timeout) from None
    return b"".join(chunks)


def _chunk(message: Message, before: int, limit: int) -> tuple[bytes, bool]:
    """A message's piece of the body, and whether more follows; `before`: the bytes read before it."""
    if message["type"] == "http.disconnect":
        raise ClientGone("the client closed the connection before sending the whole body")
    chunk: bytes = message.get("body", b"")
    more: bool = message.get("more_body", False)
    if before + len(chunk) > limit:  # the rest is not read: the body is this long or longer
        raise _body_too_large(before + len(chunk), limit, whole=not more)
    return chunk, more


def _body_too_large(size: int, limit: int, whole: bool = True) -> InputTooLong:
    """`whole`: `size` is the body's length (Content-Length, or read to its end), else what was read of it."""
    more = "" if whole else "at least "
    return InputTooLong(f"the body is {more}{size} bytes long; this server takes at most {limit}", limit=limit)


HF_EXAMPLE = '{"inputs": "some text"}'  # the Hugging Face Inference API's body (TEI's too)
PAIRS_EXAMPLE = '{"inputs": {"query": "some text", "documents": ["other text"]}}'  # a ranking bundle's /predict


def parse_json(body: bytes, example: str) -> dict[str, Any]:
    """A JSON object (any Content-Type: `curl -d` sends form encoding for JSON bodies too); `example`: a body of
    the route's own, which a refusal shows (each protocol names its texts its own way)."""
    if not body.strip():
        raise InvalidRequest(f"the body is empty; send JSON such as {example}")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(_not_json(body, exc)) from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"the body must be a JSON object such as {example}, got {params.kind(data)}")
    return data


def _not_json(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """What is wrong with a body orjson refused, in the words that help: its own when the text is UTF-8."""
    if body[:2] == b"\x1f\x8b":
        return "the body looks gzip-compressed; send it with Content-Encoding: gzip, or uncompressed"
    try:
        body.decode()
    except UnicodeDecodeError as bad:
        return (
            f"the body is not UTF-8 text (byte {body[bad.start]:#04x} at offset {bad.start}); send JSON encoded "
            "as UTF-8"
        )
    if str(exc).startswith("depth limit exceeded"):
        return f"the body nests arrays or objects over {JSON_DEPTH:,} levels deep, orjson's bound; flatten it"
    return f"the body is not valid JSON (UTF-8): {exc}"


def parse_predict(body: bytes, task: TaskSpec, model: ModelInfo, limits: Limits) -> PredictRequest:
    return parse_hf(body, task, model, limits)[0]


def parse_hf(body: bytes, task: TaskSpec, model: ModelInfo, limits: Limits) -> tuple[PredictRequest, bool]:
    """The Hugging Face Inference API body, and whether it asks for sentence similarity (embedding bundles
    take {"source_sentence", "sentences"} as inputs: the texts to embed are then [source, *sentences])."""
    example = PAIRS_EXAMPLE if task.pairs else HF_EXAMPLE
    data = parse_json(body, example)
    require(data, ("inputs",), example)
    raw = parameters(data.get("parameters"))
    parameters(data.get("options"), "options")  # the Inference API's wait_for_model and use_cache: ignored
    root = {k: v for k, v in data.items() if k not in BODY_FIELDS}
    unknown = sorted(k for k in root if k not in task.parameters and k not in COMMON)
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)}; the body is "
            f'{{"inputs": ..., "parameters": {{...}}}}, and a parameter may also sit at the root: '
            f"{', '.join(accepted_parameters(task, model))}"
        )
    for name in set(raw) & set(root):  # a parameter at the root wins; the one it hides is still checked
        (task.parameters.get(name) or COMMON[name]).read(raw, name, None)
    raw = params.Parameters({**raw, **root}, at_root=root) if root else raw  # a plain dict: the common case, quicker
    value = data["inputs"]
    if task.embeddings and isinstance(value, dict):
        return checked(similarity_inputs(value), for_cosines(raw, task), task, model, limits, uncounted=1), True
    return checked(task.parse_inputs(value), raw, task, model, limits), False


def accepted_parameters(task: TaskSpec, model: ModelInfo) -> list[str]:
    """The parameters a request of `task` may name for this model: its own that the model takes
    (params.taken), then the common ones it can use (a stride reads windows, which a task that reads its
    inputs whole refuses)."""
    return [*params.taken(task.parameters, model), *(name for name in COMMON if task.windows or name != "stride")]


def require(data: Mapping[str, object], names: Sequence[str], example: str) -> None:
    """Refuse a body that lacks any of the fields `names`, naming them and showing the route's `example`."""
    missing = ", ".join(f'"{name}"' for name in names if name not in data)
    if missing:
        raise InvalidRequest(f"the body has no {missing}; send {example}")


def only_fields(data: Mapping[str, object], accepted: Sequence[str]) -> None:
    """Refuse a body with fields beyond `accepted` (listed in the message in that order)."""
    unknown = sorted(set(data) - set(accepted))
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}")


def parameters(value: object, name: str = "parameters") -> dict[str, Any]:
    """A request's parameters object (null or absent: none)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object, got {params.kind(value)}")
    return value


def similarity_inputs(value: Mapping[str, object], name: str = "inputs") -> Inputs:
    """{"source_sentence": str, "sentences": [str]} as the texts [source, *sentences]."""
    unknown = sorted(set(value) - {"source_sentence", "sentences"})
    if unknown:
        raise InvalidRequest(
            f"{name} has unknown field(s) {', '.join(unknown)}; sentence similarity takes "
            '{"source_sentence": str, "sentences": [str]}'
        )
    if "source_sentence" not in value or "sentences" not in value:
        raise InvalidRequest(f'{name} needs "source_sentence" and "sentences" for sentence similarity')
    source = params.text(value["source_sentence"], f"{name}.source_sentence")
    sentences = params.text_list(value["sentences"], f"{name}.sentences")
    texts = [source, *sentences]
    return Inputs(texts, single=False, name=f"{name}.sentences", lead=f"{name}.source_sentence")


def for_cosines(raw: Mapping[str, object], task: TaskSpec) -> Mapping[str, object]:
    """A similarity request's parameters without those that shape answer vectors (each still checked)."""
    for name in VECTOR_SHAPE:
        if name in raw and name in task.parameters:
            task.parameters[name].read(raw, name, None)
    return params.only(raw, [k for k in raw if k not in VECTOR_SHAPE])


def checked(
    inputs: Inputs,
    raw: Mapping[str, object],
    task: TaskSpec,
    model: ModelInfo,
    limits: Limits,
    uncounted: int = 0,
    text_tokens: int | None = None,
) -> PredictRequest:
    """A request from its inputs and its parameters (the task's and COMMON), each checked. `uncounted`: leading
    texts the body's shape adds (sentence similarity's source sentence), outside the max_inputs limit;
    `text_tokens`: the body's own cap on a text's tokens (Cohere's max_tokens, max_tokens_per_doc)."""
    check_limits(inputs, limits, uncounted)
    unknown = sorted(k for k in raw if k not in task.parameters and k not in COMMON)
    if unknown:
        accepted = ", ".join(accepted_parameters(task, model))
        raise InvalidRequest(f"unknown parameter(s) {', '.join(unknown)} for {task.name}; accepted: {accepted}")
    task_params = task.parse_params(params.only(raw, task.parameters), model)
    check_joined(inputs, raw, task, limits)
    if task.prepare is not None:
        inputs = task.prepare(inputs, task_params)
    return PredictRequest(inputs, long_input(raw, task, limits, text_tokens), task_params)


def check_joined(inputs: Inputs, raw: Mapping[str, object], task: TaskSpec, limits: Limits) -> None:
    """Texts a request joins to each of its texts (a ranking query, a prompt, an LM reranker's instruction)
    are texts too: each within the characters a text may have, and the texts the request makes of them within
    the characters the largest body holds. Unchecked, a 1 MB prompt before 10,000 texts of one letter asked
    10 GB of tokenizing, and a 1 MB query beside 10,000 documents 6-7 hours of it, from bodies of 1 MB."""
    cap = limits.max_input_chars
    joined = {inputs.query_named: inputs.query} if inputs.query is not None else {}  # capped by check_limits
    for name, spec in task.parameters.items():
        text = raw.get(name)
        if isinstance(spec, params.Text) and isinstance(text, str):
            named = params.named(raw, name)
            if len(text) > cap:
                raise InputTooLong(f"{named} is {len(text)} characters; the limit is {cap}", limit=cap)
            joined[named] = text
    count = len(inputs.texts)
    total = sum(map(len, inputs.texts)) + sum(map(len, inputs.pairs or ())) + count * sum(map(len, joined.values()))
    if joined and total > limits.max_body_bytes:
        raise InputTooLong(
            f"{', '.join(joined)} joined to each of the {count} texts make {total} characters to tokenize; at most "
            f"{limits.max_body_bytes}, what the largest body holds: send fewer texts or a shorter "
            f"{' or '.join(joined)}",
            limit=limits.max_body_bytes,
        )


def long_input(raw: Mapping[str, object], task: TaskSpec, limits: Limits, text_tokens: int | None = None) -> LongInput:
    """What a request asks of its long texts, as one value: long_input (window, implied by a stride) reads
    them whole, else truncate (the server's default) cuts them and truncate false refuses them, at the
    model's maximum or at `text_tokens` of a text's own (see LongInput)."""
    truncate = COMMON["truncate"].read(raw, "truncate", limits.truncate)
    side = DIRECTIONS[COMMON["truncation_direction"].read(raw, "truncation_direction", "Right")]
    implied = "window" if raw.get("stride") is not None and task.windows else "truncate"
    mode = COMMON["long_input"].read(raw, "long_input", implied)
    if not task.windows and (mode == "window" or "stride" in raw):
        raise InvalidRequest(f"{task.name} reads every input whole: long_input window and stride do not apply")
    stride = COMMON["stride"].read(raw, "stride", None) if "stride" in raw else None
    if mode == "window" or stride is not None:  # a stride is checked even where "truncate" ignores it
        windows = LongInput.window(stride, limits.window_tokens, params.named(raw, "stride"))
        if mode == "window":
            return windows
    return LongInput("truncate" if truncate else "refuse", side=side, text_tokens=text_tokens)


def check_limits(inputs: Inputs, limits: Limits, uncounted: int = 0) -> None:
    # max_inputs bounds the list the client sent (OpenAPI's maxItems of inputs, documents or sentences), so
    # that the schema and this check agree: sentence similarity's source sentence is not one of them.
    count = len(inputs.texts) - uncounted
    if count > limits.max_inputs:
        raise InputTooLong(
            f"the request has {count} texts; this server takes at most {limits.max_inputs} per request",
            limit=limits.max_inputs,
        )
    cap = limits.max_input_chars
    if inputs.query is not None and len(inputs.query) > cap:
        raise InputTooLong(f"{inputs.query_named} is {len(inputs.query)} characters; the limit is {cap}", limit=cap)
    members = [(inputs.texts, None)] if inputs.pairs is None else [(inputs.texts, False), (inputs.pairs, True)]
    for texts, second in members:
        for i, text in enumerate(texts):
            if len(text) > cap:
                name = inputs.named(i) if second is None else inputs.member_named(i, second)
                raise InputTooLong(f"{name} is {len(text)} characters; the limit is {cap}", limit=cap)
