"""Lifecycle of the otlp receiver: binding, health, graceful and repeated shutdown."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gputally.errors import ConfigError
from gputally.otlp.batch import Batch, Signal
from gputally.receiver.otlp import OTLPReceiver, factory
from tests.receiver.otlp.helpers import Env, StartReceiver, grpc_export, http_post, metrics_request

BOTH = {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0"}}}
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 held by a listening socket for the test's duration."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def check_health(address: str, service: str = "") -> int | grpc.StatusCode:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            response = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return response.status


async def eventually(probe: Callable[[], Awaitable[object]], expected: object, *, within: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while (value := await probe()) != expected:
        assert asyncio.get_running_loop().time() < deadline, f"still {value!r}, wanted {expected!r}"
        await asyncio.sleep(0.02)


async def test_addresses_are_the_bound_ports(start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(BOTH)

    grpc_host, grpc_port = str(receiver.grpc_address).rsplit(":", 1)
    http_host, http_port = str(receiver.http_address).rsplit(":", 1)

    assert grpc_host == http_host == "127.0.0.1"
    assert int(grpc_port) > 0 and int(http_port) > 0 and grpc_port != http_port
    assert receiver.listening() == {"grpc": receiver.grpc_address, "http": receiver.http_address}


async def test_health_follows_readiness_without_auth(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(
        {"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}}},
        signals=[Signal.METRICS],
        health_interval=0.02,
    )
    address = receiver.grpc_address
    assert address is not None

    assert await check_health(address) == SERVING
    assert await check_health(address, METRICS_SERVICE) == SERVING
    assert await check_health(address, "opentelemetry.proto.collector.logs.v1.LogsService") == grpc.StatusCode.NOT_FOUND
    env.ready[0] = False
    await eventually(lambda: check_health(address), NOT_SERVING)
    assert await check_health(address, METRICS_SERVICE) == NOT_SERVING
    env.ready[0] = True
    await eventually(lambda: check_health(address, METRICS_SERVICE), SERVING)


async def test_a_failing_readiness_check_is_not_serving_and_logged_once(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0
    polled_often = asyncio.Event()

    def broken() -> bool:
        nonlocal calls
        calls += 1
        if calls >= 5:
            polled_often.set()
        raise RuntimeError("exporter state unavailable")

    receiver = OTLPReceiver(
        factory.parse({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}),
        env.context(is_ready=broken),
        {Signal.METRICS: env.consumers[Signal.METRICS]},
        health_interval=0.01,
    )
    with caplog.at_level(logging.ERROR):
        await receiver.start()
        try:
            assert await check_health(str(receiver.grpc_address)) == NOT_SERVING
            await asyncio.wait_for(polled_often.wait(), 5)
        finally:
            await receiver.shutdown()

    assert len([r for r in caplog.records if "readiness" in r.getMessage()]) == 1


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_a_taken_port_fails_start_with_a_clear_error(
    start_receiver: StartReceiver, taken_port: int, transport: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        await start_receiver({"protocols": {transport: {"endpoint": f"127.0.0.1:{taken_port}"}}})

    assert str(caught.value) == f"receivers::otlp: {transport} endpoint 127.0.0.1:{taken_port}: address in use"


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_a_second_instance_cannot_share_a_port_unless_asked(
    start_receiver: StartReceiver, transport: str
) -> None:
    def on(address: str | None) -> dict[str, object]:
        return {"protocols": {transport: {"endpoint": address}}}

    first = await start_receiver(on("127.0.0.1:0"))
    with pytest.raises(ConfigError, match="address in use"):
        await start_receiver(on(first.listening()[transport]))

    shared = await start_receiver(on("127.0.0.1:0"), reuse_port=True)
    twin = await start_receiver(on(shared.listening()[transport]), reuse_port=True)
    assert twin.listening() == shared.listening()


async def test_a_failed_start_releases_what_it_bound(env: Env, start_receiver: StartReceiver, taken_port: int) -> None:
    probe = await start_receiver(BOTH)
    grpc_endpoint = probe.grpc_address
    await probe.shutdown()

    with pytest.raises(ConfigError):
        await start_receiver(
            {"protocols": {"grpc": {"endpoint": grpc_endpoint}, "http": {"endpoint": f"127.0.0.1:{taken_port}"}}}
        )

    again = await start_receiver({"protocols": {"grpc": {"endpoint": grpc_endpoint}}})
    assert again.grpc_address == grpc_endpoint


async def test_shutdown_is_safe_before_start_and_twice(env: Env) -> None:
    receiver = OTLPReceiver(factory.parse(BOTH), env.context(), {Signal.METRICS: env.consumers[Signal.METRICS]})

    await receiver.shutdown()
    await receiver.start()
    address = receiver.http_address
    await receiver.shutdown()
    await receiver.shutdown()

    assert address is not None
    assert receiver.listening() == {}
    with pytest.raises(Exception):  # noqa: B017 - any connection error
        await http_post(address, "/v1/metrics", metrics_request().SerializeToString())
    with pytest.raises(RuntimeError, match="starts once"):
        await receiver.start()


async def succeeds(receiver: OTLPReceiver, transport: str) -> bool:
    """Send one metrics request over ``transport``; whether it was accepted."""
    body = metrics_request().SerializeToString()
    if transport == "grpc":
        return (await grpc_export(receiver.grpc_address, Signal.METRICS, body)).code == grpc.StatusCode.OK
    return (await http_post(receiver.http_address, "/v1/metrics", body)).status == 200


class Gate:
    """A consumer that holds each batch until released, to have a request in flight."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.batches: list[Batch] = []

    async def consume(self, batch: Batch) -> None:
        self.entered.set()
        await self.release.wait()
        self.batches.append(batch)


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_shutdown_lets_requests_in_flight_finish(env: Env, transport: str) -> None:
    gate = Gate()
    receiver = OTLPReceiver(factory.parse(BOTH), env.context(), {Signal.METRICS: gate})
    await receiver.start()
    request = asyncio.create_task(succeeds(receiver, transport))
    await asyncio.wait_for(gate.entered.wait(), 5)

    stopping = asyncio.create_task(receiver.shutdown())
    await asyncio.sleep(0.05)
    assert not stopping.done()
    gate.release.set()
    accepted = await asyncio.wait_for(request, 5)
    await asyncio.wait_for(stopping, 5)

    assert accepted
    assert len(gate.batches) == 1


