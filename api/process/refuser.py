"""The accept loop's canned refusal (api/process/worker.py): while admission refuses, a new connection whose
request is a POST gets a prebuilt `HTTP/1.1 429` with Retry-After and Connection: close straight from the
socket, with no transport, no HTTP parse and no app. Everything else (GET /health, /metrics, a POST once
admission opened) goes on to uvicorn as usual.

Why: a refusal through uvicorn and the app costs about 0.2 ms of a core, so refusals could not keep up with
arrivals a few times past capacity, and the connections they did not reach waited unseen in the listen
backlog (a client saw 80 s). Here a refusal is a few system calls: peek, read, send, close.

One connection, refused:

    accepted -> peek (at once: paced, it waited in the backlog and its request is most often there; else
                when readable) -> "POST " and admission refuses -> read the request, send the 429 its route
                answers
             -> the request was read whole: close
             -> else (its body still on the way, or more behind it): shutdown(SHUT_WR), then when readable
                read and drop the rest until the client closes (or LINGER_S) -> close

Closing while part of the request is still unread would make the kernel answer with a reset, which can
destroy the 429 before the client reads it (hence the lingering close every HTTP server does, here only
where it is needed: it costs a shutdown, the reads after it and the event loop's watching of the socket). A
connection that sends nothing for LINGER_S is handed to uvicorn, whose own timeouts apply.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

LINGER_S = 2.0  # a refused client has this long to read its 429 and close; a silent one to send its request
REFUSED_METHOD = b"POST "  # every inference route is a POST; RefuseEarly (api/web/errors.py) refuses the same
READ_BYTES = 65536  # what one read of a refused request takes; a longer one lingers for the rest


class Refuser:
    """Connections this worker took while refusing. `refusal` gives the whole 429 to send to a request for a
    target (its path as sent) when admission refuses now (None: it admits), built by the app's one error
    answer (api/web/errors.py, `raw_answer`: OpenAI's routes answer OpenAI's shape);
    `hand_off` gives a connection to uvicorn; `refused` tells of one canned refusal, given the request's first
    bytes and its connection, still open (metrics, the access log)."""

    def __init__(
        self,
        refusal: Callable[[bytes], bytes | None],
        hand_off: Callable[[socket.socket], object],
        refused: Callable[[bytes, socket.socket], None],
    ) -> None:
        self._refusal = refusal
        self._hand_off = hand_off
        self._refused = refused
        self._loop = asyncio.get_running_loop()
        self._held: dict[int, tuple[socket.socket, float, bool]] = {}  # fd -> (socket, deadline, answered)

    def __len__(self) -> int:
        return len(self._held)

    def take(self, conn: socket.socket) -> None:
        """Decide `conn` (non-blocking, just accepted) by its first bytes, now if they are there, else when
        they come."""
        if not self._first(conn):
            fd = conn.fileno()
            self._held[fd] = (conn, time.monotonic() + LINGER_S, False)
            self._loop.add_reader(fd, self._first, conn)

    def _first(self, conn: socket.socket) -> bool:
        """Refuse `conn`, or give it to uvicorn, or close it; False while it has sent nothing yet."""
        try:
            head = conn.recv(READ_BYTES, socket.MSG_PEEK)
        except BlockingIOError:
            return False
        except OSError:
            self._close(conn)
            return True
        if not head:  # the client left before sending anything
            self._close(conn)
            return True
        path = target(head)
        refusal = self._refusal(path) if head.startswith(REFUSED_METHOD) else None
        if refusal is None:  # another method, a request split before its 5th byte, or admission opened
            self._give(conn)
            return True
        try:
            whole = whole_request(conn.recv(READ_BYTES))
            conn.send(refusal)  # a few hundred bytes into an empty send buffer: never partial
            if not whole:
                conn.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone
            self._close(conn)
            return True
        self._refused(head, conn)
        if whole:
            self._close(conn)
            return True
        fd = conn.fileno()
        if fd in self._held:
            self._loop.remove_reader(fd)
        self._held[fd] = (conn, time.monotonic() + LINGER_S, True)
        self._loop.add_reader(fd, self._drain, conn)
        return True

    def _drain(self, conn: socket.socket) -> None:
        try:
            while conn.recv(READ_BYTES):
                pass
        except BlockingIOError:
            return
        except OSError:
            pass
        self._close(conn)  # the client closed (or reset): done

    def sweep(self) -> None:
        """Close refused connections past their linger; hand silent ones to uvicorn."""
        now = time.monotonic()
        for conn, _, answered in [v for v in self._held.values() if v[1] <= now]:
            if answered:
                self._close(conn)
            else:
                self._give(conn)

    def close_all(self) -> None:
        for conn, _, _ in list(self._held.values()):
            self._close(conn)

    def _release(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        if self._held.pop(fd, None) is not None:
            self._loop.remove_reader(fd)

    def _give(self, conn: socket.socket) -> None:
        self._release(conn)
        self._hand_off(conn)

    def _close(self, conn: socket.socket) -> None:
        self._release(conn)
        conn.close()


def http_version(request: bytes) -> str:
    """The HTTP version a request's first line names ("1.1"; "1.1" when it has not come whole yet)."""
    parts = request.partition(b"\r\n")[0].split(b" ", 2)
    version = parts[2].decode("latin-1") if len(parts) > 2 else ""
    return version.removeprefix("HTTP/") if version.startswith("HTTP/") else "1.1"


def target(request: bytes) -> bytes:
    """The target of a request's first line (its path and query, as sent), or as much of it as has come."""
    parts = request.partition(b"\r\n")[0].split(b" ", 2)
    return parts[1] if len(parts) > 1 else b""


def whole_request(request: bytes) -> bool:
    """Whether `request` is one whole HTTP request and nothing more: its head, and exactly the body its
    Content-Length gives (none without one; a chunked body is never taken for whole). Closing after reading
    it leaves nothing unread for the kernel to answer with a reset."""
    head, found, body = request.partition(b"\r\n\r\n")
    if not found:
        return False
    fields = head.lower()
    if b"\r\ntransfer-encoding:" in fields:
        return False
    at = fields.find(b"\r\ncontent-length:")
    if at < 0:
        return not body
    value = fields[at + 2 :].split(b"\r\n", 1)[0].partition(b":")[2].strip()
    return value.isdigit() and len(body) == int(value)
