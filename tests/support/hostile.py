"""Hostile HTTP/2 peers for the attack suite (tests/h2/attacks): raw frames on loopback, a
peer that never reads, and the measure of what a native server holds for its connections."""

from __future__ import annotations

import asyncio
import socket
import struct

import grpc
import grpc.aio
import hpack
import pytest

from gputally.h2 import Server
from gputally.h2 import hpack as encoder
from gputally.h2.frames import PREFACE, Flag, Type, frame, settings
from gputally.h2.calls import _Budget

__all__ = ["ECHO", "Hostile", "held_bytes", "loop_lag", "request_block", "still_serves", "warned"]

ECHO = "/test.Echo/Echo"


def request_block(path: str = ECHO, *extra: tuple[str, str | bytes]) -> bytes:
    return encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
                           ("content-type", "application/grpc"), *extra])


def held_bytes(server: Server) -> int:
    """What the server holds for its peers, in bytes: unparsed input, output owed and not yet
    taken by the socket, answers waiting in streams, and request bodies buffered."""
    total = _Budget.held
    for connection in server._connections:
        total += connection.h2.held_bytes() + connection._transport_backlog()
    return total


class Hostile:
    """A raw HTTP/2 client on loopback. ``reads=False`` never reads (with a small receive buffer)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = hpack.Decoder()

    @classmethod
    async def open(cls, port: int, *, reads: bool = True, initial: dict[int, int] | None = None) -> Hostile:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if not reads:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(PREFACE + settings(initial or {}))  # type: ignore[arg-type]
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def flood(self, data: bytes, seconds: float) -> int:
        """Write ``data`` again and again for ``seconds`` (or until the server stops taking it
        or goes away); the bytes written."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        sent = 0
        try:
            while loop.time() < end and not self.writer.is_closing():
                self.writer.write(data)
                sent += len(data)
                await asyncio.wait_for(self.writer.drain(), max(end - loop.time(), 0.01))
        except (TimeoutError, ConnectionError):
            pass
        return sent

    async def frame(self, timeout: float = 5) -> tuple[int, int, int, bytes]:
        """The next frame that is not SETTINGS or WINDOW_UPDATE."""
        while True:
            head = await asyncio.wait_for(self.reader.readexactly(9), timeout)
            high, low, kind, flags, stream = struct.unpack(">BHBBI", head)
            payload = await asyncio.wait_for(self.reader.readexactly((high << 16) | low), timeout)
            if kind not in (Type.SETTINGS, Type.WINDOW_UPDATE):
                return kind, flags, stream & 0x7FFFFFFF, payload

    async def goaway(self, timeout: float = 5) -> int:
        """The code of the server's GOAWAY (frames before it are skipped)."""
        while True:
            kind, _, _, payload = await self.frame(timeout)
            if kind == Type.GOAWAY:
                return int(struct.unpack(">I", payload[4:8])[0])

    async def answer(self, stream_id: int, timeout: float = 5) -> dict[str, str]:
        """The headers ending ``stream_id`` (a trailers-only answer or the trailers)."""
        while True:
            kind, flags, stream, payload = await self.frame(timeout)
            if kind == Type.HEADERS:
                headers = dict(self.decoder.decode(payload))
                if stream == stream_id and flags & Flag.END_STREAM:
                    return headers
            elif kind in (Type.RST_STREAM, Type.GOAWAY) and stream in (stream_id, 0):
                raise AssertionError(f"stream {stream_id} got {Type(kind).name} {payload.hex()}")

    def request(self, stream_id: int, body: bytes = b"hi", *, path: str = ECHO, end: bool = True,
                extra: tuple[tuple[str, str | bytes], ...] = ()) -> None:
        message = b"\x00" + struct.pack(">I", len(body)) + body
        self.send(frame(Type.HEADERS, Flag.END_HEADERS, stream_id, request_block(path, *extra))
                  + frame(Type.DATA, Flag.END_STREAM if end else 0, stream_id, message))

    def close(self) -> None:
        self.writer.transport.abort()


async def still_serves(port: int) -> None:
    """A valid client's call is answered within a second."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert await channel.unary_unary(ECHO)(b"valid", timeout=1) == b"dilav"


def warned(caplog: pytest.LogCaptureFixture, limit: str) -> list[str]:
    """The WARNING lines naming ``limit``; none may carry a traceback.

    One record is not the server's: grpc.aio's poller, woken for a channel an earlier test
    left on its closed event loop, logs "Exception in callback PollerCompletionQueue..." from
    whichever test runs next (seen once in a full run). Everything else counts."""
    bad = [r for r in caplog.records
           if (r.exc_info or r.levelno >= 40) and "PollerCompletionQueue" not in r.getMessage()]
    assert not bad, f"a traceback or error was logged: {[r.getMessage() for r in bad]}"
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and limit in r.getMessage()]


async def loop_lag(seconds: float) -> float:
    """The longest the event loop was held, sampled every 10 ms for ``seconds``."""
    loop = asyncio.get_running_loop()
    worst = 0.0
    end = loop.time() + seconds
    while loop.time() < end:
        before = loop.time()
        await asyncio.sleep(0.01)
        worst = max(worst, loop.time() - before - 0.01)
    return worst
