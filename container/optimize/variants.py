"""The candidate graphs `hare optimize` may ship, per target, and which of them a build makes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from container.machine import FULL_LEVELS, NARROW_LEVELS
from container.optimize import bf16 as bf16_weights
from container.optimize import fuse, grouped_int8, mixed, quantize, rows, static_int8, validate

# ONNX Runtime's transformer optimizer has one encoder model_type: "bert". Its fusions match subgraph patterns,
# so they also fuse the BERT-shaped parts of other encoders (LayerNorm, Gelu, SkipLayerNorm; Attention where
# the attention is BERT's); the fused-operator counts in the manifest say what was found.
FUSION_MODEL_TYPE = "bert"
EXPORT = "export"  # the graph the export stage wrote before its pooled-row rewrite (stages.export_fp32)


@dataclass(frozen=True)
class Variant:
    """A candidate graph: built from `parent` (None: the export) by `build(parent_file, out_file)`, or, for a
    calibrated one, after the reference by `calibrate(parent_file, out_file, parity)`, which returns what it
    chose (for the manifest) and raises mixed.Refused, with the figures, when no graph of its kind can pass.
    levels: the int8 weights' levels a side it writes (dynamic int8 and int8-mixed; None: its weights do not
    follow machine.weight_levels). reads: the graph `build` reads when it is not the parent's (the fusion
    reads the export before its pooled row, EXPORT). optional: left out unless --variants names it."""

    name: str
    precision: str
    parent: str | None
    build: Callable[[Path, Path], object] | None = None
    calibrate: Callable[[Path, Path, validate.Parity], dict[str, Any]] | None = None
    levels: int | None = None
    reads: str | None = None
    optional: bool = False  # built only when --variants names it


def fused(family: str, use_gpu: bool, attention: tuple[int, int]) -> Callable[[Path, Path], dict[str, int]]:
    """The fusion of the whole export, then the pooled row (container/optimize/rows.py) cut from the fused
    graph. ORT's Attention pattern runs from a layer's output projection back to its q/k/v, so a row sliced
    in the last layer first left that layer unfused: on DistilBERT-base, 5 of 6 Attention kernels, and on a
    GPU the unfused layer's shape nodes ran on the CPU with a copy to the device between them."""

    def build(whole: Path, out: Path) -> dict[str, int]:
        counts = fuse.fuse(whole, out, family, use_gpu, attention)
        moved = rows.pooled_row(out, out)
        return counts | ({"pooled-row MatMuls": moved} if moved else {})

    return build


def variants_for(
    target: str,
    family: str = FUSION_MODEL_TYPE,
    attention: tuple[int, int] = (0, 0),
    levels: int = FULL_LEVELS,
    bf16: bool = False,
    openvino: bool = False,
    int8_units: bool = True,
) -> list[Variant]:
    """The candidates worth trying per target; the export itself is always the fp32 baseline. Every family
    gets every candidate: a fusion that does not match a family's graph fuses less (or fails its build), and
    the gates decide what ships. `levels`: the dynamic int8 weights' levels a side (machine.weight_levels: 64
    where the CPU's int8 kernel would saturate on 127). `bf16`: the CPU computes bf16 and OpenVINO is there
    (openvino_runtime.bf16_capable): the export, its MatMul weights in bf16, run by OpenVINO in bf16, joins the
    race. `openvino`: OpenVINO is installed: int8 weights with activations quantized in groups at run time join
    the race where the CPU has int8 dot-product units (`int8_units`: grouped_int8.RUNS_ON; elsewhere only when
    named, container/optimize/grouped_int8.py), and static int8 on its int8 kernels can be named
    (container/optimize/static_int8.py)."""
    fp32 = Variant("fp32", "fp32", None)
    if target == "gpu":
        return [
            fp32,
            Variant("fused-fp32", "fp32", "fp32", fused(family, True, attention), reads=EXPORT),
            Variant("fused-fp16", "fp16", "fused-fp32", fuse.to_fp16),
        ]
    narrow = levels == NARROW_LEVELS

    def dynamic(per_channel: bool) -> Callable[[Path, Path], object]:
        return lambda p, o: quantize.quantize_int8(p, o, per_channel=per_channel, reduce_range=narrow)

    # The export, its MatMul weights in bf16: OpenVINO reads ONNX and does its own fusion (it cannot read ORT's
    # fused operators).
    on_openvino = [Variant("bf16", "bf16", "fp32", bf16_weights.build)] if bf16 else []
    if openvino:
        grouped = Variant(grouped_int8.NAME, "int8", "fp32", calibrate=grouped_int8.build, optional=not int8_units)
        on_openvino.append(grouped)
        on_openvino.append(Variant(static_int8.NAME, "int8", "fp32", calibrate=static_int8.build, optional=True))
    return [
        fp32,
        *on_openvino,
        Variant("fused-fp32", "fp32", "fp32", fused(family, False, attention), reads=EXPORT),
        Variant("int8", "int8", "fp32", dynamic(False), levels=levels),
        Variant("int8-per-channel", "int8", "fp32", dynamic(True), levels=levels),
        Variant("fused-int8", "int8", "fused-fp32", dynamic(False), levels=levels),
        Variant("fused-int8-per-channel", "int8", "fused-fp32", dynamic(True), levels=levels),
        Variant("int8-block32", "int8", "fp32", quantize.quantize_blockwise),
        Variant("int8-block128", "int8", "fp32", lambda p, o: quantize.quantize_blockwise(p, o, block=128)),
        Variant("fused-int8-block32", "int8", "fused-fp32", quantize.quantize_blockwise),
        Variant(
            "int8-mixed",
            "int8",
            "fp32",
            calibrate=lambda p, o, parity: mixed.build(p, o, parity, levels),
            levels=levels,
        ),
    ]


@dataclass(frozen=True)
class Plan:
    """What one build makes of the candidates. chosen: the variants validated (all, or those --variants
    names); to_build: the fused and quantized ones they need, themselves or as parents (the export is its own
    stage); to_calibrate: the needed ones built after the reference (int8-mixed)."""

    chosen: tuple[Variant, ...]
    to_build: tuple[Variant, ...]
    to_calibrate: tuple[Variant, ...]


def plan(candidates: Sequence[Variant], only: Sequence[str] | None = None) -> Plan:
    """The build of `candidates` limited to `only` (None: every one) and the parents those need."""
    chosen = tuple(v for v in candidates if (v.name in only if only else not v.optional))
    parents = {v.name: v.parent for v in candidates}
    needed = set()
    for v in chosen:
        name: str | None = v.name
        while name is not None:
            needed.add(name)
            name = parents[name]
    made = [v for v in candidates if v.name in needed and v.parent is not None]
    calibrated = tuple(v for v in made if v.calibrate is not None)
    return Plan(chosen, tuple(v for v in made if v.calibrate is None), calibrated)
