"""gRPC health and ``/readyz`` answer from one source of truth: the service's readiness, asked
at the moment of the question (no poll lag), through start, an exporter's outage and shutdown."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import grpc.aio
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from harness.processes import unused_port
from support.otlp import OtlpSink

from gputally.cli.admin import AdminServer
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service
from tests.receiver.otlp.helpers import Env, StartReceiver

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def grpc_health(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return int(response.status)


async def readyz(address: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"http://{address}/readyz") as response:
        return response.status


async def test_check_answers_the_readiness_of_the_moment(env: Env, start_receiver: StartReceiver) -> None:
    env.ready[0] = False
    receiver = await start_receiver({"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}, health_interval=60)
    address = str(receiver.grpc_address)
    assert await grpc_health(address) == NOT_SERVING
    env.ready[0] = True  # the poll would not notice for a minute
    assert await grpc_health(address) == SERVING
    env.ready[0] = False
    assert await grpc_health(address) == NOT_SERVING


async def test_grpc_health_and_readyz_agree_from_start_to_shutdown() -> None:
    sink = OtlpSink(unused_port())  # down at first: the exporter is not ready
    config = load_config(yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {"otlphttp": {"endpoint": f"http://127.0.0.1:{sink.port}"}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlphttp"]}},
                    "telemetry": {"metrics": {"address": None}}, "shutdown_timeout": "1s"},
    }))
    service = Service(config)
    admin = AdminServer("127.0.0.1:0", service.telemetry.registry, service.not_ready, service.degraded)
    await admin.start()
    assert admin.address is not None
    assert await readyz(admin.address) == 503  # starting
    await service.start()
    address = service.receivers["otlp"].listening()["grpc"]
    try:
        async def both() -> tuple[int, int] | None:
            """Both answers, when readiness did not change while they were asked."""
            before, health, after = await readyz(admin.address), await grpc_health(address), await readyz(admin.address)
            return (before, health) if before == after else None

        answers = [await both()]
        await sink.start()
        for _ in range(100):  # the otlphttp exporter probes its backend in the background
            answers.append(await both())
            if answers[-1] is not None and answers[-1][0] == 200:
                break
            await asyncio.sleep(0.05)
        answers = [a for a in answers if a is not None]
        assert answers[0] == (503, NOT_SERVING)
        assert answers[-1] == (200, SERVING)
        assert all((r == 200) == (g == SERVING) for r, g in answers), answers
        stopping = asyncio.create_task(service.shutdown())
        await asyncio.sleep(0)  # shutdown has begun: both say so before anything else stops
        assert await readyz(admin.address) == 503
        await stopping
    finally:
        await service.shutdown()
        await admin.shutdown()
        await sink.stop()
