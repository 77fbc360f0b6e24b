"""The native gRPC server against grpcio's client and against raw, hostile HTTP/2 bytes.

Every malformed input ends its connection (GOAWAY with the RFC's code) or its stream, and the
server goes on serving the next client.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import grpc
import grpc.aio
import hpack
import pytest

from gputally.h2 import GrpcError, Metadata, Method, Server
from gputally.h2 import hpack as encoder
from gputally.h2.frames import PREFACE, ErrorCode, Flag, Setting, Type, frame, settings, window_update
from support.hostile import Hostile

ECHO = "/test.Echo/Echo"
SLOW = "/test.Echo/Slow"
WATCH = "/test.Echo/Watch"


class Handlers:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.metadata: Metadata = ()

    async def echo(self, request: bytes, metadata: Metadata) -> bytes:
        self.metadata = metadata
        if request == b"fail":
            raise GrpcError(grpc.StatusCode.INVALID_ARGUMENT, "bad 100% ✓", (("x-why", "because"),))
        if request == b"bug":
            raise RuntimeError("a handler bug")
        return request[::-1]

    async def slow(self, request: bytes, metadata: Metadata) -> bytes:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return b"done"

    async def watch(self, request: bytes, metadata: Metadata, send) -> None:  # type: ignore[no-untyped-def]
        for i in range(int(request or b"3")):
            send(str(i).encode())
            await asyncio.sleep(0)


@pytest.fixture
def handlers() -> Handlers:
    return Handlers()


@pytest.fixture
async def server(handlers: Handlers) -> AsyncIterator[tuple[Server, int]]:
    server = Server(
        {ECHO: Method(handlers.echo), SLOW: Method(handlers.slow), WATCH: Method(handlers.watch, streaming=True)},
        max_receive_message_length=1 << 20,
    )
    port = await server.listen_tcp("127.0.0.1", 0)
    yield server, port
    await server.shutdown(0.5)


async def call(port: int, path: str, body: bytes, **kwargs) -> bytes:  # type: ignore[no-untyped-def]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        return await channel.unary_unary(path)(body, timeout=5, **kwargs)


async def test_grpcio_client_calls(server: tuple[Server, int], handlers: Handlers) -> None:
    _, port = server
    assert await call(port, ECHO, b"hello", metadata=(("x-tenant", "a"), ("x-raw-bin", b"\x00\xff"))) == b"olleh"
    assert ("x-tenant", "a") in handlers.metadata and ("x-raw-bin", b"\x00\xff") in handlers.metadata
    assert await call(port, ECHO, b"zip" * 1000, compression=grpc.Compression.Gzip) == (b"zip" * 1000)[::-1]
    big = bytes(range(256)) * 3000  # 768 KB: many frames, window updates both ways
    assert await call(port, ECHO, big) == big[::-1]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = channel.unary_unary(ECHO)
        answers = await asyncio.gather(*(stub(bytes([i]) * 40_000, timeout=5) for i in range(64)))
    assert answers == [bytes([i]) * 40_000 for i in range(64)]


async def test_statuses_reach_the_client(server: tuple[Server, int]) -> None:
    _, port = server
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call(port, ECHO, b"fail")
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failed.value.details() == "bad 100% ✓"
    assert ("x-why", "because") in tuple(failed.value.trailing_metadata() or ())
    with pytest.raises(grpc.aio.AioRpcError) as bug:
        await call(port, ECHO, b"bug")
    assert bug.value.code() == grpc.StatusCode.UNKNOWN
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await call(port, "/test.Echo/Nope", b"")
    assert missing.value.code() == grpc.StatusCode.UNIMPLEMENTED
    with pytest.raises(grpc.aio.AioRpcError) as large:
        await call(port, ECHO, b"\x00" * ((1 << 20) + 1))
    assert large.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    with pytest.raises(grpc.aio.AioRpcError) as bomb:
        await call(port, ECHO, b"\x00" * (8 << 20), compression=grpc.Compression.Gzip)
    assert bomb.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # inflating stops at the limit
    assert await call(port, ECHO, b"after") == b"retfa"


async def test_deadline_and_cancellation(server: tuple[Server, int], handlers: Handlers) -> None:
    _, port = server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await channel.unary_unary(SLOW)(b"", timeout=0.2)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        handlers.started.clear()
        handlers.cancelled.clear()
        pending = channel.unary_unary(SLOW)(b"")
        await asyncio.wait_for(handlers.started.wait(), 5)
        pending.cancel()  # the client's RST_STREAM
        await asyncio.wait_for(handlers.cancelled.wait(), 5)


async def test_every_call_gets_its_own_deadline(server: tuple[Server, int], handlers: Handlers) -> None:
    """One timer per connection serves every call's grpc-timeout: a call with an earlier
    deadline arriving after one with a later deadline still ends on time, a call answered in
    time is answered, and a call after the timer fired gets a fresh one."""
    _, port = server
    client = await Hostile.open(port)
    loop = asyncio.get_running_loop()
    started = loop.time()
    client.request(1, path=SLOW, extra=(("grpc-timeout", "1S"),))
    client.request(3, path=SLOW, extra=(("grpc-timeout", "100m"),))
    client.request(5, extra=(("grpc-timeout", "1S"),))
    answered: dict[int, tuple[str, float]] = {}
    while len(answered) < 3:
        kind, flags, stream, payload = await client.frame(timeout=5)
        if kind == Type.HEADERS and flags & Flag.END_STREAM:
            answered[stream] = dict(client.decoder.decode(payload))["grpc-status"], loop.time() - started
    assert answered[5][0] == "0"
    assert answered[3][0] == "4" and 0.09 <= answered[3][1] < answered[1][1]  # DEADLINE_EXCEEDED
    assert answered[1][0] == "4" and answered[1][1] >= 0.99
    assert handlers.cancelled.is_set()
    started = loop.time()
    client.request(7, path=SLOW, extra=(("grpc-timeout", "100m"),))
    assert (await client.answer(7))["grpc-status"] == "4"
    assert loop.time() - started >= 0.09
    client.close()


async def test_a_repeated_request_block_is_read_alike_every_call(server: tuple[Server, int],
                                                                  handlers: Handlers) -> None:
    """The same block bytes (here literal-only, so the server remembers them) give every call
    the same method, metadata and timeout; one that was refused is refused again."""
    server_, port = server
    client = await Hostile.open(port)
    for stream in (1, 3, 5):
        handlers.metadata = ()
        client.request(stream, b"abc", extra=(("x-tenant", "a"), ("x-raw-bin", "AP8"), ("grpc-timeout", "5S")))
        assert (await client.answer(stream))["grpc-status"] == "0"
        assert handlers.metadata == (("x-tenant", "a"), ("x-raw-bin", b"\x00\xff"))
    (connection,) = server_._connections
    assert len(connection._requests) == 1
    for stream in (7, 9):
        client.request(stream, path="/test.Echo/Nope")
        assert (await client.answer(stream))["grpc-status"] == "12"  # UNIMPLEMENTED
    client.close()


async def test_server_streaming(server: tuple[Server, int]) -> None:
    _, port = server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        replies = [reply async for reply in channel.unary_stream(WATCH)(b"4", timeout=5)]
        empty = [reply async for reply in channel.unary_stream(WATCH)(b"0", timeout=5)]
    assert replies == [b"0", b"1", b"2", b"3"]
    assert empty == []


async def test_shutdown_lets_calls_in_flight_finish_and_refuses_new_ones(server: tuple[Server, int],
                                                                         handlers: Handlers) -> None:
    srv, port = server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        pending = asyncio.ensure_future(channel.unary_unary(SLOW)(b"", timeout=5))
        await asyncio.wait_for(handlers.started.wait(), 5)
        stopping = asyncio.ensure_future(srv.shutdown(5))
        await asyncio.sleep(0.1)
        handlers.release.set()
        assert await pending == b"done"
        await stopping
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await channel.unary_unary(ECHO)(b"x", timeout=2)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_shutdown_past_the_grace_cancels_with_unavailable(server: tuple[Server, int],
                                                                 handlers: Handlers) -> None:
    srv, port = server
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        pending = asyncio.ensure_future(channel.unary_unary(SLOW)(b"", timeout=5))
        await asyncio.wait_for(handlers.started.wait(), 5)
        await srv.shutdown(0.1)
        with pytest.raises(grpc.aio.AioRpcError) as stopped:
            await pending
    assert stopped.value.code() == grpc.StatusCode.UNAVAILABLE
    assert handlers.cancelled.is_set()


# --- raw HTTP/2 ------------------------------------------------------------------------------


class Raw:
    """A hand-driven HTTP/2 client: frames out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.decoder = hpack.Decoder()

    @classmethod
    async def open(cls, port: int, *, preface: bytes = PREFACE, window: int | None = None) -> Raw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        values = {} if window is None else {Setting.INITIAL_WINDOW_SIZE: window}
        writer.write(preface + settings(values))
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frame(self) -> tuple[int, int, int, bytes]:
        """The next frame that is not SETTINGS, WINDOW_UPDATE or a PING ack."""
        while True:
            head = await asyncio.wait_for(self.reader.readexactly(9), 5)
            high, low, kind, flags, stream = struct.unpack(">BHBBI", head)
            payload = await asyncio.wait_for(self.reader.readexactly((high << 16) | low), 5)
            if kind not in (Type.SETTINGS, Type.WINDOW_UPDATE):
                return kind, flags, stream & 0x7FFFFFFF, payload

    async def goaway_code(self) -> int:
        while True:
            kind, _, _, payload = await self.frame()
            if kind == Type.GOAWAY:
                return int(struct.unpack(">I", payload[4:8])[0])

    async def closed(self) -> bool:
        try:
            rest = await asyncio.wait_for(self.reader.read(), 5)
        except ConnectionError:
            return True
        return rest == b"" or self.reader.at_eof()

    def request(self, stream: int, path: str = ECHO, body: bytes = b"hi", *, method: str = "POST",
                content_type: str = "application/grpc", end: bool = True) -> None:
        block = encoder.encode([(":method", method), (":scheme", "http"), (":path", path),
                                (":authority", "x"), ("content-type", content_type), ("te", "trailers")])
        message = b"\x00" + struct.pack(">I", len(body)) + body
        self.send(frame(Type.HEADERS, Flag.END_HEADERS, stream, block)
                  + frame(Type.DATA, Flag.END_STREAM if end else 0, stream, message))

    def headers(self, payload: bytes) -> dict[str, str]:
        return dict(self.decoder.decode(payload))


