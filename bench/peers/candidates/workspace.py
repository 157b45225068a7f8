"""Where a run's exports live (kept in `work`, reused from run to run, one folder per model's weights) and what
the candidates share while they load: the int8 configuration, the calibration texts, notes for the summary."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from bench.peers.candidates.base import int8_config_for
from bench.peers.options import PeersOptions
from bench.subjects import cache_dir
from container.machine import describe


class Workspace:
    """The model folder, the exports made from it, and the state the candidates' loaders share."""

    def __init__(self, options: PeersOptions, calibration: list[str]) -> None:
        self.options = options
        self.model_dir = options.model_dir
        self.work = options.work or cache_dir() / "peers" / weights_id(options.model_dir)
        self.calibration = calibration
        info = describe()
        self.int8 = options.int8_config or int8_config_for(info["flags"], os.uname().machine)
        self.notes: dict[str, str] = {}  # how each export was made, for the summary
        self.torch_model: Any = None  # one torch model for every thread count (its threads are the process's)
        self.made_here = False  # whether this run made the OpenVINO int8 export (else an earlier one did)


def weights_id(model_dir: Path) -> str:
    """A short id of the model's weights, naming its folder of exports."""
    digest = hashlib.sha256()
    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    for path in files or sorted(p for p in model_dir.iterdir() if p.is_file()):
        digest.update(path.name.encode())
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]
