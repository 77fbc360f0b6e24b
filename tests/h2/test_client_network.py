"""The native channel's way to its server, as grpcio's: an HTTP CONNECT proxy from grpc_proxy /
https_proxy (unless no_proxy), TLS only with h2 selected by ALPN, keepalive PINGs."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import trustme

from gputally.h2 import Channel, GrpcError, Method, Server, parse_target, proxy_for
from gputally.h2.client import Proxy
from gputally.h2.frames import PREFACE, Type

PATH = "/test.Echo/Echo"


async def echo(request: bytes, metadata: object) -> bytes:
    return request[::-1]


@pytest.fixture
async def server() -> AsyncIterator[int]:
    server = Server({PATH: Method(echo)}, max_receive_message_length=1 << 20)
    yield await server.listen_tcp("127.0.0.1", 0)
    await server.shutdown(0.2)


class ConnectProxy:
    """A CONNECT-only HTTP proxy on loopback that records each request's head."""

    def __init__(self) -> None:
        self.heads: list[bytes] = []
        self.port = 0

    async def start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        return server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.heads.append(head)
        host, _, port = head.split()[1].decode().rpartition(":")
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)


@pytest.mark.parametrize("variable", ["grpc_proxy", "https_proxy", "HTTPS_PROXY"])
async def test_calls_go_through_the_proxy_of_the_environment(server: int, variable: str) -> None:
    proxy = ConnectProxy()
    listening = await proxy.start()
    channel = Channel(f"127.0.0.1:{server}", environ={variable: f"http://user:pw@127.0.0.1:{proxy.port}"})
    try:
        assert await channel.unary(PATH, b"via", timeout=5) == b"aiv"
    finally:
        await channel.close()
        listening.close()
    (head,) = proxy.heads
    assert head.startswith(f"CONNECT 127.0.0.1:{server} HTTP/1.1\r\n".encode())
    assert b"Proxy-Authorization: Basic dXNlcjpwdw==" in head


async def test_no_proxy_goes_direct(server: int) -> None:
    channel = Channel(f"127.0.0.1:{server}", environ={"grpc_proxy": "http://127.0.0.1:1", "NO_PROXY": "127.0.0.0/8"})
    try:
        assert await channel.unary(PATH, b"direct", timeout=5) == b"tcerid"
    finally:
        await channel.close()


def test_which_proxy() -> None:
    target = parse_target("collector.example:4317")
    assert proxy_for(target, {"grpc_proxy": "proxy:3128", "https_proxy": "http://other:1"}) == Proxy("proxy", 3128)
    assert proxy_for(target, {"HTTPS_PROXY": "http://p:8080", "no_proxy": ".example"}) is None
    assert proxy_for(target, {"https_proxy": "http://p:8080", "no_proxy": "other.example, *"}) is None
    assert proxy_for(target, {"https_proxy": "http://p:8080", "no_proxy": "ample"}) == Proxy("p", 8080)
    assert proxy_for(parse_target("unix:///run/otlp.sock"), {"grpc_proxy": "http://p:1"}) is None
    assert proxy_for(target, {}) is None


async def test_a_proxy_that_refuses_fails_the_call_unavailable() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
        writer.close()

    listening = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    channel = Channel("127.0.0.1:9", environ={"grpc_proxy": f"127.0.0.1:{port}"})
    try:
        with pytest.raises(GrpcError) as failed:
            await channel.unary(PATH, b"x", timeout=5)
    finally:
        await channel.close()
        listening.close()
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE and "403" in failed.value.details


async def test_tls_without_h2_by_alpn_is_refused(tmp_path: Path) -> None:
    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    server_context.set_alpn_protocols(["http/1.1"])

    async def quiet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    listening = await asyncio.start_server(quiet, "127.0.0.1", 0, ssl=server_context)
    port = listening.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    channel = Channel(f"127.0.0.1:{port}", ssl_context=client_context)
    try:
        with pytest.raises(GrpcError) as failed:
            await channel.connect()
    finally:
        await channel.close()
        listening.close()
    assert failed.value.code == grpc.StatusCode.UNAVAILABLE and "ALPN" in failed.value.details


async def test_keepalive_pings_and_a_silent_server_is_left() -> None:
    pings = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        while chunk := await reader.read(65536):
            data += chunk
            frames = data[len(PREFACE):]
            while len(frames) >= 9:
                length = int.from_bytes(frames[:3], "big")
                if frames[3] == Type.PING:
                    pings.set()
                frames = frames[9 + length:]

    listening = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    channel = Channel(f"127.0.0.1:{port}", keepalive_time=0.2, keepalive_timeout=0.3,
                      keepalive_permit_without_stream=True)
    try:
        await channel.connect()
        await asyncio.wait_for(pings.wait(), 3)
        for _ in range(100):
            if not channel.connected:
                break
            await asyncio.sleep(0.05)
        assert not channel.connected  # no PING ACK within the timeout: the connection is dropped
    finally:
        await channel.close()
        listening.close()
