"""Request-level attacks on the native server: bodies that never end, gzip bombs, inputs that
used to raise out of ``data_received``, connections held open without a word."""

from __future__ import annotations

import asyncio
import logging
import struct
import tracemalloc
import zlib

import pytest

from gputally.h2.frames import ErrorCode, Flag, Type, frame
from gputally.h2.calls import _Budget
from support.hostile import Hostile, loop_lag, request_block, still_serves, warned


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)


def body_part(size: int, *, first: bool = False) -> bytes:
    prefix = b"\x00" + struct.pack(">I", 60 * 2**20) if first else b""  # announces 60 MiB, never sent
    return prefix + b"\x00" * size


async def test_bodies_that_never_end_are_bounded_per_connection(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """24 bodies of 60 MiB that never ended held 1.6 GB. The connection's budget (2 MiB here)
    refuses the stream that would pass it; the process's is given back when it closes."""
    server, port = await serve(message_limit=64 * 2**20, max_buffered_request_bytes=2 * 2**20)
    attacker = await Hostile.open(port)
    for stream in range(1, 49, 2):
        attacker.send(frame(Type.HEADERS, Flag.END_HEADERS, stream, request_block())
                      + frame(Type.DATA, 0, stream, body_part(256 * 1024, first=True)))
    refused = 0
    while refused < 24 - 8:
        kind, flags, stream, payload = await attacker.frame()
        if kind == Type.HEADERS and flags & Flag.END_STREAM:
            assert dict(attacker.decoder.decode(payload))["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
            refused += 1
    assert _Budget.held <= 2 * 2**20
    await still_serves(port)
    attacker.close()
    await asyncio.sleep(0.1)
    assert _Budget.held == 0
    assert warned(caplog, "max_buffered_request_bytes")


async def test_bodies_are_bounded_per_process(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    server, port = await serve(message_limit=64 * 2**20, max_buffered_request_bytes=8 * 2**20,
                               max_process_buffered_request_bytes=3 * 2**20)
    attackers = [await Hostile.open(port) for _ in range(4)]
    for attacker in attackers:
        attacker.send(frame(Type.HEADERS, Flag.END_HEADERS, 1, request_block())
                      + frame(Type.DATA, 0, 1, body_part(1000 * 1024, first=True)))
    await asyncio.sleep(0.3)
    assert _Budget.held <= 3 * 2**20
    await still_serves(port)
    assert warned(caplog, "max_process_buffered_request_bytes")
    for attacker in attackers:
        attacker.close()


async def test_a_body_that_does_not_end_in_read_timeout_is_answered(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    server, port = await serve(read_timeout=0.5)
    attacker = await Hostile.open(port)
    attacker.send(frame(Type.HEADERS, Flag.END_HEADERS, 1, request_block()) + frame(Type.DATA, 0, 1, body_part(10, first=True)))
    await asyncio.sleep(0.1)
    assert _Budget.held > 0
    assert (await attacker.answer(1, timeout=3))["grpc-status"] == "4"  # DEADLINE_EXCEEDED
    assert _Budget.held == 0
    assert warned(caplog, "read_timeout")


async def test_a_gzip_bomb_is_inflated_in_bounded_steps_off_the_loop(serve) -> None:  # type: ignore[no-untyped-def]
    """61 KB of gzip inflating to 64 MiB: RESOURCE_EXHAUSTED at the 4 MiB message limit, with at
    most a few MiB allocated and the event loop never held more than a step."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = compressor.compress(b"\x00" * (64 * 2**20)) + compressor.flush()
    assert len(bomb) < 70_000
    server, port = await serve(message_limit=4 * 2**20)
    attacker = await Hostile.open(port)
    message = b"\x01" + struct.pack(">I", len(bomb)) + bomb
    tracemalloc.start()
    try:
        lag = asyncio.ensure_future(loop_lag(1.0))
        for stream in range(1, 21, 2):
            attacker.send(frame(Type.HEADERS, Flag.END_HEADERS, stream, request_block("/test.Echo/Echo",
                                                                                      ("grpc-encoding", "gzip")))
                          + frame(Type.DATA, Flag.END_STREAM, stream, message))
        for stream in range(1, 21, 2):
            assert (await attacker.answer(stream))["grpc-status"] == "8"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # ten bombs at once, each holding at most the 4 MiB limit and a 1 MiB step (whole: 640 MiB)
    assert peak < 10 * 5 * 2**20 + 2**20, peak
    assert await lag < 0.2
    await still_serves(port)


async def test_a_non_ascii_timeout_digit_is_ignored_without_a_traceback(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """``grpc-timeout: ²S`` let a ValueError escape data_received (an 18-line traceback per
    connection)."""
    _, port = await serve()
    for _ in range(3):
        client = await Hostile.open(port)
        client.request(1, extra=(("grpc-timeout", "²S".encode()),))
        assert (await client.answer(1))["grpc-status"] == "0"
        client.close()
    assert warned(caplog, "") == []


async def test_an_idle_connection_gets_goaway(serve) -> None:  # type: ignore[no-untyped-def]
    _, port = await serve(max_connection_idle=0.3)
    client = await Hostile.open(port)
    client.request(1)
    assert (await client.answer(1))["grpc-status"] == "0"
    assert await client.goaway(timeout=3) == ErrorCode.NO_ERROR
    assert await asyncio.wait_for(client.reader.read(), 3) == b""


async def test_a_peer_that_does_not_answer_keepalive_is_closed(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    _, port = await serve(keepalive_time=0.2, keepalive_timeout=0.3)
    client = await Hostile.open(port)
    kind, flags, _, _ = await client.frame(timeout=3)
    assert (kind, flags & Flag.ACK) == (Type.PING, 0)  # the server's keepalive PING, not answered
    assert await asyncio.wait_for(client.reader.read(), 3) == b""
    assert warned(caplog, "keepalive_timeout")


async def test_a_peer_that_answers_keepalive_stays(serve) -> None:  # type: ignore[no-untyped-def]
    _, port = await serve(keepalive_time=0.2, keepalive_timeout=0.3)
    client = await Hostile.open(port)
    for _ in range(3):
        kind, _, _, payload = await client.frame(timeout=3)
        assert kind == Type.PING
        client.send(frame(Type.PING, Flag.ACK, 0, payload))
    client.request(1)
    assert (await client.answer(1))["grpc-status"] == "0"


async def test_max_connection_age_sends_goaway(serve) -> None:  # type: ignore[no-untyped-def]
    _, port = await serve(max_connection_age=0.3, max_connection_age_grace=0.3)
    client = await Hostile.open(port)
    assert await client.goaway(timeout=3) == ErrorCode.NO_ERROR
