"""A third-party Python processor inside a real Collector, through the bridge:

    examples/plugin-processor (its own package, entry point ``gputally.processors: team``)
        installed with pip into a temporary directory (the test's environment is not changed)
    otelcol: otlp -> gputally processor --bridge--> gputally serve (PYTHONPATH: that directory):
        metrics/bridge [team]  -> back --> otlp exporter --> a sink
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import grpc
from harness.otelcol.collector import Otelcol
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

from tests.otelcol.shapes import METRICS_EXPORT, REPO, GputallyProcess

EXAMPLE = REPO / "examples" / "plugin-processor"


def install_example(tmp_path: Path) -> Path:
    """The example package installed (not editable) into a directory of its own, built from a
    copy so no build output lands in the checkout; the directory to put on PYTHONPATH."""
    source, target = tmp_path / "plugin-src", tmp_path / "plugin-site"
    shutil.copytree(EXAMPLE, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "--target", str(target), str(source)], check=True, timeout=300,
                   capture_output=True, text=True)
    return target


def request(namespace: str | None, host: str) -> ExportMetricsServiceRequest:
    message = ExportMetricsServiceRequest()
    rm = message.resource_metrics.add()
    for key, value in (("host.name", host), ("k8s.namespace.name", namespace)):
        if value is not None:
            rm.resource.attributes.add(key=key).value.string_value = value
    metric = rm.scope_metrics.add().metrics.add(name="hw.gpu.utilization", unit="1")
    metric.gauge.data_points.add(as_double=0.5, time_unix_nano=1_700_000_000_000_000_000)
    return message


def gputally_config() -> dict[str, Any]:
    return {
        "receivers": {"bridge": {"endpoint": "127.0.0.1:0"}},
        "processors": {"team": {"teams": {"ml-research": "vision"}, "default": "unowned"}},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"metrics/bridge": {"receivers": ["bridge"], "processors": ["team"],
                                                     "exporters": ["debug"]}},
                    "telemetry": {"metrics": {"address": None}}},
    }


async def test_a_python_plugin_processor_runs_in_a_collector_through_the_bridge(
    otelcol: Callable[..., Otelcol], otlp_sink: OtlpSink, tmp_path: Path,
) -> None:
    site = await asyncio.to_thread(install_example, tmp_path)
    assert (site / "gputally_team.py").is_file()
    # Only the temporary directory knows the plugin: this environment was not changed.
    assert "team" not in {e.name for e in entry_points(group="gputally.processors")}

    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    gputally = GputallyProcess(gputally_config(), tmp_path / "gputally", env=env).start()
    bridge_port = gputally.port("grpc", "bridge")
    try:
        collector = otelcol({
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
            "processors": {"gputally": {"endpoint": f"127.0.0.1:{bridge_port}", "tls": {"insecure": True},
                                        "pipeline": "metrics/bridge", "on_error": "fail"}},
            "exporters": {"otlp": {"endpoint": otlp_sink.endpoint, "tls": {"insecure": True}}},
            "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["gputally"],
                                                  "exporters": ["otlp"]}}},
        })
        async with grpc.aio.insecure_channel(f"127.0.0.1:{collector.port('otlp')}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            for namespace, host in (("ml-research", "gpu-1"), ("notebooks", "gpu-2"), (None, "gpu-3")):
                await export(request(namespace, host).SerializeToString(), timeout=10)
        await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) == 3)
    finally:
        assert await asyncio.to_thread(gputally.stop) == 0, gputally.log_tail()

    teams = {}
    for message in otlp_sink.messages():
        for rm in message.resource_metrics:
            attributes = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
            teams[attributes["host.name"]] = attributes.get("team")
    # A known namespace its team, another the default, a resource without one left alone.
    assert teams == {"gpu-1": "vision", "gpu-2": "unowned", "gpu-3": None}
