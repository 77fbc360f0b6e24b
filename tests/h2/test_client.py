"""The native gRPC client channel against grpcio's server and against scripted HTTP/2 peers:
statuses, deadlines, flow control, GOAWAY, lost connections and the reconnect backoff."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable

import grpc
import grpc.aio
import hpack
import pytest

from gputally.h2 import Channel, GrpcError, parse_target
from gputally.h2 import hpack as encoder
from gputally.h2.client import Target
from gputally.h2.frames import PREFACE, ErrorCode, Flag, Setting, Type, frame, goaway, rst_stream, settings
from harness.processes import unused_port

SERVICE, METHOD = "test.Echo", "Echo"
PATH = f"/{SERVICE}/{METHOD}"


@pytest.fixture
async def grpcio_server() -> AsyncIterator[tuple[int, list[tuple[bytes, dict[str, str | bytes]]]]]:
    seen: list[tuple[bytes, dict[str, str | bytes]]] = []

    async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        seen.append((request, dict(context.invocation_metadata() or ())))
        if request == b"throttle":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down ✓")
        if request == b"sleep":
            await asyncio.sleep(5)
        return request[::-1]

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(echo)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield port, seen
    await server.stop(0)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("127.0.0.1:4317", Target("127.0.0.1", 4317)),
        ("dns:///collector.example:4317", Target("collector.example", 4317)),
        ("[::1]:4317", Target("::1", 4317)),
        ("collector", Target("collector", 443)),
        ("unix:///run/otlp.sock", Target(path="/run/otlp.sock")),
        ("unix:relative.sock", Target(path="relative.sock")),
    ],
)
def test_targets(target: str, expected: Target) -> None:
    assert parse_target(target) == expected


@pytest.mark.parametrize("target", ["", ":4317", "host:port", "host:70000", "unix:"])
def test_malformed_targets(target: str) -> None:
    with pytest.raises(ValueError):
        parse_target(target)


async def test_calls_to_grpcio(grpcio_server: tuple[int, list[tuple[bytes, dict[str, str | bytes]]]]) -> None:
    port, seen = grpcio_server
    channel = Channel(f"127.0.0.1:{port}")
    try:
        assert await channel.unary(PATH, b"abc", timeout=5, metadata=(("x-tenant", "a"), ("x-key-bin", b"\x01\x02"))) \
            == b"cba"
        assert seen[-1][1]["x-tenant"] == "a" and seen[-1][1]["x-key-bin"] == b"\x01\x02"
        assert await channel.unary(PATH, b"gz" * 5000, timeout=5, compress=True) == (b"gz" * 5000)[::-1]
        big = bytes(range(256)) * 12_000  # 3 MB: far beyond grpcio's first windows
        assert await channel.unary(PATH, big, timeout=10) == big[::-1]
        many = await asyncio.gather(*(channel.unary(PATH, bytes([i]) * 50_000, timeout=10) for i in range(40)))
        assert many == [bytes([i]) * 50_000 for i in range(40)]
        with pytest.raises(GrpcError) as throttled:
            await channel.unary(PATH, b"throttle", timeout=5)
        assert (throttled.value.code, throttled.value.details) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "slow down ✓")
        with pytest.raises(GrpcError) as late:
            await channel.unary(PATH, b"sleep", timeout=0.2)
        assert late.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        with pytest.raises(GrpcError) as missing:
            await channel.unary("/test.Echo/Nope", b"", timeout=5)
        assert missing.value.code == grpc.StatusCode.UNIMPLEMENTED
        assert await channel.unary(PATH, b"again", timeout=5) == b"niaga"
    finally:
        await channel.close()


async def test_an_unreachable_backend_fails_fast_then_backs_off() -> None:
    port = unused_port()
    channel = Channel(f"127.0.0.1:{port}", initial_backoff=0.3, max_backoff=1.0)
    try:
        with pytest.raises(GrpcError) as down:
            await channel.unary(PATH, b"x", timeout=5)
        assert down.value.code == grpc.StatusCode.UNAVAILABLE and "failed to connect" in down.value.details
        attempts: list[int] = []

        async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            attempts.append(1)
            writer.close()

        listener = await asyncio.start_server(count, "127.0.0.1", port, reuse_port=True)  # beside the hold
        with pytest.raises(GrpcError):  # inside the backoff: no new attempt
            await channel.unary(PATH, b"x", timeout=5)
        assert attempts == []
        listener.close()
    finally:
        await channel.close()


async def test_wait_for_ready_waits_for_the_backend(grpcio_server: tuple[int, list[object]]) -> None:
    port = unused_port()
    channel = Channel(f"127.0.0.1:{port}", initial_backoff=0.1, max_backoff=0.2)
    server = grpc.aio.server()
    try:
        with pytest.raises(GrpcError):
            await channel.unary(PATH, b"x", timeout=5)
        waiting = asyncio.ensure_future(channel.unary(PATH, b"late", timeout=10, wait_for_ready=True))
        await asyncio.sleep(0.5)
        assert not waiting.done()

        async def echo(request: bytes, context: object) -> bytes:
            return request[::-1]

        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(echo)})])
        server.add_insecure_port(f"127.0.0.1:{port}")  # grpcio sets SO_REUSEPORT: beside the hold
        await server.start()
        assert await waiting == b"etal"
    finally:
        await channel.close()
        await server.stop(0)


# --- scripted peers -------------------------------------------------------------------------

Script = Callable[["Peer", int, list[tuple[str, str]]], None]


class Peer(asyncio.Protocol):
    """An HTTP/2 server driven by a test: it hands each request's stream to ``script``."""

    def __init__(self, script: Script, server_settings: dict[Setting, int]) -> None:
        self.script = script
        self.settings = server_settings
        self.buffer = b""
        self.decoder = hpack.Decoder()
        self.transport: asyncio.Transport | None = None
        self.data: dict[int, bytes] = {}
        self.frames: list[tuple[int, int, int]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(settings(self.settings))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.buffer.startswith(PREFACE):
            self.buffer = self.buffer[len(PREFACE):]
        while len(self.buffer) >= 9:
            high, low, kind, flags, stream = struct.unpack(">BHBBI", self.buffer[:9])
            length = (high << 16) | low
            if len(self.buffer) < 9 + length:
                return
            payload, self.buffer = self.buffer[9 : 9 + length], self.buffer[9 + length :]
            self.frames.append((kind, stream, length))
            if kind == Type.HEADERS:
                self.script(self, stream, self.decoder.decode(payload))
            elif kind == Type.DATA:
                self.data[stream] = self.data.get(stream, b"") + payload

    def answer(self, stream: int, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            frame(Type.HEADERS, Flag.END_HEADERS, stream, encoder.encode([(":status", "200"),
                                                                          ("content-type", "application/grpc")]))
            + frame(Type.DATA, 0, stream, b"\x00" + struct.pack(">I", len(body)) + body)
            + frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, stream, encoder.encode([("grpc-status", "0")])))

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


