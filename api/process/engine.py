"""The shared engine: the one process that holds a GPU bundle's session, running the model calls of every
worker (api/engine/remote.py) together.

    worker calls ──> a thread per connection ──> pending ──> the GPU thread: all pending calls that fit one
                                                              batch (max_batch_size, max_batch_tokens),
                                                              padded to the longest (to the runtime's
                                                              length multiple), one run
                                     <── the answer thread: each call of the batch pooled (where it asks)
                                         and sent, while the GPU thread runs the next batch

A call whose requests all take the same pooling of token states (embeddings) gets one pooled vector per
sequence, not its token states: 384 floats instead of 128 x 384 for a 128-token MiniLM text. Moving token
states was the engine's cost: with the model's run stood in for by a 1 ms sleep, 8 callers on 2 cores got
5,453-5,842 sequences/s of 128 x 384 token states through it and 14,945-15,910 pooled
(scripts/engine-transport.py).
With CUDA graphs the device pools them where the model left them (container/cudagraphs.py, for the poolings
container/pooling.py has graphs of) when every call of a batch pools alike; otherwise the engine pools on
the host, the way post-processing does (tasks/ops.py pool_tokens), on the answer thread, off the GPU thread.

No waiting for a batch to fill: while one batch runs on the GPU the next gathers, so the batches grow with
the load. A call that finds nothing pending and the model free runs at once on its connection's thread,
with no hand-off to the GPU thread and back (measured on 2 cores, a tiny model, 2 clients: 2,202 req/s
through the GPU thread, 2,500 without). A queued call wakes its connection's thread once (to read it):
the answer thread, not the connection's, sends its rows, where the connection's thread waited for them
before (three wake-ups a call, each taking the GIL; with the one-frame messages of remote.py, 8 callers on 2
cores: 1.5-2.3x the calls at one 128-token sequence and a 0.2 ms run, the engine's CPU 83-102 us a call
against 188-244, scripts/engine-transport.py). Every call gets its rows or an error message; a call that
cannot be merged (bigger than the budget on its own) runs alone.

`gunicorn_conf` starts it (python -m api.process.engine) before the workers, from the same HARE_*
environment, and stops it after them by closing its stdin, which the engine reads to its end: it also ends
when the master and its workers are gone (killed, say), never outliving them with the GPU. SIGTERM and SIGINT
are the server's: systemd (KillMode=control-group) and a terminal's Ctrl-C send them to every process of the
server at once, and an engine that stopped then failed the requests its workers were draining; it lets the
master stop it after them. It listens on HARE_ENGINE_SOCKET. Its model calls are counted in the
workers' metrics folder (PROMETHEUS_MULTIPROC_DIR, inherited), so any worker's /metrics shows how well the
workers' calls batch: hare_engine_batch_size (sequences per model call) and hare_engine_batch_calls (worker
calls merged into one).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from api.config import Settings
from api.engine.backend import Backend
from api.engine.lengthqueue import common_pooling
from api.engine.opened import open_bundle
from api.engine.remote import receive, send
from api.web.metrics import SIZES
from container.bundle import MODEL_FILE
from tasks.ops import pool_tokens

log = logging.getLogger("hare.engine")


@dataclass(slots=True)
class Call:
    """One worker's model call: its padded feeds, and once run, its rows or the error."""

    feeds: dict[str, NDArray[np.int64]]
    pooling: str | None = None  # pool each sequence's token states (a pooling of tasks/ops.py) before answering
    lengths: tuple[int, ...] = ()  # each sequence's tokens (with pooling)
    caller: socket.socket | None = None  # the worker's connection, where the answer goes
    rows: NDArray[np.float32] | None = None
    error: str | None = None

    @property
    def shape(self) -> tuple[int, int]:
        n, length = next(iter(self.feeds.values())).shape
        return int(n), int(length)


def merge(calls: list[Call], pad_id: int, length: int = 0) -> dict[str, NDArray[np.int64]]:
    """The calls' feeds stacked into one batch, padded to `length` or the longest, whichever is more (pad id
    for input ids, 0 elsewhere)."""
    longest = max(length, *(c.shape[1] for c in calls))
    total = sum(c.shape[0] for c in calls)
    merged = {}
    for name in calls[0].feeds:
        out = np.full((total, longest), pad_id if name == "input_ids" else 0, dtype=np.int64)
        row = 0
        for c in calls:
            n, length = c.shape
            out[row : row + n, :length] = c.feeds[name]
            row += n
        merged[name] = out
    return merged


