"""A stream of gzip bombs on one connection against the otlp receiver, on both transports it
serves: OTLP/gRPC on the native HTTP/2 server and OTLP/HTTP.

Each bomb is 61 KB on the wire and 60 MiB inflated; they go back to back without waiting for
answers. Before the fix, on gRPC, every bomb's stream inflated at once (4 MiB each on the
event loop, then in a thread each), with none of the inflated bytes counted: 40 of them grew
the server by hundreds of MB and made valid calls from another client time out. Now the
inflated bytes count against the connection's and the process's request budgets, one
connection's requests inflate one at a time, and past the first MiB off the event loop. The
receiver here has small budgets (32 MiB a connection, 64 MiB the process), so the peak is
measured against them: tracemalloc's peak of everything the process allocated while the
attack lasted must stay under the process budget, and 5 valid calls made meanwhile from
another client must all succeed, with the loop never held long.
"""

from __future__ import annotations

import asyncio
import gzip
import struct
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import grpc.aio
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from gputally.h2.calls import _Budget
from gputally.h2.frames import Flag, Type, frame
from gputally.otlp.batch import Signal
from gputally.receiver.otlp import OTLPReceiver, factory
from gputally.telemetry import SelfTelemetry
from support.hostile import Hostile, loop_lag, request_block
from tests.receiver.otlp.helpers import Env, Recorder, metrics_request

EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
BOMBS = 40
MIB = 2**20
PROCESS_BUDGET = 64 * MIB
CONFIG: dict[str, Any] = {
    "protocols": {
        "grpc": {"endpoint": "127.0.0.1:0", "implementation": "native",
                 "limits": {"max_buffered_request_mib": 32, "max_process_buffered_request_mib": 64}},
        "http": {"endpoint": "127.0.0.1:0"},
    },
}


@pytest.fixture(scope="module")
def bomb() -> bytes:
    payload = gzip.compress(b"\x00" * (60 * MIB), 9)
    assert len(payload) < 62_000
    return payload


@pytest.fixture
async def receiver() -> AsyncIterator[OTLPReceiver]:
    env = Env(SelfTelemetry(), {signal: Recorder() for signal in Signal}, [True])
    started = OTLPReceiver(factory.parse(CONFIG), env.context(), dict(env.consumers), health_interval=1.0)
    await started.start()
    yield started
    await started.shutdown()
    assert _Budget.held == 0  # every request byte held was given back


async def _during(attack: Awaitable[int], valid_call: Callable[[], Awaitable[bool]]) -> tuple[int, list[bool], float, int]:
    """Run ``attack`` (it returns how many bombs were answered) while 5 valid calls are made
    one after another from another client; the answered count, the calls' outcomes, the
    loop's worst lag and the process's allocation peak."""
    tracemalloc.start()
    try:
        lag = asyncio.ensure_future(loop_lag(3.0))
        attacking = asyncio.ensure_future(attack)
        await asyncio.sleep(0.2)  # the bombs are in
        outcomes = []
        for _ in range(5):
            outcomes.append(await valid_call())
            await asyncio.sleep(0.1)
        answered = await asyncio.wait_for(attacking, 120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return answered, outcomes, await lag, peak


async def test_a_stream_of_gzip_bombs_over_grpc(receiver: OTLPReceiver, bomb: bytes) -> None:
    address = receiver.grpc_address
    assert address is not None
    port = int(address.rsplit(":", 1)[1])
    attacker = await Hostile.open(port)
    message = b"\x01" + struct.pack(">I", len(bomb)) + bomb
    block = request_block(EXPORT, ("grpc-encoding", "gzip"))

    async def attack() -> int:
        for stream in range(1, 2 * BOMBS, 2):
            attacker.send(frame(Type.HEADERS, Flag.END_HEADERS, stream, block)
                          + frame(Type.DATA, Flag.END_STREAM, stream, message))
        answered = 0
        for stream in range(1, 2 * BOMBS, 2):
            status = (await attacker.answer(stream, timeout=60))["grpc-status"]
            assert status in ("3", "8")  # INVALID_ARGUMENT (over 16 MiB) or RESOURCE_EXHAUSTED (over budget)
            answered += 1
        return answered

    channel = grpc.aio.insecure_channel(address)
    export = channel.unary_unary(EXPORT)
    valid = metrics_request().SerializeToString()

    async def call() -> bool:
        try:
            ExportMetricsServiceResponse.FromString(await export(valid, timeout=2))
        except grpc.aio.AioRpcError:
            return False
        return True

    try:
        answered, outcomes, lag, peak = await _during(attack(), call)
    finally:
        await channel.close()
        attacker.close()
    assert answered == BOMBS
    assert outcomes == [True] * 5
    assert peak < PROCESS_BUDGET, f"{peak / MIB:.0f} MiB"
    assert lag < 0.3, lag


async def test_a_stream_of_gzip_bombs_over_http(receiver: OTLPReceiver, bomb: bytes) -> None:
    """HTTP/1.1 answers a bomb 413 and closes its connection, so the stream comes from four
    connections at once, each sending its next bomb as soon as its last was answered. Before
    the fix each was inflated to the 16 MiB limit on the event loop (about 0.15 s each here,
    four at a time)."""
    address = receiver.http_address
    assert address is not None
    host, port = address.rsplit(":", 1)
    head = (f"POST /v1/metrics HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Encoding: gzip\r\nContent-Length: {len(bomb)}\r\n\r\n").encode()

    async def one_connection(bombs: int) -> int:
        answered = 0
        for _ in range(bombs):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(head + bomb)
                line = await asyncio.wait_for(reader.readline(), 60)
                assert line.split()[1:2] == [b"413"], line
                answered += 1
            finally:
                writer.close()
        return answered

    async def attack() -> int:
        return sum(await asyncio.gather(*(one_connection(BOMBS // 4) for _ in range(4))))

    valid = metrics_request().SerializeToString()

    async def call() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    f"http://{address}/v1/metrics", data=gzip.compress(valid),
                    headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
                    timeout=aiohttp.ClientTimeout(total=2)) as response:
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    answered, outcomes, lag, peak = await _during(attack(), call)
    assert answered == BOMBS // 4 * 4
    assert outcomes == [True] * 5
    assert peak < PROCESS_BUDGET, f"{peak / MIB:.0f} MiB"
    assert lag < 0.3, lag