@pytest.mark.parametrize("transport", ["grpc", "http"])
async def test_shutdown_gives_up_on_stuck_requests_after_the_grace_period(env: Env, transport: str) -> None:
    gate = Gate()  # never released
    receiver = OTLPReceiver(factory.parse(BOTH), env.context(shutdown_timeout=0.2), {Signal.METRICS: gate})
    await receiver.start()
    request = asyncio.create_task(succeeds(receiver, transport))
    await asyncio.wait_for(gate.entered.wait(), 5)

    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(receiver.shutdown(), 5)
    took = asyncio.get_running_loop().time() - started
    (outcome,) = await asyncio.gather(request, return_exceptions=True)

    assert 0.15 < took < 2.0
    assert gate.batches == []
    assert outcome is not True  # failed, or raised a connection error


async def test_grpc_on_a_unix_socket(env: Env, start_receiver: StartReceiver, tmp_path: Path) -> None:
    endpoint = f"unix://{tmp_path}/otlp.sock"
    receiver = await start_receiver({"protocols": {"grpc": {"endpoint": endpoint}}})

    result = await grpc_export(endpoint, Signal.METRICS, metrics_request().SerializeToString())

    assert receiver.grpc_address == endpoint
    assert result.code == grpc.StatusCode.OK
    assert len(env.consumers[Signal.METRICS].batches) == 1


def test_factory_builds_the_receiver(env: Env) -> None:
    receiver = factory.create(factory.parse(BOTH), env.context(), {Signal.METRICS: env.consumers[Signal.METRICS]})

    assert factory.type_name == "otlp"
    assert isinstance(receiver, OTLPReceiver)
    assert receiver.listening() == {}


def test_unknown_authenticator_is_a_config_error(env: Env) -> None:
    config = factory.parse({"protocols": {"http": {"auth": {"authenticator": "bearertokenauth/missing"}}}})

    with pytest.raises(ConfigError, match="bearertokenauth/missing"):
        factory.create(config, env.context(), {})
