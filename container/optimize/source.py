"""Inspect a Hugging Face model folder before any work: refuse early, with a reason, what cannot be served."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.base import TaskSpec
from tasks.errors import UnsupportedModel

# model_type -> the family ORT's transformer optimizer fuses it as. These are the types whose export, fusion
# and tokenizers are tested; MiniLM checkpoints are model_type "bert".
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "bert": "bert",
    "distilbert": "bert",
    "roberta": "bert",
    "xlm-roberta": "bert",
}
HUGE_MAX_LENGTH = 1_000_000


@dataclass(frozen=True)
class SourceModel:
    """What the optimizer learned from the folder; everything later stages need about the source."""

    path: Path
    config: dict[str, Any]
    model_type: str
    architecture: str
    labels: dict[int, str]
    multi_label: bool
    pooling: str | None
    normalize: bool
    max_length: int
    weights: list[Path]
    weights_sha256: str


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise UnsupportedModel(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UnsupportedModel(f"{path} should hold a JSON object")
    return data


def _weights(folder: Path, allow_pickle: bool) -> list[Path]:
    safetensors = sorted(folder.glob("*.safetensors"))
    if safetensors:
        return safetensors
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    if pickles and allow_pickle:
        return pickles
    if pickles:
        raise UnsupportedModel(
            f"{folder} has weights only as pickle ({pickles[0].name}), which can run arbitrary code when "
            "loaded; convert them to safetensors or pass --allow-pickle if you trust the source"
        )
    raise UnsupportedModel(f"{folder} has no weights (model.safetensors or pytorch_model.bin)")


def _pooling(folder: Path) -> tuple[str | None, bool]:
    """Pooling and normalization from sentence-transformers' modules.json, else (None, False)."""
    modules_file = folder / "modules.json"
    if not modules_file.is_file():
        return None, False
    modules = json.loads(modules_file.read_text())
    types = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules}
    pooling = None
    if "Pooling" in types:
        cfg = _read_json(folder / types["Pooling"]["path"] / "config.json")
        modes = {
            "cls": cfg.get("pooling_mode_cls_token"),
            "mean": cfg.get("pooling_mode_mean_tokens"),
            "max": cfg.get("pooling_mode_max_tokens"),
            "mean_sqrt_len": cfg.get("pooling_mode_mean_sqrt_len_tokens"),
        }
        chosen = [name for name, on in modes.items() if on]
        if len(chosen) != 1:
            raise UnsupportedModel(f"{folder} pools with {chosen or 'no mode'}; hare supports exactly one mode")
        pooling = chosen[0]
    return pooling, "Normalize" in types


def _max_length(folder: Path, config: dict[str, Any]) -> int:
    """The smallest maximum the model's own files declare (sentence-transformers, tokenizer, positions)."""
    limits: list[int] = []
    st = folder / "sentence_bert_config.json"
    if st.is_file() and isinstance(_read_json(st).get("max_seq_length"), int):
        limits.append(_read_json(st)["max_seq_length"])
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        declared = _read_json(tc).get("model_max_length")
        if isinstance(declared, int | float) and declared < HUGE_MAX_LENGTH:
            limits.append(int(declared))
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int):
        # RoBERTa-style models start positions after padding_idx, so two slots are not usable.
        offset = config.get("pad_token_id", 0) + 1 if config["model_type"] in ("roberta", "xlm-roberta") else 0
        limits.append(positions - offset)
    if not limits:
        raise UnsupportedModel(f"{folder} declares no maximum length (max_position_embeddings)")
    return min(limits)


def _sha256(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def inspect_source(folder: Path, task: TaskSpec, allow_pickle: bool = False) -> SourceModel:
    """Check that `folder` is a model hare can optimize for `task`, and read what the bundle needs."""
    if not folder.is_dir():
        raise UnsupportedModel(f"model folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise UnsupportedModel(f"{folder} has no config.json; is it a Hugging Face model folder?")
    config = _read_json(folder / "config.json")
    if "auto_map" in config:
        raise UnsupportedModel(
            f"{folder} needs trust_remote_code (its config has auto_map); hare refuses to run a model's own code"
        )
    model_type = config.get("model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"architecture {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else f"{model_type} (base model)"
    if task.architectures and not any(a.endswith(task.architectures) for a in architectures):
        raise UnsupportedModel(
            f"{folder} has no {task.name} head (architectures: {architectures or 'none'}; expected one ending "
            f"in {' or '.join(task.architectures)})"
        )
    weights = _weights(folder, allow_pickle)
    pooling, normalize = _pooling(folder)
    pooling = pooling or task.default_pooling
    id2label = config.get("id2label") or {}
    return SourceModel(
        path=folder,
        config=config,
        model_type=model_type,
        architecture=architecture,
        labels={int(k): str(v) for k, v in id2label.items()} if task.architectures else {},
        multi_label=config.get("problem_type") == "multi_label_classification",
        pooling=pooling,
        normalize=normalize,
        max_length=_max_length(folder, config),
        weights=weights,
        weights_sha256=_sha256(weights),
    )
