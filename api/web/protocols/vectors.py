"""Embedding answers back to arrays, for the protocols that compute on them (cosines, FP32 tensors)."""

from __future__ import annotations

from tasks.base import Array
from tasks.feature_extraction import decode


def as_vector(value: object) -> Array:
    """A vector of the task's answer: a float array, or its base64 form (encoding_format base64); the task
    that encodes it decodes it (tasks/feature_extraction.py)."""
    return decode(value)
