"""The candidates `hare bench peers` knows, their labels, and the options of a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("hare", "hare-http", "torch", "onnx", "onnx-int8", "openvino", "openvino-int8", "fastembed")
LABELS = {
    "hare": "hare's bundle, hare's own runtime code",
    "hare-http": "hare serve over HTTP (end to end)",
    "torch": "sentence-transformers torch fp32 (reference)",
    "onnx": "sentence-transformers onnx fp32",
    "onnx-int8": "sentence-transformers onnx int8 (dynamic, per channel)",
    "openvino": "sentence-transformers openvino fp32",
    "openvino-int8": "sentence-transformers openvino int8 (static)",
    "fastembed": "fastembed fp32",
}


@dataclass(frozen=True)
class PeersOptions:
    model_dir: Path  # the Hugging Face (sentence-transformers) folder every peer loads
    bundle: Path  # hare's bundle of it
    seq_len: int = 128  # tokens per text for speed
    batch: int = 32  # the throughput batch (batch 1 is always measured too)
    threads: tuple[int, ...] = (1, 2)
    rounds: int = 5
    seconds: float = 1.0  # recorded per slot and round
    warmup_calls: int = 2  # unrecorded calls before each slot
    min_calls: int = 2  # recorded calls per slot and round at least, however long they take
    fidelity: int = 200  # texts in the fidelity set
    fidelity_max: int = 200  # their longest, in tokens
    candidates: tuple[str, ...] = CANDIDATES
    int8_config: str | None = None  # sentence-transformers' name; None: from this CPU's flags
    ov_calibration: int | None = None  # OpenVINO calibration texts; None: OVQuantizationConfig's num_samples
    work: Path | None = None  # where exports are kept (default: the bench cache)
    name: str = ""
