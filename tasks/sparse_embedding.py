"""Sparse embeddings: one weight per vocabulary entry, for hybrid (lexical + dense) search.

Two kinds of bundle serve this task (docs/sparse.md):
- SPLADE (a masked LM): the graph itself computes max over tokens of log(1 + relu(logits)) (padding masked), as
  sentence-transformers' SparseEncoder does, so each sequence's output is already its [vocab] vector; here it is
  only written as its non-zero entries, pruned to top_k / threshold when the request asks.
- bge-m3 (ModelInfo.heads): the graph's output per token is [hidden state | sparse weight | ColBERT vector]
  from one forward pass; FlagEmbedding's post-processing (normalized CLS, max weight per token id with special
  tokens dropped, normalized ColBERT vectors without CLS) runs here, for the outputs the request asks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from tasks import params, prompts
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
    json_object,
    tensor_io,
)
from tasks.errors import InvalidRequest
from tasks.ops import l2_normalize, normalize_vector

if TYPE_CHECKING:  # annotations only: the console reads the task specs without tokenizers
    from tokenizers import Encoding

NAME = "sparse-embedding"
OUTPUT = "sparse_embedding"
# bge-m3's heads, as FlagEmbedding names the request flags and the answer's keys.
HEADS = ("dense", "sparse", "colbert")
FLAGS = {"dense": "return_dense", "sparse": "return_sparse", "colbert": "return_colbert_vecs"}
KEYS = {"dense": "dense_vecs", "sparse": "lexical_weights", "colbert": "colbert_vecs"}
# What a request gets when it names no output: the vectors hybrid search combines. ColBERT's one vector per
# token is large, so it is asked for (FlagEmbedding's own default is dense only).
DEFAULT_OUTPUTS = ("dense", "sparse")
TOP_TERMS = 20


@dataclass(frozen=True)
class Number(params.Spec):
    """A finite number of at least `minimum`."""

    minimum: float = 0.0

    def read(self, raw: Mapping[str, object], name: str, default: float) -> float:
        value = raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not np.isfinite(value):
            raise InvalidRequest(f"{params.named(raw, name)} must be a number, got {params.kind(value)}")
        if value < self.minimum:
            raise InvalidRequest(f"{params.named(raw, name)} must be at least {self.minimum}, got {value}")
        return float(value)

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return {"type": "number", "minimum": self.minimum, "description": self.help}


@dataclass(frozen=True)
class Head(params.Boolean):
    """A bge-m3 output flag: documented only for bundles that have the heads (bounds["heads"])."""

    def schema(self, bounds: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        return super().schema(bounds) if (bounds or {}).get("heads") else None


PARAMETERS: dict[str, params.Spec] = {
    "top_k": params.Integer(
        "keep only the k largest weights of each sparse vector (sentence-transformers' max_active_dims); "
        "default: the model's max_active_dims where its folder set one, else every non-zero weight; null: every one",
        minimum=1,
        nullable=True,
    ),
    "threshold": Number("drop weights at or below this value (default 0: every non-zero weight)"),
    **prompts.PARAMETERS,
    "return_dense": Head("bge-m3: answer dense_vecs, the normalized CLS vector (default true)"),
    "return_sparse": Head("bge-m3: answer lexical_weights, {token id: weight} (default true)"),
    "return_colbert_vecs": Head("bge-m3: answer colbert_vecs, one normalized vector per token but CLS (default false)"),
}


@dataclass(frozen=True, slots=True)
class Params:
    top_k: int | None
    threshold: float
    outputs: tuple[str, ...]
    heads: bool  # a bge-m3 bundle: the answer is FlagEmbedding's dict of the asked outputs
    prompt: str = ""


def parse_params(raw: Mapping[str, object], model: ModelInfo) -> Params:
    asked = {head: PARAMETERS[FLAGS[head]].read(raw, FLAGS[head], head in DEFAULT_OUTPUTS) for head in HEADS}
    flags = [FLAGS[h] for h in HEADS if FLAGS[h] in raw]
    if not model.heads and flags:
        raise InvalidRequest(
            f"parameters {', '.join(flags)} choose among a bge-m3 bundle's outputs (dense, sparse, ColBERT); "
            "this bundle is a SPLADE model, whose one output is the sparse vector: leave them out"
        )
    outputs = tuple(h for h in HEADS if asked[h] and h in model.heads)
    return Params(
        PARAMETERS["top_k"].read(raw, "top_k", model.max_active_dims),
        PARAMETERS["threshold"].read(raw, "threshold", 0.0),
        outputs,
        bool(model.heads),
        prompts.read(raw, model),
    )


def prepare(inputs: Inputs, p: Params) -> Inputs:
    """A SparseEncoder's prompt before every text, as its encode writes it before tokenizing."""
    return prompts.prepend(inputs, p.prompt)