async def still_serves(port: int) -> None:
    assert await call(port, ECHO, b"ok") == b"ko"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        pytest.param(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", ErrorCode.PROTOCOL_ERROR, id="http1"),
        pytest.param(frame(Type.HEADERS, Flag.END_HEADERS, 2, b""), ErrorCode.PROTOCOL_ERROR, id="even-stream"),
        pytest.param(frame(Type.HEADERS, Flag.END_HEADERS, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR,
                     id="bad-hpack"),
        pytest.param(struct.pack(">BHBBI", 0x20, 0, Type.DATA, 0, 1), ErrorCode.FRAME_SIZE_ERROR, id="huge-frame"),
        pytest.param(frame(Type.DATA, 0, 0, b"x"), ErrorCode.PROTOCOL_ERROR, id="data-on-stream-0"),
        pytest.param(frame(Type.DATA, 0, 9, b"x"), ErrorCode.PROTOCOL_ERROR, id="data-on-idle-stream"),
        pytest.param(frame(Type.PING, 0, 0, b"short"), ErrorCode.FRAME_SIZE_ERROR, id="short-ping"),
        pytest.param(frame(Type.SETTINGS, 0, 0, b"12345"), ErrorCode.FRAME_SIZE_ERROR, id="ragged-settings"),
        pytest.param(window_update(0, 0), ErrorCode.PROTOCOL_ERROR, id="zero-window-update"),
        pytest.param(window_update(0, 2**31 - 1), ErrorCode.FLOW_CONTROL_ERROR, id="window-overflow"),
        pytest.param(frame(Type.CONTINUATION, Flag.END_HEADERS, 1, b""), ErrorCode.PROTOCOL_ERROR,
                     id="stray-continuation"),
        pytest.param(frame(Type.PUSH_PROMISE, 0, 1, b"\x00\x00\x00\x02"), ErrorCode.PROTOCOL_ERROR, id="push"),
    ],
)
async def test_a_broken_connection_gets_goaway_and_the_server_goes_on(server: tuple[Server, int], raw: bytes,
                                                                       code: ErrorCode) -> None:
    _, port = server
    if raw.startswith(b"GET"):
        client = await Raw.open(port, preface=raw)
    else:
        client = await Raw.open(port)
        client.send(raw)
    assert await client.goaway_code() == code
    assert await client.closed()
    await still_serves(port)


