"""One send per answer: uvicorn writes a response's head and its body to the transport separately, and each
write is a send() on the socket, which on loopback also runs the receiving side's TCP work in the sender's
system call. The two writes were 45% of a worker's event-loop samples at two users on a tiny model (py-spy,
AMD EPYC, 2 cores: 34.5% the head's, 10.4% the body's).

`coalescing(cls)` is uvicorn's HTTP protocol class with its transport wrapped in `OneWrite`, which holds the
writes made in one turn of the event loop and sends them as one at the end of that turn. A handler sends the
head and then the body without waiting in between, so an answer leaves in one send, a turn later (a
callback's time, microseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import socket
import struct
import termios
from typing import Any


class OneWrite:
    """A transport whose writes within one turn of the event loop leave as one write; everything else is the
    wrapped transport's. Closing sends what is held first; aborting drops it, as the transport's own abort
    drops its buffer."""

    __slots__ = ("_held", "_loop", "_transport", "_written")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: list[bytes] = []
        self._written = 0  # bytes handed to the transport so far

    def sent(self) -> int:
        """Bytes the client's side has taken so far: handed to the transport, and in neither its buffer nor the
        kernel's (unsent or unacknowledged). The kernel's counts: as a slow client reads, its kernel takes more
        and the socket's buffer (MBs on loopback) frees at once, but the transport's shrinks only once a third
        of the socket's is free."""
        unsent = self._transport.get_write_buffer_size()
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile
                # SIOCOUTQ: what the socket holds and its peer has not acknowledged
                unsent += struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        return self._written - unsent

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held:
            self._loop.call_soon(self.flush)
        self._held.append(bytes(data))

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what is held (a no-op when nothing is, or when the connection is already closing)."""
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            data = held[0] if len(held) == 1 else b"".join(held)
            self._written += len(data)
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def drop(self) -> None:
        """Abort, and have the kernel drop what it still holds too (SO_LINGER 0): the client sees a reset at
        once, rather than the kernel's MBs of a cut answer and then its end."""
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def coalescing(cls: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """`cls` (uvicorn's HTTP protocol) with its transport wrapped in OneWrite."""

    class Coalescing(cls):  # type: ignore[valid-type,misc]  # a class known only at run time
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(OneWrite(transport))  # type: ignore[arg-type]

    Coalescing.__name__ = Coalescing.__qualname__ = f"OneWrite{cls.__name__}"
    return Coalescing
