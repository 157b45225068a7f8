"""`int8-static`: int8 MatMuls with activation scales fixed at build time, run by OpenVINO's CPU plugin.

ONNX Runtime's quantizer writes the graph as QuantizeLinear / DequantizeLinear pairs around each MatMul
(`quantize_static`, QDQ): per-channel symmetric int8 weights, uint8 activations with one scale and zero
point per tensor calibrated on the calibration samples (MinMax). OpenVINO reads those pairs and runs the
MatMuls on its int8 kernels, the rest in bf16 where the CPU has it (container/openvino_runtime.py). Static
scales cost no quantization pass per call and do not change with the company a text keeps in a batch; they
hold only activations without outliers, so, as int8-mixed does, the build first smooths (SmoothQuant,
container/optimize/smoothing.py) and then keeps the MatMuls whose smoothed input still spreads furthest
(largest channel maximum against the median channel's) out of int8, as few as pass: every choice is judged
by the task's gates on the calibration samples, with OpenVINO running it, and the first that passes with
mixed.MARGIN of each gate's room to spare ships. None passing refuses the variant with its closest figures.

Measured on all-MiniLM-L6-v2 (AMD EPYC, AVX-512 VNNI and AVX512_BF16, one thread): 400 ms at 32 x 128
tokens against int8-mixed's 575 on ONNX Runtime, equal at one 128-token text, slower at 16 tokens
(docs/history/2026-11-optimizer.md). Built only when named (`--variants int8-static`): its calibration runs
the quantizer once per choice tried.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from numpy.typing import NDArray
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, quantize_static

from container.optimize import graphs
from container.optimize.mixed import MARGIN, Refused
from container.optimize.simulator import used
from container.optimize.smoothing import activation_maxima, smooth, smoothing_groups, spread, targets
from container.optimize.validate import Parity, show_figures, validate
from tasks.ops import pad_batch

NAME = "int8-static"
ALPHAS = (0.5, 0.7, 0.85)
# Shares of the candidate MatMuls kept out of int8 (those whose smoothed input spreads furthest), tried in turn.
KEPT_SHARES = (0.0, 1 / 6, 1 / 3, 1 / 2)


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    """The calibration samples' feeds, one at a time, as the quantizer reads them."""

    def __init__(self, feeds: Sequence[Mapping[str, NDArray[np.int64]]]) -> None:
        self._feeds: Iterator[Mapping[str, NDArray[np.int64]]] = iter(feeds)

    def get_next(self) -> dict[str, NDArray[np.int64]] | None:
        feed = next(self._feeds, None)
        return None if feed is None else dict(feed)


def build(fp32: Path, out: Path, fit: Parity) -> dict[str, Any]:
    """Write the first static int8 graph for `fp32` that meets the gates on the calibration samples `fit` with
    MARGIN to spare to `out`, and return what it chose (for the manifest); Refused, with the closest figures,
    when none does."""
    start = time.perf_counter()
    folder = out.parent / f"{out.stem}.work"
    folder.mkdir(exist_ok=True)
    model = onnx.load(str(fp32))
    names = [i.name for i in model.graph.input]
    feeds = [pad_batch([e], names, fit.pad_id) for e in fit.encodings]
    maxima = activation_maxima(model, feeds, folder)
    ideal = validate(fp32, "fp32", "fp32", fit).figures
    big = graphs.too_big(model)
    closest: tuple[float, str] = (float("inf"), "")
    tried = 0
    logging.disable(logging.WARNING)  # the quantizer's advice on pre-processing, once per call
    try:
        for share in KEPT_SHARES:
            for alpha in ALPHAS:
                ranked = sorted(spread(model, maxima, alpha).items(), key=lambda item: item[1])
                kept = [name for name, _ in ranked[len(ranked) - round(share * len(ranked)) :]] if share else []
                int8 = [name for name, _ in ranked if name not in kept]
                if not int8:
                    continue
                source = folder / "smoothed.onnx"
                graphs.save(smooth(model, maxima, alpha), source)
                quantize_static(
                    str(source),
                    str(out),
                    _Reader(feeds),
                    quant_format=QuantFormat.QDQ,
                    per_channel=True,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    op_types_to_quantize=["MatMul"],
                    nodes_to_quantize=int8,
                    calibrate_method=CalibrationMethod.MinMax,
                    use_external_data_format=big,
                    extra_options={"WeightSymmetric": True},
                )
                tried += 1
                report = validate(out, NAME, "int8", fit)
                harm = max((used(g, report.gates[g.metric], ideal) for g in fit.task.gates), default=0.0)
                if report.passed and harm <= 1 - MARGIN:
                    return {  # as int8-mixed's plan names them (optimize's build lines read both)
                        "alpha": alpha,
                        "scales": "tensor, fixed at build",
                        "smoothed": len(smoothing_groups(model)) if alpha else 0,
                        "matmuls": len(targets(model)),
                        "fp32": kept,
                        "calibration": len(feeds),
                        "figures": report.figures,
                        "passes": tried,
                        "seconds": round(time.perf_counter() - start, 1),
                    }
                closest = min(closest, (harm, f"α {alpha}, {len(kept)} MatMuls kept: {show_figures(report.figures)}"))
    finally:
        logging.disable(logging.NOTSET)
        shutil.rmtree(folder, ignore_errors=True)
    raise Refused(
        f"no static int8 graph left {MARGIN:.0%} of each gate's room on the calibration samples; closest "
        f"{closest[1]} (fp32: {show_figures(ideal)})"
    )