async def test_ping_is_acknowledged_and_bytes_may_come_one_at_a_time(server: tuple[Server, int]) -> None:
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    client = Raw(reader, writer)
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", ECHO), (":authority", "x"),
                            ("content-type", "application/grpc")])
    wire = (PREFACE + settings({}) + frame(Type.PING, 0, 0, b"12345678")
            + frame(Type.HEADERS, Flag.END_HEADERS, 1, block)
            + frame(Type.DATA, Flag.END_STREAM, 1, b"\x00\x00\x00\x00\x03abc"))
    for byte in wire:
        writer.write(bytes([byte]))
        await writer.drain()
    kind, flags, _, payload = await client.frame()
    assert (kind, flags, payload) == (Type.PING, Flag.ACK, b"12345678")
    kind, _, _, payload = await client.frame()
    assert kind == Type.HEADERS and client.headers(payload)[":status"] == "200"
    kind, _, _, payload = await client.frame()
    assert (kind, payload) == (Type.DATA, b"\x00\x00\x00\x00\x03cba")
    kind, flags, _, payload = await client.frame()
    assert kind == Type.HEADERS and flags & Flag.END_STREAM and client.headers(payload)["grpc-status"] == "0"
    writer.close()


@pytest.mark.parametrize(
    ("kwargs", "status"),
    [({"method": "GET"}, "405"), ({"content_type": "text/plain"}, "415")],
    ids=["not-post", "not-grpc"],
)
async def test_requests_that_are_not_grpc_get_an_http_status(server: tuple[Server, int], kwargs: dict[str, str],
                                                             status: str) -> None:
    _, port = server
    client = await Raw.open(port)
    client.request(1, **kwargs)
    kind, flags, stream, payload = await client.frame()
    assert (kind, stream) == (Type.HEADERS, 1) and flags & Flag.END_STREAM
    assert client.headers(payload)[":status"] == status
    client.request(3)  # the connection goes on
    kind, _, stream, payload = await client.frame()
    assert (kind, stream, client.headers(payload)[":status"]) == (Type.HEADERS, 3, "200")


