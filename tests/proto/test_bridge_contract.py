"""The bridge API's generated stubs against the contract in proto/bridge/README.md.

The README is what the other side is implemented from, so its tables (methods, field numbers,
status codes) are read here and compared with the descriptors protoc generated: a change to
bridge.proto that the README does not follow, or the reverse, fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2

from gputally.proto.bridge.v1 import bridge_pb2, bridge_pb2_grpc

README = Path(__file__).resolve().parents[2] / "proto" / "bridge" / "README.md"
SERVICE = bridge_pb2.DESCRIPTOR.services_by_name["Bridge"]
OTLP_TYPES = {
    "ProcessMetrics": metrics_service_pb2.ExportMetricsServiceRequest,
    "ProcessLogs": logs_service_pb2.ExportLogsServiceRequest,
    "ProcessTraces": trace_service_pb2.ExportTraceServiceRequest,
}
TYPE_NAMES = {FieldDescriptor.TYPE_BYTES: "bytes", FieldDescriptor.TYPE_STRING: "string",
              FieldDescriptor.TYPE_INT64: "int64", FieldDescriptor.TYPE_BOOL: "bool", FieldDescriptor.TYPE_UINT32: "uint32",
              FieldDescriptor.TYPE_UINT64: "uint64", FieldDescriptor.TYPE_DOUBLE: "double"}


def type_name(field: FieldDescriptor) -> str:
    """As the README's Messages table writes a field's type: ``repeated KeyValue``, ``bool``..."""
    name = field.message_type.name if field.type == FieldDescriptor.TYPE_MESSAGE else TYPE_NAMES[field.type]
    return f"repeated {name}" if field.is_repeated else name


def table_rows(heading: str) -> list[list[str]]:
    """The body rows of the first table under ``## heading``, cells stripped of backticks."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under {heading}"
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_readme_names_the_service_and_package() -> None:
    assert bridge_pb2.DESCRIPTOR.package == "gputally.bridge.v1"
    assert SERVICE.full_name == "gputally.bridge.v1.Bridge"
    assert f"Service `{SERVICE.full_name}`" in README.read_text()


def test_methods_table_matches_the_service() -> None:
    documented = {(path, request, response) for path, request, response, _, _ in table_rows("Methods")}
    generated = {(f"/{SERVICE.full_name}/{m.name}", m.input_type.name, m.output_type.name) for m in SERVICE.methods}
    assert documented == generated
    for method in SERVICE.methods:
        assert not method.client_streaming and not method.server_streaming, method.name


def test_methods_table_names_each_signals_otlp_request() -> None:
    for path, _, _, otlp_type, _ in table_rows("Methods"):
        assert OTLP_TYPES[path.rsplit("/", 1)[1]].DESCRIPTOR.full_name == otlp_type


def test_fields_table_matches_every_message() -> None:
    documented = {(message, field, int(number), kind) for message, field, number, kind in table_rows("Messages")}
    generated = {
        (message.name, field.name, field.number, type_name(field))
        for message in bridge_pb2.DESCRIPTOR.message_types_by_name.values()
        for field in message.fields
    }
    assert documented == generated


def test_status_table_uses_real_grpc_codes() -> None:
    rows = table_rows("Status codes")
    assert {retry for *_, retry in rows} == {"permanent", "transient"}
    for code, *_ in rows:
        assert code in grpc.StatusCode.__members__, code
    assert "OK" not in {code for code, *_ in rows}


def metrics_request(value: float = 1.5) -> metrics_service_pb2.ExportMetricsServiceRequest:
    request = metrics_service_pb2.ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="gpu.utilization")
    metric.gauge.data_points.add(as_double=value, time_unix_nano=1_700_000_000_000_000_000)
    return request


def test_request_and_response_round_trip() -> None:
    otlp = metrics_request().SerializeToString()
    request = bridge_pb2.ProcessMetricsRequest(otlp=otlp, pipeline="metrics/bridge")
    decoded = bridge_pb2.ProcessMetricsRequest.FromString(request.SerializeToString())
    assert decoded.pipeline == "metrics/bridge"
    assert metrics_service_pb2.ExportMetricsServiceRequest.FromString(decoded.otlp) == metrics_request()

    response = bridge_pb2.ProcessTracesResponse(otlp=b"", dropped_items=7, error_message="filtered")
    decoded_response = bridge_pb2.ProcessTracesResponse.FromString(response.SerializeToString())
    assert (decoded_response.otlp, decoded_response.dropped_items, decoded_response.error_message) == (
        b"", 7, "filtered")