def take(pending: queue.Queue[Call], first: Call, max_size: int, max_tokens: int) -> tuple[list[Call], Call | None]:
    """`first` and the pending calls after it that fit one batch with it; the first that does not fit is
    returned apart, to lead the next batch."""
    calls = [first]
    size, longest = first.shape
    while True:
        try:
            call = pending.get_nowait()
        except queue.Empty:
            return calls, None
        n, length = call.shape
        if size + n > max_size or (size + n) * max(longest, length) > max_tokens:
            return calls, call
        calls.append(call)
        size, longest = size + n, max(longest, length)


def answer(call: Call) -> NDArray[np.float32]:
    """A run call's rows as they go back: token states pooled where it asks, [sequences, dim]."""
    rows = call.rows
    assert rows is not None
    if call.pooling is not None and rows.ndim == 3:
        return np.stack([pool_tokens(r[:n], call.pooling) for r, n in zip(rows, call.lengths, strict=True)])
    return np.ascontiguousarray(rows, dtype=np.float32)


class Engine:
    def __init__(
        self,
        backend: Backend,
        pad_id: int,
        max_size: int,
        max_tokens: int,
        registry: CollectorRegistry,
    ) -> None:
        """`registry`: where the batch histograms go (the process's default REGISTRY writes them, in
        multiprocess mode, to files in the workers' metrics folder)."""
        self.backend = backend
        self.pad_id = pad_id
        self.max_size = max_size
        self.max_tokens = max_tokens
        self.pending: queue.Queue[Call] = queue.Queue()
        # For the answer thread: each run batch's calls, and the connections to close once their calls are answered.
        self.answered: queue.SimpleQueue[list[Call] | socket.socket] = queue.SimpleQueue()
        self.busy = threading.Lock()  # held by whichever thread runs the model
        # The GPU thread holds a call and waits for the model: a lone call arriving now queues behind it rather
        # than run at once. The lock is not fair, and a connection's thread, already running, took it first: 16
        # callers on 2 cores and a 0.3-0.5 ms run, the held call waited 1.7-3.1 ms at p99, 0.4-2.1 since.
        self.leading = False
        self.sequences = Histogram(
            "hare_engine_batch_size", "sequences per model call of the shared engine", buckets=SIZES, registry=registry
        )
        self.merged = Histogram(
            "hare_engine_batch_calls",
            "workers' model calls merged into one model call of the shared engine",
            buckets=SIZES,
            registry=registry,
        )
        self.greeting = {
            "providers": backend.providers,
            "input_names": backend.input_names,
            "output_width": backend.output_width,
        }

    def run_forever(self) -> None:
        """The GPU thread: batch after batch of whatever is pending, each batch's calls answered by the answer
        thread (pooled where asked, then sent) while the next batch runs."""
        threading.Thread(target=_answer_forever, args=(self.answered,), name="answer", daemon=True).start()
        lead: Call | None = None
        while True:
            first = lead or self.pending.get()
            self.leading = True
            with self.busy:
                self.leading = False
                calls, lead = take(self.pending, first, self.max_size, self.max_tokens)
                self.run(calls)
            self.answered.put(calls)

    def run(self, calls: list[Call]) -> None:
        self.merged.observe(len(calls))
        self.sequences.observe(sum(c.shape[0] for c in calls))
        try:
            # Padded as a worker's own Backend pads (the runtime's length multiple): a merged batch is a new
            # shape for OpenVINO to compile kernels for otherwise.
            length = self.backend.padded_length(max(c.shape[1] for c in calls))
            feeds = merge(calls, self.pad_id, length)
            out = self.backend.run_padded(feeds, pooling=common_pooling(c.pooling for c in calls))
        except Exception as exc:  # every call gets an answer, the error's message if nothing else
            log.exception("model call failed")
            for c in calls:
                c.error = str(exc) or type(exc).__name__
            return
        row = 0
        for c in calls:
            n, length = c.shape
            c.rows = out[row : row + n, :length] if out.ndim > 2 else out[row : row + n]
            row += n

    def serve_forever(self, listener: socket.socket) -> None:
        """Accept the workers' connections, each read by a thread of its own, until the listener is closed."""
        while True:
            try:
                sock = listener.accept()[0]
            except OSError:
                if listener.fileno() == -1:  # closed: the way out
                    return
                raise  # anything else stops the engine loudly; the workers then say it is gone
            threading.Thread(target=self.serve, args=(sock,), name="connection", daemon=True).start()

    def serve(self, sock: socket.socket) -> None:
        """One worker thread's connection: greet, then read its calls until it closes. A call that finds nothing
        pending, no call held by the GPU thread and the model free runs at once, here, and is answered from
        here; any other goes to the GPU thread, and this thread back to reading (the worker sends its next call
        once answered). A connection that sends what is not a call is dropped, and only it."""
        try:
            send(sock, self.greeting)
            while True:
                call = self._read(sock)
                if self.pending.empty() and not self.leading and self.busy.acquire(blocking=False):
                    try:
                        self.run([call])  # alone, at once: nothing to batch it with
                    finally:
                        self.busy.release()
                    reply(call)
                else:
                    self.pending.put(call)
        except (EOFError, ConnectionError):
            pass  # the worker closed its end (it stopped, or its thread ended)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("dropped a worker's connection: %s", exc)
        finally:
            # Closed by the answer thread, after whatever it still had to send there: closed here, its number
            # could go to the next connection while an answer to this one was on its way.
            self.answered.put(sock)

    @staticmethod
    def _read(sock: socket.socket) -> Call:
        header, arrays = receive(sock)
        feeds = dict(zip(header["inputs"], (a.astype(np.int64) for a in arrays), strict=True))
        return Call(feeds, header.get("pooling"), tuple(header.get("lengths", ())), sock)


