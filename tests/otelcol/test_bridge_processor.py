"""The test otelcol carries gputally's bridge processor (collector/gputallyprocessor, built in
by tests/harness/otelcol/build.sh), and the real binary talks to a bridge server written with
the Python stubs of proto/bridge: the two sides of the contract meet here."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from harness.otelcol.collector import Otelcol, validate
from harness.processes import free_port
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.proto.bridge.v1 import bridge_pb2, bridge_pb2_grpc
from support.otlp import OtlpSink
from tests.otelcol.shapes import METRICS_EXPORT


def test_the_test_otelcol_lists_the_gputally_processor(otelcol_binary: Path) -> None:
    result = subprocess.run([str(otelcol_binary), "components"], capture_output=True, text=True, timeout=60,
                            check=True)
    processors = {entry["name"]: entry for entry in yaml.safe_load(result.stdout)["processors"]}
    assert "gputally" in processors, sorted(processors)
    stability = processors["gputally"]["stability"]
    assert {signal: stability[signal] for signal in ("metrics", "logs", "traces")} == {
        "metrics": "Alpha", "logs": "Alpha", "traces": "Alpha"}


def bridge_config(bridge_port: int, front_port: int, sink: str, **processor: Any) -> dict[str, Any]:
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{front_port}"}}}},
        "processors": {"gputally": {"endpoint": f"127.0.0.1:{bridge_port}", "tls": {"insecure": True},
                                    "pipeline": "metrics/bridge", **processor}},
        "exporters": {"otlp": {"endpoint": sink, "tls": {"insecure": True}, "retry_on_failure": {"enabled": False}}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["gputally"],
                                              "exporters": ["otlp"]}}},
    }


def test_otelcol_validates_the_processor_config(otelcol_binary: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(bridge_config(free_port(), free_port(), "127.0.0.1:4317", on_error="fail")))
    result = validate(otelcol_binary, good)
    assert result.returncode == 0, result.stderr

    bad_config = bridge_config(free_port(), free_port(), "127.0.0.1:4317", on_error="retry", timeout="0s")
    del bad_config["processors"]["gputally"]["pipeline"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bad_config))
    result = validate(otelcol_binary, bad)
    assert result.returncode != 0
    for message in ("pipeline: required", 'on_error: must be pass, drop or fail, got "retry"',
                    "timeout: must be positive"):
        assert message in result.stderr, result.stderr


class Bridge(bridge_pb2_grpc.BridgeServicer):
    """A bridge server as the contract describes one: labels every resource with a pod, or
    refuses every call with ``refuse``."""

    def __init__(self) -> None:
        self.pipelines: list[str] = []
        self.refuse: grpc.StatusCode | None = None

    async def ProcessMetrics(  # noqa: N802 - the gRPC method's name
        self, request: bridge_pb2.ProcessMetricsRequest, context: grpc.aio.ServicerContext
    ) -> bridge_pb2.ProcessMetricsResponse:
        self.pipelines.append(request.pipeline)
        if self.refuse is not None:
            await context.abort(self.refuse, f"refused by the test: {request.pipeline}")
        batch = ExportMetricsServiceRequest.FromString(request.otlp)
        for rm in batch.resource_metrics:
            attribute = rm.resource.attributes.add(key="k8s.pod.name")
            attribute.value.string_value = "trainer-0"
        return bridge_pb2.ProcessMetricsResponse(otlp=batch.SerializeToString())


@pytest.fixture
async def bridge() -> AsyncIterator[tuple[Bridge, int]]:
    servicer, port = Bridge(), free_port()
    limits = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    server = grpc.aio.server(options=limits)
    bridge_pb2_grpc.add_BridgeServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    yield servicer, port
    await server.stop(None)


def metrics_request() -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    attribute = rm.resource.attributes.add(key="host.name")
    attribute.value.string_value = "gpu-node-1"
    metric = rm.scope_metrics.add().metrics.add(name="gpu.utilization")
    metric.gauge.data_points.add(as_double=0.87, time_unix_nano=1_700_000_000_000_000_000)
    return request


async def test_otelcol_sends_batches_through_a_python_bridge(
    otelcol: Callable[..., Otelcol], otlp_sink: OtlpSink, bridge: tuple[Bridge, int],
) -> None:
    servicer, bridge_port = bridge
    front_port = free_port()
    otelcol(bridge_config(bridge_port, front_port, otlp_sink.endpoint, on_error="fail"), wait_for=front_port)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{front_port}") as channel:
        export = channel.unary_unary(METRICS_EXPORT)
        await export(metrics_request().SerializeToString(), timeout=10)
        await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) == 1)
        (delivered,) = otlp_sink.messages()
        attributes = {kv.key: kv.value.string_value for kv in delivered.resource_metrics[0].resource.attributes}
        assert attributes == {"host.name": "gpu-node-1", "k8s.pod.name": "trainer-0"}
        assert servicer.pipelines == ["metrics/bridge"]

        # Under on_error: fail the bridge's status reaches the sender: the otlp receiver
        # answers with the code it carries (NOT_FOUND: not retryable by OTLP's rules).
        servicer.refuse = grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(metrics_request().SerializeToString(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
        assert 'gputally ProcessMetrics (pipeline "metrics/bridge")' in (refused.value.details() or "")
        assert len(otlp_sink.received_metrics()) == 1
