"""A worker's model calls sent to the shared engine (api/process/engine.py), the one process that holds the GPU:
the same interface as Backend (api/engine/backend.py), so the batcher and warm-up cannot tell them apart.

    worker model thread ── padded ids (int32) ──> engine ── every worker's pending calls, one GPU batch
                        <── its rows (float32) ──┘

Each model thread keeps its own connection (a Unix socket, multiprocessing.connection's framing: no pickle,
raw bytes), so a call is one send and one receive with no other thread in between. Several worker processes
parse, tokenize and answer in parallel, while the GPU sees one context and batches as big as all of them
together make: separate sessions per worker time-slice the device between contexts instead (measured on
an H200: 4,394 req/s at best, the GPU 99% busy; docs/gpu.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from numpy.typing import NDArray
from tokenizers import Encoding

from api.engine.backend import Array, padded_feeds, split_rows
from container.runtime import InferenceFailed

# The gunicorn config starts the workers once the engine listens: a refused connection is an engine that
# died, and a worker starting then fails its boot, which stops the server, rather than waiting.
CONNECT_SECONDS = 5.0


def send(connection: Connection, header: dict[str, Any], arrays: Sequence[NDArray[Any]] = ()) -> None:
    """One message: a JSON header naming each array's dtype and shape, then each array's bytes."""
    specs = [[a.dtype.str, list(a.shape)] for a in arrays]
    connection.send_bytes(orjson.dumps(header | {"arrays": specs}))
    for a in arrays:
        connection.send_bytes(np.ascontiguousarray(a).data.cast("B"))


def receive(connection: Connection) -> tuple[dict[str, Any], list[NDArray[Any]]]:
    """A message `send` wrote: its header, and its arrays received straight into their own (writable) memory."""
    header = orjson.loads(connection.recv_bytes())
    arrays = []
    for dtype, shape in header.pop("arrays"):
        array = np.empty(shape, dtype=np.dtype(dtype))
        connection.recv_bytes_into(array.data.cast("B"))
        arrays.append(array)
    return header, arrays


class RemoteBackend:
    """Backend's interface over the engine at `socket`: what the engine's session is (providers, inputs,
    output width) comes in its greeting."""

    def __init__(
        self,
        socket: Path,
        pad_id: int = 0,
        unk_id: int | None = None,
        on_unknown: Callable[[int], None] | None = None,
    ) -> None:
        self._socket = socket
        self._pad_id = pad_id
        self._unk_id = unk_id
        self._on_unknown = on_unknown
        self._local = threading.local()
        greeting = self._connection()[1]
        self.providers: list[str] = greeting["providers"]
        self.input_names: list[str] = greeting["input_names"]
        self.output_width: int | None = greeting["output_width"]
        self.widths = (1,)

    def _connection(self) -> tuple[Connection, dict[str, Any]]:
        """This thread's connection and the engine's greeting on it, connecting (with retries while the
        engine starts) on first use."""
        held = getattr(self._local, "held", None)
        if held is not None:
            return held  # type: ignore[no-any-return]
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            try:
                connection = Client(str(self._socket), family="AF_UNIX")
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise InferenceFailed(f"the model engine at {self._socket} does not answer") from None
                time.sleep(0.1)
        held = (connection, receive(connection)[0])
        self._local.held = held
        return held

    def trim(self) -> None:
        """Nothing to give back here: the engine's process holds the model's memory."""

    def run(self, batch: Sequence[Encoding], width: int = 1, pooling: str | None = None) -> list[Array]:
        """As Backend.run; with `pooling`, a token-level output comes back pooled by the engine: one vector per
        sequence, [dim], which post-processing takes as pooled (tasks/feature_extraction.py)."""
        feeds = padded_feeds(batch, self.input_names, self._pad_id, self._unk_id, self._on_unknown)
        return split_rows(self.run_padded(feeds, pooling=pooling, lengths=[len(e) for e in batch]), batch)

    def run_padded(
        self,
        feeds: dict[str, NDArray[np.int64]],
        width: int = 1,
        pooling: str | None = None,
        lengths: Sequence[int] = (),
    ) -> Array:
        """The padded output, or with `pooling` and each sequence's `lengths` a token-level output pooled."""
        # ids fit in int32 (vocabularies are far smaller), which halves what crosses the socket.
        names = list(feeds)
        header: dict[str, Any] = {"inputs": names}
        if pooling is not None:
            header |= {"pooling": pooling, "lengths": [int(n) for n in lengths]}
        try:
            connection = self._connection()[0]
            send(connection, header, [feeds[n].astype(np.int32) for n in names])
            header, arrays = receive(connection)
        except (OSError, EOFError) as exc:
            self._local.held = None  # the next call connects afresh
            raise InferenceFailed(f"the model engine is gone ({type(exc).__name__}: {exc})") from exc
        if "error" in header:
            raise InferenceFailed(header["error"])
        return arrays[0]
