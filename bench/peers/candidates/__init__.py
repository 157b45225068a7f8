"""The candidates, one module per runtime, and `load`: a candidate at a thread count, or Skip saying why not.

    hare.py                    hare         hare's bundle with hare's own runtime code, scheduled as served
    http.py                    hare-http    `hare serve` of the bundle, over HTTP on loopback
    sentence_transformers.py   torch        the reference; onnx and onnx-int8 (Optimum's export, dynamic int8)
    openvino.py                openvino     Optimum Intel's export; openvino-int8 (static, our calibration)
    fastembed.py               fastembed    fastembed's TextEmbedding on Optimum's export

base.py holds what they share (the Encoder, the packages each needs, Skip); workspace.py the exports' folder.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.peers.candidates.base import Encoder, Skip, missing, reason
from bench.peers.candidates.fastembed import load_fastembed
from bench.peers.candidates.hare import load_hare
from bench.peers.candidates.http import load_hare_http
from bench.peers.candidates.openvino import load_openvino, load_openvino_int8
from bench.peers.candidates.sentence_transformers import load_onnx, load_onnx_int8, load_torch
from bench.peers.candidates.workspace import Workspace

LOADERS: dict[str, Callable[[Workspace, int], Encoder]] = {
    "hare": load_hare,
    "hare-http": load_hare_http,
    "torch": load_torch,
    "onnx": load_onnx,
    "onnx-int8": load_onnx_int8,
    "openvino": load_openvino,
    "openvino-int8": load_openvino_int8,
    "fastembed": load_fastembed,
}


def load(space: Workspace, key: str, threads: int) -> Encoder:
    """`key` at `threads` threads; Skip when it cannot run here."""
    why = missing(key)
    if why:
        raise Skip(why)
    try:
        return LOADERS[key](space, threads)
    except Skip:
        raise
    except Exception as exc:  # an import that fails against these versions, an export that fails
        raise Skip(reason(exc)) from exc