def _answer_forever(answered: queue.SimpleQueue[list[Call] | socket.socket]) -> None:
    """The answer thread: each run batch's calls answered in turn, and each dropped connection closed."""
    while True:
        item = answered.get()
        if isinstance(item, socket.socket):
            item.close()
            continue
        for call in item:
            reply(call)


def reply(call: Call) -> None:
    """Send a run call its rows, or its error; a worker gone meanwhile has nobody to answer."""
    if call.caller is None:
        return
    try:
        if call.error is not None:
            send(call.caller, {"error": call.error})
        else:
            send(call.caller, {}, [answer(call)])
    except OSError:
        pass


def listen(path: Path) -> socket.socket:
    """A Unix socket listening at `path`, over a socket file a dead engine left there; RuntimeError if a live one
    listens there. (The gunicorn config starts the workers once the path exists; a worker that connects before
    the listen() is refused and tries again.)"""
    if path.is_socket():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(path))
            except ConnectionRefusedError:
                path.unlink()  # nobody listens: a dead engine's
            else:
                raise RuntimeError(f"another engine already listens at {path}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        listener.listen(socket.SOMAXCONN)
    except BaseException:
        listener.close()
        raise
    return listener


def _exit_when_stdin_closes() -> None:
    """End the process once every holder of the pipe's other end (the master, its workers) closed it or died."""
    while sys.stdin.buffer.read(65536):
        pass
    os._exit(0)


def main() -> None:
    for server_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(server_signal, signal.SIG_IGN)  # the server's to handle; its master stops this (see above)
    threading.Thread(target=_exit_when_stdin_closes, name="stdin", daemon=True).start()
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="[%(asctime)s] [%(process)d] [ENGINE] %(message)s")
    path = Path(os.environ["HARE_ENGINE_SOCKET"])
    opened = open_bundle(settings)
    settings, manifest = opened.settings, opened.manifest
    backend = Backend(
        settings.bundle / MODEL_FILE,
        settings.target or manifest.target,  # a GPU's, where gunicorn_conf starts it; a CPU's for the tests
        (1,),
        manifest.output,
        arena=settings.cpu_arena,
        pad_id=manifest.pad_id,
        graph_shapes=opened.graph_shapes,
        variant=manifest.variant,
        max_length=manifest.max_length,
    )
    engine = Engine(backend, manifest.pad_id, settings.max_batch_size, settings.max_batch_tokens, REGISTRY)
    threading.Thread(target=engine.run_forever, name="gpu", daemon=True).start()
    listener = listen(path)
    log.info("engine ready on %s (%s)", path, ", ".join(backend.providers))
    engine.serve_forever(listener)


if __name__ == "__main__":
    main()
