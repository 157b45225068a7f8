"""Stage 4, validate: every candidate graph against the PyTorch model on the same token ids.

The reference runs once and is stored as an .npz; each variant is then compared with it, metric by metric,
and checked against the gates. A variant that fails a gate is never shipped.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray
from tokenizers import Encoding, Tokenizer

from container.bundle import MAX_BATCH_SIZE
from container.models import open_model
from container.optimize.errors import ValidationFailed
from container.optimize.source import SourceModel
from container.optimize.textset import Sample
from tasks.base import DIFFERENCE, Gate, ParityInput, TaskSpec
from tasks.errors import InputError
from tasks.ops import length_batches, pad_batch

# Every task's fp32 variants, beside the task's own gates: an fp32 graph must be the model, not close to it.
# The bound is per unit of the outputs' largest magnitude (at least 1): float32 rounds relative to a value's
# size, and a model whose outputs run to 4.6 (a Gemma 4 text geometry, hidden 1536: max|diff| 1.07e-4 from
# reordered sums alone) is as exact as one whose outputs stay under 1. A broken graph misses by 0.1 and more.
FP32_GATE = Gate(
    "max_abs_diff",
    1e-4,
    False,
    "fp32 variants: largest |output difference| from PyTorch, per unit of the outputs' largest magnitude (>= 1)",
    DIFFERENCE,
)
# The token count of the sample where a graph is furthest from PyTorch (a metric, named in refusals).
WORST_AT = "max_abs_diff_tokens"


@dataclass
class VariantReport:
    """One candidate's validation: metrics, each gate's verdict, and whether it may ship."""

    name: str
    precision: str
    metrics: dict[str, float]
    gates: dict[str, dict[str, float | bool]]
    passed: bool
    size_mb: float
    timings_ms: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # the build (fusion, quantization) failed: why; nothing else was measured
    build: dict[str, Any] = field(default_factory=dict)  # what a calibrated build chose (int8-mixed: mixed.Plan)

    @classmethod
    def failed_build(cls, name: str, precision: str, error: str) -> VariantReport:
        return cls(name, precision, {}, {}, False, 0.0, error=error)

    @property
    def figures(self) -> dict[str, float]:
        """Each gate's figure, by metric (what a calibrated build records and refuses with)."""
        return {metric: float(gate["value"]) for metric, gate in self.gates.items()}


def show_figures(figures: Mapping[str, float]) -> str:
    """Gate figures as `metric=value`, four significant digits (a calibrated build's refusal)."""
    return ", ".join(f"{m}={v:.4g}" for m, v in figures.items())


@dataclass(frozen=True)
class Parity:
    """What every candidate is checked against: the stored PyTorch reference, the samples it was computed on
    (and their encodings), the task whose metrics and gates apply, gate overrides by metric name, the
    target whose execution provider runs the candidate, and whether the checkpoint is multi-label (its
    scores are sigmoids) or regression (its scores are its logits)."""

    reference: Path
    encodings: Sequence[Encoding]
    samples: Sequence[Sample]
    task: TaskSpec
    pooling: str | None = None
    thresholds: Mapping[str, float] = field(default_factory=dict)
    target: str = "cpu"
    multi_label: bool = False
    pad_id: int = 0
    regression: bool = False


def encode_samples(tokenizer: Tokenizer, samples: Sequence[Sample]) -> list[Encoding]:
    return [tokenizer.encode(s.text, s.pair) if s.pair is not None else tokenizer.encode(s.text) for s in samples]


def reference_outputs(
    source: SourceModel, task: TaskSpec, encodings: Sequence[Encoding], inputs: Sequence[str], out: Path
) -> Path:
    """Run the PyTorch model on each encoding (batch 1, so no padding is involved) and save to `out`."""
    import torch

    from container.optimize.export import load_torch_model, reference_row

    model = load_torch_model(source, task)
    arrays: dict[str, NDArray[np.float32]] = {}
    with torch.inference_mode():
        for i, enc in enumerate(encodings):
            feeds = {k: torch.from_numpy(v) for k, v in pad_batch([enc], inputs).items()}
            arrays[str(i)] = reference_row(model, source, task, feeds).float().numpy()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out


