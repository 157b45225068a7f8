"""The lengths where a model's arithmetic changes, read from its config, so that the parity set crosses them.

An exported graph can equal PyTorch at every length its samples had and leave it past one they never
reached: the gated delta rule works in chunks of 64 tokens (delta_rule.CHUNK, its scan doubling with the
chunks), a sliding window (Mistral, Gemma 2/3, UltraBERT, the privacy filter) or ModernBERT's local attention
(a band of local_attention / 2 tokens each side) starts to mask past its width, rope scaling switches factors
past an original maximum (LongRoPE, dynamic NTK), and positions end at the maximum. The parity set
(textset.regime_samples) holds a text one token short of each such length, one at it and one past it, up to
the bundle's maximum, alone and in padded batches (validate.served_outputs).

Only lengths whose PyTorch reference fits: eager attention holds heads x length^2 fp32 scores at once, kept
within SCORES_BYTES (4,096 tokens at 32 heads), so a 32k-token maximum is checked up to that bound, and at it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from container.optimize.delta_rule import CHUNK

WINDOWS = ("sliding_window", "attention_window_size", "sliding_window_size")
SCORES_BYTES = 2**31


def nested(config: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The config and those nested in it (a multimodal model's text_config, an encoder-decoder's halves)."""
    yield config
    for value in config.values():
        if isinstance(value, Mapping) and ("model_type" in value or "hidden_size" in value or "text_config" in value):
            yield from nested(value)


def _ropes(rope: Any) -> Iterator[Mapping[str, Any]]:
    """rope_parameters / rope_scaling: one set, or one per layer type (Gemma 3's sliding and full layers)."""
    if isinstance(rope, Mapping):
        if any(isinstance(v, Mapping) for v in rope.values()):
            for v in rope.values():
                yield from _ropes(v)
        else:
            yield rope


def boundaries(config: Mapping[str, Any], max_length: int) -> dict[int, str]:
    """Each length up to `max_length` where the arithmetic of the model `config` describes changes, and why."""
    found: dict[int, str] = {}

    def add(length: Any, why: str) -> None:
        if isinstance(length, int) and not isinstance(length, bool) and 1 < length <= max_length:
            found.setdefault(length, why)

    for cfg in nested(config):
        if "linear_attention" in (cfg.get("layer_types") or ()):
            n = CHUNK
            while n <= max_length:  # a chunk's edge; past each doubling the chunk scan takes one more step
                add(n, f"gated delta rule chunk edge ({CHUNK}-token chunks)")
                n *= 2
        for key in WINDOWS:
            add(cfg.get(key), f"{key} {cfg.get(key)}")
        if isinstance(local := cfg.get("local_attention"), int):
            add(local // 2, f"local_attention {local} (a band of {local // 2} each side)")
            add(local, f"local_attention {local}")
        for rope in _ropes(cfg.get("rope_parameters") or cfg.get("rope_scaling")):
            if rope.get("rope_type", rope.get("type", "default")) != "default":
                # Phi-3 keeps the original maximum beside its rope set, and transformers reads it there first.
                original = cfg.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
                add(original, f"rope {rope.get('rope_type', rope.get('type'))}: original maximum {original}")
        add(cfg.get("max_position_embeddings"), "max_position_embeddings")
    add(max_length, "the bundle's maximum length")
    return dict(sorted(found.items()))


def reference_limit(config: Mapping[str, Any]) -> int:
    """The longest text whose eager attention scores (heads x length^2 fp32) fit SCORES_BYTES."""
    heads = max(
        [1, *(c.get("num_attention_heads", 1) for c in nested(config) if isinstance(c.get("num_attention_heads"), int))]
    )
    return math.isqrt(SCORES_BYTES // (4 * heads))


def parity_lengths(config: Mapping[str, Any], max_length: int) -> list[int]:
    """The lengths the parity set adds: one short of, at and one past each boundary, within the bundle's
    maximum and reference_limit (and that limit itself, where the maximum is past it)."""
    limit = min(max_length, reference_limit(config))
    found = {n for b in boundaries(config, max_length) for n in (b - 1, b, b + 1) if 1 <= n <= limit}
    return sorted(found | {limit})
