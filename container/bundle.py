"""The bundle format `hare optimize` writes and `hare serve` reads: model.onnx, tokenizer.json, hare.json.

Loading a bundle needs onnxruntime and tokenizers only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tasks.errors import InputError

MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
MANIFEST_FILE = "hare.json"
FORMAT_VERSION = 1


@dataclass
class Manifest:
    """hare.json: what the server needs to answer, and the evidence of how the model was chosen.

    task: one of tasks.registry.TASKS.
    labels: id -> label for classification heads (empty for embeddings).
    multi_label: the checkpoint's problem_type is multi_label_classification (sigmoid, not softmax).
    pooling/normalize: how token states become an embedding (from sentence-transformers' modules).
    max_length: tokens per sequence, special tokens included; the tokenizer truncates there.
    inputs/output: the graph's input names and the output the task reads.
    target: cpu or gpu; variant: the chosen variant's name; variants: every candidate's metrics and timings.
    """

    task: str
    architecture: str
    model_type: str
    labels: dict[int, str]
    multi_label: bool
    pooling: str | None
    normalize: bool
    max_length: int
    inputs: list[str]
    output: str
    target: str
    variant: str
    precision: str
    variants: list[dict[str, Any]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        data["labels"] = {int(k): v for k, v in data.get("labels", {}).items()}
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def read_manifest(bundle: Path) -> Manifest:
    """Read and check a bundle folder; the error names what is missing."""
    if not bundle.is_dir():
        raise InputError(f"bundle folder {bundle} does not exist; build one with `hare optimize`")
    missing = [f for f in (MODEL_FILE, TOKENIZER_FILE, MANIFEST_FILE) if not (bundle / f).is_file()]
    if missing:
        raise InputError(f"{bundle} is not a hare bundle: missing {', '.join(missing)}")
    try:
        manifest = Manifest.from_dict(json.loads((bundle / MANIFEST_FILE).read_text()))
    except (ValueError, TypeError) as exc:
        raise InputError(f"{bundle / MANIFEST_FILE} is unreadable: {exc}") from exc
    if manifest.format_version != FORMAT_VERSION:
        raise InputError(
            f"{bundle} has bundle format {manifest.format_version}, this hare reads {FORMAT_VERSION}; "
            "rebuild it with `hare optimize`"
        )
    return manifest
