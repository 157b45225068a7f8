"""The gunicorn worker class of `hare serve`: uvicorn-worker's UvicornWorker with its own accept loop, so that
a refusal costs the server as little as possible and keeps up with the clients who arrive.

- Canned refusals (HARE_REFUSE_IN_ACCEPT, api/process/refuser.py): while admission (api/engine/admission.py)
  refuses, a new connection's POST is answered a prebuilt 429 with Retry-After and Connection: close right
  from the socket (the bytes of the app's one error answer, api/web/errors.py), with no HTTP parse and no app;
  other requests, and every request once admission opens, go to uvicorn.
  Through uvicorn and the app a refusal cost about 0.2 ms of a core, too much to keep up with arrivals a few
  times past capacity: the connections it could not reach waited unseen in the listen backlog, and an
  accepted answer came 10-30 s after its client sent it.
- Paced refusals (HARE_REFUSALS_PER_ANSWER, HARE_REFUSAL_INTERVAL_MS): while admission refuses, the workers
  together accept up to 3 new connections a second for each answer a second the machine is measured to give
  (one worker at most one per interval on average: pace.py). A greedy client is back 10 ms after its 429, so
  refusing every connection at once lets a flood of them spend the cores on refusals (the server's, the clients' and the
  kernel's: about 0.7 ms of CPU each on the build machine, against 25 ms for an answer at 128 tokens);
  paced, the rest of a flood waits in the kernel's listen backlog at no cost. Open-loop arrivals up to 4x
  capacity are all refused at once; a fixed pace was either too slow for short requests (hundreds of
  answers a second) or too fast for long ones. As soon as admission opens, the worker accepts as fast as
  connections come, oldest first. A worker that never refuses accepts exactly as uvicorn would, but for:
- Balanced connections: every worker wakes for a new connection, and one that serves more connections than
  the least busy other worker (counts on the shared page of api/engine/cores.py) leaves it to that one: it
  looks every millisecond whether the connection was taken, and takes it itself after 3 ms, or 50 ms when
  the other holds no connection and nothing waits for the model (it is idle, but may be starved of CPU, or
  hung). A worker still loading its model, or draining, counts as none (it takes no connection). Keep-alive
  connections made while only one worker was up (right after a start, or while a replaced worker boots)
  would all stay on it: a worker holding 2 more than the least busy one answers one request with Connection:
  close (api/web/app.py, Rebalance), and its client reconnects to the other. Two clients of a two-worker
  server then run on two workers, each alone on its connection, which runs short calls on its event loop
  (api/engine/batching.py); on one, the p99 was 40% higher.

    kernel listen backlog (one socket, every worker)
        -> accept loop (this module): open while admitted, paced by capacity while refusing
            -> refusing: api/process/refuser.py (peek "POST ", read it, the prebuilt 429, close)
            -> otherwise: uvicorn's protocol (httptools; one write per answer, onewrite.py)
                -> the app (api/web/app.py): RefuseEarly, routes, batcher
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

from api.engine.cores import NOT_ACCEPTING
from api.engine.errors import NotReady, Overloaded
from api.process.onewrite import coalescing
from api.process.pace import Pace
from api.process.refuser import LINGER_S, Refuser, http_version, target
from api.web.errors import HeadTooLarge, raw_answer
from api.web.routes import ROUTES
from api.web.state import Resources
from tasks.errors import InputError

log = logging.getLogger("hare")
ACCEPT_ERROR_PAUSE_S = 0.1  # after EMFILE and the like: let connections close before trying again
# An accept that keeps failing is logged once in this long, with the count of the failures in between: out of
# descriptors, a worker logged 'accept failed: [Errno 24] Too many open files' 10 times a second, 596 identical
# lines from two workers in 30 s.
ACCEPT_ERROR_LOG_S = 10.0
REFUSALS_PER_YIELD = 64  # canned refusals taken from the backlog between two turns of the event loop
# A worker with more connections than another leaves a new one to it, looking every BALANCE_STEP_S whether it
# was taken: until BALANCE_IDLE_S while the other holds no connection and no worker has work for the model (the
# other, woken by the same connection, may wait for a busy CPU; at a fixed 3 ms 3 of 12 second clients of a
# 2-core test landed on the busy worker while a second test suite ran on the same cores, and two clients on one
# worker share its loop and its model stream and leave a core idle), else BALANCE_S: under load the backlog
# would wait for the crowded worker too (at 50 ms whenever the other held no connection, whatever was queued,
# 3x overload's accepted p99 rose from 1.21-1.25 s to 1.32-1.41 and its goodput fell from 0.84-0.85 of capacity
# to 0.80-0.81).
BALANCE_STEP_S = 0.001
BALANCE_S = 0.003
BALANCE_IDLE_S = 0.05
REBALANCE_AT = 2  # connections more than the least busy worker at which a client is asked to reconnect
REBALANCE_S = 0.1  # a worker looks whether to ask (and asks) at most once in this time
LOOK_TICKS = 10  # uvicorn ticks every 0.1 s: the master and slow requests are looked at once a second
# A refusing worker waiting for its next slot looks at least this often whether admission opened: slept whole, a
# long interval (HARE_REFUSAL_INTERVAL_MS=60000, or a slow model's measured capacity) left the port unaccepted
# that long after the queue had drained, and 1e300 (a valid value) for good: health probes on it timed out.
REFUSING_LOOK_S = 0.05
# At shutdown, a connection accepted whose request has not come yet gets this long for it to begin (then it is
# answered, and closed): uvicorn's shutdown closed it at once, and the request its client sent a moment later met
# a reset ('Server disconnected without sending a response'), one or two a SIGTERM under load.
FIRST_REQUEST_S = 0.5
# At shutdown, a request whose body is still coming gets this long for it, then a 503 (send it again): a client
# that had stalled mid-body held the drain for HARE_READ_TIMEOUT, a pod's whole grace period.
UPLOAD_DRAIN_S = 2.0


class PacedServer(Server):
    """uvicorn's Server, accepting through `_accept` instead of the event loop's own server."""

    def __init__(self, config: Any, app: Any, master: int | None = None) -> None:
        """`master`: the gunicorn master's pid; the worker stops (draining) once it is no longer its parent."""
        super().__init__(config=config)
        self._app = app
        self._master = master
        self._accepting: list[asyncio.Task[None]] = []
        self._connecting: set[asyncio.Task[None]] = set()  # connections being handed to uvicorn's protocol
        self._looked = 0.0  # when this worker last looked whether to ask a client to reconnect
        self._http: type[asyncio.Protocol] | None = None  # uvicorn's protocol class, coalescing its writes
        # The connections waiting for their client at the last look, and since when, monotonic: for a request,
        # uvicorn's cycle (the last one answered, or the one being read; None before the first); for an answer
        # to be taken, the bytes the client had taken (_close_slow_reads).
        self._waiting: dict[Any, tuple[Any, float]] = {}
        self._listeners: list[socket.socket] = []  # the listening sockets (startup)
        self._accept_error_logged = -ACCEPT_ERROR_LOG_S  # when a failed accept was last logged, monotonic
        self._accept_errors_unlogged = 0  # failed accepts since

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._listeners = list(sockets or [])
        await super().startup(sockets=[])  # lifespan, and no loop server: the sockets are ours
        if not self.started or self.should_exit:  # stopped while it loaded: its listeners are closed
            return
        # What exists after the lifespan's warm-up (modules, sessions, the app) lives as long as the worker:
        # frozen, it is out of the collector's sight, and a full collection walks only what requests made
        # since. Unfrozen, one took 17-20 ms over the worker's ~45,000 objects, in the middle of an answer.
        gc.collect()
        gc.freeze()
        res = self._resources()
        if res is not None:
            # Every worker sees this one's count as soon as it changes (the accept loops balance them).
            pool = res.pool
            connections = _Counted(self.server_state.connections, pool.set_connections if pool else None)
            self.server_state.connections = connections  # uvicorn's protocols add and discard themselves here
            # Alone on one connection, its short calls run on this loop (api/engine/batching.py).
            res.batcher.solo = lambda: len(connections) == 1
            res.rebalance = self._overfull
        probes = res.settings.probe_port if res is not None else None
        for sock in sockets or []:
            sock.setblocking(False)
            on_probes = probes is not None and sock.family != socket.AF_UNIX and sock.getsockname()[1] == probes
            task = asyncio.create_task(self._accept_probes(sock) if on_probes else self._accept(sock))
            task.add_done_callback(self._accept_stopped)
            self._accepting.append(task)
        if isinstance(self.server_state.connections, _Counted):
            self.server_state.connections.start()  # accepting from here on: the other workers balance with it

    def handle_exit(self, sig: int, frame: Any) -> None:
        """SIGTERM (or SIGINT) while the worker still loads its model: its copy of the listening sockets is closed
        at once. Held until the load and warm-up ended, it kept the port's listen queue open after the master had
        closed its own, and the connections the kernel queued there for nobody were reset seconds later (8
        clients' requests, a SIGTERM 0.5 s after a SIGHUP)."""
        super().handle_exit(sig, frame)
        if not self._accepting:
            for sock in self._listeners:
                sock.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if isinstance(self.server_state.connections, _Counted):
            self.server_state.connections.stop()  # the others stop leaving new connections to this one
        for task in self._accepting:  # stop accepting first; the connections drain in uvicorn's shutdown
            task.cancel()
        await asyncio.gather(*self._accepting, return_exceptions=True)
        # A hand-off is never cancelled: uvloop closes the socket of a connect_accepted_socket cancelled after
        # connection_made without telling the protocol, whose request is then answered into a closed handle
        # and whose connection uvicorn's shutdown waits for until gunicorn kills the worker.
        if self._connecting:
            await asyncio.gather(*self._connecting, return_exceptions=True)
            # A turn of the loop for them to read what their clients sent: uvicorn's shutdown closes a
            # connection that has no request under way.
            await asyncio.sleep(0)
        deadline = time.monotonic() + FIRST_REQUEST_S
        while time.monotonic() < deadline and any(_awaiting_first(c) for c in self.server_state.connections):
            await asyncio.sleep(0.01)
        cutting = asyncio.create_task(self._cut_uploads())
        try:
            await super().shutdown(sockets=sockets)
        finally:
            cutting.cancel()

    async def _cut_uploads(self) -> None:
        """UPLOAD_DRAIN_S into the drain, answer 503 the requests whose bodies are still coming, and close their
        connections: the app, waiting for the body, reads a disconnect and answers nobody."""
        await asyncio.sleep(UPLOAD_DRAIN_S)
        said = raw_answer(
            NotReady(
                "the server is shutting down and this request's body had not all come; send it again (another "
                "replica, or this one once restarted, will answer it)"
            ),
            close=True,
        )
        for protocol in list(self.server_state.connections):
            cycle = getattr(protocol, "cycle", None)
            if cycle is not None and cycle.more_body and not cycle.response_started:
                protocol.transport.write(said)
                protocol.transport.close()

    async def on_tick(self, counter: int) -> bool:
        """uvicorn's tick (every 0.1 s), and once a second whether the master is still this worker's parent. A
        master killed outright (kill -9) left its workers serving on its port with nobody to stop them
        (uvicorn's workers never look), and a server started again could not bind it; such a worker now drains
        and exits."""
        if counter % LOOK_TICKS == 0:
            if self._master is not None and os.getppid() != self._master:
                log.warning("the master (pid %d) is gone: this worker stops", self._master)
                return True
            try:
                self._close_slow_reads(time.monotonic())
            except Exception:  # uvicorn's internals moved, say: a bug here must not stop the worker's main loop
                log.exception("the look for slow requests failed")
        stop: bool = await super().on_tick(counter)
        return stop

    def _close_slow_reads(self, now: float) -> None:
        """Close the connections that have waited HARE_READ_TIMEOUT (to within a look) for a request's head
        since they opened or their last answer, or for the rest of its body since its head, or for their client
        to take any more of an answer. uvicorn has no such bound: its keep-alive timer stops at a connection's
        first byte, a request never finished is held for good, with its descriptor, and, once its head came,
        its place in admission; an answer nobody reads stays in the worker's memory. One client locked everyone
        else out with either (tiny classifier, 2 workers): 2,243 half heads at systemd's 1,024 descriptors
        (connects timed out), 600 heads whose bodies never came (every request 429); 12 unread 14 MB answers
        held 53-74 MB in each of two workers until their clients left."""
        res = self._resources()
        limit = res.settings.read_timeout if res is not None else 0.0
        if not limit:
            return
        waiting = {}
        connections: set[Any] = self.server_state.connections  # uvicorn's protocols, HTTP's (httptools') or not
        for protocol in connections:
            if not hasattr(protocol, "cycle"):
                continue  # a WebSocket handshake's, refused at once (hare serves no WebSocket route)
            transport = protocol.transport  # OneWrite (onewrite.py)
            if transport.get_write_buffer_size():
                # An answer waits for its client. Timed from its last progress, as nginx's send_timeout: a slow
                # reader that reads is never cut. Closing would wait to send it all: dropped, its buffers go.
                seen = self._waiting.get(protocol)
                sent = transport.sent()
                since = seen[1] if seen is not None and seen[0] == sent else now
                if now - since >= limit:
                    transport.drop()
                else:
                    waiting[protocol] = (sent, since)
                continue
            cycle = protocol.cycle  # uvicorn's request-response cycle: the last request's, None before one
            if cycle is None or cycle.response_complete:
                if getattr(protocol, "pipeline", None):
                    continue  # the next request, parsed, waits behind an answer
            elif not cycle.more_body or cycle.response_started:
                continue  # a request read whole (or being answered): the server's turn
            seen = self._waiting.get(protocol)
            since = seen[1] if seen is not None and seen[0] is cycle else now
            if now - since >= limit:
                transport.close()
            else:
                waiting[protocol] = (cycle, since)
        self._waiting = waiting

    def _accept_stopped(self, task: asyncio.Task[None]) -> None:
        """An accept loop that died of a bug leaves a worker that never answers again: exit, gunicorn replaces it."""
        if not task.cancelled() and task.exception() is not None:
            log.critical("the accept loop stopped: %r; this worker exits", task.exception())
            self.should_exit = True

    def _protocol(self) -> asyncio.Protocol:
        # As uvicorn's own startup builds it for loop.create_server, each answer sent in one write (onewrite.py).
        if self._http is None:
            self._http = answering_json(coalescing(self.config.http_protocol_class))
        make: Any = self._http
        protocol: asyncio.Protocol = make(
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        return protocol

    def _resources(self) -> Resources | None:
        res = getattr(self._app.state, "hare", None)
        return res if isinstance(res, Resources) else None

    def _refusal(self) -> Overloaded | None:
        """Why admission would refuse a request now (None: it admits)."""
        res = self._resources()
        return res.batcher.refusal() if res is not None else None

    def _canned(self, target: bytes) -> bytes | None:
        """The whole 429 the refuser sends to a request for `target` when admission refuses now (None: it
        admits)."""
        refusal = self._refusal()
        return None if refusal is None else raw_answer(refusal, target.decode("latin-1"))

    def _interval(self) -> float:
        """Seconds between two connections this worker accepts while refusing: its share of the refusals
        per answer times the measured capacity, and never below the configured interval."""
        res = self._resources()
        if res is None:
            return 0.0
        settings = res.settings
        floor = settings.refusal_interval_ms / 1000
        capacity = res.batcher.answers_per_second()
        if settings.refusals_per_answer <= 0 or capacity <= 0:
            return floor
        return max(floor, settings.workers / (settings.refusals_per_answer * capacity))

    def _fewest_elsewhere(self) -> int | None:
        """The connections of the least busy other worker that accepts (None: no other one does)."""
        res = self._resources()
        return res.pool.fewest_connections_elsewhere() if res is not None and res.pool is not None else None

    def _surplus(self) -> int:
        """Connections this worker holds over the least busy other worker (0 when it is alone, or not above)."""
        fewest = self._fewest_elsewhere()
        return 0 if fewest is None else len(self.server_state.connections) - fewest

    def _leave_for(self) -> float:
        """How long this worker leaves a waiting connection to another (0: it takes it): one serving fewer
        connections should take it; one serving none, while no worker has work for the model, is idle and
        takes it as soon as it runs."""
        fewest = self._fewest_elsewhere()
        if fewest is None or len(self.server_state.connections) <= fewest:
            return 0.0
        res = self._resources()
        idle = fewest == 0 and res is not None and res.pool is not None and res.pool.queued() == 0
        return BALANCE_IDLE_S if idle else BALANCE_S

    def _overfull(self) -> bool:
        """Whether this worker holds REBALANCE_AT connections more than the least busy other worker, looked at
        no more than once per REBALANCE_S (so at most one client a time asked to reconnect, the time its
        reconnection takes to show; and not a read of the shared page per request: 1-2% of a worker's samples
        at 64 connections on a tiny model)."""
        if len(self.server_state.connections) < REBALANCE_AT:  # cannot be that many over anyone: no page read
            return False
        now = time.monotonic()
        if now - self._looked < REBALANCE_S:
            return False
        self._looked = now
        return self._surplus() >= REBALANCE_AT

    def _count_refusal(self, head: bytes, conn: socket.socket) -> None:
        """One canned refusal (its request's first bytes, its connection): counted in the metrics, and a line in
        the access log as uvicorn writes one for the requests it answers (HARE_ACCESS_LOG). Without it the log
        showed 89 of the 406 429s 64 greedy clients got in 6 s, the metrics all of them."""
        path = target(head)
        res = self._resources()
        if res is not None:
            res.metrics.refused(ROUTES, path.partition(b"?")[0].decode("latin-1"))
        access = logging.getLogger("uvicorn.access")
        if access.hasHandlers() and access.isEnabledFor(logging.INFO):  # as uvicorn decides for its own lines
            try:
                host, port = conn.getpeername()[:2]
                client = f"{host}:{port}"
            except OSError:  # gone already
                client = ""
            access.info('%s - "%s %s HTTP/%s" %d', client, "POST", path.decode("latin-1"), http_version(head), 429)

    def _hand_off(self, conn: socket.socket) -> asyncio.Task[None]:
        """Give `conn` to uvicorn's protocol in a task of its own, which shutdown waits for, never cancels."""
        task = asyncio.get_running_loop().create_task(self._connect(conn))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)
        return task

    async def _connect(self, conn: socket.socket) -> None:
        """Give an accepted connection to uvicorn's protocol."""
        try:
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as asyncio's own servers do
            await asyncio.get_running_loop().connect_accepted_socket(self._protocol, conn)
        except Exception:  # this connection is lost (its client sees a reset), not the accept loop
            log.exception("could not set up an accepted connection")
            conn.close()

    def _accept_failed(self, exc: OSError) -> None:
        """Log a failed accept, once in ACCEPT_ERROR_LOG_S with the count of those since; out of descriptors,
        with what to change."""
        now = time.monotonic()
        if now < self._accept_error_logged + ACCEPT_ERROR_LOG_S:
            self._accept_errors_unlogged += 1
            return
        said = f"accept failed: {exc}"
        if exc.errno == errno.EMFILE:
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            said += (
                f" (this worker holds {len(self.server_state.connections)} connections and may open {limit} "
                "descriptors: new clients wait in the listen backlog until some close; raise the limit, e.g. "
                "systemd's LimitNOFILE or docker run --ulimit nofile=, or lower HARE_READ_TIMEOUT to close idle "
                "ones sooner)"
            )
        if self._accept_errors_unlogged:
            said += f"; {self._accept_errors_unlogged} more failed since the last such line"
        log.warning("%s", said)
        self._accept_error_logged = now
        self._accept_errors_unlogged = 0

    async def _sweep(self, refuser: Refuser) -> None:
        while True:
            await asyncio.sleep(LINGER_S / 4)
            refuser.sweep()

    async def _accept_probes(self, sock: socket.socket) -> None:
        """The probe port's accept loop (HARE_PROBE_PORT): every connection at once, to uvicorn, never paced,
        left to another worker or refused: on HARE_PORT a probe waits behind the connections before it in the
        listen backlog, which a refusing server accepts at a pace (seconds apart while a long request runs).
        The app answers this port its probe routes alone (errors.ProbesOnly)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = sock.accept()
            except BlockingIOError:
                await _readable(loop, sock)
                continue
            except OSError as exc:  # as in _accept
                self._accept_failed(exc)
                await asyncio.sleep(ACCEPT_ERROR_PAUSE_S)
                continue
            conn.setblocking(False)
            await asyncio.shield(self._hand_off(conn))

    async def _accept(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        res = self._resources()
        refuser = Refuser(self._canned, self._hand_off, self._count_refusal)
        canned = res is not None and res.settings.refuse_in_accept
        sweeper = asyncio.create_task(self._sweep(refuser)) if canned else None
        pace = Pace()
        refused_in_a_row = 0
        deferred_at: float | None = None  # when this worker began leaving the waiting connection to another
        try:
            while True:
                refusing = self._refusal() is not None
                interval = self._interval() if refusing else 0.0
                now = time.monotonic()
                wait = pace.wait(interval, now) if refusing else 0.0
                if wait:
                    await asyncio.sleep(min(wait, REFUSING_LOOK_S))
                    continue  # admission may have opened meanwhile
                leave = 0.0 if refusing else self._leave_for()
                if leave:
                    deferred_at = now if deferred_at is None else deferred_at
                    if now - deferred_at < leave:
                        await asyncio.sleep(BALANCE_STEP_S)  # a worker with fewer connections takes it meanwhile
                        if not _pending(sock):  # it did
                            deferred_at = None
                            await _readable(loop, sock)
                        continue
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    deferred_at = None
                    await _readable(loop, sock)
                    continue
                except OSError as exc:  # out of descriptors, a connection reset before accept: not fatal
                    self._accept_failed(exc)
                    await asyncio.sleep(ACCEPT_ERROR_PAUSE_S)
                    continue
                deferred_at = None
                conn.setblocking(False)
                if refusing:  # this one will most likely be refused
                    pace.took(interval, time.monotonic())
                if refusing and canned:
                    refuser.take(conn)  # its first bytes decide: a canned 429, or uvicorn
                    refused_in_a_row += 1
                    if refused_in_a_row % REFUSALS_PER_YIELD == 0:
                        await asyncio.sleep(0)  # a backlog of thousands must not stall the event loop
                    continue
                refused_in_a_row = 0
                await asyncio.shield(self._hand_off(conn))  # cancelled here, the hand-off still completes
                # Let this connection's request reach admission before the next accept: a backlog taken in
                # one go when admission opens would be refused all but one.
                await asyncio.sleep(0)
        finally:
            if sweeper is not None:
                sweeper.cancel()
            refuser.close_all()


def _awaiting_first(connection: Any) -> bool:
    """Whether uvicorn's `connection` is open and has not begun its first request (its client sends one next)."""
    transport = getattr(connection, "transport", None)
    return getattr(connection, "cycle", False) is None and transport is not None and not transport.is_closing()


