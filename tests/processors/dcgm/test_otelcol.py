"""Live: dcgm-exporter's page, scraped by a real otelcol's prometheus receiver, through gputally.

    fake dcgm-exporter (/metrics) <--scrape-- otelcol (prometheus receiver -> otlp exporter)
        --OTLP/gRPC--> gputally (otlp receiver -> dcgm -> otlp exporter) --> sink

Uses the otelcol of tests/harness/otelcol (the fixture fails, naming the build script, when it
is not built).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import yaml
from aiohttp import web
from harness.otelcol.collector import Otelcol
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service
from gputally.processors.dcgm import factory
from gputally.telemetry import SelfTelemetry

from .scrape import GPU0_UUID, GPU1_UUID, TWO_GPUS, attrs, exposition, normalized, request


@pytest.fixture
async def dcgm_exporter() -> AsyncIterator[int]:
    """A stand-in for dcgm-exporter serving a fixed page on ``/metrics``; yields its port."""
    page = exposition(TWO_GPUS)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner.addresses[0][1]
    await runner.cleanup()


def collector_config(target: int, gputally_port: int) -> dict[str, Any]:
    scrape = {"job_name": "dcgm-exporter", "scrape_interval": "1s",
              "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}
    return {
        "receivers": {"prometheus/dcgm": {"config": {"scrape_configs": [scrape]}}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{gputally_port}", "tls": {"insecure": True}}},
        "service": {"pipelines": {"metrics": {"receivers": ["prometheus/dcgm"], "exporters": ["otlp"]}}},
    }


def gputally_config(port: int, sink: str) -> str:
    return yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {"dcgm": None},
        "exporters": {"otlp": {"endpoint": sink, "tls": {"insecure": True}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["dcgm"], "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    })


async def expected() -> ExportMetricsServiceRequest:
    """What the processor makes of the request `scrape.request` builds for the same page."""
    proc = factory.create(factory.parse(None), ComponentContext(id="dcgm", telemetry=SelfTelemetry()),
                          Signal.METRICS)
    out = await proc.process(Batch.decode(Signal.METRICS, request(TWO_GPUS).SerializeToString()))
    assert out is not None
    return Batch.decode(Signal.METRICS, out.serialize()).message


def without_scope_version(message: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:
    """The scope's version is the collector's own; the harness's pin may move."""
    for rm in message.resource_metrics:
        for sm in rm.scope_metrics:
            sm.scope.version = ""
    return message


async def test_a_real_scrape_comes_out_one_resource_per_gpu(
    otelcol: Callable[..., Otelcol], dcgm_exporter: int, otlp_sink: OtlpSink
) -> None:
    service = Service(load_config(gputally_config(0, otlp_sink.endpoint)))
    await service.start()
    try:
        gputally_port = int(service.receivers["otlp"].listening()["grpc"].rpartition(":")[2])
        collector = otelcol(collector_config(dcgm_exporter, gputally_port), name="scraper")
        try:
            await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) >= 1, timeout=30)
        except TimeoutError:
            pytest.fail(f"nothing reached the sink; collector log:\n{collector.log_tail()}")
        await asyncio.to_thread(collector.stop)
    finally:
        await service.shutdown()
    got = otlp_sink.messages()[0]
    by_gpu = {attrs(rm.resource).get("hw.id"): rm for rm in got.resource_metrics}
    assert list(by_gpu) == [None, GPU0_UUID, GPU1_UUID]
    assert attrs(by_gpu[GPU0_UUID].resource)["host.name"] == "gpu-7"
    assert without_scope_version(normalized(got)) == without_scope_version(normalized(await expected()))
