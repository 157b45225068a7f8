"""The gunicorn worker class of `hare serve`: uvicorn-worker's UvicornWorker with its own accept loop, so that
a worker whose admission refuses (api/admission.py) stops taking connections it would only refuse.

Why: a refusal is cheap for one client and ruinous for a flood. Each one costs the server an accept, a parse,
a 429 and a close (about 0.2 ms of a core, measured), and a greedy client is back 10 ms later; 1000 of them
refused about 3,200 times a second and left the model 39% of the machine. Here, while admission refuses, a
worker accepts one connection per HARE_REFUSAL_INTERVAL_MS: that client gets its prompt 429 with Retry-After,
and the others wait in the kernel's listen backlog at no cost (beyond the backlog the kernel drops their
SYNs and their own TCP stack retries later). As soon as admission opens, the worker accepts as fast as
connections come, oldest first. A worker that never refuses accepts exactly as uvicorn would.

    kernel listen backlog (one socket, every worker)
        -> accept loop (this module): open while admitted, one per interval while refusing
            -> uvicorn's protocol (httptools) -> the app (api/app.py): RefuseEarly, routes, batcher
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import time
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from api.state import Resources

log = logging.getLogger("hare")
ACCEPT_ERROR_PAUSE_S = 0.1  # after EMFILE and the like: let connections close before trying again


class PacedServer(Server):
    """uvicorn's Server, accepting through `_accept` instead of the event loop's own server."""

    def __init__(self, config: Any, app: Any) -> None:
        super().__init__(config=config)
        self._app = app
        self._accepting: list[asyncio.Task[None]] = []

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # lifespan, and no loop server: the sockets are ours
        if not self.started:
            return
        for sock in sockets or []:
            sock.setblocking(False)
            task = asyncio.create_task(self._accept(sock))
            task.add_done_callback(self._accept_stopped)
            self._accepting.append(task)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for task in self._accepting:  # stop accepting first; the connections drain in uvicorn's shutdown
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        await super().shutdown(sockets=sockets)

    def _accept_stopped(self, task: asyncio.Task[None]) -> None:
        """An accept loop that died of a bug leaves a worker that never answers again: exit, gunicorn replaces it."""
        if not task.cancelled() and task.exception() is not None:
            log.critical("the accept loop stopped: %r; this worker exits", task.exception())
            self.should_exit = True

    def _protocol(self) -> asyncio.Protocol:
        # As uvicorn's own startup builds it for loop.create_server.
        make: Any = self.config.http_protocol_class
        protocol: asyncio.Protocol = make(
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    def _pace(self) -> float:
        """Seconds between accepts: HARE_REFUSAL_INTERVAL_MS while this worker's admission refuses, else 0."""
        res = getattr(self._app.state, "hare", None)
        if not isinstance(res, Resources) or res.settings.refusal_interval_ms <= 0 or res.batcher.refusal() is None:
            return 0.0
        return res.settings.refusal_interval_ms / 1000

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        last_refused = 0.0
        while True:
            pace = self._pace()
            wait = last_refused + pace - time.monotonic()
            if pace and wait > 0:
                await asyncio.sleep(wait)
                continue  # admission may have opened meanwhile
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                await _readable(loop, sock)
                continue
            except OSError as exc:  # out of descriptors, a connection reset before accept: not fatal
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(ACCEPT_ERROR_PAUSE_S)
                continue
            if pace:
                last_refused = time.monotonic()  # this one will most likely be refused
            try:
                conn.setblocking(False)
                if conn.family != socket.AF_UNIX:
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's own servers do
                await loop.connect_accepted_socket(self._protocol, conn)
            except Exception:  # this connection is lost (its client sees a reset), not the accept loop
                log.exception("could not set up an accepted connection")
                conn.close()
            # Let this connection's request reach admission before the next accept: a backlog taken in one
            # go when admission opens would be refused all but one.
            await asyncio.sleep(0)


async def _readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Until `sock` has a connection to accept."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await ready
    finally:
        loop.remove_reader(sock.fileno())


class HareWorker(UvicornWorker):  # type: ignore[misc]  # uvicorn_worker ships no type hints
    """gunicorn's worker for hare: UvicornWorker (uvloop, httptools) with the paced accept loop above."""

    async def _serve(self) -> None:
        self.config.app = self.wsgi
        server = PacedServer(self.config, self.wsgi)
        self._install_sigquit_handler()
        await server.serve(sockets=[s.sock for s in self.sockets])
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
