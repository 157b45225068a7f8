"""Smoothing (SmoothQuant, Xiao et al. 2022) for the mixed int8 stage (container/optimize/mixed.py): the
MatMuls dynamic int8 quantizes, those that read one activation, that activation's largest values per channel
on calibration samples, and the graph with each such activation divided by per-channel factors and the weight
rows multiplied by them (the same function in fp32, the outliers moved into the weights); and the channels a
split MatMul computes in fp32, where those outliers flow."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from container.optimize.int8 import split_rows
from container.optimize.simulator import cpu_session

# Bounds on a smoothing factor, against channels that are (nearly) silent in the calibration samples.
SCALE_RANGE = (1e-3, 1e3)


def targets(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMuls whose weight (second input) is a 2-D float initializer: what dynamic int8 quantizes, and what
    the simulation models; any other MatMul stays fp32."""
    inits = {t.name: t for t in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type != "MatMul" or not node.name:
            continue
        weight = inits.get(node.input[1])
        if weight is not None and weight.data_type == TensorProto.FLOAT and len(weight.dims) == 2:
            found.append(node)
    return found


def _consumers(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            counts[name] = counts.get(name, 0) + 1
    return counts


def smoothing_groups(model: onnx.ModelProto) -> dict[str, list[onnx.NodeProto]]:
    """The target MatMuls by the activation they read, leaving out any whose weight another node also reads
    (ALBERT's shared layers: scaling it for one input would change the others)."""
    uses = _consumers(model)
    groups: dict[str, list[onnx.NodeProto]] = {}
    for node in targets(model):
        if uses[node.input[1]] == 1:
            groups.setdefault(node.input[0], []).append(node)
    return groups


def activation_maxima(
    model: onnx.ModelProto, feeds: Sequence[Mapping[str, NDArray[np.int64]]], folder: Path
) -> dict[str, NDArray[np.float32]]:
    """max |x_j| per input channel of each smoothing group's activation over `feeds` (the fp32 graph, with
    those activations as extra outputs). An activation with no rows in any feed (a routed expert that no
    calibration token picked, container/optimize/experts.py) has no entry."""
    names = list(smoothing_groups(model))
    if not names:
        return {}
    probe = copy.deepcopy(model)
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    session = cpu_session(probe, folder)
    maxima: dict[str, NDArray[np.float32]] = {}
    for feed in feeds:
        for name, value in zip(names, session.run(names, dict(feed)), strict=True):
            if value.size == 0:
                continue
            channel = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
            maxima[name] = np.maximum(maxima[name], channel) if name in maxima else channel
    return maxima


def smooth(model: onnx.ModelProto, maxima: Mapping[str, NDArray[np.float32]], alpha: float) -> onnx.ModelProto:
    """A copy of `model` with each smoothing group's activation divided by its factors (one Mul before the
    group's first MatMul) and the group's weight rows multiplied by them; the same function in fp32. A group
    whose activation `maxima` has no entry for (never reached in calibration) is left as it is."""
    out = copy.deepcopy(model)
    if alpha == 0:
        return out
    inits = {t.name: t for t in out.graph.initializer}
    muls: dict[str, onnx.NodeProto] = {}
    for activation, nodes in smoothing_groups(out).items():
        if activation not in maxima:
            continue
        weights = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
        s = _factors(maxima[activation], weights, alpha)
        scaled = f"{activation}/hare_smooth"
        out.graph.initializer.append(numpy_helper.from_array((1 / s).astype(np.float32), f"{scaled}/inverse"))
        muls[activation] = helper.make_node("Mul", [activation, f"{scaled}/inverse"], [scaled], name=scaled)
        for node, weight in zip(nodes, weights, strict=True):
            inits[node.input[1]].CopyFrom(numpy_helper.from_array(weight * s[:, None], node.input[1]))
            node.input[0] = scaled
    ordered: list[onnx.NodeProto] = []
    for node in out.graph.node:
        for name in node.input:  # each Mul goes right before the first node that reads it
            if name.endswith("/hare_smooth") and name[: -len("/hare_smooth")] in muls:
                ordered.append(muls.pop(name[: -len("/hare_smooth")]))
        ordered.append(node)
    del out.graph.node[:]
    out.graph.node.extend(ordered)
    return out


def spread(model: onnx.ModelProto, maxima: Mapping[str, NDArray[np.float32]], alpha: float) -> dict[str, float]:
    """Per target MatMul of a smoothing group, how far its input's largest channel maximum stands above the
    median channel's once smoothed at `alpha`: what one static activation scale per tensor loses the most
    levels to (container/optimize/static_int8.py). Groups `maxima` has no entry for are left out."""
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, float] = {}
    for activation, nodes in smoothing_groups(model).items():
        if activation not in maxima:
            continue
        xmax = maxima[activation]
        if alpha:
            xmax = xmax / _factors(xmax, [numpy_helper.to_array(inits[n.input[1]]) for n in nodes], alpha)
        ratio = float(xmax.max() / max(float(np.median(xmax)), 1e-12))
        out.update({n.name: ratio for n in nodes})
    return out


def _factors(xmax: NDArray[np.float32], weights: Sequence[NDArray[np.float32]], alpha: float) -> NDArray[np.float32]:
    """The smoothing factors s_j = max|x_j|^alpha / max|w_j|^(1 - alpha) of one activation read by `weights`."""
    wmax = np.max([np.abs(w).max(axis=1) for w in weights], axis=0)
    live = (xmax > 0) & (wmax > 0)
    s = np.ones_like(xmax)
    s[live] = xmax[live] ** alpha / wmax[live] ** (1 - alpha)
    return np.clip(s, *SCALE_RANGE).astype(np.float32)


def split_channels(
    model: onnx.ModelProto, maxima: Mapping[str, NDArray[np.float32]], alpha: float
) -> dict[str, NDArray[np.int64]]:
    """The input channels each target MatMul computes in fp32 when split (int8.split_rows) in the graph smoothed
    at `alpha`: where the outliers flow, on either side of the product. A channel ranks by the larger of its
    smoothed activation maximum (max|x_j| / s_j over `maxima`, the unsmoothed graph's) against the median
    channel's and its smoothed weight row's maximum against the median row's: a massive activation channel
    (at alpha 0), or the weight row smoothing moved it into. A MatMul whose activation has no maxima is left
    out (split_rows then ranks its rows by their weights alone)."""
    inits = {t.name: t for t in model.graph.initializer}
    found: dict[str, NDArray[np.int64]] = {}
    for activation, nodes in smoothing_groups(model).items():
        if activation not in maxima:
            continue
        weights = [numpy_helper.to_array(inits[n.input[1]]) for n in nodes]
        s = _factors(maxima[activation], weights, alpha) if alpha else np.ones_like(maxima[activation])
        x = _against_median(maxima[activation] / s)
        for node, weight in zip(nodes, weights, strict=True):
            found[node.name] = split_rows(weight, np.maximum(x, _against_median(np.abs(weight).max(axis=1) * s)))
    return found


def _against_median(values: NDArray[np.float32]) -> NDArray[np.float32]:
    return values / max(float(np.median(values)), 1e-30)