async def test_the_response_waits_for_the_clients_window(server: tuple[Server, int]) -> None:
    _, port = server
    client = await Raw.open(port, window=100)
    body = bytes(range(250))
    client.request(1, body=body)
    kind, _, _, _ = await client.frame()
    assert kind == Type.HEADERS
    kind, _, _, first = await client.frame()
    assert (kind, len(first)) == (Type.DATA, 100)  # all the window allows
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(client.frame(), 0.3)
    client.send(window_update(1, 1000))
    kind, _, _, rest = await client.frame()
    assert kind == Type.DATA and first + rest == b"\x00\x00\x00\x00\xfa" + body[::-1]
    kind, flags, _, payload = await client.frame()
    assert kind == Type.HEADERS and flags & Flag.END_STREAM and client.headers(payload)["grpc-status"] == "0"


async def test_a_malformed_message_is_internal(server: tuple[Server, int]) -> None:
    _, port = server
    client = await Raw.open(port)
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", ECHO), (":authority", "x"),
                            ("content-type", "application/grpc")])
    client.send(frame(Type.HEADERS, Flag.END_HEADERS, 1, block) + frame(Type.DATA, Flag.END_STREAM, 1, b"\x00\x00"))
    kind, flags, _, payload = await client.frame()
    assert kind == Type.HEADERS and flags & Flag.END_STREAM
    assert client.headers(payload)["grpc-status"] == str(grpc.StatusCode.INTERNAL.value[0])


async def test_a_header_block_split_over_continuations(server: tuple[Server, int]) -> None:
    _, port = server
    client = await Raw.open(port)
    block = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", ECHO), (":authority", "x"),
                            ("content-type", "application/grpc"), ("x-pad", "p" * 300)])
    client.send(frame(Type.HEADERS, 0, 1, block[:10]) + frame(Type.CONTINUATION, 0, 1, block[10:200])
                + frame(Type.CONTINUATION, Flag.END_HEADERS, 1, block[200:])
                + frame(Type.DATA, Flag.END_STREAM, 1, b"\x00\x00\x00\x00\x02ab"))
    kind, _, _, payload = await client.frame()
    assert kind == Type.HEADERS and client.headers(payload)[":status"] == "200"
    kind, _, _, payload = await client.frame()
    assert payload == b"\x00\x00\x00\x00\x02ba"


async def test_headers_after_the_request_ended_reset_the_stream(server: tuple[Server, int],
                                                                handlers: Handlers) -> None:
    _, port = server
    client = await Raw.open(port)
    client.request(1, SLOW)  # ended, and held by the handler
    await asyncio.wait_for(handlers.started.wait(), 5)
    client.send(frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, encoder.encode([("x", "y")])))
    kind, _, stream, payload = await client.frame()  # half-closed (remote): STREAM_CLOSED (RFC 9113 5.1)
    assert (kind, stream, struct.unpack(">I", payload)[0]) == (Type.RST_STREAM, 1, ErrorCode.STREAM_CLOSED)
    await asyncio.wait_for(handlers.cancelled.wait(), 5)  # its call ends with the stream
    await still_serves(port)


async def test_a_connection_that_never_speaks_is_closed(server: tuple[Server, int],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from gputally.h2 import serving as module

    monkeypatch.setattr(module, "PREFACE_TIMEOUT", 0.2)
    _, port = server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 5) != b"" or reader.at_eof()  # its SETTINGS, then the close
    assert reader.at_eof()
    writer.close()
    await still_serves(port)
