"""Vector encodings for the wire: float, base64 float32, and the quantized forms sentence-transformers'
`quantize_embeddings` defines (and Cohere's embed API returns), in pure numpy.

    float    float32 numbers
    base64   the little-endian float32 bytes, base64 (OpenAI's and Cohere's base64)
    int8     floor((x - lo) / step) - 128 with step = (hi - lo) / 255; x clipped to [lo, hi]
    uint8    floor((x - lo) / step)
    binary   the sign bits (x > 0) packed 8 per byte, most significant first (np.packbits), minus 128, as int8
    ubinary  the same packed bits as uint8

int8/uint8 need a range per dimension. sentence-transformers takes it from calibration embeddings, or else
from the very embeddings it is quantizing (their per-dimension min and max). A server cannot do the latter:
a text's codes would depend on the other texts of its request, and a request of one text has no range at all
(max = min). hare uses the fixed range [-1, 1] for every dimension, the range of any component of a unit
vector, so a text always gets the same codes and codes from different requests compare; the result equals
`quantize_embeddings(x, precision, ranges=np.array([[-1.0] * d, [1.0] * d]))`. Components of vectors that
are not unit length (normalize false) saturate at -1 and 1.
"""

from __future__ import annotations

import base64

import numpy as np
from numpy.typing import NDArray

ENCODINGS: tuple[str, ...] = ("float", "base64", "int8", "uint8", "binary", "ubinary")
FLOATS: tuple[str, ...] = ("float", "base64")  # the encodings OpenAI's API and float consumers accept
RANGE = (-1.0, 1.0)


def quantize(vectors: NDArray[np.float32], encoding: str) -> NDArray[np.generic]:
    """Vectors [..., d] in a numeric encoding (not base64): float32, int8 or uint8 [..., d], or packed bits
    [..., ceil(d / 8)] (a width that is not a multiple of 8 is padded with zero bits, as np.packbits does)."""
    x = np.asarray(vectors, dtype=np.float32)
    if encoding == "float":
        return x
    if encoding in ("int8", "uint8"):
        lo, hi = RANGE
        step = (hi - lo) / 255
        # Floored before the offset, as sentence-transformers 6 does (5 truncated after it, toward zero): the
        # same codes bit for bit.
        levels = np.floor((np.clip(x, lo, hi) - lo) / step)  # in [0, 255]
        return (levels - 128).astype(np.int8) if encoding == "int8" else levels.astype(np.uint8)
    if encoding in ("binary", "ubinary"):
        bits = np.packbits(x > 0, axis=-1)
        return (bits.astype(np.int16) - 128).astype(np.int8) if encoding == "binary" else bits
    raise ValueError(f"unknown encoding {encoding!r}; known: {', '.join(ENCODINGS)}")


def float_base64(vector: NDArray[np.float32]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def encode(vector: NDArray[np.float32], encoding: str) -> NDArray[np.generic] | str:
    """One vector (or a [tokens, d] matrix) as the answer carries it: an array orjson serializes, or base64."""
    return float_base64(vector) if encoding == "base64" else quantize(vector, encoding)
