"""tasks/quantize.py against sentence-transformers' quantize_embeddings, the reference for every encoding."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from tasks import quantize
from tasks.ops import l2_normalize


def unit_vectors(n: int, d: int, seed: int = 0) -> np.ndarray:
    return l2_normalize(np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32))


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_equal_to_sentence_transformers(precision: str) -> None:
    vectors = unit_vectors(16, 64)
    vectors[:, ::4] = np.maximum(vectors[:, ::4], 0)  # exact zeros, as a ReLU Dense module leaves: sign bit 0
    ranges = np.array([[-1.0] * 64, [1.0] * 64], dtype=np.float32)
    expected = quantize_embeddings(vectors, precision, ranges=ranges)  # type: ignore[arg-type]
    assert isinstance(expected, np.ndarray)  # sentence-transformers 6 types it as an array or a list of them
    ours = quantize.quantize(vectors, precision)
    assert ours.dtype == expected.dtype and ours.shape == expected.shape
    assert np.array_equal(ours, expected)
    one = quantize.quantize(vectors[3], precision)  # one vector alone: the same codes as in the batch
    assert np.array_equal(one, expected[3])


def test_int8_codes_do_not_depend_on_the_batch() -> None:
    vectors = unit_vectors(8, 32)
    assert np.array_equal(quantize.quantize(vectors[:1], "int8"), quantize.quantize(vectors, "int8")[:1])
    # sentence-transformers without ranges scales by the batch's own min and max: a lone vector breaks it
    with np.errstate(all="ignore"):
        lone = quantize_embeddings(vectors[:2], "int8")
    assert not np.array_equal(lone[0], quantize_embeddings(vectors, "int8")[0])


def test_int8_keeps_the_geometry() -> None:
    vectors = unit_vectors(64, 384, seed=1)
    codes = quantize.quantize(vectors, "int8").astype(np.float32) + 0.5  # back to the centre of each level
    cosines = (l2_normalize(codes) * vectors).sum(axis=1)
    assert cosines.min() > 0.99


def test_out_of_range_saturates_instead_of_wrapping() -> None:
    for precision, low in (("int8", -128), ("uint8", 0)):
        edges = quantize.quantize(np.array([1.0, -1.0], np.float32), precision).tolist()
        assert quantize.quantize(np.array([3.0, -3.0], np.float32), precision).tolist() == edges
        assert edges[1] == low and edges[0] >= low + 254  # 1.0 is the top level but for float rounding


def test_binary_bits_most_significant_first_and_padded() -> None:
    signs = np.array([1, -1, 1, 1, -1, -1, -1, -1, 1, 1], dtype=np.float32)  # 10 dimensions: 2 bytes
    assert quantize.quantize(signs, "ubinary").tolist() == [0b10110000, 0b11000000]
    assert quantize.quantize(signs, "binary").tolist() == [0b10110000 - 128, 0b11000000 - 128]
    tokens = np.stack([signs, -signs])  # a [tokens, d] matrix packs each row
    assert quantize.quantize(tokens, "ubinary").shape == (2, 2)


def test_base64_is_little_endian_float32() -> None:
    vector = unit_vectors(1, 8)[0]
    decoded = np.frombuffer(base64.b64decode(quantize.encode(vector, "base64")), dtype="<f4")  # type: ignore[arg-type]
    assert np.array_equal(decoded, vector)
    assert quantize.encode(vector, "float") is not None and quantize.quantize(vector, "float").dtype == np.float32
    with pytest.raises(ValueError, match="known: float, base64"):
        quantize.quantize(vector, "int4")