async def scripted(script: Script, server_settings: dict[Setting, int] | None = None) -> tuple[asyncio.Server, int,
                                                                                              list[Peer]]:
    peers: list[Peer] = []

    def make() -> Peer:
        peers.append(Peer(script, server_settings or {}))
        return peers[-1]

    server = await asyncio.get_running_loop().create_server(make, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], peers


async def test_goaway_sends_new_calls_to_a_new_connection() -> None:
    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        if peer is peers[0]:
            peer.answer(stream, b"first")
            peer.write(goaway(1, ErrorCode.NO_ERROR))
        else:
            peer.answer(stream, b"later")

    server, port, peers = await scripted(script)
    channel = Channel(f"127.0.0.1:{port}")
    try:
        assert await channel.unary(PATH, b"a", timeout=5) == b"first"
        await asyncio.sleep(0.05)
        assert await channel.unary(PATH, b"b", timeout=5) == b"later"
        assert len(peers) == 2
    finally:
        await channel.close()
        server.close()


async def test_every_call_ends_by_its_own_deadline() -> None:
    """One deadline timer per connection: a call with an earlier deadline started after one
    with a later deadline ends first, each ends DEADLINE_EXCEEDED with its stream cancelled, a
    call answered in time is answered, and a call after the timer fired gets a fresh one."""
    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        if stream == 5:
            peer.answer(stream, b"in time")

    server, port, peers = await scripted(script)
    channel = Channel(f"127.0.0.1:{port}")
    loop = asyncio.get_running_loop()
    ended: dict[str, float] = {}

    async def call(name: str, timeout: float) -> bytes:
        try:
            return await channel.unary(PATH, name.encode(), timeout=timeout)
        finally:
            ended[name] = loop.time() - started

    try:
        await channel.connect()
        started = loop.time()
        slow = asyncio.ensure_future(call("slow", 1.0))
        await asyncio.sleep(0)
        quick = asyncio.ensure_future(call("quick", 0.1))
        await asyncio.sleep(0)
        assert await call("answered", 1.0) == b"in time"
        for late in (quick, slow):
            with pytest.raises(GrpcError) as exceeded:
                await late
            assert exceeded.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 0.09 <= ended["quick"] < ended["slow"] and ended["slow"] >= 0.99
        await asyncio.sleep(0.05)
        resets = [stream for kind, stream, _ in peers[0].frames if kind == Type.RST_STREAM]
        assert resets == [3, 1]  # CANCEL, in the order the deadlines passed
        started = loop.time()
        with pytest.raises(GrpcError) as again:
            await call("again", 0.1)
        assert again.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and ended["again"] >= 0.09
    finally:
        await channel.close()
        server.close()


async def test_calls_the_server_never_started_are_unavailable() -> None:
    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        if stream == 3:
            peer.write(goaway(1, ErrorCode.NO_ERROR))  # stream 3 is above: never handled

    server, port, _ = await scripted(script)
    channel = Channel(f"127.0.0.1:{port}")
    try:
        first = asyncio.ensure_future(channel.unary(PATH, b"a", timeout=1))
        await asyncio.sleep(0.05)
        with pytest.raises(GrpcError) as refused:
            await channel.unary(PATH, b"b", timeout=5)
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(GrpcError):
            await first  # stream 1 was accepted but never answered: its deadline
    finally:
        await channel.close()
        server.close()