def test_patch_attributes_are_wire_identical_to_otlp_attributes() -> None:
    """A run of OTLP KeyValues (a Resource's ``attributes``) is an encoded ``Attributes``: each
    AnyValue kind reads back through the bridge's own KeyValue and encodes to the same bytes."""
    resource = resource_pb2.Resource()
    for key, value in (("s", common_pb2.AnyValue(string_value="x")), ("b", common_pb2.AnyValue(bool_value=True)),
                       ("i", common_pb2.AnyValue(int_value=-3)), ("d", common_pb2.AnyValue(double_value=0.5)),
                       ("raw", common_pb2.AnyValue(bytes_value=b"\x00")), ("empty", common_pb2.AnyValue())):
        resource.attributes.add(key=key).value.CopyFrom(value)
    nested = resource.attributes.add(key="nested")
    nested.value.kvlist_value.values.add(key="arr").value.array_value.values.add(int_value=1)
    wire = resource.SerializeToString()
    attributes = bridge_pb2.Attributes.FromString(wire)
    assert [kv.key for kv in attributes.set] == ["s", "b", "i", "d", "raw", "empty", "nested"]
    assert attributes.set[6].value.kvlist_value.values[0].value.array_value.values[0].int_value == 1
    assert attributes.SerializeToString() == wire


def _add_with_dependencies(pool: descriptor_pool.DescriptorPool, file: FileDescriptor) -> None:
    for dependency in file.dependencies:
        _add_with_dependencies(pool, dependency)
    try:
        pool.FindFileByName(file.name)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)


def test_bytes_payload_is_wire_identical_to_the_embedded_otlp_message() -> None:
    """The README lets a peer declare ``otlp`` as the OTLP message type itself: a request
    encoded with the bytes field decodes through such a declaration, and back."""
    pool = descriptor_pool.DescriptorPool()
    _add_with_dependencies(pool, metrics_service_pb2.DESCRIPTOR)
    embedding = descriptor_pb2.FileDescriptorProto(
        name="embedding.proto", package="embedding", syntax="proto3",
        dependency=[metrics_service_pb2.DESCRIPTOR.name])
    message = embedding.message_type.add(name="ProcessMetricsRequest")
    message.field.add(name="otlp", number=1, type=FieldDescriptor.TYPE_MESSAGE, label=FieldDescriptor.LABEL_OPTIONAL,
                      type_name=".opentelemetry.proto.collector.metrics.v1.ExportMetricsServiceRequest")
    message.field.add(name="pipeline", number=2, type=FieldDescriptor.TYPE_STRING,
                      label=FieldDescriptor.LABEL_OPTIONAL)
    pool.Add(embedding)
    embedded_class = message_factory.GetMessageClass(pool.FindMessageTypeByName("embedding.ProcessMetricsRequest"))

    wire = bridge_pb2.ProcessMetricsRequest(otlp=metrics_request(2.5).SerializeToString(),
                                            pipeline="metrics/bridge").SerializeToString()
    embedded = embedded_class.FromString(wire)
    assert embedded.pipeline == "metrics/bridge"
    assert embedded.otlp.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double == 2.5
    assert embedded.SerializeToString() == wire


#: One empty resource entry: the smallest non-empty OTLP export request of any signal.
ONE_EMPTY_RESOURCE = b"\x0a\x00"


class Echo(bridge_pb2_grpc.BridgeServicer):
    """Sends each batch back with one item counted as dropped; refuses unknown pipelines."""

    def _answer(self, request: Any, context: grpc.ServicerContext, response_type: Any) -> Any:
        if request.pipeline != "bridge":
            context.abort(grpc.StatusCode.NOT_FOUND, f"no pipeline {request.pipeline!r}")
        return response_type(otlp=request.otlp, dropped_items=1, error_message="one")

    def ProcessMetrics(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802 - the gRPC method's name
        return self._answer(request, context, bridge_pb2.ProcessMetricsResponse)

    def ProcessLogs(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._answer(request, context, bridge_pb2.ProcessLogsResponse)

    def ProcessTraces(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        return self._answer(request, context, bridge_pb2.ProcessTracesResponse)


@pytest.fixture
def channel() -> Iterator[grpc.Channel]:
    """A channel to an `Echo` bridge on a real loopback port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    bridge_pb2_grpc.add_BridgeServicer_to_server(Echo(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel
    server.stop(grace=None)


@pytest.mark.parametrize("signal", ["Metrics", "Logs", "Traces"])
def test_generated_service_serves_every_method(channel: grpc.Channel, signal: str) -> None:
    call = getattr(bridge_pb2_grpc.BridgeStub(channel), f"Process{signal}")
    request_type = getattr(bridge_pb2, f"Process{signal}Request")
    response = call(request_type(otlp=ONE_EMPTY_RESOURCE, pipeline="bridge"), timeout=10)
    assert (response.otlp, response.dropped_items, response.error_message) == (ONE_EMPTY_RESOURCE, 1, "one")

    with pytest.raises(grpc.RpcError) as refused:
        call(request_type(otlp=ONE_EMPTY_RESOURCE, pipeline="nope"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


def test_methods_are_served_at_the_documented_paths(channel: grpc.Channel) -> None:
    """A client that knows only the README's paths and field numbers reaches the servicer:
    the request is encoded by hand (field 1 bytes, field 2 string), the answer read raw."""
    request = b"\x0a" + bytes([len(ONE_EMPTY_RESOURCE)]) + ONE_EMPTY_RESOURCE + b"\x12\x06bridge"
    for path, *_ in table_rows("Methods"):
        raw = channel.unary_unary(path)(request, timeout=10)
        assert raw == b"\x0a\x02" + ONE_EMPTY_RESOURCE + b"\x10\x01" + b"\x1a\x03one", path
