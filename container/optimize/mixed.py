"""Stage 3b, mixed int8 (`int8-mixed`): per-channel dynamic int8 that keeps the task's gates, chosen on the
validation samples once the PyTorch reference exists.

Dynamic int8 gives a MatMul's activations one scale per call. Trained BERT-style encoders put a few huge
values on one token ([CLS]) in a few fixed channels: all-MiniLM-L6-v2 has 28 in channel 99 of every
attention-output LayerNorm where its other tokens stay under 10, and 24 in one channel of layer 0's GELU
output, so that one scale leaves the other tokens a handful of levels (cosine p1 0.977 against PyTorch, the
gate is 0.99). Decoders carry massive activations (a few residual channels 50-100x the median on every
token and up to 100,000x on the first and delimiter tokens; tests/outliers.py injects them). Three remedies,
cheapest first, each chosen against the reference on a calibration subset of the samples:

1. Smoothing (SmoothQuant, Xiao et al. 2022). The input channel j of the constant-weight MatMuls that read
   one activation is divided by s_j = max|x_j|^alpha / max|w_j|^(1 - alpha) (one Mul before them) and row j
   of their weights multiplied by it: the same function in fp32, with the outliers moved into the weights,
   which are quantized per output channel. alpha is one of ALPHAS (0: no smoothing).
2. Per-token activation scales (as SmoothQuant and LLM.int8 quantize activations): max|x_row| / 127 for each
   token, u8 around 128, written here (the dynamic quantizer has no such mode). A token whose activations
   are massive (a decoder's delimiter at layer 0's down_proj input: 2,000x the median unit) then costs its
   own row its levels, not every token's, and a text's result no longer depends on the texts batched with
   it. It costs a few percent over the per-call kernel, which ONNX Runtime fuses into one operator (58.3 ms
   against 54.9 at 128 tokens on the Qwen3 geometry of docs/optimizer.md), so it is chosen only when the
   cheaper graph misses: the per-call scales' best alpha is kept if its fully quantized graph meets the gates
   with MARGIN of their room to spare on the subset and passes on every sample; otherwise the per-token
   scales' best alpha, if it does; otherwise the better of the two goes on to 3.
3. Mixed precision. Each MatMul's harm is measured alone (only it quantized: how much of each gate's room
   between the fp32 graph and the threshold it takes); the most harmful stay fp32, one more at a time, until
   every gate passes with MARGIN of its room to spare on the subset and passes on every sample, at most
   MAX_FP32 of them. Then, split instead of fp32 (LLM.int8()'s decomposition, int8.split): the input channels
   where the outliers flow (smoothing.split_channels: the smoothed activation's or weight row's maximum far
   past the median channel's; the massive channels of a decoder) computed in fp32 beside an int8 product of
   the rest, whose activations are quantized without them, so a massive channel no longer takes a token's (or
   a call's) levels. The same MatMuls, and up to SPLIT_MORE times as many in the same order, are tried split
   one more at a time; the first that meets the gates the same way replaces the fp32 choice. Where no choice
   within MAX_FP32 passed, 1 to every MatMul are tried split the same way; none passing refuses the variant,
   its closest figures against the gates first. A split costs little more than int8: all-MiniLM-L6-v2 on the
   AVX2 kernel (64-level weights), 8 split and none fp32, runs at 1.44x the fused fp32 graph, against 1.34x
   with the 4 that would otherwise stay fp32.

Last, the lookup tables (the word embedding: dynamic int8 quantizes it, int8-mixed's MatMul choice leaves it
fp32) are tried as int8 rows, one scale per row (int8.int8_tables), under the same rule: kept if the chosen
graph with them still meets the gates with MARGIN to spare on the subset and passes on every sample, otherwise
left fp32, so they never cost a MatMul its int8. A quarter of the bytes, at the same speed.

Every choice is one pass of a simulation graph over the subset, not a quantizer run: the fp32 graph with each
MatMul behind an `If` that switches it to either int8 arithmetic as the build writes it (per call: the dynamic
quantizer's DynamicQuantizeLinear, MatMulInteger on the int8 weight values and per-channel scales it would
store, the scales' Mul; per token: the same product, as MatMulIntegerToFloat, behind hare's own row scales), so
the CPU's own int8 kernel runs each choice: CPUs without VNNI add u8 x s8 pairs in 16-bit registers that can
saturate (ONNX Runtime's quantization docs). There the build's weights keep 64 levels a side
(machine.weight_levels), which cannot; with 127 (`--int8-weights full`) the choice is made with the
saturation's error. Measured on all-MiniLM-L6-v2 on an AVX-512 VNNI CPU: the built graph's figures equal the
simulation's to 5 digits. The built graph is then validated like every variant.

The cost is linear in the MatMuls: one pass per alpha and kind of scales over the subset (CALIBRATION_TOKENS
tokens), one or two over every sample, one per MatMul over a subset of at most RANKING_TOKENS / MatMuls
tokens (only when some must stay fp32), one per MatMul kept fp32, and up to SPLIT_MORE times as many more
for the splits (as many as MatMuls where no fp32 choice passed; and one over every sample for each that meets
the margin), one or two for the tables; then
one quantizer run (or hare's per-token rewrite). The choice is fitted to (part of) the samples the gate then
checks, which MARGIN hedges; a --validation-file of the served texts checks the shipped graph on unseen ones.

Its parts: smoothing.py (1: the MatMuls int8 quantizes, their activations' maxima, the smoothed graph),
simulator.py (judging a choice in one simulation pass), int8.py (the int8 arithmetic, splits, tables); this
module chooses (`plan`) and builds.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from container.machine import FULL_LEVELS, NARROW_LEVELS, available_bytes
from container.optimize import graphs
from container.optimize.int8 import (
    SPLIT,
    TENSOR,
    TOKEN,
    int8_tables,
    per_token,
    split,
    tables,
)
from container.optimize.simulator import Judgement, Simulator
from container.optimize.smoothing import activation_maxima, smooth, smoothing_groups, split_channels, targets
from container.optimize.validate import Parity

# Smoothing strengths tried (0: none). SmoothQuant's default is 0.5; all-MiniLM-L6-v2 needs 0.7.
ALPHAS = (0.0, 0.5, 0.6, 0.7, 0.8)
# Tokens in the calibration subset (the shortest samples first: short inputs are where [CLS] dominates).
CALIBRATION_TOKENS = 1024
# Tokens per MatMul x MatMuls for the sensitivity pass: a decoder with many MatMuls ranks on fewer samples.
RANKING_TOKENS = 32768
# Share of each gate's room (fp32's figure to the threshold) a choice must leave unused on the subset.
MARGIN = 0.4
# The most of the MatMuls that may stay fp32: past it the variant is not worth its name.
MAX_FP32 = 0.5
# Split MatMuls tried in place of k fp32 ones: up to SPLIT_MORE x k (a split costs about what int8 does).
SPLIT_MORE = 3
# Peak memory of the stage: the graph, a smoothed copy, a simulation session and the quantizer's copies, about
# 5x the fp32 graph's weight bytes, over what the build's process holds already. Measured peak RSS: 765 MB for
# all-MiniLM-L6-v2's 90 MB graph, 11.9 GB for a Qwen3-Embedding-0.6B geometry's 2.4 GB (4.9x). A graph whose
# estimate is past the memory available is refused before anything runs: the kernel's OOM killer would end the
# whole build, not this variant. (10x alone refused the 0.6B geometry on a 24 GiB machine, where it builds.)
# Splits add about a quarter of the weight bytes to each simulation (each weight's int8 copy without its split
# rows, and those rows in fp32): with them and the tables' simulation, the 0.6B geometry peaked at 12.7 GB (5.1x;
# 15.9 GB while the tables' check held a third copy of the graph, since removed).
MEMORY_FACTOR = 6
MEMORY_BASE = 512 * 2**20
# Activation scales, cheapest first: one per call (the quantizer's, fused by ONNX Runtime into one kernel), one
# per token (a row's own max |x|: a token with massive activations costs only its own row its levels).
SCALES = ("tensor", "token")


class Refused(Exception):
    """No mixed graph within MAX_FP32 meets the gates on the calibration samples; the message has the figures."""


@dataclass
class Plan:
    """What the stage chose, as the manifest records it (the variant's `build`).

    alpha: the smoothing strength (0: none); scales: the int8 activations' scales, one per call ("tensor") or
    per token ("token"); levels: the int8 weights' levels a side (machine.weight_levels); smoothed: activations
    scaled. matmuls: MatMuls with a constant 2-D weight (the candidates); fp32: those kept in fp32, most
    harmful first; split: those split (int8.split) instead, most harmful first (fp32 is then empty); channels:
    each split MatMul's input channels in fp32 (smoothing.split_channels; absent: its largest weight rows).
    tables: the lookup tables stored as int8 rows (int8.int8_tables; empty: those there are stay fp32). harm:
    each MatMul's share of the tightest gate's room when it alone is int8, most harmful first (empty when none
    had to stay fp32).
    calibration: samples in the calibration subset; figures: the gates' figures of the chosen graph there.
    passes: simulation passes over a subset or the whole set.
    """

    alpha: float
    scales: str
    levels: int
    smoothed: int
    matmuls: int
    fp32: list[str]
    split: list[str] = field(default_factory=list)
    channels: dict[str, list[int]] = field(default_factory=dict)
    tables: list[str] = field(default_factory=list)
    harm: dict[str, float] = field(default_factory=dict)
    calibration: int = 0
    figures: dict[str, float] = field(default_factory=dict)
    passes: int = 0
    seconds: float = 0.0


def calibration(lengths: Sequence[int], groups: Sequence[int], pairs: bool, budget: int) -> list[int]:
    """Indices of the samples to calibrate on: the shortest first up to `budget` tokens (at least one), whole
    query groups for pair tasks (a ranking gate is per query)."""
    units: dict[int, list[int]] = {}
    for i, group in enumerate(groups):
        units.setdefault(group if pairs else i, []).append(i)
    chosen: list[int] = []
    tokens = 0
    for unit in sorted(units.values(), key=lambda u: (sum(lengths[i] for i in u), u[0])):
        cost = sum(lengths[i] for i in unit)
        if chosen and tokens + cost > budget:
            break
        chosen += unit
        tokens += cost
    return sorted(chosen)


def plan(fp32: Path, parity: Parity, folder: Path, levels: int = FULL_LEVELS) -> tuple[onnx.ModelProto, Plan]:
    """Choose the smoothing, the MatMuls that stay fp32 or split and the tables in int8 rows for the graph at
    `fp32` (module docstring), with int8 weights of `levels` a side; returns the smoothed graph (its MatMuls
    still fp32, its chosen tables in int8 rows) and the plan. Raises Refused, with the figures, when no choice
    within MAX_FP32 passes."""
    start = time.perf_counter()
    weights = _weight_bytes(fp32)
    available = available_bytes()
    need = MEMORY_BASE + weights * MEMORY_FACTOR
    if available and need > available:
        raise Refused(
            f"the simulation would need about {need / 2**30:.1f} GiB ({MEMORY_FACTOR}x the graph's "
            f"{weights / 2**30:.1f} GiB and {MEMORY_BASE / 2**30:.1f} GiB more), more than the "
            f"{available / 2**30:.1f} GiB available"
        )
    model = onnx.load(str(fp32))
    names = [n.name for n in targets(model)]
    if not names:
        raise Refused("the graph has no MatMul with a constant 2-D weight to quantize")
    lengths = [len(e.ids) for e in parity.encodings]
    groups = [s.group for s in parity.samples]
    subset = calibration(lengths, groups, parity.task.pairs, CALIBRATION_TOKENS)
    ranking = calibration(lengths, groups, parity.task.pairs, max(1, RANKING_TOKENS // len(names)))
    everything = list(range(len(lengths)))
    folder.mkdir(parents=True, exist_ok=True)
    passes: list[int] = []
    held: dict[float, Simulator] = {}
    maxima: dict[str, NDArray[np.float32]] = {}

    def simulator(alpha: float) -> Simulator:
        """The simulation of the graph smoothed at `alpha`, its splits' channels chosen there: one at a time,
        as each holds the graph about three times (the one held is dropped before the next is built)."""
        if alpha not in held:
            held.clear()
            rows = split_channels(model, maxima, alpha)
            held[alpha] = Simulator(smooth(model, maxima, alpha), names, folder, parity, passes, levels, rows)
        return held[alpha]

    off = np.zeros(len(names), np.int64)
    reference = simulator(0.0).judge(off, subset)  # the fp32 graph: each gate's room is measured from it
    if not reference.passed:
        raise Refused(f"the fp32 graph itself misses the gates on the calibration samples ({_show(reference)})")
    ideal = reference.figures
    maxima |= activation_maxima(model, [simulator(0.0).feeds[i] for i in subset], folder)
    if maxima:
        held.clear()  # the reference's simulation split its MatMuls by their weights alone
    alphas = ALPHAS if maxima else (0.0,)
    code = {"tensor": TENSOR, "token": TOKEN}
    tried = {  # every alpha's all-int8 graph with each kind of activation scales, on the calibration subset
        (kind, a): simulator(a).judge(np.full(len(names), code[kind]), subset, ideal) for a in alphas for kind in SCALES
    }

    def best(kinds: Sequence[str]) -> tuple[str, float]:
        return min(((k, a) for k in kinds for a in alphas), key=lambda c: (tried[c].harm, tried[c].error))

    # The cheapest activation scales whose best alpha meets the gates with the margin and on every sample;
    # failing that, the best choice of all, and MatMuls kept fp32 from there.
    wholes: dict[tuple[str, float], Judgement] = {}
    choice = None
    for kind in SCALES:
        key = best([kind])
        if tried[key].harm <= 1 - MARGIN:
            wholes[key] = simulator(key[1]).judge(np.full(len(names), code[kind]), everything)
            if wholes[key].passed:
                choice = key
                break
    scales, alpha = choice or best(SCALES)
    whole = wholes.get((scales, alpha))
    sim = simulator(alpha)
    judged = tried[scales, alpha]
    cap = int(len(names) * MAX_FP32)
    order: list[int] = []
    harm: dict[str, float] = {}

    def rank() -> None:
        """The sensitivity pass: each MatMul alone in int8 on the ranking subset, most harmful first."""
        base = sim.judge(off, ranking).figures
        alone = []
        for i in range(len(names)):
            one = off.copy()
            one[i] = code[scales]
            alone.append(sim.judge(one, ranking, base))
        order[:] = sorted(range(len(names)), key=lambda i: (-alone[i].harm, -alone[i].error))
        harm.update({names[i]: round(alone[i].harm, 4) for i in order})

    switches = np.full(len(names), code[scales])
    refusal = ""
    while True:
        kept = int((switches == 0).sum())
        if whole is None and judged.harm <= 1 - MARGIN:
            whole = sim.judge(switches, everything)
        if whole is not None and whole.passed:
            break
        if kept == cap:
            where = (
                f"the calibration samples give {_show(judged)}, within {1 - MARGIN:.0%} of each gate's room "
                f"from fp32's figures, but every sample gives {_show(whole)}"
                if whole is not None
                else f"the calibration samples still give {_show(judged)} (a choice must leave {MARGIN:.0%} of "
                f"each gate's room from fp32's figures {_show(reference)} unused)"
            )
            refusal = (
                f"with {kept} of {len(names)} MatMuls in fp32 (the most allowed: "
                f"{', '.join(names[i] for i in order[:kept]) or 'none'}), smoothing alpha {alpha:g} and one "
                f"activation scale per {scales}, {where}"
            )
            break
        if not order:
            rank()
        switches[order[kept]] = 0
        judged, whole = sim.judge(switches, subset, ideal), None
    # Splits in place of the fp32 choice: from as many as were kept fp32 up to SPLIT_MORE times as many, or,
    # where no fp32 choice passed, from one up to every MatMul (a split costs about what int8 does).
    splits, closest, split_best = 0, judged, None
    first, last = (1, len(names) if SPLIT_MORE else 0) if refusal else (kept, min(len(names), SPLIT_MORE * kept))
    if refusal and not order:
        rank()
    for count in range(first, last + 1) if kept or refusal else ():
        trial = np.full(len(names), code[scales])
        trial[order[:count]] += SPLIT
        tight = sim.judge(trial, subset, ideal)
        closest = tight if tight.harm < closest.harm else closest
        split_best = tight if split_best is None or tight.harm < split_best.harm else split_best
        if tight.harm <= 1 - MARGIN and sim.judge(trial, everything).passed:
            judged, splits, kept, switches = tight, count, 0, trial
            break
    if refusal and not splits:  # the closest figures and the gates first: the build's table shows the start
        raise Refused(
            f"at best {_against_gates(closest)} on the calibration samples; {refusal}"
            + (f"; split instead (1 to {len(names)} of them), at best {_show(split_best)}" if split_best else "")
        )
    # Last, the lookup tables as int8 rows, kept only if the choice still meets the gates the same way with them.
    # Their simulation is built from a smoothed copy it consumes, as the others are: no third copy is held.
    stored = tables(model)
    rows = split_channels(model, maxima, alpha) if splits else {}
    if stored:
        held.clear()
        del sim
        tabled = Simulator(
            int8_tables(smooth(model, maxima, alpha), stored), names, folder, parity, passes, levels, rows
        )
        tight = tabled.judge(switches, subset, ideal)
        if tight.harm <= 1 - MARGIN and tabled.judge(switches, everything).passed:
            judged = tight
        else:
            stored = []
        del tabled
    chosen = Plan(
        alpha=alpha,
        levels=levels,
        scales=scales,
        smoothed=len(smoothing_groups(model)) if alpha else 0,
        matmuls=len(names),
        fp32=[names[i] for i in order[:kept]],
        split=[names[i] for i in order[:splits]],
        channels={names[i]: rows[names[i]].tolist() for i in order[:splits] if names[i] in rows},
        tables=stored,
        harm=harm,
        calibration=len(subset),
        figures={m: round(v, 5) for m, v in judged.figures.items()},
        passes=sum(passes),
        seconds=round(time.perf_counter() - start, 1),
    )
    return int8_tables(smooth(model, maxima, alpha), stored), chosen


def _weight_bytes(path: Path) -> int:
    """The bytes of the graph's initializers, inline or in external files (read from their shapes)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return sum(
        int(np.prod(t.dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        for t in graph.initializer
        if t.data_type != TensorProto.STRING
    )


def _against_gates(judged: Judgement) -> str:
    """The gates' figures against their thresholds, for a refusal."""
    return ", ".join(f"{m} {v:.4g} (gate {judged.thresholds[m]:g})" for m, v in judged.figures.items())


def _show(judged: Judgement) -> str:
    """The gates' figures, for a message."""
    return ", ".join(f"{m}={v:.4g}" for m, v in judged.figures.items())


def build(fp32: Path, out: Path, parity: Parity, levels: int = FULL_LEVELS) -> dict[str, Any]:
    """Write the int8-mixed graph for `fp32` to `out`, weights of `levels` a side, and return its plan (for the
    manifest): per-token scales written here, per-call ones by ONNX Runtime's dynamic quantizer (whose
    operators it fuses)."""
    folder = out.parent / f"{out.stem}.work"
    try:
        smoothed, chosen = plan(fp32, parity, folder, levels)
        # The split MatMuls first, in either kind of scales: the targets left named are fp32 or int8.
        smoothed = split(smoothed, chosen.split, chosen.scales, levels, chosen.channels)
        int8 = [n for n in (t.name for t in targets(smoothed)) if n not in chosen.fp32]
        big = graphs.too_big(smoothed)
        if chosen.scales == "token":
            graphs.save(per_token(smoothed, int8, levels), out)
        else:
            source = folder / "smoothed.onnx"
            graphs.save(smoothed, source)
            quantize_dynamic(
                str(source),
                str(out),
                per_channel=True,
                reduce_range=levels == NARROW_LEVELS,
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=int8,
                use_external_data_format=big,
                extra_options={"MatMulConstBOnly": True, "DefaultTensorType": TensorProto.FLOAT},
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return asdict(chosen)
