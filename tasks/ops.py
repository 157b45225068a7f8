"""Numeric building blocks shared by the tasks: pure numpy, no state."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # annotations only: the console reads the task specs without tokenizers
    from tokenizers import Encoding

Array = NDArray[np.float32]
Pooling = Literal["mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken"]
# sentence-transformers' pooling modes: weightedmean weighs token i by i+1 (SGPT), lasttoken takes the last
# real token (decoder embedders).
POOLINGS: tuple[str, ...] = ("mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
# Tokens per bucket of the packing rule (next_call): sequences whose lengths share a bucket are equals there.
BUCKET = 16
T = TypeVar("T")


def softmax(x: Array, axis: int = -1) -> Array:
    """Numerically stable softmax (max subtracted first, so large logits do not overflow)."""
    z = x - x.max(axis=axis, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=axis, keepdims=True)).astype(np.float32)


def sigmoid(x: Array) -> Array:
    """The logistic function, written with tanh so that no logit overflows (exp(-x) does below -88 in float32,
    which warnings-as-errors turns into a failure), computed in float64 and given back as float32."""
    return (0.5 + 0.5 * np.tanh(x.astype(np.float64) / 2)).astype(np.float32)


_erf = np.vectorize(math.erf, otypes=[np.float64])

# Activations a model's config may name (sentence-transformers Dense modules, CrossEncoder heads), by the
# short name the manifest stores. GELU is the exact (erf) form, as torch.nn.GELU() computes by default.
ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "identity": lambda x: x,
    "sigmoid": lambda x: sigmoid(x),
    "tanh": lambda x: np.tanh(x).astype(np.float32),
    "relu": lambda x: np.maximum(x, 0).astype(np.float32),
    "gelu": lambda x: (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32),
}


@dataclass(frozen=True)
class Dense:
    """A sentence-transformers Dense module: activation(weight @ x + bias); weight is [out, in]."""

    weight: Array
    bias: Array | None
    activation: str

    def __call__(self, vector: Array) -> Array:
        y = self.weight @ vector
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y.astype(np.float32))


def l2_normalize(x: Array, axis: int = -1) -> Array:
    norm = np.linalg.norm(x, axis=axis, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def pool_tokens(states: Array, mode: str) -> Array:
    """Pool one sequence's token states [tokens, dim] (padding already trimmed) into [dim], as
    sentence-transformers' Pooling module does (tests/test_tasks_serving.py checks it against it). The one
    pooling: the server and the optimizer's gate both call it.

    Plain ufunc reductions: this runs once per input on the serving hot path, where numpy's Python-level
    wrappers (mean, linalg.norm) cost more than the arithmetic.
    """
    if mode == "mean":
        return np.add.reduce(states, axis=0) / np.float32(len(states))
    if mode == "cls":
        return states[0]
    if mode == "max":
        return np.maximum.reduce(states, axis=0)
    if mode == "mean_sqrt_len":
        return np.add.reduce(states, axis=0) / np.float32(np.sqrt(len(states)))
    if mode == "weightedmean":
        w = np.arange(1, len(states) + 1, dtype=np.float32)
        return (w @ states) / np.float32(w.sum())
    if mode == "lasttoken":
        return states[-1]
    raise ValueError(f"unknown pooling {mode!r}; choose one of {', '.join(POOLINGS)}")


def normalize_vector(vector: Array) -> Array:
    """One vector scaled to unit length (the 1-D, hot-path form of l2_normalize)."""
    return vector / np.float32(max(float(np.sqrt(vector @ vector)), 1e-12))


def padded_length(longest: int, multiple: int = 1, max_length: int = 0) -> int:
    """The length a batch whose longest sequence has `longest` tokens is padded to: the next multiple of
    `multiple`, but never past `max_length` (the model's positions end there) nor below `longest`."""
    return max(longest, min(-(-longest // multiple) * multiple, max_length or longest))


def pad_batch(
    encodings: Sequence[Encoding],
    input_names: Sequence[str],
    pad_id: int = 0,
    multiple: int = 1,
    max_length: int = 0,
) -> dict[str, NDArray[np.int64]]:
    """Right-pad encodings to the longest in the batch and build the graph's feeds; with a `multiple`, to the
    next multiple of that many tokens, but never past the model's `max_length` (its positions end there).

    Only the inputs the graph declares are built: DistilBERT and RoBERTa graphs take no token_type_ids.
    Padding ids are the model's pad token: a decoder's classification head finds each row's last token by
    comparing ids with it, as transformers does.
    """
    length = padded_length(max(len(e.ids) for e in encodings), multiple, max_length)
    n = len(encodings)
    ids = np.full((n, length), pad_id, dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.int64)
    types = np.zeros((n, length), dtype=np.int64) if "token_type_ids" in input_names else None
    for i, e in enumerate(encodings):
        k = len(e.ids)
        ids[i, :k] = e.ids
        mask[i, :k] = e.attention_mask
        if types is not None:
            types[i, :k] = e.type_ids
    feeds = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        feeds["token_type_ids"] = types
    return {name: feeds[name] for name in input_names}


def next_call(
    queued: Mapping[int, Iterable[T]],
    first: int,
    length: Callable[[T], int],
    max_batch_size: int,
    max_batch_tokens: int,
) -> list[T]:
    """The packing rule: the sequences of the next model call. `queued`: the waiting sequences by bucket (their
    length // BUCKET), each bucket oldest first; `first`: the bucket of the oldest. A call starts from the
    oldest and takes the heads of the buckets nearest in length to it (nearest first, the shorter on a tie)
    while it holds fewer than `max_batch_size` sequences and its padded tokens (its longest x its count) stay
    within `max_batch_tokens`; one sequence always fits. A bucket whose next sequence would pass the tokens is
    left for the next call, and nearer buckets on the other side may still fill this one.

    The server's queue takes its batches with it (api/engine/lengthqueue.py); length_batches applies it to
    sequences that arrive together (the optimizer's gate, the peers bench, the bulk job)."""
    call: list[T] = []
    longest = 0
    for key in sorted(queued, key=lambda k: (abs(k - first), k)):
        for item in queued[key]:
            if len(call) == max_batch_size:
                return call
            top = max(longest, length(item))
            if call and top * (len(call) + 1) > max_batch_tokens:
                break
            call.append(item)
            longest = top
    return call


def length_batches(
    lengths: Sequence[int], max_batch_size: int, max_batch_tokens: int, bucket: int = BUCKET
) -> list[list[int]]:
    """Sequence indices (their lengths in tokens, in arrival order) grouped into model calls as the server's
    queue groups sequences that reach it together: next_call's rule, call after call."""
    queued: dict[int, deque[int]] = {}
    for i, n in enumerate(lengths):
        queued.setdefault(n // bucket, deque()).append(i)
    calls: list[list[int]] = []
    while queued:
        first = min(queued, key=lambda k: queued[k][0])
        call = next_call(queued, first, lambda i: lengths[i], max_batch_size, max_batch_tokens)
        for i in call:  # the call took each bucket's heads
            key = lengths[i] // bucket
            queued[key].popleft()
            if not queued[key]:
                del queued[key]
        calls.append(call)
    return calls


def spearman(a: NDArray[np.floating], b: NDArray[np.floating]) -> float:
    """Spearman rank correlation with average ranks for ties (1.0 when both are constant)."""
    ra, rb = _rank(a), _rank(b)
    if ra.std() == 0 or rb.std() == 0:
        return 1.0 if ra.std() == rb.std() else 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _rank(x: NDArray[np.floating]) -> NDArray[np.float64]:
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    # Ties share the mean of their ranks, as scipy.stats.rankdata(method="average") does.
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def cosine(a: Array, b: Array) -> NDArray[np.float32]:
    """Row-wise cosine similarity of two [n, dim] arrays."""
    return (l2_normalize(a) * l2_normalize(b)).sum(axis=-1).astype(np.float32)