class _Counted(set[Any]):
    """uvicorn's set of open connections, telling `publish` its size whenever a connection comes or goes, from
    `start()` (the worker accepts) to `stop()` (it no longer does: NOT_ACCEPTING)."""

    def __init__(self, items: set[Any], publish: Callable[[int], None] | None) -> None:
        super().__init__(items)
        self._publish = publish
        self._accepting = False

    def start(self) -> None:
        self._accepting = True
        self._tell()

    def stop(self) -> None:
        self._accepting = False
        if self._publish is not None:
            self._publish(NOT_ACCEPTING)

    def add(self, item: Any) -> None:
        super().add(item)
        self._tell()

    def discard(self, item: Any) -> None:
        super().discard(item)
        self._tell()

    def _tell(self) -> None:
        if self._accepting and self._publish is not None:
            self._publish(len(self))


# What a request the HTTP parser cannot read is answered (a broken chunk, both Content-Length and chunked, a
# Content-Length that is not a number, a method HTTP does not have, TLS sent to plain HTTP).
UNREADABLE = (
    "the request is not HTTP/1.1 this server can read: check its request line, its headers and how its body is "
    "framed (one Content-Length, or chunked)"
)


# The most a request's head (request line and headers) may take: httptools sets no bound, and grows a header
# it reads in pieces by copying it whole at each piece, so a header trickled in 16 kB writes cost a worker
# seconds of CPU and its memory (40 connections of 8 MB headers: 320 MB), all its clients waiting. nginx
# allows 32 kB (4 lines of 8 kB), Node.js 16 kB.
MAX_HEAD_BYTES = 32 << 10
HEAD_TOO_LARGE = (
    f"the request's head (its request line and headers) is over {MAX_HEAD_BYTES >> 10} kB; send long values in the body"
)


