"""Generated frame sequences and byte noise into the native server's connection, in process:
whatever arrives, ``data_received`` never raises, and a connection that was not closed for a
protocol error still answers a well-formed call."""

from __future__ import annotations

import asyncio
import struct

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from gputally.h2 import Method, Server
from gputally.h2 import hpack as encoder
from gputally.h2.frames import PREFACE, Flag, Type, frame
from gputally.h2.serving import ServerConnection

PATH = "/test.Echo/Echo"
REQUEST = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "x"),
                          ("content-type", "application/grpc")])


class Transport(asyncio.Transport):
    """Collects what the connection writes."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0  # everything written is taken at once

    def pause_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def resume_reading(self) -> None:
        pass


def frames_of(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return frame(kind, flags, stream, payload)


FRAME = st.builds(
    frames_of,
    st.sampled_from([*Type, 0xA, 0xFF]),
    st.integers(0, 255),
    st.sampled_from([0, 1, 2, 3, 5, 2**31 - 1]),
    st.one_of(st.binary(max_size=64), st.just(REQUEST), st.just(b"\x00\x00\x00\x00\x02hi")),
)


async def echo(request: bytes, metadata: object) -> bytes:
    return request[::-1]


async def answers_a_call(connection: ServerConnection, transport: Transport, stream: int) -> bool:
    """True once the call's answer is written (or the connection closed for an earlier error)."""
    before = len(transport.out)
    connection.data_received(frame(Type.HEADERS, Flag.END_HEADERS, stream, REQUEST)
                             + frame(Type.DATA, Flag.END_STREAM, stream, b"\x00\x00\x00\x00\x02hi"))
    for _ in range(3):
        await asyncio.sleep(0)
    return b"\x00\x00\x00\x00\x02ih" in transport.out[before:] or transport.closing


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(FRAME, st.binary(max_size=40)), max_size=12), st.integers(1, 7))
def test_any_input_is_handled(chunks: list[bytes], split: int) -> None:
    async def run() -> None:
        server = Server({PATH: Method(echo)}, max_receive_message_length=1024)
        connection = ServerConnection(server)
        transport = Transport()
        connection.connection_made(transport)
        wire = PREFACE + b"".join(chunks)
        for offset in range(0, len(wire), split):  # arbitrary TCP segmentation
            connection.data_received(wire[offset : offset + split])
            if transport.closing:
                break
        await asyncio.sleep(0)
        stream = connection._last_stream + 2  # the next stream the client may open
        if not transport.closing and not connection.h2.unread and stream < 2**31:  # between frames
            assert await answers_a_call(connection, transport, stream)
        connection.connection_lost(None)
        await asyncio.sleep(0)

    asyncio.run(run())


def test_a_well_formed_call_through_the_fuzz_harness_is_answered() -> None:
    """The harness itself: a clean connection answers, so the property above can fail."""

    async def run() -> bytes:
        server = Server({PATH: Method(echo)}, max_receive_message_length=1024)
        connection = ServerConnection(server)
        transport = Transport()
        connection.connection_made(transport)
        connection.data_received(PREFACE + frame(Type.SETTINGS, 0, 0, b""))
        assert await answers_a_call(connection, transport, 1)
        return bytes(transport.out)

    out = asyncio.run(run())
    assert struct.pack(">I", 2) + b"ih" in out


@pytest.mark.parametrize("size", [0, 1, 8, 9, 23])
async def test_a_truncated_preface_waits(size: int) -> None:
    server = Server({PATH: Method(echo)}, max_receive_message_length=1024)
    connection = ServerConnection(server)
    transport = Transport()
    connection.connection_made(transport)
    connection.data_received(PREFACE[:size])
    assert not transport.closing
    connection.connection_lost(None)
