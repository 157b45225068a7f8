"""A minimal HTTP/1.1 keep-alive client on a non-blocking socket, parsed by httptools (llhttp).

The load generator shares two cores with the server it measures, so every microsecond it spends per request
is stolen from the server. httpx costs a few hundred microseconds of Python per request; this client writes a
prepared request in one call and lets llhttp parse the answer, keeping only the headers the bench reads.
Loopback only: it speaks plain HTTP to the host it is given and never follows redirects.

When an answer arrived: the kernel stamps every segment with its arrival at the socket (SO_TIMESTAMPNS, on
Linux), and `Answer.wire` is the time from the request's write to that stamp on the answer's last bytes, both
on the wall clock the stamps use. The load generator reads them only once it gets a core, and on a machine
it shares with the server both cores are often busy with model calls: at 8 tokens and two users, 1% of the
answers were read about 1 ms after they arrived, which alone moved p99/p50 from about 1.17 to 1.5. That wait
is the load generator's, not the server's; a client on another machine would not have it. Where the kernel
gives no stamp, `wire` ends when the bytes were read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import sys
import time
from dataclasses import dataclass

import httptools

# Lower-cased response headers the bench keeps; everything else is parsed and dropped.
WANTED = frozenset({b"x-compute-time", b"x-compute-tokens", b"server-timing", b"retry-after"})
READ_SIZE = 256 * 1024
# SO_TIMESTAMPNS (Linux; Python's socket module does not name it): a struct timespec of CLOCK_REALTIME per read.
TIMESTAMPNS = 35 if sys.platform == "linux" else None
STAMP = struct.Struct("qq")
ANCILLARY_SIZE = socket.CMSG_SPACE(STAMP.size)


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    wire: float = 0.0  # seconds from the request's write to its answer's last bytes reaching the socket


class RequestTimeout(Exception):
    pass


def build_request(host: str, port: int, method: str, path: str, body: bytes = b"", token: str | None = None) -> bytes:
    """The exact bytes of one request, built once and sent many times (`token`: sent as a bearer token)."""
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: hare-bench\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


async def _address(host: str, port: int) -> tuple[socket.AddressFamily, tuple[str, int]]:
    try:
        ip = ipaddress.ip_address(host)  # the common case, without a resolver call per connection
        return (socket.AF_INET6 if ip.version == 6 else socket.AF_INET), (host, port)
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        return family, (str(address[0]), int(address[1]))


class Connection:
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, sock: socket.socket, keep_body: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.sock = sock
        self.fd = sock.fileno()
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Answer] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.headers: dict[bytes, bytes] = {}
        self.keep_body = keep_body
        self.body: list[bytes] = []
        self.unsent = b""  # the rest of a request the socket's buffer did not take at once
        self.sent = 0.0  # time.time() of the request's write
        self.arrived = 0.0  # time.time() when the bytes read last reached the socket
        self.closed = False
        self.loop.add_reader(self.fd, self._readable)

    @classmethod
    async def open(cls, host: str, port: int, keep_body: bool = False) -> Connection:
        family, address = await _address(host, port)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if TIMESTAMPNS is not None:
                sock.setsockopt(socket.SOL_SOCKET, TIMESTAMPNS, 1)
            await asyncio.get_running_loop().sock_connect(sock, address)
        except BaseException:
            sock.close()
            raise
        return cls(sock, keep_body)

    # -- the socket -------------------------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(READ_SIZE, ANCILLARY_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lost(exc)
            return
        if not data:
            self._lost(None)
            return
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == TIMESTAMPNS and len(payload) >= STAMP.size:
                seconds, nanoseconds = STAMP.unpack_from(payload)
                self.arrived = seconds + nanoseconds * 1e-9
                break
        else:
            self.arrived = time.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))
            self.close()

    def _writable(self) -> None:
        self.loop.remove_writer(self.fd)
        self._write(b"")

    def _write(self, data: bytes) -> None:
        data, self.unsent = self.unsent + data, b""
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lost(exc)
            return
        if sent < len(data):  # rare: the rest goes when the socket can take it
            self.unsent = data[sent:]
            self.loop.add_writer(self.fd, self._writable)

    def _lost(self, exc: Exception | None) -> None:
        self.close()
        self._fail(ConnectionError(f"the server closed the connection{f': {exc}' if exc else ''}"))

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in WANTED:
            self.headers[name] = value

    def on_body(self, body: bytes) -> None:
        if self.keep_body:
            self.body.append(body)

    def on_message_complete(self) -> None:
        wire = max(0.0, self.arrived - self.sent)
        answer = Answer(self.parser.get_status_code(), self.headers, b"".join(self.body), wire)
        self.headers, self.body = {}, []
        if not self.parser.should_keep_alive():
            self.close()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    # -- use --------------------------------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _timed_out(self) -> None:
        self.timer = None
        self._fail(RequestTimeout())
        self.close()  # a late answer would be read as the next request's

    def send(self, raw: bytes, timeout: float) -> asyncio.Future[Answer]:
        """Write a prepared request; the future completes with the answer, ConnectionError or RequestTimeout."""
        if self.closed:
            raise ConnectionError("connection is closed")
        assert self.waiter is None, "one request at a time per connection"
        waiter = self.waiter = self.loop.create_future()
        self.timer = self.loop.call_later(timeout, self._timed_out)
        self.sent = time.time()
        self._write(raw)
        return waiter

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()


async def fetch(
    host: str, port: int, method: str, path: str, body: bytes = b"", timeout: float = 5.0, token: str | None = None
) -> Answer:
    """One request on a fresh connection (for /ready, /info and the like)."""
    conn = await asyncio.wait_for(Connection.open(host, port, keep_body=True), timeout)
    try:
        return await conn.send(build_request(host, port, method, path, body, token), timeout)
    finally:
        conn.close()
