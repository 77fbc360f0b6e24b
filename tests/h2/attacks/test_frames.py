"""Frame-level attacks on the native server: CONTINUATION floods, control-frame floods against a
peer that does not read, answer amplification, Rapid Reset, streams parked on a zero window.

Each attack runs a second or two on loopback against limits set small; each asserts the
server holds a bounded number of bytes for the attacker (``held_bytes``), answers a valid
client during and after, and logs one WARNING naming the peer and the limit, no traceback.
"""

from __future__ import annotations

import asyncio
import logging

import hpack
import pytest

from gputally.h2.frames import ErrorCode, Flag, Setting, Type, frame, rst_stream, settings
from support.hostile import Hostile, held_bytes, loop_lag, request_block, still_serves, warned

pytestmark = pytest.mark.usefixtures("caplog")


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)


async def test_empty_continuation_frames_end_the_connection_at_once(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """CVE-2024-27316 class: 40,000 empty CONTINUATIONs cost 27 s before; now the 9th ends it."""
    server, port = await serve()
    attacker = await Hostile.open(port)
    started = asyncio.get_running_loop().time()
    attacker.send(frame(Type.HEADERS, 0, 1, request_block()[:5]) + frame(Type.CONTINUATION, 0, 1) * 40_000)
    assert await attacker.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    assert asyncio.get_running_loop().time() - started < 1.0
    await still_serves(port)
    (line,) = warned(caplog, "max_continuation_frames")
    assert "127.0.0.1:" in line


async def test_a_header_block_beyond_twice_the_list_limit_ends_the_connection(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    server, port = await serve(max_header_list_size=8192, max_continuation_frames=100)
    attacker = await Hostile.open(port)
    attacker.send(frame(Type.HEADERS, 0, 1, request_block()) + frame(Type.CONTINUATION, 0, 1, b"\x00" * 4096) * 50)
    assert await attacker.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    assert held_bytes(server) < 64 * 1024
    await still_serves(port)
    assert warned(caplog, "max_header_list_size")


async def test_a_large_header_list_fails_its_call_alone(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """A 64 KiB ``authorization`` fails that call with RESOURCE_EXHAUSTED (as grpcio does); the
    connection goes on (it used to get GOAWAY)."""
    _, port = await serve()
    client = await Hostile.open(port)
    client.request(1, extra=(("authorization", "x" * 65536),))
    assert (await client.answer(1))["grpc-status"] == "8"
    client.request(3, b"next")
    assert (await client.answer(3))["grpc-status"] == "0"
    assert warned(caplog, "max_header_list_size")


@pytest.mark.parametrize("flood", [frame(Type.PING, 0, 0, b"12345678"), frame(Type.SETTINGS, 0, 0)],
                         ids=["ping", "settings"])
async def test_a_control_frame_flood_from_a_peer_that_does_not_read(serve, caplog, flood: bytes) -> None:  # type: ignore[no-untyped-def]
    """10.6 M PING ACKs (256 MB) were queued before. Now reading stops once 64 KiB of answers
    wait, and the peer is closed (too many answers owed, or write_timeout)."""
    server, port = await serve(max_output_buffer=64 * 1024, max_queued_control_frames=2000, write_timeout=1.0)
    attacker = await Hostile.open(port, reads=False)
    worst = 0

    async def watch() -> None:
        nonlocal worst
        while True:
            worst = max(worst, held_bytes(server))
            await asyncio.sleep(0.005)

    watcher = asyncio.ensure_future(watch())
    try:
        sent = await attacker.flood(flood * 4096, 2.5)
        await still_serves(port)
    finally:
        watcher.cancel()
    assert sent > 1_000_000 or attacker.writer.is_closing() or not server._connections - {None}
    assert worst < 1 * 1024 * 1024, worst  # the transport's buffer plus one read's answers
    await asyncio.sleep(0.1)
    assert all(c.h2.closed or c._transport is None for c in server._connections if c.peer.endswith(
        str(attacker.writer.get_extra_info("sockname")[1])))
    assert warned(caplog, "max_queued_control_frames") or warned(caplog, "write_timeout")


async def test_an_echoed_path_does_not_amplify(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """A 3 KB path indexed once and referenced by one byte made each 15-byte HEADERS a 3 KB
    answer. The echo is cut to 100 characters and a peer that does not read is held at
    max_output_buffer."""
    server, port = await serve(max_output_buffer=64 * 1024, write_timeout=1.0)
    attacker = await Hostile.open(port, reads=False)
    peer = hpack.Encoder()
    fields = [(":method", "POST"), (":scheme", "http"), (":path", "/x" + "a" * 3000), (":authority", "x"),
              ("content-type", "application/grpc")]
    wire = [frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, 1, peer.encode(fields))]
    wire += [frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, stream, peer.encode(fields))
             for stream in range(3, 20_000, 2)]
    assert len(wire[-1]) < 20
    worst = 0
    attacker.send(b"".join(wire))
    for _ in range(100):
        await asyncio.sleep(0.02)
        worst = max(worst, held_bytes(server))
    await still_serves(port)
    assert worst < 1 * 1024 * 1024, worst


async def test_rapid_reset_gets_goaway(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """CVE-2023-44487: HEADERS then RST_STREAM, as fast as possible. The reset bucket (burst
    200, 10/s here) runs dry and the connection gets GOAWAY ENHANCE_YOUR_CALM."""
    server, port = await serve(reset_burst=200, reset_rate=10)
    attacker = await Hostile.open(port)
    block = request_block()
    pairs = b"".join(frame(Type.HEADERS, Flag.END_HEADERS, s, block) + rst_stream(s, ErrorCode.CANCEL)
                     for s in range(1, 4000, 2))
    attacker.send(pairs)
    assert await attacker.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    await still_serves(port)
    assert warned(caplog, "reset_rate")


async def test_streams_parked_on_a_zero_window_count_against_the_limit(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    """With INITIAL_WINDOW_SIZE 0 every answer waits; such streams used to leave the count
    (20,000 held against 1,000 advertised). Now the 51st is refused, SETTINGS frames cost
    at most one walk of those 50, and the stalled connection is closed after write_timeout."""
    server, port = await serve(max_concurrent_streams=50, write_timeout=1.5, reset_burst=10_000)
    attacker = await Hostile.open(port, initial={Setting.INITIAL_WINDOW_SIZE: 0})
    for stream in range(1, 400, 2):
        attacker.request(stream)
    refused = 0
    while refused < 150:
        kind, _, _, payload = await attacker.frame()
        if kind == Type.RST_STREAM:
            assert int.from_bytes(payload, "big") == ErrorCode.REFUSED_STREAM
            refused += 1
    (connection,) = server._connections
    assert connection.h2.streams.active_peer == 50
    # 4.5 KB of SETTINGS froze the loop 6.1 s with 20,000 parked streams; 300 KB, each frame
    # changing the window (a walk of the 50 streams and 1 byte for each), now take a fraction.
    flood = b"".join(settings({Setting.INITIAL_WINDOW_SIZE: i % 2}) for i in range(20_000))
    lag = asyncio.ensure_future(loop_lag(1.0))
    attacker.send(flood)
    assert await lag < 1.0
    assert await attacker.goaway(timeout=5) == ErrorCode.ENHANCE_YOUR_CALM  # stalled past write_timeout
    await still_serves(port)
    assert warned(caplog, "max_concurrent_streams") and warned(caplog, "write_timeout")
