"""The model backend (as text-embeddings-inference's Backend trait): token sequences in, each sequence's rows
out. It owns the whole model call, so the batcher and warm-up never see a tensor shape:

    sequences ── pad into the graph's feeds ── count unknown tokens ── session of the granted width ── trim
                                                                         (1 thread, or every core)

One ONNX Runtime session per width (intra-op thread count) the scheduler may grant: ORT fixes a session's
threads when it is made, so a call that may use every core needs its own session. Each costs about one more
copy of the weights (measured: +116 MB for a 90 MB fp32 MiniLM); widths (1,) keep one session.

On a GPU, `graph_shapes` makes the one session replay a captured CUDA graph for each batch that one of those
padded shapes holds (container/cudagraphs.py); a bundle whose graph cannot be captured runs plainly, said in
the log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from tokenizers import Encoding

from container.cudagraphs import CudaGraphs, Shape
from container.models import Model, open_models
from container.runtime import InferenceFailed, OnnxModel
from tasks.ops import pad_batch, padded_length, pool_tokens

Array = NDArray[np.float32]
# Batches above this many padded tokens give ORT's arena back after their run (measured on a 90 MB fp32
# MiniLM: a 64 x 128 batch left the process at 370 MB for good, 190 MB with the shrink; re-allocating costs
# little next to such a batch's compute). Smaller batches keep their buffers: they come back every call.
SHRINK_ABOVE = 2048
log = logging.getLogger("hare.backend")


class Backend:
    """Runs batches of encodings on a bundle's graph, with sessions of the given `widths` (threads)."""

    def __init__(
        self,
        path: Path,
        target: str = "cpu",
        widths: Sequence[int] = (1,),
        output: str | None = None,
        unk_id: int | None = None,
        on_unknown: Callable[[int], None] | None = None,
        arena: bool = True,
        pad_id: int = 0,
        graph_shapes: Sequence[Shape] = (),
        variant: str = "fp32",
        callers: int | None = None,
        *,
        max_length: int,
    ) -> None:
        """`variant`: the bundle's, which picks the runtime (container/models.py). `callers`: the model
        threads that may call the narrowest session at once (default: one per core of the widest width, as the
        core pool grants them); a wider session gets as many as fit the same cores. `max_length`: the bundle's
        (required: a call is padded to the runtime's length_multiple, never past it, and without it not at
        all)."""
        self.graphs = _graphs(path, output, arena, graph_shapes, pad_id) if target == "gpu" and graph_shapes else None
        self.sessions: dict[int, Model]
        if self.graphs is not None:
            self.sessions = {min(widths): self.graphs.model}
        else:
            cores = callers * min(widths) if callers else max(widths)
            callers_by_width = {w: max(1, cores // w) for w in sorted(set(widths))}
            self.sessions = open_models(path, variant, target, callers_by_width, output, arena)
        first = next(iter(self.sessions.values()))
        self.input_names = first.input_names
        self.providers = first.providers
        self._unk_id = unk_id
        self._pad_id = pad_id
        # Calls are padded to the length their runtime runs best (Model.length_multiple): fewer shapes to compile
        # and keep kernels for.
        self._multiple = first.length_multiple
        self._max_length = max_length
        self._on_unknown = on_unknown
        # The sessions (by width) a call left with memory above a small request's needs since their last trim
        # (trim_above): only those trim, so a burst on the narrow session costs the wide one no run.
        self._grown: set[int] = set()

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.sessions)

    @property
    def copy_per_caller(self) -> bool:
        """Whether every thread that may call the model at once costs a copy of it (container/models.py)."""
        return any(model.copy_per_caller for model in self.sessions.values())

    @property
    def output_width(self) -> int | None:
        """The size of the output's last axis (a vector's size, for embeddings) when the graph fixes it."""
        return next(iter(self.sessions.values())).output_width

    def padded_length(self, longest: int) -> int:
        """The length a call whose longest sequence has `longest` tokens is padded to (see __init__)."""
        return padded_length(longest, self._multiple, self._max_length)

    def trim(self) -> None:
        """Give back the memory a batch grew past a small request's needs, once the worker is idle: each session
        that ran such a batch trims (ONNX Runtime: a one-token run that shrinks the CPU arena the sessions
        share; OpenVINO: each compiled copy's intermediate buffers, kept otherwise at the biggest shape it has
        run). It holds no core of the pool."""
        if self.graphs is not None:  # a graphed session's plain runs need their graph id
            return
        for width in sorted(self._grown):
            if self.sessions[width].trim():
                self._grown.discard(width)  # else busy (a call began meanwhile): the next idle spell tries again

    def run(self, batch: Sequence[Encoding], width: int = 1, pooling: str | None = None) -> list[Array]:
        """Each sequence's rows: [labels] per sequence, or [its length, dim] for token-level outputs (padding
        trimmed off). `width` picks the session (the widest not above it). `pooling`: the pooling the batch's
        requests all take; each sequence then comes back as one pooled [dim] row, pooled by the device where
        it can (CUDA graphs, container/cudagraphs.py), else here."""
        feeds = padded_feeds(
            batch, self.input_names, self._pad_id, self._unk_id, self._on_unknown, self._multiple, self._max_length
        )
        rows = split_rows(self.run_padded(feeds, width, pooling), batch)
        if pooling is not None and rows and rows[0].ndim == 2:
            # On the thread that ran the model, while its output is still in that core's caches: post-processing
            # on the event loop gets [dim] rows, and a batch's pooling leaves the loop.
            return [pool_tokens(r, pooling) for r in rows]
        return rows

    def run_padded(self, feeds: dict[str, NDArray[np.int64]], width: int = 1, pooling: str | None = None) -> Array:
        """The model's output for padded `feeds` (sequences x tokens), padding rows and columns included; with
        `pooling`, [sequences, dim] where the device pooled it (see run)."""
        width = max((w for w in self.sessions if w <= width), default=min(self.sessions))
        session = self.sessions[width]
        padded = next(iter(feeds.values())).size
        if self.graphs is not None:
            out = self.graphs.run(feeds, pooling)
        else:
            out = session.run(feeds, shrink=padded > SHRINK_ABOVE)
        if padded > session.trim_above:  # the runtime's own threshold (Model.trim_above)
            self._grown.add(width)
        return out


def padded_feeds(
    batch: Sequence[Encoding],
    input_names: Sequence[str],
    pad_id: int,
    unk_id: int | None,
    on_unknown: Callable[[int], None] | None,
    multiple: int = 1,
    max_length: int = 0,
) -> dict[str, NDArray[np.int64]]:
    """The graph's inputs for `batch`, padded as tasks.ops.pad_batch pads, with its unknown tokens counted."""
    feeds = pad_batch(batch, input_names, pad_id, multiple, max_length)
    if unk_id is not None and on_unknown is not None and "input_ids" in feeds:
        unknown = int(np.count_nonzero(feeds["input_ids"] == unk_id))
        if unknown:
            on_unknown(unknown)
    return feeds


def split_rows(out: Array, batch: Sequence[Encoding]) -> list[Array]:
    """A padded output cut into each sequence's rows (token-level outputs trimmed to the sequence's length)."""
    if len(out) != len(batch):
        raise InferenceFailed(f"the model returned {len(out)} rows for {len(batch)} sequences")
    if out.ndim > 2:
        return [out[i, : len(e)] for i, e in enumerate(batch)]
    return list(out)


def _graphs(path: Path, output: str | None, arena: bool, shapes: Sequence[Shape], pad_id: int) -> CudaGraphs | None:
    """A CUDA-graph session with every shape captured, or None (and why, in the log) where ONNX Runtime
    cannot capture this graph (a node it places on the CPU, say): the caller then makes plain sessions."""
    try:
        model = OnnxModel(path, "gpu", 1, output, arena=arena, cuda_graph=True)
        graphs = CudaGraphs(model, shapes, pad_id)
        graphs.capture()
    except Exception as exc:  # ORT's errors are untyped; the plain sessions still serve the bundle
        log.warning("CUDA graphs off for this bundle (plain GPU runs instead): %s", str(exc)[:500])
        return None
    captured = graphs.captured
    log.info("CUDA graphs captured for %d batch shapes: %s", len(captured), " ".join(f"{b}x{n}" for b, n in captured))
    return graphs
