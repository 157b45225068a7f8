"""A candidate's figures (its row of the table, kept in the run's summary), its fidelity to torch, and the
issue's goal: hare at least as fast as the fastest peer whose cosine p1 to torch is at least GOAL_P1."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tasks.ops import cosine

GOAL_P1 = 0.99  # the bar: peers whose cosine p1 to torch is at least this count for the goal


@dataclass
class Row:
    """One candidate's line of the table."""

    key: str
    label: str
    skipped: str = ""  # why it did not run ("" when it did)
    p50_ms: dict[int, float] = field(default_factory=dict)  # batch 1, by threads
    sentences_s: dict[int, float] = field(default_factory=dict)  # at the batch, by threads
    cores: dict[str, float] = field(default_factory=dict)  # "b1t2" -> cores used over the slot
    cpu_ms: dict[str, float] = field(default_factory=dict)  # "b1t2" -> p50 of the process's CPU ms per call
    cosine_p1: float = math.nan
    cosine_mean: float = math.nan
    cosine_min: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "skipped": self.skipped,
            "p50_ms": {str(k): v for k, v in self.p50_ms.items()},
            "sentences_s": {str(k): v for k, v in self.sentences_s.items()},
            "cores": self.cores,
            "cpu_ms": self.cpu_ms,
            "cosine_p1": _json(self.cosine_p1),
            "cosine_mean": _json(self.cosine_mean),
            "cosine_min": _json(self.cosine_min),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        return cls(
            key=data["key"],
            label=data["label"],
            skipped=data.get("skipped", ""),
            p50_ms={int(k): v for k, v in data.get("p50_ms", {}).items()},
            sentences_s={int(k): v for k, v in data.get("sentences_s", {}).items()},
            cores=dict(data.get("cores", {})),
            cpu_ms=dict(data.get("cpu_ms", {})),
            cosine_p1=_num(data.get("cosine_p1")),
            cosine_mean=_num(data.get("cosine_mean")),
            cosine_min=_num(data.get("cosine_min")),
        )

    def take_fidelity(self, reference: NDArray[np.float32], vectors: NDArray[np.float32]) -> None:
        """The cosines of this candidate's vectors of the fidelity set against the reference's (torch's)."""
        cos = cosine(np.asarray(reference, dtype=np.float32), np.asarray(vectors, dtype=np.float32))
        self.cosine_p1 = float(np.percentile(cos, 1))
        self.cosine_mean = float(cos.mean())
        self.cosine_min = float(cos.min())


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def _json(value: float) -> float | None:
    """NaN (not measured) as null, so that the stored JSON is standard."""
    return None if math.isnan(value) else value


# hare's own rows: the goal is the in-process one's, and neither is a peer.
OURS = ("hare", "hare-http")


def goal(rows: Sequence[Row], threads: Sequence[int]) -> list[dict[str, Any]]:
    """The issue's goal, per figure: hare at least as fast as the fastest peer whose cosine p1 is >= 0.99."""
    hare = next((r for r in rows if r.key == "hare" and not r.skipped), None)
    peers = [r for r in rows if r.key not in OURS and not r.skipped and r.cosine_p1 >= GOAL_P1]
    out = []
    for figure in ("p50_ms", "sentences_s"):
        lower_better = figure == "p50_ms"
        for t in threads:
            ours = getattr(hare, figure).get(t) if hare else None
            theirs = [(getattr(p, figure)[t], p.key) for p in peers if t in getattr(p, figure)]
            best = (min if lower_better else max)(theirs, default=None)
            met = None
            if ours is not None and best is not None:
                met = ours <= best[0] if lower_better else ours >= best[0]
            out.append(
                {
                    "figure": "batch 1 p50 ms" if lower_better else "batch sentences/s",
                    "threads": t,
                    "hare": ours,
                    "best_peer": best[1] if best else None,
                    "peer": best[0] if best else None,
                    "met": met,
                }
            )
    return out
