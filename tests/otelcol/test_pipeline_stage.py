"""gputally as a pipeline stage between two real otelcols (issue 7).

    client --OTLP/gRPC--> otelcol "front" (otlp receiver -> otlp exporter)
           --OTLP/gRPC--> gputally (otlp receiver -> attributes processor -> otlp exporter)
           --OTLP/gRPC--> otelcol "back" (otlp receiver -> file exporter, JSON lines)

The collectors are the otelcol-gputally-test binary built by tests/harness/otelcol/build.sh.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import yaml
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.config.model import load_config
from gputally.pipeline.service import Service

from harness.otelcol.collector import Otelcol, free_port, validate

REPO = Path(__file__).resolve().parents[2]
METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
STAGE_KEY, STAGE_VALUE = "gputally.stage", "pipeline-stage"

Key = tuple[frozenset[tuple[str, str]], str, frozenset[tuple[str, str]]]


def gpu_node_request() -> ExportMetricsServiceRequest:
    """bench/gpu_node_request.py's realistic 8-GPU node request (340 data points)."""
    spec = importlib.util.spec_from_file_location("gpu_node_request", REPO / "bench" / "gpu_node_request.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.gpu_node_request()


def front_config(port: int, gputally_port: int) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{gputally_port}", "tls": {"insecure": True}}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}}},
    }


def back_config(port: int, out: Path) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "exporters": {"file": {"path": str(out), "format": "json", "flush_interval": "100ms"}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["file"]}}},
    }


def gputally_config(port: int, back_port: int) -> str:
    return yaml.safe_dump(
        {
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
            "processors": {
                "attributes/stage": {
                    "actions": [{"key": STAGE_KEY, "value": STAGE_VALUE, "action": "insert", "context": "resource"}]
                }
            },
            "exporters": {
                "otlp": {
                    "endpoint": f"127.0.0.1:{back_port}",
                    "tls": {"insecure": True},
                    "retry_on_failure": {"initial_interval": "50ms", "max_interval": "200ms"},
                }
            },
            "service": {
                "pipelines": {
                    "metrics": {"receivers": ["otlp"], "processors": ["attributes/stage"], "exporters": ["otlp"]}
                },
                "telemetry": {"metrics": {"address": None}},
                "shutdown_timeout": "2s",
            },
        }
    )


def _pb_attrs(attributes: Any) -> frozenset[tuple[str, str]]:
    return frozenset((kv.key, str(getattr(kv.value, kv.value.WhichOneof("value")))) for kv in attributes)


def _json_attrs(attributes: list[dict[str, Any]]) -> frozenset[tuple[str, str]]:
    return frozenset((kv["key"], str(next(iter(kv["value"].values())))) for kv in attributes)


def expected_points(request: ExportMetricsServiceRequest) -> Counter[Key]:
    points: Counter[Key] = Counter()
    for rm in request.resource_metrics:
        resource = _pb_attrs(rm.resource.attributes) | {(STAGE_KEY, STAGE_VALUE)}
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in getattr(metric, metric.WhichOneof("data")).data_points:
                    points[(resource, metric.name, _pb_attrs(point.attributes))] += 1
    return points


def exported_points(out: Path) -> Counter[Key]:
    """Every data point in the file exporter's JSON lines (one ExportMetricsServiceRequest a line)."""
    points: Counter[Key] = Counter()
    if not out.exists():
        return points
    for line in out.read_text().splitlines():
        if not line.strip():
            continue
        for rm in json.loads(line).get("resourceMetrics", []):
            resource = _json_attrs(rm.get("resource", {}).get("attributes", []))
            for sm in rm.get("scopeMetrics", []):
                for metric in sm.get("metrics", []):
                    for kind in ("gauge", "sum", "histogram", "exponentialHistogram", "summary"):
                        for point in metric.get(kind, {}).get("dataPoints", []):
                            points[(resource, metric["name"], _json_attrs(point.get("attributes", [])))] += 1
    return points


async def test_gputally_between_two_otelcols_keeps_every_point_once(
    otelcol: Callable[..., Otelcol], tmp_path: Path
) -> None:
    front_port, gputally_port, back_port = free_port(), free_port(), free_port()
    out = tmp_path / "back" / "metrics.json"
    request = gpu_node_request()
    expected = expected_points(request)
    assert sum(expected.values()) == 340 and set(expected.values()) == {1}

    back = otelcol(back_config(back_port, out), wait_for=back_port, name="back")
    service = Service(load_config(gputally_config(gputally_port, back_port)))
    await service.start()
    try:
        front = otelcol(front_config(front_port, gputally_port), wait_for=front_port, name="front")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front_port}") as channel:
            await channel.unary_unary(METRICS_EXPORT)(request.SerializeToString(), timeout=10)
        deadline = asyncio.get_running_loop().time() + 30
        while sum(exported_points(out).values()) < len(expected):
            assert asyncio.get_running_loop().time() < deadline, (
                f"{sum(exported_points(out).values())} of {len(expected)} points reached the file exporter\n"
                f"front log:\n{front.log_tail()}\nback log:\n{back.log_tail()}"
            )
            await asyncio.sleep(0.1)
        # Drain the whole chain (front first) before reading the final file: a late duplicate
        # (a retry after a lost ack) would show up as a count of 2.
        assert await asyncio.to_thread(front.stop) == 0, front.log_tail()
    finally:
        await service.shutdown()
    assert await asyncio.to_thread(back.stop) == 0, back.log_tail()

    got = exported_points(out)
    assert got == expected
    for key in got:
        assert (STAGE_KEY, STAGE_VALUE) in key[0]


def test_otelcol_validates_the_pipeline_stage_configs(otelcol_binary: Path, tmp_path: Path) -> None:
    for name, config in {
        "front": front_config(free_port(), free_port()),
        "back": back_config(free_port(), tmp_path / "metrics.json"),
    }.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        result = validate(otelcol_binary, path)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_otelcol_validate_rejects_a_broken_config(otelcol_binary: Path, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {}}}},
        "exporters": {"nosuch": {}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["nosuch"]}}},
    }))
    result = validate(otelcol_binary, path)
    assert result.returncode != 0
    assert "nosuch" in result.stderr
