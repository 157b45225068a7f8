"""One pass of the int8 simulation graph (container/optimize/int8.py `simulation`) over validation samples: a
choice of MatMuls in int8 judged against the PyTorch reference by the task's gates, each sample alone and in
the batches the server forms, as validate judges a built graph. The mixed int8 stage (mixed.py) makes every
choice with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from numpy.typing import NDArray

from container.machine import FULL_LEVELS
from container.optimize import graphs
from container.optimize.int8 import SWITCHES, simulation
from container.optimize.validate import Parity, served_outputs, verdicts
from container.runtime import PROVIDERS, session_options
from tasks.base import Gate, ParityInput
from tasks.ops import pad_batch


def cpu_session(model: onnx.ModelProto, folder: Path) -> ort.InferenceSession:
    """A CPU session over `model`: from memory, or through a file in `folder` past protobuf's inline limit."""
    options = session_options(0)
    if not graphs.too_big(model):
        return ort.InferenceSession(model.SerializeToString(), options, providers=PROVIDERS["cpu"])
    path = folder / "hare-int8-simulation.onnx"
    graphs.save(model, path)  # one simulation per smoothing alpha, each replacing the last
    return ort.InferenceSession(str(path), options, providers=PROVIDERS["cpu"])


@dataclass(frozen=True)
class Judgement:
    """A simulated graph on some samples: the gates' figures, whether every gate passes, the largest share of
    a gate's room (fp32's figure to the threshold) it uses, and its squared output error relative to the
    reference's (the tie-break between equal harms)."""

    figures: dict[str, float]
    passed: bool
    harm: float
    error: float
    thresholds: dict[str, float] = field(default_factory=dict)


class Simulator:
    """One simulation graph's session, with the samples' feeds and the reference; `judge` runs a choice of
    switches over some of the samples."""

    def __init__(
        self,
        model: onnx.ModelProto,
        names: Sequence[str],
        folder: Path,
        parity: Parity,
        passes: list[int],
        levels: int = FULL_LEVELS,
        rows: Mapping[str, NDArray[np.int64]] | None = None,
    ) -> None:
        self.names = list(names)
        self.parity = parity
        self.session = cpu_session(simulation(model, self.names, levels, rows), folder)
        inputs = [i.name for i in self.session.get_inputs() if i.name != SWITCHES]
        self.feeds = [pad_batch([e], inputs) for e in parity.encodings]
        with np.load(parity.reference) as stored:
            self.reference = [stored[str(i)] for i in range(len(parity.encodings))]
        self.passes = passes  # one entry per pass, shared by the simulators of one plan

    def judge(
        self, switches: NDArray[np.int64], indices: Sequence[int], ideal: Mapping[str, float] | None = None
    ) -> Judgement:
        p, task = self.parity, self.parity.task

        def run(feeds: dict[str, NDArray[np.int64]]) -> NDArray[np.float32]:
            return np.asarray(self.session.run([task.output], feeds | {SWITCHES: switches})[0], np.float32)

        # As validate judges the built graph: each sample alone and in the batches the server forms (one
        # activation scale per call is shared by a batch; per-token scales are not).
        feeds, refs = [self.feeds[i] for i in indices], [self.reference[i] for i in indices]
        ref, out, groups = served_outputs(run, feeds, p.pad_id, refs, [p.samples[i].group for i in indices])
        self.passes.append(1)
        figures = task.parity(ParityInput(ref, out, groups, p.pooling or "mean", p.multi_label, p.regression))
        judged = verdicts(figures, task.gates, p.thresholds)
        harm = max((used(g, judged[g.metric], ideal) for g in task.gates), default=0.0) if ideal else 0.0
        error = sum(float(((o - r) ** 2).sum()) for o, r in zip(out, ref, strict=True))
        scale = sum(float((r**2).sum()) for r in ref) or 1.0
        return Judgement(
            {g.metric: float(figures[g.metric]) for g in task.gates},
            all(bool(v["passed"]) for v in judged.values()),
            harm,
            error / scale,
            {g.metric: float(judged[g.metric]["threshold"]) for g in task.gates},
        )


def used(gate: Gate, verdict: Mapping[str, float | bool], ideal: Mapping[str, float]) -> float:
    """The share of `gate`'s room between fp32's figure and its threshold that a figure uses."""
    value, threshold, best = float(verdict["value"]), float(verdict["threshold"]), ideal[gate.metric]
    room = max(best - threshold if gate.higher_is_better else threshold - best, 1e-12)
    return (best - value if gate.higher_is_better else value - best) / room
