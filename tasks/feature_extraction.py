"""Embeddings, as sentence-transformers computes them: the prompt prepended to each text, token states
pooled into one vector, the model's Dense modules (numpy, weights from the bundle), then normalized; or, with
output_value "token_embeddings" (sentence-transformers' encode option, TEI's /embed_all), the token states
themselves, special tokens included, before pooling, Dense and normalizing (as both of them return them)."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from tasks import params, prompts, quantize
from tasks.base import (
    CORRELATION,
    NUMBER,
    TEXT_TENSOR,
    Answer,
    Array,
    Baseline,
    Gate,
    Inputs,
    ModelInfo,
    Outputs,
    ParityInput,
    Playground,
    TaskSpec,
    Tensor,
    Tensors,
    tensor_io,
)
from tasks.errors import InvalidRequest

if TYPE_CHECKING:  # annotations only: the console reads the task specs without tokenizers
    from tokenizers import Encoding
from tasks.ops import POOLINGS, Dense, cosine, normalize_vector, pool_tokens
from tasks.windows import combine_vectors, content_tokens

ENCODINGS = quantize.ENCODINGS
OUTPUT_VALUES = ("sentence_embedding", "token_embeddings")


def parity(p: ParityInput) -> dict[str, float]:
    ref = np.stack([pool_tokens(r, p.pooling) for r in p.reference])
    cand = np.stack([pool_tokens(c, p.pooling) for c in p.candidate])
    cos = cosine(ref, cand)
    return {"cosine_p1": float(np.percentile(cos, 1)), "cosine_min": float(cos.min())}


@dataclass(frozen=True, slots=True)
class Params:
    pooling: str
    normalize: bool
    dimensions: int | None
    encoding: str
    dense: tuple[Dense, ...] = ()
    prompt: str = ""
    tokens: bool = False
    # where the request put `dimensions` (OpenAI's at the body's root), to name it so when it is too wide
    dimensions_field: str = "parameters.dimensions"


PARAMETERS = {
    "pooling": params.Choice(
        f"{', '.join(POOLINGS)} (default: the bundle's, from sentence-transformers' config); one named here pools "
        "every token, a prompt's included",
        options=POOLINGS,
    ),
    "normalize": params.Boolean("scale each vector to unit length (default: the bundle's)"),
    "dimensions": params.Integer(
        "keep the first N dimensions (Matryoshka), re-normalized when normalize is on; at most the vector size "
        "(default: every one, or the truncate_dim the model's sentence-transformers config sets)",
        minimum=1,
        bound="width",
    ),
    "encoding_format": params.Choice(
        "float (JSON numbers, default), base64 (little-endian float32 bytes, as OpenAI's API), int8 or uint8 "
        "(each component scaled from [-1, 1] to 256 levels), binary (int8) or ubinary (uint8): sign bits packed "
        "8 per byte; as sentence-transformers' quantize_embeddings (docs/vector-output.md)",
        options=ENCODINGS,
    ),
    "output_value": params.Choice(
        "sentence_embedding (default): one vector per text; token_embeddings: the model's last hidden state "
        "per token, special tokens included, as sentence-transformers' encode and TEI's /embed_all answer it: "
        "pooling, Dense, normalize and dimensions apply to sentence embeddings only, so they are ignored",
        options=OUTPUT_VALUES,
    ),
    **prompts.PARAMETERS,
}


def parse_params(raw: Mapping[str, object], model: ModelInfo) -> Params:
    tokens = PARAMETERS["output_value"].read(raw, "output_value", "sentence_embedding") == "token_embeddings"
    return Params(
        PARAMETERS["pooling"].read(raw, "pooling", model.pooling),
        PARAMETERS["normalize"].read(raw, "normalize", model.normalize),
        PARAMETERS["dimensions"].read(raw, "dimensions", model.truncate_dim),
        PARAMETERS["encoding_format"].read(raw, "encoding_format", "float"),
        model.dense,
        prompts.read(raw, model),
        tokens,
        params.named(raw, "dimensions") if "dimensions" in raw else "the bundle's truncate_dim (hare.json)",
    )


def prepare(inputs: Inputs, p: Params) -> Inputs:
    """Prepend the prompt to every text, as sentence-transformers does before tokenizing."""
    return prompts.prepend(inputs, p.prompt)


def check_dimensions(p: Params, width: int) -> None:
    if p.dimensions is not None and p.dimensions > width:
        raise InvalidRequest(
            f"{p.dimensions_field} is {p.dimensions}, more than this model's {width}; ask for at most {width}"
        )


def pooling(p: Params) -> str | None:
    """The pooling `embed` applies to every sequence's token states, which the model's side may apply instead
    (None: the answer is the token states)."""
    return None if p.tokens else p.pooling


def token_values(rows: Sequence[Array], p: Params) -> int:
    """The numbers of the answer's token vectors: the model's rows as they are, when token states are asked."""
    return sum(row.size for row in rows) if p.tokens else 0


def embed(out: Outputs, p: Params) -> list[Array]:
    """One vector per input; a windowed text's windows are pooled (a [dim] row came pooled already: the shared
    engine pooled it with `pooling`), then combined weighted by length."""
    vectors = []
    for windows, rows in zip(out.windows, out.arrays, strict=True):
        pooled = [r if r.ndim == 1 else pool_tokens(r, p.pooling) for r in rows]
        vector = combine_vectors(pooled, [len(w) for w in windows], p.pooling)
        for layer in p.dense:
            vector = layer(vector)
        if p.dimensions is not None:
            check_dimensions(p, len(vector))
            vector = vector[: p.dimensions]
        vectors.append(normalize_vector(vector) if p.normalize else vector)
    return vectors


def encode(vector: Array, encoding: str) -> NDArray[np.generic] | str:
    """A vector (or a [tokens, dim] matrix) in the answer's encoding (tasks/quantize.py)."""
    return quantize.encode(vector, encoding)


