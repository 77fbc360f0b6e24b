"""The ``bridge`` receiver: a real ``Service`` on loopback, called through the generated client.

Each call runs the named pipeline's processors and answers with the result; codes as in
``proto/bridge/README.md``; data processors create (``usage``'s counters) leaves through the
pipeline's exporters; config keeps holding processors and other receivers out.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from support.otlp import OtlpSink

from gputally.errors import ConfigError, Refused
from gputally.otlp.batch import Batch
from gputally.otlp.signals import Signal
from gputally.pipeline.component import ComponentContext
from gputally.pipeline.config import validate
from gputally.pipeline.registry import Registry
from gputally.pipeline.service import Service
from gputally.proto.bridge.v1 import bridge_pb2, bridge_pb2_grpc
from gputally.receiver.bridge import BridgeReceiver, BridgeReceiverConfig
from gputally.telemetry import SelfTelemetry
from tests.processors.usage.series import probe_requests, recording


def metrics_request(*names: str, attrs: dict[str, str] | None = None) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    resource_metrics = request.resource_metrics.add()
    for key, value in (attrs or {"hw.id": "GPU-1"}).items():
        attribute = resource_metrics.resource.attributes.add()
        attribute.key, attribute.value.string_value = key, value
    scope = resource_metrics.scope_metrics.add()
    for name in names:
        metric = scope.metrics.add()
        metric.name = name
        metric.gauge.data_points.add().as_double = 1.0
    return request


def resource_attributes(raw: bytes) -> dict[str, str]:
    request = ExportMetricsServiceRequest.FromString(raw)
    return {a.key: a.value.string_value for a in request.resource_metrics[0].resource.attributes}


def metric_names(raw: bytes) -> list[str]:
    request = ExportMetricsServiceRequest.FromString(raw)
    return [m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def config(port: int = 0, sink: OtlpSink | None = None, **extra: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "extensions": {"bearertokenauth": {"token": "s3cret"}},
        "receivers": {"bridge": {"endpoint": f"127.0.0.1:{port}"},
                      "bridge/auth": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}},
        "processors": {
            "attributes/cluster": {"actions": [{"key": "k8s.cluster.name", "value": "prod", "action": "insert",
                                                "context": "resource"}]},
            "filter/noisy": {"metrics": {"exclude": {"match_type": "strict", "metric_names": ["noisy"]}}},
        },
        "exporters": {"debug": {}},
        "service": {
            "pipelines": {
                "metrics/bridge": {"receivers": ["bridge", "bridge/auth"], "processors": ["attributes/cluster", "filter/noisy"],
                                   "exporters": ["debug"]},
                "logs/bridge": {"receivers": ["bridge"], "exporters": ["debug"]},
            },
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    }
    for key, value in extra.items():
        document[key] = {**document.get(key, {}), **value}
    return document


@pytest.fixture
async def bridge() -> AsyncIterator[tuple[Service, bridge_pb2_grpc.BridgeStub]]:
    service = Service(validate(config(), Registry.discover()))
    await service.start()
    channel = grpc.aio.insecure_channel(service.receivers["bridge"].listening()["grpc"])
    try:
        yield service, bridge_pb2_grpc.BridgeStub(channel)
    finally:
        await channel.close()
        await service.shutdown()


async def call_error(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def test_a_batch_comes_back_processed(bridge: tuple[Service, bridge_pb2_grpc.BridgeStub]) -> None:
    _, stub = bridge
    sent = metrics_request("hw.gpu.utilization", "noisy")
    answer = await stub.ProcessMetrics(bridge_pb2.ProcessMetricsRequest(otlp=sent.SerializeToString(),
                                                                        pipeline="metrics/bridge"))
    assert resource_attributes(answer.otlp) == {"hw.id": "GPU-1", "k8s.cluster.name": "prod"}
    assert metric_names(answer.otlp) == ["hw.gpu.utilization"]
    assert answer.dropped_items == 1 and "metrics/bridge dropped 1" in answer.error_message


async def test_a_pipeline_without_processors_answers_the_batch_as_it_came(
    bridge: tuple[Service, bridge_pb2_grpc.BridgeStub],
) -> None:
    _, stub = bridge
    sent = ExportLogsServiceRequest()
    record = sent.resource_logs.add().scope_logs.add().log_records.add()
    record.body.string_value = "GPU 3 fell off the bus"
    answer = await stub.ProcessLogs(bridge_pb2.ProcessLogsRequest(otlp=sent.SerializeToString(), pipeline="logs/bridge"))
    assert ExportLogsServiceRequest.FromString(answer.otlp) == sent
    assert (answer.dropped_items, answer.error_message) == (0, "")


async def test_a_batch_dropped_whole_comes_back_empty(bridge: tuple[Service, bridge_pb2_grpc.BridgeStub]) -> None:
    _, stub = bridge
    answer = await stub.ProcessMetrics(bridge_pb2.ProcessMetricsRequest(
        otlp=metrics_request("noisy", "noisy").SerializeToString(), pipeline="metrics/bridge"))
    assert metric_names(answer.otlp) == [] and answer.dropped_items == 2


@pytest.mark.parametrize(
    ("pipeline", "otlp", "code", "message"),
    [
        ("metrics/nope", b"", grpc.StatusCode.NOT_FOUND, "no pipeline 'metrics/nope' lists receiver bridge"),
        ("logs/bridge", b"", grpc.StatusCode.FAILED_PRECONDITION, "'logs/bridge' is a logs pipeline, not metrics"),
        ("", b"", grpc.StatusCode.INVALID_ARGUMENT, "pipeline: required"),
        ("metrics/bridge", b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, ""),
    ],
)
async def test_bad_calls_get_the_contracts_codes(
    bridge: tuple[Service, bridge_pb2_grpc.BridgeStub], pipeline: str, otlp: bytes, code: grpc.StatusCode, message: str,
) -> None:
    _, stub = bridge
    error = await call_error(stub.ProcessMetrics(bridge_pb2.ProcessMetricsRequest(otlp=otlp, pipeline=pipeline)))
    assert error.code() == code and message in (error.details() or "")


async def test_traces_are_unimplemented_without_a_traces_pipeline(
    bridge: tuple[Service, bridge_pb2_grpc.BridgeStub],
) -> None:
    _, stub = bridge
    error = await call_error(stub.ProcessTraces(bridge_pb2.ProcessTracesRequest(pipeline="traces/bridge")))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_the_token_is_required_where_auth_is_set(bridge: tuple[Service, bridge_pb2_grpc.BridgeStub]) -> None:
    service, _ = bridge
    address = service.receivers["bridge/auth"].listening()["grpc"]
    request = bridge_pb2.ProcessMetricsRequest(otlp=metrics_request("x").SerializeToString(), pipeline="metrics/bridge")
    async with grpc.aio.insecure_channel(address) as channel:
        stub = bridge_pb2_grpc.BridgeStub(channel)
        error = await call_error(stub.ProcessMetrics(request))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = await stub.ProcessMetrics(request, metadata=(("authorization", "Bearer s3cret"),))
        assert metric_names(answer.otlp) == ["x"]


class Pushback:
    """An in-line pipeline that refuses, as a memory_limiter short of memory does."""

    id = "metrics/bridge"
    signal = Signal.METRICS

    async def process(self, batch: Batch) -> Batch | None:
        raise Refused("memory limit reached", retry_after=2.5)


async def test_backpressure_is_resource_exhausted_with_retry_info() -> None:
    context = ComponentContext(id="bridge", telemetry=SelfTelemetry(), inline={"metrics/bridge": Pushback()})
    receiver = BridgeReceiver(BridgeReceiverConfig(endpoint="127.0.0.1:0"), context)
    await receiver.start()
    try:
        async with grpc.aio.insecure_channel(receiver.listening()["grpc"]) as channel:
            error = await call_error(bridge_pb2_grpc.BridgeStub(channel).ProcessMetrics(bridge_pb2.ProcessMetricsRequest(
                otlp=metrics_request("x").SerializeToString(), pipeline="metrics/bridge")))
    finally:
        await receiver.shutdown()
        await receiver.shutdown()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    details = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    (detail,) = status_pb2.Status.FromString(details).details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info) and info.retry_delay.ToNanoseconds() == 2_500_000_000


def test_a_bridge_pipeline_refuses_holding_processors_and_other_receivers() -> None:
    document = config(4320)
    document["receivers"]["otlp"] = {"protocols": {"grpc": None}}
    document["processors"]["batch"] = {}
    document["service"]["pipelines"]["metrics/bridge"] = {
        "receivers": ["bridge", "otlp"], "processors": ["attributes/cluster", "batch"], "exporters": ["debug"]}
    with pytest.raises(ConfigError) as caught:
        validate(document, Registry.discover())
    problems = "\n".join(caught.value.problems)
    assert ("service.pipelines.metrics/bridge.receivers: 'otlp' cannot share a pipeline with 'bridge', which answers "
            "its caller with the pipeline's output") in problems
    assert ("service.pipelines.metrics/bridge.processors[1]: 'batch' holds requests to release them later, so in a "
            "pipeline of 'bridge' its data would bypass the caller") in problems


async def test_usage_counters_leave_through_the_pipelines_exporters() -> None:
    """What ``usage`` creates is not the caller's batch: it goes to the pipeline's exporters,
    while each call is answered with the batch it sent."""
    sink = OtlpSink()
    await sink.start()
    document = {
        "receivers": {"bridge": {"endpoint": "127.0.0.1:0"}},
        "processors": {"usage": {"emit_interval": "200ms", "settle": 0}},
        "exporters": {"otlp": {"endpoint": sink.endpoint, "tls": {"insecure": True}}},
        "service": {"pipelines": {"metrics/bridge": {"receivers": ["bridge"], "processors": ["usage"],
                                                     "exporters": ["otlp"]}},
                    "telemetry": {"metrics": {"address": None}}, "shutdown_timeout": "2s"},
    }
    service = Service(validate(document, Registry.discover()))
    await service.start()
    requests = await probe_requests(recording(), base_ns=1_800_000_000 * 10**9)
    try:
        async with grpc.aio.insecure_channel(service.receivers["bridge"].listening()["grpc"]) as channel:
            stub = bridge_pb2_grpc.BridgeStub(channel)
            for request in requests:
                raw = request.SerializeToString()
                answer = await stub.ProcessMetrics(bridge_pb2.ProcessMetricsRequest(otlp=raw, pipeline="metrics/bridge"))
                assert answer.otlp == raw and answer.dropped_items == 0  # usage only reads
        for _ in range(100):
            emitted = [n for raw in sink.received["opentelemetry.proto.collector.metrics.v1.MetricsService"]
                       for n in metric_names(raw)]
            if any(n.startswith("gputally.usage.") for n in emitted):
                break
            await asyncio.sleep(0.05)
    finally:
        await service.shutdown()
        await sink.stop()
    assert any(n.startswith("gputally.usage.") for n in emitted), emitted
    assert not any(n.startswith("hw.") for n in emitted)  # the callers' batches were answered, not exported