# The server batches waiting sequences of near lengths (api/engine/lengthqueue.py), and a dynamic int8 graph
# quantizes a whole batch's activations with one scale: all-MiniLM-L6-v2's int8-mixed gave cosine p1 0.9952
# alone and 0.9895 in such batches of the same texts. So every candidate is judged both ways: each sample
# alone, and each in the batch the server's packing rule (tasks/ops.py next_call) puts it in when the samples
# arrive together: up to SERVED_BATCH sequences and SERVED_TOKENS padded tokens (max_batch_tokens measured on
# CPUs run 128-2048). SERVED_BATCH is the server's HARE_MAX_BATCH_SIZE default.
SERVED_BATCH = MAX_BATCH_SIZE
SERVED_TOKENS = 512


def served_batches(lengths: Sequence[int]) -> list[list[int]]:
    """Sample indices grouped as the server's queue groups sequences that reach it together."""
    return length_batches(lengths, SERVED_BATCH, SERVED_TOKENS)


Run = Callable[[dict[str, NDArray[np.int64]]], NDArray[np.float32]]


class Served(NamedTuple):
    """Each sample's output alone (its feeds: a batch of one, unpadded), then within its served batch, beside
    its reference (twice) and its ranking group (the second pass's groups apart from the first's)."""

    references: list[NDArray[np.float32]]
    outputs: list[NDArray[np.float32]]
    groups: list[int]


def served_outputs(
    run: Run,
    feeds: Sequence[Mapping[str, NDArray[np.int64]]],
    pad_id: int,
    refs: Sequence[NDArray[np.float32]],
    groups: Sequence[int],
) -> Served:
    """The samples' outputs as the server can give them: alone, and within the batches it forms (right-padded
    with `pad_id`, token-level rows trimmed to the sample's length); `refs` and `groups` are the samples'."""
    alone = [run(dict(f))[0] for f in feeds]
    lengths = [f["input_ids"].shape[1] for f in feeds]
    batched: list[NDArray[np.float32]] = list(alone)
    for batch in served_batches(lengths):
        if len(batch) == 1:
            continue
        width = max(lengths[i] for i in batch)
        stacked = {
            name: np.concatenate(
                [
                    np.pad(
                        feeds[i][name],
                        ((0, 0), (0, width - lengths[i])),
                        constant_values=pad_id if name == "input_ids" else 0,
                    )
                    for i in batch
                ]
            )
            for name in feeds[batch[0]]
        }
        out = run(stacked)
        for row, i in enumerate(batch):
            batched[i] = out[row, : lengths[i]] if out.ndim > 2 else out[row]
    offset = max(groups, default=0) + 1
    return Served([*refs, *refs], alone + batched, [*groups, *(g + offset for g in groups)])


def verdicts(
    metrics: Mapping[str, float], gates: Sequence[Gate], thresholds: Mapping[str, float]
) -> dict[str, dict[str, float | bool]]:
    """Each gate's verdict on `metrics`: its value, its threshold (`thresholds` overrides by metric name) and
    whether it passed."""
    judged: dict[str, dict[str, float | bool]] = {}
    for gate in gates:
        threshold = thresholds.get(gate.metric, gate.threshold)
        checked = Gate(gate.metric, threshold, gate.higher_is_better, gate.help)
        value = metrics[gate.metric]
        judged[gate.metric] = {"value": value, "threshold": threshold, "passed": checked.passes(value)}
    return judged


def judge(
    task: TaskSpec,
    precision: str,
    ref: Sequence[NDArray[np.float32]],
    cand: Sequence[NDArray[np.float32]],
    groups: Sequence[int],
    pooling: str,
    multi_label: bool,
    thresholds: Mapping[str, float],
    regression: bool = False,
) -> tuple[dict[str, float], dict[str, dict[str, float | bool]]]:
    """The metrics of candidate outputs against the reference, and each gate's verdict (the task's gates, and
    FP32_GATE for an fp32 graph; `thresholds` overrides by metric name). The build and `hare tune --check`
    both judge here."""
    metrics = {"max_abs_diff": float(max(np.abs(r - c).max() for r, c in zip(ref, cand, strict=True)))}
    metrics |= task.parity(ParityInput(ref, cand, groups, pooling, multi_label, regression))
    if precision != "fp32":
        return metrics, verdicts(metrics, task.gates, thresholds)
    scale = max([1.0, *(float(np.abs(r).max()) for r in ref)])
    exact = {FP32_GATE.metric: thresholds.get(FP32_GATE.metric, FP32_GATE.threshold) * scale}
    return metrics, verdicts(metrics, [*task.gates, FP32_GATE], {**thresholds, **exact})


