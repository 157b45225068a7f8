"""What a folder built as `sparse-embedding` is: a SPLADE masked LM, or a bge-m3 model with its extra heads.

SPLADE: any `*ForMaskedLM` checkpoint, pooled as sentence-transformers' SpladePooling says (its module config
when the folder is a SparseEncoder folder; max and relu, SparseEncoder's defaults, otherwise).
bge-m3: FlagEmbedding's layout, a base encoder with `sparse_linear.pt` (Linear(hidden, 1)) and
`colbert_linear.pt` (Linear(hidden, hidden)) beside it. The .pt files are read here, at build time only, with
torch.load(weights_only=True), which refuses anything but tensors; the bundle carries them inside the graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container.optimize.errors import UnsupportedModel

HEAD_FILES = {"sparse": "sparse_linear.pt", "colbert": "colbert_linear.pt"}
SPLADE_POOLINGS = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
# sentence-transformers modules a SPLADE folder may list: the MLM itself and its pooling.
SPLADE_MODULES = ("MLMTransformer", "Transformer", "SpladePooling")


@dataclass(frozen=True)
class SparseModel:
    """pooling/activation: SpladePooling's (SPLADE only). heads: bge-m3's head files by name (empty for SPLADE).
    max_active_dims: SparseEncoder's (config_sentence_transformers.json): the weights a vector keeps by default."""

    pooling: str = "max"
    activation: str = "relu"
    heads: dict[str, Path] = field(default_factory=dict)
    max_active_dims: int | None = None

    @property
    def outputs(self) -> list[str]:
        """What the bundle answers: bge-m3's three outputs, or nothing more than the task's sparse vector."""
        return ["dense", "sparse", "colbert"] if self.heads else []


def inspect(folder: Path, architectures: list[str], st_config: dict[str, Any]) -> SparseModel:
    """The folder as a sparse model, or a refusal that says what to build instead. `st_config`: its
    config_sentence_transformers.json ({} without one)."""
    present = {name: folder / f for name, f in HEAD_FILES.items() if (folder / f).is_file()}
    if present:
        missing = [HEAD_FILES[n] for n in HEAD_FILES if n not in present]
        if missing:
            raise UnsupportedModel(
                f"{folder} has {', '.join(p.name for p in present.values())} but not {', '.join(missing)}; a bge-m3 "
                "folder carries both heads (FlagEmbedding saves them beside the model)"
            )
        return SparseModel(heads=present)
    if not any(a.endswith("ForMaskedLM") for a in architectures):
        raise UnsupportedModel(
            f"{folder} is not a sparse model (architectures: {architectures or 'none'}): sparse-embedding needs a "
            "SPLADE checkpoint (a masked-LM head, *ForMaskedLM) or a bge-m3 folder (sparse_linear.pt and "
            "colbert_linear.pt beside the model). For dense vectors from this model, build it with "
            "--task feature-extraction"
        )
    return _splade(folder, st_config)


def _splade(folder: Path, st_config: dict[str, Any]) -> SparseModel:
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return SparseModel()  # SparseEncoder's defaults for a bare masked LM
    pooling: dict[str, Any] = {}
    for module in json.loads(modules_file.read_text()):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in SPLADE_MODULES:
            raise UnsupportedModel(
                f"{folder} has a sentence-transformers module {kind!r} hare does not apply; a SPLADE folder may "
                f"list {', '.join(SPLADE_MODULES)}"
            )
        if kind == "SpladePooling":
            config = folder / module.get("path", "") / "config.json"
            pooling = json.loads(config.read_text()) if config.is_file() else {}
    found = SparseModel(
        pooling.get("pooling_strategy", "max"),
        pooling.get("activation_function", "relu"),
        max_active_dims=_max_active_dims(st_config),
    )
    if found.pooling not in SPLADE_POOLINGS or found.activation not in SPLADE_ACTIVATIONS:
        raise UnsupportedModel(
            f"{folder} pools with {found.pooling}/{found.activation}; hare computes SpladePooling's "
            f"{'/'.join(SPLADE_POOLINGS)} with {'/'.join(SPLADE_ACTIVATIONS)}"
        )
    return found


def _max_active_dims(st_config: dict[str, Any]) -> int | None:
    """SparseEncoder's max_active_dims as the folder saved it: encode keeps that many weights a vector."""
    value = st_config.get("max_active_dims")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise UnsupportedModel(
            f"config_sentence_transformers.json: max_active_dims must be a positive integer or null, got {value!r}"
        )
    return value


def load_head(path: Path, hidden: int, out_features: int) -> dict[str, Any]:
    """A head's Linear weights from its .pt file (tensors only: weights_only), checked against the model's
    hidden size so a mismatched file fails here with its name, not deep inside the export."""
    import torch

    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickling refusal or a corrupt file: either way this file is the problem
        raise UnsupportedModel(f"{path} is not a plain tensor file torch loads with weights_only: {exc}") from exc
    weight = state.get("weight") if isinstance(state, dict) else None
    if weight is None or tuple(weight.shape) != (out_features, hidden):
        shape = None if weight is None else tuple(weight.shape)
        raise UnsupportedModel(
            f"{path} should hold a Linear({hidden}, {out_features}) state dict (weight [{out_features}, {hidden}]); "
            f"found weight {shape}"
        )
    return dict(state)
