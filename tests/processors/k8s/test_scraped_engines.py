"""Engines scraped by a user's own otelcol (the pipeline-stage shape): what the real
prometheus receiver puts on the resource, and that ``k8s`` leaves such a resource as received
(it has neither ``process.pid`` nor ``hw.id``), as docs/attribution.md says.

    engine-shaped server (/metrics) <--scrape-- otelcol (prometheus receiver -> otlp)
        --OTLP/gRPC--> gputally serve --> sink;  the sink's message -> the k8s processor
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from harness.otelcol.collector import Otelcol
from harness.processes import terminate
from support.otlp import OtlpSink

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.config import load_config
from gputally.pipeline.service import Service
from tests.probes.engines.pods import SERVER, started_port

from .helpers import attrs, make, resource_attrs

VLLM = Path(__file__).parents[2] / "fixtures" / "engines" / "vllm.txt"


@pytest.fixture
def vllm() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, str(SERVER), "--file", str(VLLM)], stdout=subprocess.PIPE)
    yield started_port(proc)
    terminate(proc, 5.0)
    proc.stdout.close()


def scraper(target: int, gputally_port: int) -> dict[str, Any]:
    scrape = {"job_name": "inference-engines", "scrape_interval": "1s",
              "static_configs": [{"targets": [f"127.0.0.1:{target}"]}]}
    return {
        "receivers": {"prometheus/engines": {"config": {"scrape_configs": [scrape]}}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{gputally_port}", "tls": {"insecure": True}}},
        "service": {"pipelines": {"metrics": {"receivers": ["prometheus/engines"], "exporters": ["otlp"]}}},
    }


def gateway(port: int, sink: str) -> str:
    return yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"otlp": {"endpoint": sink, "tls": {"insecure": True}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    })


async def test_a_scraped_engine_resource_is_the_scrape_target_and_k8s_leaves_it_alone(
        otelcol: Callable[..., Otelcol], vllm: int, otlp_sink: OtlpSink) -> None:
    service = Service(load_config(gateway(0, otlp_sink.endpoint)))
    await service.start()
    try:
        port = int(service.receivers["otlp"].listening()["grpc"].rpartition(":")[2])
        collector = otelcol(scraper(vllm, port), name="scraper")
        try:
            await otlp_sink.wait_for(lambda: bool(otlp_sink.received_metrics()), timeout=30)
        except TimeoutError:
            pytest.fail(f"nothing reached the sink; collector log:\n{collector.log_tail()}")
        await asyncio.to_thread(collector.stop)
    finally:
        await service.shutdown()
    message = otlp_sink.messages()[0]
    [resource] = [attrs(rm.resource) for rm in message.resource_metrics]
    assert resource["service.name"] == "inference-engines"
    assert resource["service.instance.id"] == f"127.0.0.1:{vllm}"
    assert str(resource["server.port"]) == str(vllm) and resource["url.scheme"] == "http"
    assert not {"process.pid", "process.linux.cgroup", "hw.id", "gputally.inference.engine"} & set(resource)
    names = {m.name for rm in message.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert "vllm:prompt_tokens" in names or "vllm:prompt_tokens_total" in names  # the engine's own names

    raw = message.SerializeToString()
    out = await make().process(Batch.decode(Signal.METRICS, raw))
    assert out is not None
    assert resource_attrs(out) == [resource]  # no k8s.*, no gputally.k8s.attribution: left as received