def answering_json(cls: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """`cls` (uvicorn's HTTP protocol) answering a request its parser cannot read in hare's error shape, as
    every other error: uvicorn's own answer was a plain-text "Invalid HTTP request received."; and, on
    httptools' protocol, refusing a head over MAX_HEAD_BYTES (431) before it is all read (h11's bounds one
    itself, at 16 kB)."""

    class JsonErrors(cls):  # type: ignore[valid-type,misc]  # a class known only at run time
        _refusal: bytes | None = None  # the last answer, owed once the requests read whole before it are answered

        def data_received(self, data: bytes) -> None:
            if self._refusal is None:  # else what follows a request refused is not read
                super().data_received(data)

        def send_400_response(self, msg: str) -> None:
            self._refuse(raw_answer(InputError(UNREADABLE), close=True))

        def _refuse(self, answer: bytes) -> None:
            """Send `answer` to a request the parser cannot read, and close: at once, or, when requests read
            whole before it on this connection (pipelined) are still to be answered, after them, as HTTP/1.1
            answers in order (uvicorn closed at once: their answers were lost)."""
            if self._refusal is not None:
                return  # refused already: the parser stopped, and reads nothing more
            cycle, pipeline = getattr(self, "cycle", None), getattr(self, "pipeline", None)
            broken = cycle is not None and cycle.more_body  # the parser failed in this request's body
            if pipeline and broken:
                pipeline.popleft()  # queued behind the one being answered: it never runs (the newest is first)
            # The request being answered: the one before the queue, or the newest when its body was read whole.
            owed = bool(pipeline) or (cycle is not None and not cycle.response_complete and not broken)
            if not owed:
                self.transport.write(answer)
                self.transport.close()
                return
            self._refusal = answer
            self.transport.pause_reading()

        def on_response_complete(self) -> None:
            last = not getattr(self, "pipeline", None)  # no request queued behind this answer
            super().on_response_complete()
            if self._refusal is not None and last and not self.transport.is_closing():
                self.transport.write(self._refusal)
                self.transport.close()

    answering = _bounded_head(JsonErrors) if hasattr(cls, "on_headers_complete") else JsonErrors
    answering.__name__ = answering.__qualname__ = f"JsonErrors{cls.__name__}"
    return answering


def _bounded_head(cls: type[Any]) -> type[Any]:
    """httptools' protocol `cls` answering a head over MAX_HEAD_BYTES with a 431, and closing: while it is read
    in pieces, once the pieces pass the bound; read whole, by its parsed size."""

    class BoundedHead(cls):  # type: ignore[valid-type,misc]
        _in_head = True  # reading a head: from the connection's start and each message's end to its headers' end
        _heads = 0  # heads read whole on this connection
        _head = 0  # the bytes of reads that were all head, since the last head read whole
        _too_large = False

        def data_received(self, data: bytes) -> None:
            # Only a read that began and ended in one head counts: one may also end a body, or begin the next
            # request after a whole one, and those bytes are not a head's.
            in_head, heads = self._in_head, self._heads
            super().data_received(data)
            if in_head and self._in_head and self._heads == heads and not self.transport.is_closing():
                self._head += len(data)
                if self._head > MAX_HEAD_BYTES:
                    self._refuse_head()

        def on_headers_complete(self) -> None:
            self._in_head, self._head = False, 0
            self._heads += 1
            if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > MAX_HEAD_BYTES:
                self._too_large = True
                raise HeadTooLarge(HEAD_TOO_LARGE)  # httptools stops; uvicorn answers with send_400_response
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head = True

        def send_400_response(self, msg: str) -> None:
            if self._too_large:
                self._refuse_head()
            else:
                super().send_400_response(msg)

        def _refuse_head(self) -> None:
            self._refuse(raw_answer(HeadTooLarge(HEAD_TOO_LARGE), close=True))

    return BoundedHead


def _pending(sock: socket.socket) -> bool:
    """Whether a connection waits in `sock`'s backlog (without taking it)."""
    poll = select.poll()
    poll.register(sock, select.POLLIN)
    return bool(poll.poll(0))


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
        server = PacedServer(self.config, self.wsgi, self.ppid)
        # gunicorn's quick stop (SIGINT or SIGQUIT to the master) sends its workers SIGQUIT. uvicorn_worker's
        # handler only marks the worker not alive, which nothing reads: a worker served on, new requests too,
        # until the master SIGKILLed it after the graceful timeout, cutting those in flight (and logging
        # "Perhaps out of memory?"). It now stops accepting at once and drains what it holds, as on SIGTERM.
        asyncio.get_running_loop().add_signal_handler(signal.SIGQUIT, self._quit, server)
        await server.serve(sockets=[s.sock for s in self.sockets])
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)

    def _quit(self, server: PacedServer) -> None:
        self.alive = False
        server.should_exit = True
