"""Embedding answers back to arrays, for the protocols that compute on them (cosines, FP32 tensors)."""

from __future__ import annotations

import base64

import numpy as np

from tasks.base import Array


def as_vector(value: object) -> Array:
    """A vector of the task's answer: a float array, or its base64 form (encoding_format base64)."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    return np.asarray(value, dtype=np.float32)
