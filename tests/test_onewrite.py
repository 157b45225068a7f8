"""One send per answer (api/process/onewrite.py): the writes of one event-loop turn reach the socket as one write,
in order; closing sends what is held first; an abort drops it. Over a real loopback connection."""

from __future__ import annotations

import asyncio
import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.process.onewrite import OneWrite, coalescing


async def _pair() -> tuple[OneWrite, asyncio.Transport, list[bytes], socket.socket]:
    left, right = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, left)
    assert isinstance(transport, asyncio.Transport)
    writes: list[bytes] = []
    real_write = transport.write

    def counted(data: bytes | bytearray | memoryview) -> None:
        writes.append(bytes(data))
        real_write(data)

    transport.write = counted  # type: ignore[method-assign]
    right.setblocking(False)
    return OneWrite(transport), transport, writes, right


async def _read(peer: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = b""
    while len(got) < n:
        got += await loop.sock_recv(peer, 4096)
    return got


def test_the_writes_of_one_turn_leave_as_one_write_in_order() -> None:
    async def scenario() -> tuple[list[bytes], bytes]:
        one, transport, writes, peer = await _pair()
        one.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        one.write(b"{}")
        assert writes == []  # held until the end of this turn
        await asyncio.sleep(0)
        received = await _read(peer, 40)
        transport.close()
        peer.close()
        return writes, received

    writes, received = asyncio.run(scenario())
    assert writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    assert received == writes[0]


def test_close_sends_what_is_held_and_abort_drops_it() -> None:
    async def scenario() -> tuple[bytes, list[bytes]]:
        one, _, _, peer = await _pair()
        one.write(b"last answer")
        one.close()  # uvicorn closes right after the body of a Connection: close answer
        received = await _read(peer, 11)
        peer.close()
        two, _, dropped, peer2 = await _pair()
        two.write(b"never sent")
        two.abort()
        await asyncio.sleep(0.01)
        peer2.close()
        return received, dropped

    received, dropped = asyncio.run(scenario())
    assert received == b"last answer"
    assert dropped == []


def test_the_served_protocol_wraps_its_transport() -> None:
    cls = coalescing(HttpToolsProtocol)
    assert issubclass(cls, HttpToolsProtocol) and cls.__name__ == "OneWriteHttpToolsProtocol"


def test_sent_counts_what_the_peer_took_even_while_the_kernel_holds_the_rest() -> None:
    """What the worker's look (api/process/worker.py) times a reader's progress by: a reader that takes a few
    hundred KB moves it at once, though the transport's buffer shrinks only once MBs of the kernel's are free;
    one that reads nothing leaves it still."""

    async def scenario() -> tuple[int, int, int, int]:
        loop = asyncio.get_running_loop()
        listener = socket.create_server(("127.0.0.1", 0))
        peer = socket.socket()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2**16)
        peer.connect(listener.getsockname())
        peer.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, listener.accept()[0])
        assert isinstance(transport, asyncio.Transport)
        one = OneWrite(transport)
        one.write(b"x" * 16 * 2**20)  # more than the kernel's buffers: the transport keeps the rest
        await asyncio.sleep(0.2)
        still = one.sent()
        await asyncio.sleep(0.2)
        before = one.sent()
        await _read(peer, 2**18)
        await asyncio.sleep(0.2)  # the window's update reaches the sender
        after = one.sent()
        buffered = transport.get_write_buffer_size()
        one.drop()
        listener.close()
        peer.close()
        return still, before, after, buffered

    still, before, after, buffered = asyncio.run(scenario())
    assert still == before < 16 * 2**20
    assert after >= before + 2**18 - 2**17  # what the peer read, less what its own buffer held before
    assert buffered > 8 * 2**20  # while the transport still held most of it
