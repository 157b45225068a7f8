"""A worker's model calls sent to the shared engine (api/process/engine.py), the one process that holds the GPU:
the same interface as Backend (api/engine/backend.py), so the batcher and warm-up cannot tell them apart.

    worker model thread ── padded ids (int32) ──> engine ── every worker's pending calls, one GPU batch
                        <── its rows (float32) ──┘

Each model thread keeps its own connection (a Unix socket), so a call is one send and one receive with no
other thread in between. A message is one frame each way (`send`, `receive`): its lengths, a JSON header naming
each array's dtype and shape, then the arrays' bytes, written with one system call and read with two, no
pickle (multiprocessing's Connection took a message per array: a call was three writes and six reads). Several
worker processes parse, tokenize and answer in parallel, while the GPU sees one context and batches as big as
all of them together make: separate sessions per worker time-slice the device between contexts instead
(measured on an H200: 4,394 req/s at best, the GPU 99% busy; docs/deployment.md).
"""

from __future__ import annotations

import math
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
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


# A frame's lengths: its JSON header's bytes, then its arrays' bytes together.
FRAME = struct.Struct("<IQ")


def send(sock: socket.socket, header: dict[str, Any], arrays: Sequence[NDArray[Any]] = ()) -> None:
    """One frame: the lengths, a JSON header naming each array's dtype and shape, then each array's bytes, handed
    to the kernel together (no copy of the arrays into one buffer). Written to the descriptor (os.writev), as
    `receive` reads it: a worker's call took 2-3x as long with the socket's own recv_into reading its answer
    (156-161 us a round trip between two processes against 65-76, AMD EPYC), and not with os.readv."""
    head = orjson.dumps(header | {"arrays": [[a.dtype.str, list(a.shape)] for a in arrays]})
    body = [np.ascontiguousarray(a).data.cast("B") for a in arrays]
    parts = [memoryview(FRAME.pack(len(head), sum(map(len, body)))), memoryview(head), *body]
    fd = sock.fileno()
    sent = os.writev(fd, parts)
    for part in parts:  # what a big frame's first write left over
        if sent >= len(part):
            sent -= len(part)
            continue
        view = part[sent:]
        while view:
            view = view[os.write(fd, view) :]
        sent = 0


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[NDArray[Any]]]:
    """A frame `send` wrote: its header, and its arrays over the frame's own (writable) memory. EOFError when
    the other end has closed."""
    fd = sock.fileno()
    head_n, body_n = FRAME.unpack(_read(fd, bytearray(FRAME.size)))
    frame = _read(fd, bytearray(head_n + body_n))
    header = orjson.loads(memoryview(frame)[:head_n])
    arrays, offset = [], head_n
    for dtype, shape in header.pop("arrays"):
        kind = np.dtype(dtype)
        count = math.prod(shape)
        arrays.append(np.frombuffer(frame, kind, count, offset).reshape(shape))
        offset += count * kind.itemsize
    return header, arrays


def _read(fd: int, buffer: bytearray) -> bytearray:
    """`buffer` filled from the descriptor."""
    view, got = memoryview(buffer), 0
    while got < len(buffer):
        n = os.readv(fd, [view[got:]])
        if n == 0:
            raise EOFError("the other end closed the connection")
        got += n
    return buffer


class Line:
    """One model thread's connection to the engine and the engine's greeting on it; closed when dropped (the
    thread ended, or the connection broke), as the thread-local that holds it goes."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(str(path))
            self.greeting = receive(self.sock)[0]
        except BaseException:
            self.sock.close()
            raise

    def __del__(self) -> None:
        self.sock.close()


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
        greeting = self._line().greeting
        self.providers: list[str] = greeting["providers"]
        self.input_names: list[str] = greeting["input_names"]
        self.output_width: int | None = greeting["output_width"]
        self.widths = (1,)
        self.copy_per_caller = False  # the engine's own streams run the calls

    def _line(self) -> Line:
        """This thread's connection, made (with retries while the engine starts) on first use."""
        line: Line | None = getattr(self._local, "line", None)
        if line is not None:
            return line
        deadline = time.monotonic() + CONNECT_SECONDS
        while True:
            try:
                line = Line(self._socket)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                if time.monotonic() > deadline:
                    raise InferenceFailed(f"the model engine at {self._socket} does not answer") from None
                time.sleep(0.1)
        self._local.line = line
        return line

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
            sock = self._line().sock
            send(sock, header, [feeds[n].astype(np.int32) for n in names])
            header, arrays = receive(sock)
        except (OSError, EOFError) as exc:
            self._local.line = None  # the next call connects afresh
            raise InferenceFailed(f"the model engine is gone ({type(exc).__name__}: {exc})") from exc
        if "error" in header:
            raise InferenceFailed(header["error"])
        return arrays[0]
