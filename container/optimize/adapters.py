"""Task adapters baked in: a checkpoint that carries several LoRA adapters (jina-embeddings-v3: retrieval.query,
retrieval.passage, separation, classification, text-matching) becomes, for one adapter, a plain folder whose
weights are W + (alpha / rank) * B[t] @ A[t]. The export stage then sees an ordinary model.

Why one bundle per adapter, chosen at build time (`hare optimize --adapter NAME`): the merge costs nothing at
serve time (no LoRA product per call, no adapter index in the graph), a bundle stays one model with one
answer per text, and an asymmetric search runs two bundles (queries and passages) as it runs two encode
calls. transformers 5's native `jina_embeddings_v3` loads such a checkpoint without its adapters, i.e. as the
base model, which is not what the model card's `encode(task=...)` computes; hare therefore refuses the folder
until an adapter is named.

The layout is the one jina's own code (`modeling_lora.py`, LoRAParametrization) saves: a parametrized weight is
`P.parametrizations.weight.original`, beside `P.parametrizations.weight.0.lora_A` and `.lora_B`, one slice per
adapter on the first axis. Linear layers: A [n, rank, in], B [n, out, rank], delta B[t] @ A[t]. Embeddings:
A [n, vocab, rank], B [n, rank, dim], delta A[t] @ B[t]. Adapter names and rank/alpha come from config.json
(`lora_adaptations`, `lora_rank`, `lora_alpha`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tasks.errors import InputError

ORIGINAL = ".parametrizations.weight.original"
LORA = ".parametrizations.weight.0.lora_"


def names(folder: Path) -> list[str]:
    """The adapters `folder`'s config.json declares ([] for a model without any)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return []
    found = config.get("lora_adaptations") if isinstance(config, dict) else None
    return [str(n) for n in found] if isinstance(found, list) else []


def choose(folder: Path, adapter: str | None) -> str | None:
    """The adapter to bake, checked against the folder: None for a folder without adapters."""
    declared = names(folder)
    if not declared:
        if adapter:
            raise InputError(f"--adapter {adapter}: {folder} declares no task adapters (config.json lora_adaptations)")
        return None
    if adapter is None:
        raise InputError(
            f"{folder} carries {len(declared)} task adapters (LoRA: {', '.join(declared)}); a bundle serves one, "
            "baked into its weights: pass --adapter NAME, and build one bundle per adapter you serve (e.g. "
            "retrieval.query for queries and retrieval.passage for documents)"
        )
    if adapter not in declared:
        raise InputError(f"--adapter {adapter}: {folder} has {', '.join(declared)}")
    return adapter


def merge(folder: Path, adapter: str, out: Path) -> Path:
    """Write `folder` with `adapter` merged into its weights to `out` (every other file copied as it is)."""
    from safetensors.numpy import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    index = names(folder).index(adapter)
    scaling = float(config.get("lora_alpha", 1)) / float(config.get("lora_rank", 1))
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"), dirs_exist_ok=True)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise InputError(f"{folder}: adapters are merged from safetensors weights, and it has none")
    merged = 0
    for path in weights:
        tensors = load_file(str(path))
        plain: dict[str, NDArray[Any]] = {}
        for key, value in tensors.items():
            if LORA in key:
                continue
            if key.endswith(ORIGINAL):
                prefix = key.removesuffix(ORIGINAL)
                a, b = tensors[f"{prefix}{LORA}A"], tensors[f"{prefix}{LORA}B"]
                value = value + scaling * _delta(a[index], b[index], value.shape).astype(value.dtype)
                key = f"{prefix}.weight"
                merged += 1
            plain[key] = value
        save_file(plain, str(out / path.name), metadata={"format": "pt"})
    if not merged:
        raise InputError(f"{folder} declares adapters but its weights hold no LoRA pairs ({ORIGINAL})")
    config["hare_adapter"] = adapter
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def _delta(a: NDArray[Any], b: NDArray[Any], shape: tuple[int, ...]) -> NDArray[Any]:
    """One adapter's update of a weight of `shape`: B @ A for a linear layer, A @ B for an embedding."""
    delta = b @ a if (b.shape[0], a.shape[-1]) == shape else a @ b
    if delta.shape != shape:
        raise InputError(f"a LoRA pair of shapes {a.shape} and {b.shape} does not update a weight of {shape}")
    return np.asarray(delta)
