"""OTLP/HTTP against clients that misbehave: malformed requests, slow clients, too many
connections, ``Expect: 100-continue`` with an oversized body, unknown enum names in JSON."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import pytest

from gputally.otlp.batch import Signal
from tests.receiver.otlp.helpers import Env, StartReceiver

JSON_SUM = (
    '{"resourceMetrics":[{"scopeMetrics":[{"metrics":[{"name":"m","sum":{"aggregationTemporality":%s,'
    '"dataPoints":[{"asInt":"1"}]}}]}]}]}'
)


def http(**settings: Any) -> dict[str, Any]:
    return {"protocols": {"http": {"endpoint": "127.0.0.1:0", **settings}}}


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


async def exchange(address: str, raw: bytes, *, close_after: float | None = None, timeout: float = 5.0) -> bytes:
    """Send ``raw`` on a fresh connection; what comes back until the server closes (or timeout)."""
    reader, writer = await asyncio.open_connection(*host_port(address))
    writer.write(raw)
    await writer.drain()
    if close_after is not None:
        await asyncio.sleep(close_after)
        writer.close()
        return b""
    try:
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def malformed(env: Env, reason: str) -> float:
    labels = {"receiver": "otlp", "transport": "http", "reason": reason}
    return env.telemetry.registry.get_sample_value("gputally_receiver_malformed_requests_total", labels) or 0.0


HEAD = b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
BAD = {
    "negative Content-Length": HEAD + b"Content-Length: -5\r\n\r\n",
    "3,000 headers": HEAD + b"".join(b"X-%d: a\r\n" % i for i in range(3000)) + b"\r\n",
    "an 8 KiB header": HEAD + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n",
    "Content-Length and Transfer-Encoding": HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
}


async def test_malformed_requests_are_counted_and_logged_once_without_traceback(
    env: Env, start_receiver: StartReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = await start_receiver(http())
    address = receiver.http_address
    assert address is not None
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            for raw in BAD.values():
                answer = await exchange(address, raw)
                assert answer.startswith(b"HTTP/1.0 400") or answer.startswith(b"HTTP/1.1 400"), answer[:80]
            await exchange(address, HEAD + b"Content-Length: 100\r\n\r\nabc", close_after=0.1)  # gone mid-body
        await asyncio.sleep(0.2)
    assert malformed(env, "bad_request") == 12
    assert malformed(env, "client_gone") == 3
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any(r.exc_info for r in errors), "a client's fault must not log a traceback"
    assert not any("Traceback" in r.getMessage() for r in caplog.records)
    assert len([r for r in errors if "(bad_request)" in r.getMessage()]) == 1, [r.getMessage() for r in errors]
    assert len([r for r in errors if "(client_gone)" in r.getMessage()]) == 1
    assert len(errors) == 2
    async with aiohttp.ClientSession() as session:  # and the server is fine
        async with session.post(f"http://{address}/v1/metrics", data=b"",
                                headers={"Content-Type": "application/x-protobuf"}) as response:
            assert response.status == 200


async def test_a_client_that_never_finishes_its_headers_is_dropped(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(http(read_header_timeout="300ms"))
    assert receiver.http_address is not None
    started = time.monotonic()
    answer = await exchange(receiver.http_address, b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\n", timeout=10)
    assert answer == b"" and time.monotonic() - started < 3, "the connection stayed open"


async def test_a_body_that_never_arrives_is_408(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(http(read_timeout="300ms"))
    assert receiver.http_address is not None
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(*host_port(receiver.http_address))
    writer.write(HEAD + b"Content-Length: 100\r\n\r\nabc")
    try:
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 3
        await asyncio.wait_for(reader.read(), 10)  # and closed (after at most 2 s of lingering)
    finally:
        writer.close()
    assert malformed(env, "body_timeout") == 1


async def test_connections_beyond_the_limit_are_closed_at_once(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(http(max_connections=2))
    assert receiver.http_address is not None
    held = [await asyncio.open_connection(*host_port(receiver.http_address)) for _ in range(2)]
    await asyncio.sleep(0.1)
    started = time.monotonic()
    answer = await exchange(receiver.http_address, HEAD + b"Content-Length: 0\r\n\r\n", timeout=5)
    assert answer == b"" and time.monotonic() - started < 2
    assert malformed(env, "connection_limit") == 1
    for _, writer in held:
        writer.close()
    await asyncio.sleep(0.2)  # with those gone, connections are taken again
    assert (await exchange(receiver.http_address, HEAD + b"Content-Length: 0\r\nConnection: close\r\n\r\n")).startswith(
        b"HTTP/1.1 200")


async def test_expect_100_continue_with_an_oversized_body_gets_413_at_once(
    env: Env, start_receiver: StartReceiver
) -> None:
    receiver = await start_receiver(http(max_request_body_size=1000))
    assert receiver.http_address is not None
    answer = await exchange(receiver.http_address, HEAD + b"Content-Length: 999999\r\nExpect: 100-continue\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:80]
    assert b"100 Continue" not in answer
    assert env.count("refused", "http", Signal.METRICS, "too_large") == 0  # counted, with no items
    small = await exchange(receiver.http_address,
                           HEAD + b"Content-Length: 0\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
    assert small.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"), small[:80]


@pytest.mark.parametrize(("value", "status"), [
    ('"NOPE"', 400), ('"AGGREGATION_TEMPORALITY_DELTA"', 200), ("1", 200), ("7", 200),
])
async def test_unknown_enum_names_in_json_are_400(
    env: Env, start_receiver: StartReceiver, value: str, status: int
) -> None:
    receiver = await start_receiver(http())
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{receiver.http_address}/v1/metrics", data=JSON_SUM % value,
                                headers={"Content-Type": "application/json"}) as response:
            assert response.status == status, await response.text()
            if status == 400:
                assert "aggregationTemporality" in (await response.json())["message"]
    assert len(env.consumers[Signal.METRICS].batches) == (status == 200)


async def test_an_unpaired_surrogate_in_json_is_400_not_500(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(http())
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://{receiver.http_address}/v1/metrics", data=b'{"]ud800\\udc00": null}',
                                headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400, await response.text()
