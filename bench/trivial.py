"""A trivial HTTP server that answers every request at once with a fixed JSON body and hare's timing headers.

`python -m bench.trivial --port P` (loopback only). It measures the load generator's own ceiling: the
requests per second and CPU per request the bench can drive when the server costs next to nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import cast

import httptools
import uvloop

BODY = b'[{"label":"positive","score":0.9}]'
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-compute-time: 0.000010\r\n"
    b"server-timing: tokenize;dur=0.001, queue;dur=0.001, inference;dur=0.005, postprocess;dur=0.001\r\n"
    b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)
# GET /info as a hare server answers it (its task, in short), so that `hare bench run URL` takes this server for
# one: the bench's tests measure it as a stand-in for hare, which the bench refuses a server that is not.
INFO = b'{"task":"text-classification"}'
INFO_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(INFO)).encode()
    + b"\r\n\r\n"
    + INFO
)


class TrivialProtocol(asyncio.Protocol):
    """Parses each request and answers it with RESPONSE (INFO_RESPONSE at /info) when it is complete."""

    def __init__(self) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_message_complete(self) -> None:
        if self.transport is not None:
            self.transport.write(INFO_RESPONSE if self.url == b"/info" else RESPONSE)


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(TrivialProtocol, host, port, reuse_address=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve("127.0.0.1", args.port))


if __name__ == "__main__":
    main()