def validate(variant: Path, name: str, precision: str, parity: Parity) -> VariantReport:
    """Compare the graph at `variant` with the stored reference and apply the gates.

    FP32_GATE (`max_abs_diff`, default 1e-4) also gates fp32 variants.
    """
    task = parity.task
    with np.load(parity.reference) as stored:
        ref = [stored[str(i)] for i in range(len(parity.encodings))]
    model = open_model(variant, name, parity.target, output=task.output)
    feeds = [pad_batch([e], model.input_names) for e in parity.encodings]
    served = served_outputs(model.run, feeds, parity.pad_id, ref, [s.group for s in parity.samples])
    metrics, judged = judge(
        task, precision, *served, parity.pooling or "mean", parity.multi_label, parity.thresholds, parity.regression
    )
    # Where the graph is furthest from PyTorch, for a refusal to name (samples alone, then in their batches).
    diffs = [float(np.abs(r - c).max()) for r, c in zip(served.references, served.outputs, strict=True)]
    metrics[WORST_AT] = float(feeds[int(np.argmax(diffs)) % len(feeds)]["input_ids"].shape[1])
    return VariantReport(
        name=name,
        precision=precision,
        metrics=metrics,
        gates=judged,
        passed=all(bool(v["passed"]) for v in judged.values()),
        size_mb=round(variant.stat().st_size / 2**20, 2),
    )


def refuse_departing_graphs(reports: Sequence[VariantReport]) -> None:
    """Raise ValidationFailed, naming the length and the figure, when every fp32 graph checked misses
    FP32_GATE: the export itself departs from PyTorch, every variant derives from it, and an int8 one could
    still pass its looser gates with the departure inside."""
    fp32 = [r for r in reports if r.precision == "fp32" and r.error is None]
    if not fp32 or any(r.gates[FP32_GATE.metric]["passed"] for r in fp32):
        return
    closest = min(fp32, key=lambda r: r.metrics[FP32_GATE.metric])
    gate = closest.gates[FP32_GATE.metric]
    raise ValidationFailed(
        f"the fp32 graph departs from PyTorch: {closest.name}'s max |output difference| is "
        f"{float(gate['value']):.3g} (gate {float(gate['threshold']):.3g}) at {closest.metrics[WORST_AT]:.0f} "
        "tokens; every variant derives from it, so none ships. A length where the model's arithmetic changes "
        "(container/optimize/regimes.py) that the export does not follow is the usual cause"
    )


INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def save_parity(out: Path, parity: Parity) -> Path:
    """The validation set as each sample's model inputs, PyTorch's answers and the ranking groups, in one
    .npz that travels with the bundle (no tokenizer or torch is needed to read it)."""
    with np.load(parity.reference) as stored:
        arrays = {f"ref_{i}": stored[str(i)] for i in range(len(parity.encodings))}
    for i, enc in enumerate(parity.encodings):
        arrays |= {f"{name}_{i}": value for name, value in pad_batch([enc], INPUTS).items()}
    arrays["groups"] = np.array([s.group for s in parity.samples], dtype=np.int64)
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    return out


def load_parity(path: Path) -> tuple[list[dict[str, NDArray[np.int64]]], list[NDArray[np.float32]], list[int]]:
    """save_parity's file: per sample the model inputs and the reference, and the groups."""
    try:
        with path.open("rb") as file, np.load(file) as stored:  # np.load left a damaged file's handle open
            groups = [int(g) for g in stored["groups"]]
            feeds = [{name: stored[f"{name}_{i}"] for name in INPUTS} for i in range(len(groups))]
            refs = [stored[f"ref_{i}"] for i in range(len(groups))]
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:  # cut short, or not save_parity's
        raise InputError(f"{path} is damaged ({exc}); rebuild the bundle") from None
    return feeds, refs, groups
