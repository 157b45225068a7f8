"""A minimal HTTP/1.1 keep-alive client on asyncio protocols, parsed by httptools (llhttp).

The load generator shares two cores with the server it measures, so every microsecond it spends per request
is stolen from the server. httpx costs a few hundred microseconds of Python per request; this client writes a
prepared request in one call and lets llhttp parse the answer, keeping only the headers the bench reads.
Loopback only: it speaks plain HTTP to the host it is given and never follows redirects.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import cast

import httptools

# Lower-cased response headers the bench keeps; everything else is parsed and dropped.
WANTED = frozenset({b"x-compute-time", b"x-compute-tokens", b"server-timing", b"retry-after"})


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


class RequestTimeout(Exception):
    pass


def build_request(host: str, port: int, method: str, path: str, body: bytes = b"") -> bytes:
    """The exact bytes of one request, built once and sent many times."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: hare-bench\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, keep_body: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[Answer] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.headers: dict[bytes, bytes] = {}
        self.keep_body = keep_body
        self.body: list[bytes] = []
        self.closed = False

    @classmethod
    async def open(cls, host: str, port: int, keep_body: bool = False) -> Connection:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: cls(keep_body), host, port)
        return protocol

    # -- asyncio.Protocol -----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ConnectionError("the server closed the connection"))

    # -- httptools callbacks --------------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in WANTED:
            self.headers[name] = value

    def on_body(self, body: bytes) -> None:
        if self.keep_body:
            self.body.append(body)

    def on_message_complete(self) -> None:
        answer = Answer(self.parser.get_status_code(), self.headers, b"".join(self.body))
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
        if self.closed or self.transport is None:
            raise ConnectionError("connection is closed")
        assert self.waiter is None, "one request at a time per connection"
        self.waiter = self.loop.create_future()
        self.timer = self.loop.call_later(timeout, self._timed_out)
        self.transport.write(raw)
        return self.waiter

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


async def fetch(host: str, port: int, method: str, path: str, body: bytes = b"", timeout: float = 5.0) -> Answer:
    """One request on a fresh connection (for /ready, /info and the like)."""
    conn = await asyncio.wait_for(Connection.open(host, port, keep_body=True), timeout)
    try:
        return await conn.send(build_request(host, port, method, path, body), timeout)
    finally:
        conn.close()
