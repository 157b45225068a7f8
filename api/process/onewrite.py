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
from typing import Any


class OneWrite:
    """A transport whose writes within one turn of the event loop leave as one write; everything else is the
    wrapped transport's. Closing sends what is held first; aborting drops it, as the transport's own abort
    drops its buffer."""

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._loop = asyncio.get_running_loop()
        self._held: list[bytes] = []

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
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def coalescing(cls: type[asyncio.Protocol]) -> type[asyncio.Protocol]:
    """`cls` (uvicorn's HTTP protocol) with its transport wrapped in OneWrite."""

    class Coalescing(cls):  # type: ignore[valid-type,misc]  # a class known only at run time
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(OneWrite(transport))  # type: ignore[arg-type]

    Coalescing.__name__ = Coalescing.__qualname__ = f"OneWrite{cls.__name__}"
    return Coalescing