def prune(index: np.ndarray, weights: Array, p: Params) -> tuple[np.ndarray, Array]:
    """The entries above the threshold, the top_k largest of them when asked, in index order."""
    keep = weights > np.float64(p.threshold)  # a float64 side: 1e308 is no float32 (numpy warned of an overflow)
    index, weights = index[keep], weights[keep]
    if p.top_k is not None and len(weights) > p.top_k:
        top = np.sort(np.argpartition(-weights, p.top_k - 1)[: p.top_k])
        index, weights = index[top], weights[top]
    return index, weights


def sparse_entries(vector: Array, p: Params) -> list[dict[str, Any]]:
    """A [vocab] vector as TEI's /embed_sparse writes it: its non-zero entries, {"index", "value"}, by index."""
    index, weights = prune(np.arange(len(vector)), vector, p)
    return [{"index": int(i), "value": float(w)} for i, w in zip(index, weights, strict=True)]


def lexical_weights(weights: Array, encoding: Encoding, special_ids: frozenset[int]) -> tuple[np.ndarray, Array]:
    """FlagEmbedding's _process_token_weights: per token id, the largest weight of its occurrences; CLS, EOS,
    padding and the unknown token dropped by id, as FlagEmbedding drops them (so a "</s>" typed in the text
    is dropped too). Sorted by token id."""
    ids = np.asarray(encoding.ids, dtype=np.int64)
    keep = ~np.isin(ids, list(special_ids)) & (weights > 0)
    ids, weights = ids[keep], weights[keep]
    unique, slot = np.unique(ids, return_inverse=True)
    best = np.zeros(len(unique), dtype=np.float32)
    np.maximum.at(best, slot, weights)
    return unique, best


def split(rows: Array) -> tuple[Array, Array, Array]:
    """A bge-m3 graph row [tokens, hidden + 1 + hidden] -> hidden states, sparse weights, ColBERT vectors."""
    width = (rows.shape[-1] - 1) // 2
    return rows[..., :width], rows[..., width], rows[..., width + 1 :]


def token_values(rows: Sequence[Array], p: Params) -> int:
    """The numbers of the answer's ColBERT vectors (a bge-m3 row's third part, but for CLS), when asked."""
    if "colbert" not in p.outputs:
        return 0
    return sum((len(row) - 1) * split(row)[2].shape[-1] for row in rows)


def m3_outputs(rows: Array, encoding: Encoding, p: Params, model: ModelInfo) -> dict[str, Any]:
    hidden, weights, colbert = split(rows)
    found: dict[str, Any] = {}
    if "dense" in p.outputs:
        found["dense_vecs"] = normalize_vector(hidden[0])
    if "sparse" in p.outputs:
        ids, best = prune(*lexical_weights(weights, encoding, model.vocab.special_ids), p)
        found["lexical_weights"] = {str(int(i)): float(w) for i, w in zip(ids, best, strict=True)}
    if "colbert" in p.outputs:
        found["colbert_vecs"] = l2_normalize(colbert[1:])
    return found


def postprocess(out: Outputs, p: Params, model: ModelInfo) -> Answer:
    """SPLADE: [{"index", "value"}] per input. bge-m3: FlagEmbedding's encode answer, {"dense_vecs",
    "lexical_weights", "colbert_vecs"}, each a list over the inputs (one input sent as a string gets the items
    themselves) and null when not asked."""
    if not p.heads:
        vectors = [sparse_entries(rows[0], p) for rows in out.arrays]
        return Answer(vectors[0] if out.inputs.single else vectors)
    each = [m3_outputs(rows[0], windows[0], p, model) for rows, windows in zip(out.arrays, out.windows, strict=True)]
    answer: dict[str, Any] = {KEYS[h]: None for h in HEADS}
    for key in (KEYS[h] for h in p.outputs):
        answer[key] = each[0][key] if out.inputs.single else [found[key] for found in each]
    return Answer(answer)


def tei_rows(body: Any) -> list[list[dict[str, Any]]]:
    """The answer to a list of inputs as TEI's /embed_sparse writes it: one list of {"index", "value"} per
    input (bge-m3: its lexical weights, which the route always asks for)."""
    if isinstance(body, dict):
        return [[{"index": int(k), "value": v} for k, v in row.items()] for row in body["lexical_weights"]]
    rows: list[list[dict[str, Any]]] = body
    return rows


def _cos(a: Array, b: Array) -> float:
    """Cosine, taking two all-zero vectors as equal (a sparse head may leave a short text with no weight)."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na < 1e-12 or nb < 1e-12:
        return 1.0 if max(na, nb) < 1e-6 else 0.0
    return float(a @ b) / (na * nb)


def _overlap(a: Array, b: Array) -> float:
    """Shared entries of the two vectors' TOP_TERMS largest (or of their length, when shorter)."""
    k = min(TOP_TERMS, len(a))
    top_a = set(np.argpartition(-a, k - 1)[:k].tolist())
    top_b = set(np.argpartition(-b, k - 1)[:k].tolist())
    return len(top_a & top_b) / k


