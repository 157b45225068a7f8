"""Merging a long text's overlapping windows back into one answer (long_input="window").

The server reads a text longer than the model's maximum as windows of at most max_length tokens, each
starting with the last `stride` content tokens of the one before (tokenizers' overflow with a stride).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tasks.base import Array

if TYPE_CHECKING:  # annotations only: the console reads the task specs without tokenizers
    from tokenizers import Encoding


@dataclass(frozen=True, slots=True)
class Tokens:
    """A text's content tokens (special tokens removed), each once, with their output rows.

    index: each token's position as if the whole text had been one encoding (after the leading specials).
    """

    ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    index: list[int]
    rows: Array


def content_tokens(windows: Sequence[Encoding], arrays: Sequence[Array], stride: int, begin: int = 0) -> Tokens:
    """The tokens of a text read as `windows`, each overlap split at its middle; `begin`: the character of the
    text where the part they read begins (an end read alone: Outputs.begins), which their offsets move by.

    A token shared by two windows takes its row from the window where it sits further from the edge: the
    first half of an overlap from the earlier window, the second half from the later one.
    """
    ids: list[int] = []
    tokens: list[str] = []
    offsets: list[tuple[int, int]] = []
    rows: list[Array] = []
    last = len(windows) - 1
    lead = 0
    for k, (enc, out) in enumerate(zip(windows, arrays, strict=True)):
        content = [i for i, special in enumerate(enc.special_tokens_mask) if not special]
        if k == 0 and content:
            lead = content[0]
        keep_from = stride // 2 if k > 0 else 0
        keep_to = len(content) - (stride - stride // 2) if k < last else len(content)
        kept = content[keep_from:keep_to]
        enc_ids, enc_tokens, enc_offsets = enc.ids, enc.tokens, enc.offsets
        ids += [enc_ids[i] for i in kept]
        tokens += [enc_tokens[i] for i in kept]
        offsets += [enc_offsets[i] for i in kept] if not begin else [_moved(enc_offsets[i], begin) for i in kept]
        rows.append(out[kept])
    merged = np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)
    return Tokens(ids, tokens, offsets, list(range(lead, lead + len(ids))), merged)


def _moved(offsets: tuple[int, int], by: int) -> tuple[int, int]:
    return offsets[0] + by, offsets[1] + by


def combine_vectors(vectors: Sequence[Array], weights: Sequence[int], mode: str) -> Array:
    """One vector from the windows' pooled vectors: elementwise max for max pooling, the last window's for
    last-token pooling, else the mean weighted by each window's token count (a short last window counts less)."""
    if len(vectors) == 1 or mode == "lasttoken":
        return vectors[-1]
    stacked = np.stack(vectors)
    if mode == "max":
        return stacked.max(axis=0)
    w = np.asarray(weights, dtype=np.float32)
    return ((stacked * w[:, None]).sum(axis=0) / w.sum()).astype(np.float32)