@pytest.mark.parametrize(
    ("code", "status"),
    [(ErrorCode.REFUSED_STREAM, grpc.StatusCode.UNAVAILABLE), (ErrorCode.CANCEL, grpc.StatusCode.CANCELLED),
     (ErrorCode.INTERNAL_ERROR, grpc.StatusCode.INTERNAL)],
)
async def test_a_reset_stream_is_a_status(code: ErrorCode, status: grpc.StatusCode) -> None:
    server, port, _ = await scripted(lambda peer, stream, headers: peer.write(rst_stream(stream, code)))
    channel = Channel(f"127.0.0.1:{port}")
    try:
        with pytest.raises(GrpcError) as reset:
            await channel.unary(PATH, b"a", timeout=5)
        assert reset.value.code == status
    finally:
        await channel.close()
        server.close()


async def test_a_lost_connection_is_unavailable_and_the_next_call_reconnects() -> None:
    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        if len(peers) == 1:
            assert peer.transport is not None
            peer.transport.close()
        else:
            peer.answer(stream, b"back")

    server, port, peers = await scripted(script)
    channel = Channel(f"127.0.0.1:{port}")
    try:
        with pytest.raises(GrpcError) as lost:
            await channel.unary(PATH, b"a", timeout=5)
        assert lost.value.code == grpc.StatusCode.UNAVAILABLE
        assert await channel.unary(PATH, b"b", timeout=5) == b"back"
    finally:
        await channel.close()
        server.close()


@pytest.mark.parametrize(
    ("status", "code"),
    [("404", grpc.StatusCode.UNIMPLEMENTED), ("503", grpc.StatusCode.UNAVAILABLE), ("500", grpc.StatusCode.UNKNOWN)],
)
async def test_an_http_error_status_is_a_grpc_code(status: str, code: grpc.StatusCode) -> None:
    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        peer.write(frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, stream,
                         encoder.encode([(":status", status)])))

    server, port, _ = await scripted(script)
    channel = Channel(f"127.0.0.1:{port}")
    try:
        with pytest.raises(GrpcError) as failed:
            await channel.unary(PATH, b"a", timeout=5)
        assert failed.value.code == code
    finally:
        await channel.close()
        server.close()


async def test_the_request_waits_for_the_servers_window() -> None:
    answered: list[int] = []

    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        answered.append(stream)

    server, port, peers = await scripted(script, {Setting.INITIAL_WINDOW_SIZE: 1000, Setting.MAX_FRAME_SIZE: 16384})
    channel = Channel(f"127.0.0.1:{port}")
    try:
        call = asyncio.ensure_future(channel.unary(PATH, b"x" * 5000, timeout=5))
        await asyncio.sleep(0.2)
        (peer,) = peers
        assert len(peer.data[1]) == 1000  # the stream's window, not a byte more
        peer.write(frame(Type.WINDOW_UPDATE, 0, 1, struct.pack(">I", 10_000)))
        await asyncio.sleep(0.2)
        assert peer.data[1] == b"\x00" + struct.pack(">I", 5000) + b"x" * 5000
        peer.answer(1, b"ok")
        assert await call == b"ok"
    finally:
        await channel.close()
        server.close()


async def test_a_server_that_allows_one_stream_gets_one_at_a_time() -> None:
    open_streams: list[int] = []

    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        open_streams.append(stream)
        asyncio.get_running_loop().call_later(0.05, peer.answer, stream, b"ok")

    server, port, peers = await scripted(script, {Setting.MAX_CONCURRENT_STREAMS: 1})
    channel = Channel(f"127.0.0.1:{port}")
    try:
        await channel.connect()
        await asyncio.sleep(0.05)  # the server's SETTINGS are in
        results = await asyncio.gather(*(channel.unary(PATH, b"a", timeout=5) for _ in range(3)))
        assert results == [b"ok"] * 3
        headers = [(kind, stream) for kind, stream, _ in peers[0].frames if kind == Type.HEADERS]
        assert [stream for _, stream in headers] == [1, 3, 5]
    finally:
        await channel.close()
        server.close()


async def test_a_response_beyond_the_limit_is_refused_without_holding_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputally.h2 import client as module

    monkeypatch.setattr(module, "MAX_RESPONSE", 1000)

    def script(peer: Peer, stream: int, headers: list[tuple[str, str]]) -> None:
        peer.write(frame(Type.HEADERS, Flag.END_HEADERS, stream, encoder.encode([(":status", "200"),
                                                                               ("content-type", "application/grpc")]))
                   + frame(Type.DATA, 0, stream, b"\x00" + struct.pack(">I", 5000) + b"x" * 3000))

    server, port, peers = await scripted(script)
    channel = Channel(f"127.0.0.1:{port}")
    try:
        with pytest.raises(GrpcError) as large:
            await channel.unary(PATH, b"a", timeout=5)
        assert large.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        await asyncio.sleep(0.05)
        assert (Type.RST_STREAM, 1, 4) in peers[0].frames  # the stream is cancelled, not read to its end
    finally:
        await channel.close()
        server.close()
