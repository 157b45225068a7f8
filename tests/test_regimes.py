"""The gate sees every regime: the lengths where a family's arithmetic changes, read from its config
(container/optimize/regimes.py), are in the parity set on both sides, and a build whose fp32 graph departs from
PyTorch only past one of them is refused with the length and the figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from tokenizers import Tokenizer

from container.optimize import export, regimes, source, textset
from container.optimize.errors import ValidationFailed
from tests.conftest import quick_bundle
from tests.tiny_models import make_model


def _defaults(model_type: str, **config: Any) -> dict[str, Any]:
    """transformers' default config of `model_type` (the released geometry's knobs), as a dict."""
    import transformers

    return dict(transformers.AutoConfig.for_model(model_type, **config).to_dict())


def test_the_boundaries_come_from_each_familys_config() -> None:
    qwen35 = regimes.parity_lengths(_defaults("qwen3_5_text"), 32768)
    # Chunk edges of the gated delta rule, both sides, as far as a reference of 16 heads fits in memory, and
    # that far.
    assert qwen35[:6] == [63, 64, 65, 127, 128, 129] and qwen35[-4:] == [4095, 4096, 4097, 5792]
    # ModernBERT: the local band (64 each side of 128) and the window itself; its maximum is past a reference.
    assert regimes.parity_lengths(_defaults("modernbert"), 8192) == [63, 64, 65, 127, 128, 129, 6688]
    gemma3 = regimes.boundaries(_defaults("gemma3_text", sliding_window=512), 2048)
    assert gemma3 == {512: "sliding_window 512", 2048: "the bundle's maximum length"}
    longrope = _defaults(
        "phi3",
        max_position_embeddings=131072,
        original_max_position_embeddings=2048,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0] * 48,
            "long_factor": [2.0] * 48,
            "original_max_position_embeddings": 2048,
        },
    )
    assert "original maximum 2048" in regimes.boundaries(longrope, 4096)[2048]
    # Nothing past the bundle's maximum, which is a boundary itself.
    assert regimes.parity_lengths(_defaults("bert"), 128) == [127, 128]


def test_regime_samples_have_the_lengths_asked_for(tiny_model: Any) -> None:
    folder = tiny_model("text-classification", "mistral")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    lengths = [2, 7, 8, 9, 63, 64, 65, 120]
    samples = textset.regime_samples(tokenizer, lengths, pairs=False)
    assert [len(tokenizer.encode(s.text).ids) for s in samples] == lengths
    pairs = textset.regime_samples(tokenizer, [40, 41], pairs=True)
    assert [len(tokenizer.encode(s.text, s.pair).ids) for s in pairs] == [40, 41]


def _mistral(folder: Path, window: int | None, positions: int) -> Path:
    make_model(folder, "text-classification", "mistral", max_position_embeddings=positions, sliding_window=window)
    config = folder / "tokenizer_config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"model_max_length": positions}))
    return folder


def test_a_graph_that_departs_past_a_window_is_refused_at_that_length(tmp_path: Path) -> None:
    """The graph of the same weights with no window (what an export that ignored the config's sliding window
    would give) equals PyTorch up to 700 tokens, past the built-in texts' 600, and departs after."""
    window, positions = 700, 1024
    model = _mistral(tmp_path / "windowed", window, positions)
    unwindowed = _mistral(tmp_path / "full", None, positions)
    real_export = export.export_onnx

    def without_window(src: source.SourceModel, task: Any, out: Path) -> list[str]:
        return real_export(source.inspect_source(unwindowed, task), task, out)

    assert regimes.parity_lengths(json.loads((model / "config.json").read_text()), positions) == [
        699,
        700,
        701,
        1023,
        1024,
    ]
    with (
        mock.patch.object(export, "export_onnx", without_window),
        pytest.raises(ValidationFailed, match="departs from PyTorch") as refused,
    ):
        quick_bundle(model, "text-classification", tmp_path / "bundle")
    named = int(str(refused.value).split(" tokens")[0].rsplit(" ", 1)[1])
    assert window < named <= positions, str(refused.value)