def token_states(windows: list[Encoding], rows: list[Array], stride: int) -> Array:
    """One input's token states [tokens, dim]: its one window's rows, or its windows merged (each content
    token once, tasks/windows.py) between the first window's leading and the last window's trailing specials."""
    if len(rows) == 1:
        return rows[0]
    first, last = windows[0].special_tokens_mask, windows[-1].special_tokens_mask
    lead = next((i for i, special in enumerate(first) if not special), len(first))
    tail = next((i for i, special in enumerate(reversed(last)) if not special), len(last))
    merged = content_tokens(windows, rows, stride).rows
    return np.concatenate([rows[0][:lead], merged, rows[-1][len(rows[-1]) - tail :]])


def decode(value: object) -> Array:
    """A vector of the answer back to float32: a float vector, or its base64 form (encoding_format base64).
    Quantized codes and token states are refused: cosines and FP32 tensors need one float vector per text."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    vector = np.asarray(value)
    if not np.issubdtype(vector.dtype, np.floating) or vector.ndim != 1:
        raise InvalidRequest(
            f"this route computes on float vectors: encoding_format must be one of {', '.join(quantize.FLOATS)} "
            "and output_value sentence_embedding"
        )
    return vector.astype(np.float32, copy=False)


def postprocess(out: Outputs, p: Params, model: ModelInfo) -> Answer:
    if p.tokens:
        states = [token_states(w, r, out.stride) for w, r in zip(out.windows, out.arrays, strict=True)]
        # dimensions is ignored here, but checked as for sentence embeddings
        check_dimensions(p, p.dense[-1].weight.shape[0] if p.dense else states[0].shape[-1])
        vectors = [encode(s, p.encoding) for s in states]
    else:
        vectors = [encode(v, p.encoding) for v in embed(out, p)]
    return Answer(vectors[0] if out.inputs.single else vectors)


VECTOR = {"oneOf": [{"type": "array", "items": NUMBER}, {"type": "string", "description": "base64 float32"}]}
TOKENS = {"type": "array", "items": {"type": "array", "items": NUMBER}, "description": "a vector per token"}
# An answer's item: a vector (quantized codes are integers), or token vectors (output_value token_embeddings).
EMBEDDING = {"anyOf": [VECTOR, TOKENS]}
ANSWER = {"anyOf": [EMBEDDING, {"type": "array", "items": EMBEDDING}]}


def tensors(body: list[Any]) -> list[Tensor]:
    """One vector per input, of the model's size (or the dimensions parameter's)."""
    vectors = np.stack([decode(v) for v in body])
    return [Tensor("embeddings", "FP32", list(vectors.shape), vectors)]


# An FP32 tensor carries float sentence vectors (decode above): KServe's route takes these values only.
TENSOR_PARAMETERS = {
    "encoding_format": params.Choice("float (default) or base64: the tensor is FP32 either way", quantize.FLOATS),
    "output_value": params.Choice("sentence_embedding: one vector per text", ("sentence_embedding",)),
}


def baseline(model: Any, inputs: Any) -> Any:
    """sentence-transformers' `SentenceTransformer.encode`, as its users run an embedding folder: its own
    pooling, prompts and normalization (a folder without sentence-transformers files gets mean pooling)."""
    texts = [inputs] if isinstance(inputs, str) else inputs
    out = np.asarray(model.encode(texts), dtype=np.float32).tolist()
    return out[0] if isinstance(inputs, str) else out


SPEC = TaskSpec(
    name="feature-extraction",
    head="AutoModel",
    architectures=(),
    output="last_hidden_state",
    pairs=False,
    parity=parity,
    default_pooling="mean",  # what transformers' feature-extraction models without a pooling config get
    gates=(Gate("cosine_p1", 0.99, True, "1st percentile of cosine(PyTorch, candidate) embeddings", CORRELATION),),
    parameters=PARAMETERS,
    parse_inputs=params.texts,
    parse_params=parse_params,
    postprocess=postprocess,
    prepare=prepare,
    pooling=pooling,
    token_values=token_values,
    embeddings=True,
    answer=ANSWER,
    tensors=Tensors((TEXT_TENSOR,), (tensor_io("embeddings", "FP32", [-1, -1]),), tensors, TENSOR_PARAMETERS),
    playground=Playground(
        "sentences", "similarity", "A cat sits on the mat.\nA kitten rests on a rug.\nThe stock market fell today."
    ),
    baseline=Baseline("SentenceTransformer", baseline),
)
