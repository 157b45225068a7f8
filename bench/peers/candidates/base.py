"""What every candidate is made of: an encoder (texts to vectors), the packages it needs, and how it is skipped
when they are missing or fail. The peers are imported by name only here (`module`): they are optional, and
their versions vary (docs/benchmarks.md, Peers)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

Vectors = NDArray[np.float32]

# The packages each candidate needs beyond hare's dev dependencies, as bench/peers-requirements.txt brings them.
NEEDS = {
    "hare": (),
    "hare-http": (),
    "torch": ("sentence_transformers", "torch"),
    "onnx": ("sentence_transformers", "optimum.onnxruntime"),
    "onnx-int8": ("sentence_transformers", "optimum.onnxruntime"),
    "openvino": ("sentence_transformers", "openvino", "optimum.intel"),
    "openvino-int8": ("sentence_transformers", "openvino", "optimum.intel", "nncf"),
    "fastembed": ("fastembed", "sentence_transformers", "optimum.onnxruntime"),
}
QUIET_LOGGERS = ("sentence_transformers", "transformers", "optimum", "nncf", "fastembed")


class Skip(Exception):
    """A candidate that cannot run here; the message says why."""


@dataclass
class Encoder:
    """One loaded candidate at one thread count: `encode` texts to vectors; `enter` before each slot; `close`
    when the run is over (a server to stop); `model` the library's own object, for a caller that makes its own
    calls (`hare bench bulk` calls encode or embed once over a whole corpus, bench/bulk_peers.py)."""

    encode: Callable[[list[str]], Vectors]
    enter: Callable[[], None] = lambda: None
    close: Callable[[], None] = lambda: None
    model: Any = None


def missing(key: str) -> str:
    """Why `key` cannot run here for want of a package ("" when everything it needs is installed)."""
    absent = [name for name in NEEDS[key] if _find(name) is None]
    if not absent:
        return ""
    return f"not installed: {', '.join(absent)} (docs/benchmarks.md, Installing the peers, says how)"


def _find(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that is absent or broken
        return None


def module(name: str) -> Any:
    """A peer's module, untyped: the peers are optional, and their versions vary (see docs/benchmarks.md)."""
    return importlib.import_module(name)


def reason(exc: BaseException) -> str:
    """An exception as one short line: why a candidate was skipped, or why a run failed."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:240]}"


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The peers' own warnings and chatter off while they load and export (by their loggers' levels too:
    Optimum Intel's exporter lifts `logging.disable` as it finishes)."""
    previous = logging.root.manager.disable
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    logging.disable(logging.WARNING)
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def int8_config_for(flags: Sequence[str], machine: str = "") -> str:
    """sentence-transformers' dynamic-quantization configuration for a CPU with these flags."""
    if "avx512_vnni" in flags or "amx_int8" in flags:
        return "avx512_vnni"
    if "avx512bw" in flags or "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    if machine.lower() in ("aarch64", "arm64") or "asimddp" in flags:
        return "arm64"
    return "avx2"