def parity(p: ParityInput) -> dict[str, float]:
    """cosine: of the SPLADE vectors; for bge-m3 the worst of the dense vector, the token weights and the
    ColBERT vectors. top-20 overlap: of the SPLADE vectors' largest terms (bge-m3: of the token weights)."""
    cosines, overlaps = [], []
    for ref, cand in zip(p.reference, p.candidate, strict=True):
        if ref.ndim == 1:
            cosines.append(_cos(ref, cand))
            overlaps.append(_overlap(ref, cand))
            continue
        (rh, rw, rc), (ch, cw, cc) = split(ref), split(cand)
        colbert = min(_cos(r, c) for r, c in zip(rc[1:], cc[1:], strict=True)) if len(rc) > 1 else 1.0
        cosines.append(min(_cos(rh[0], ch[0]), _cos(rw, cw), colbert))
        overlaps.append(_overlap(rw, cw))
    return {
        "cosine_p1": float(np.percentile(cosines, 1)),
        "top20_overlap_p1": float(np.percentile(overlaps, 1)),
    }


SPARSE = {
    "type": "array",
    "items": json_object({"index": {"type": "integer"}, "value": NUMBER}, ["index", "value"]),
    "description": "the non-zero weights, by vocabulary index",
}
M3_OUTPUTS = {
    "dense_vecs": {"type": "array", "items": NUMBER},
    "lexical_weights": {"type": "object", "additionalProperties": NUMBER, "description": "token id -> weight"},
    "colbert_vecs": {"type": "array", "items": {"type": "array", "items": NUMBER}},
}
# bge-m3: FlagEmbedding's encode answer, null for the outputs not asked; per input, or the items of one input.
M3_ONE = json_object({k: {"anyOf": [v, {"type": "null"}]} for k, v in M3_OUTPUTS.items()}, list(M3_OUTPUTS))
M3_MANY = json_object(
    {k: {"anyOf": [{"type": "array", "items": v}, {"type": "null"}]} for k, v in M3_OUTPUTS.items()}, list(M3_OUTPUTS)
)
ANSWER = {"anyOf": [SPARSE, {"type": "array", "items": SPARSE}, M3_ONE, M3_MANY]}


def tensors(body: list[Any] | dict[str, list[Any]]) -> list[Tensor]:
    """One JSON text per input: its sparse entries (SPLADE), or its asked bge-m3 outputs as an object."""
    if isinstance(body, list):
        rows = body
    else:  # the outputs not asked are null in the answer, and left out of each input's object
        asked = {key: values for key, values in body.items() if values is not None}
        rows = [dict(zip(asked, each, strict=True)) for each in zip(*asked.values(), strict=True)]
    texts = [orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY).decode() for row in rows]
    return [Tensor("sparse", "BYTES", [len(rows)], texts)]


def baseline(model: Any, inputs: Any) -> Any:
    """sentence-transformers' `SparseEncoder.encode` (the library SPLADE models ship for), answered as hare's
    /predict does: [{"index", "value"}] per input."""
    texts = [inputs] if isinstance(inputs, str) else inputs
    vectors = np.asarray(model.encode(texts, convert_to_tensor=True, convert_to_sparse_tensor=False).cpu())
    out = [[{"index": int(i), "value": float(row[i])} for i in np.flatnonzero(row)] for row in vectors]
    return out[0] if isinstance(inputs, str) else out


SPEC = TaskSpec(
    name=NAME,
    head="AutoModelForMaskedLM",
    architectures=("ForMaskedLM",),
    output=OUTPUT,
    pairs=False,
    parity=parity,
    gates=(
        Gate("cosine_p1", 0.99, True, "1st percentile of cosine(PyTorch, candidate) sparse vectors", CORRELATION),
        Gate("top20_overlap_p1", 0.9, True, "1st percentile of the share of the top-20 terms both vectors keep"),
    ),
    parameters=PARAMETERS,
    parse_inputs=params.texts,
    parse_params=parse_params,
    postprocess=postprocess,
    prepare=prepare,
    token_values=token_values,
    # A sparse vector of overlapping windows has no agreed merge (and bge-m3's ColBERT rows would repeat):
    # inputs are read whole, truncated at the model's length.
    windows=False,
    sparse=True,
    answer=ANSWER,
    tensors=Tensors((TEXT_TENSOR,), (tensor_io("sparse", "BYTES", [-1]),), tensors),
    playground=Playground("text", "terms", "Hybrid search mixes sparse and dense vectors."),
    baseline=Baseline("SparseEncoder", baseline),
)
