"""OTLP protobuf and JSON requests, well-formed and damaged, through the receiver into a pipeline.

In process, each case runs the HTTP receiver's own body path (inflate, decode, the JSON enum
check) and the intake into a real pipeline (``attributes``, ``filter``, ``batch``). Against
real servers, fewer cases go over HTTP and gRPC to a running receiver. The answer must always
be "accepted" or "your request is invalid" (400/413/415, INVALID_ARGUMENT), never an internal
error, and an accepted request's point count must match what the decoded message holds.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputally.errors import InvalidRequest
from gputally.otlp import json as otlp_json
from gputally.otlp.batch import Batch, Signal
from gputally.otlp.known import CheckedShapes
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.pipeline.pipeline import Pipeline, Stage
from gputally.pipeline.registry import Registry
from gputally.receiver.otlp import OTLPReceiver, factory
from gputally.receiver.otlp.http_server import Encoding, _decode, inflate
from gputally.receiver.otlp.intake import Intake
from gputally.receiver.otlp.status import Failure, Reason
from gputally.telemetry import SelfTelemetry
from tests.fuzz.budget import bounded_memory, case, fuzz_settings
from tests.fuzz.strategies import REQUESTS, bent, damaged, json_bytes

LIMIT = 1 << 20
OTLP_KEYS = st.sampled_from([
    "resourceMetrics", "scopeMetrics", "metrics", "name", "gauge", "sum", "histogram", "dataPoints", "asInt",
    "asDouble", "timeUnixNano", "aggregationTemporality", "isMonotonic", "resourceLogs", "scopeLogs", "logRecords",
    "severityNumber", "body", "resourceSpans", "scopeSpans", "spans", "traceId", "spanId", "parentSpanId", "kind",
    "status", "code", "attributes", "key", "value", "stringValue", "intValue", "arrayValue", "kvlistValue",
    "values", "bytesValue", "resource", "scope", "exemplars", "bucketCounts", "explicitBounds", "flags",
])
SIGNALS = st.sampled_from(list(Signal))


class Keep(Exporter):
    def __init__(self) -> None:
        self.items = 0

    async def export(self, batch: Batch) -> None:
        self.items += batch.items


def pipelines(telemetry: SelfTelemetry) -> dict[Signal, Pipeline]:
    registry = Registry.discover()
    context = ComponentContext(id="fuzz", telemetry=telemetry)
    sections = {
        "attributes": {"actions": [{"key": "fuzz", "value": 1, "action": "upsert"},
                                   {"key": "host.name", "action": "delete", "context": "resource"}]},
        "filter": {"metrics": {"exclude": {"match_type": "regexp", "metric_names": ["^DCGM_"]}},
                   "logs": {"exclude": {"match_type": "strict", "record_attributes": [{"key": "gpu"}]}},
                   "spans": {"exclude": {"match_type": "regexp", "span_names": ["x+"]}}},
        "batch": {"send_batch_size": 0, "timeout": 0},
    }
    built = {}
    for signal in Signal:
        stages = []
        for kind, section in sections.items():
            factory_ = registry.processors[kind]
            stages.append(Stage(kind, factory_.create(factory_.parse(section), context, signal),
                                telemetry.for_processor(kind)))
        built[signal] = Pipeline(str(signal), signal, stages, [("keep", Keep())], registry=telemetry.registry)
    return built


def points_in(message: Any) -> int:
    """Data points, log records or spans, counted by walking the decoded message (the oracle)."""
    total = 0
    for rm in getattr(message, "resource_metrics", ()):
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                total += len(getattr(metric, kind).data_points) if kind else 0
    for rl in getattr(message, "resource_logs", ()):
        total += sum(len(sl.log_records) for sl in rl.scope_logs)
    for rs in getattr(message, "resource_spans", ()):
        total += sum(len(ss.spans) for ss in rs.scope_spans)
    return total


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def intake() -> Intake:
    telemetry = SelfTelemetry()
    # Checked shapes on: the fuzzer's requests repeat and vary, some through a learned shape.
    return Intake(name="fuzz", consumers=pipelines(telemetry), metrics=telemetry.for_receiver("fuzz", "http"), auth=None,
                  checked=CheckedShapes())


def deliver(loop: asyncio.AbstractEventLoop, intake: Intake, signal: Signal, body: bytes, encoding: Encoding,
            coding: str) -> Any:
    """What the HTTP handler does with a body it has read: inflate, decode, consume."""
    if coding != "identity":
        try:
            inflated = inflate(body, {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS}[coding], LIMIT)
        except InvalidRequest:
            return "invalid"
        if inflated is None:
            return "too_large"
        body = inflated
    decoded: list[Batch] = []

    def decode() -> Batch:
        decoded.append(_decode(intake, signal, body, encoding))
        return decoded[-1]

    outcome = loop.run_until_complete(intake.deliver(signal, decode))
    if isinstance(outcome, Failure):
        assert outcome.reason in (Reason.INVALID, Reason.TOO_LARGE), f"{outcome.reason}: {outcome.message}"
        return outcome.reason.value
    batch = decoded[0]
    # The census (C speed, on bytes) and the decoded message agree on the items.
    assert batch.items == points_in(batch.message), (batch.items, points_in(batch.message))
    return "accepted"


@st.composite
def compressed(draw: st.DrawFn, raw: bytes) -> tuple[bytes, str]:
    coding = draw(st.sampled_from(["identity", "identity", "gzip", "deflate"]))
    if coding == "gzip":
        raw = draw(damaged(gzip.compress(raw)))
    elif coding == "deflate":
        raw = draw(damaged(zlib.compress(raw)))
    return raw, coding


def test_protobuf_requests(loop: asyncio.AbstractEventLoop, intake: Intake) -> None:
    @fuzz_settings("otlp_protobuf")
    @given(signal=SIGNALS, data=st.data())
    def one(signal: Signal, data: st.DataObject) -> None:
        with case("otlp_protobuf"):
            message = data.draw(REQUESTS[signal.value])
            raw = data.draw(damaged(message.SerializeToString()))
            body, coding = data.draw(compressed(raw))
            deliver(loop, intake, signal, body, Encoding.PROTOBUF, coding)

    with bounded_memory("otlp_protobuf"):
        one()


def test_json_requests(loop: asyncio.AbstractEventLoop, intake: Intake) -> None:
    @fuzz_settings("otlp_json")
    @given(signal=SIGNALS, data=st.data())
    def one(signal: Signal, data: st.DataObject) -> None:
        with case("otlp_json"):
            message = data.draw(REQUESTS[signal.value])
            tree = data.draw(bent(json.loads(otlp_json.encode(message)), keys=OTLP_KEYS))
            body = data.draw(damaged(json_bytes(tree))) if data.draw(st.integers(0, 4)) == 0 else json_bytes(tree)
            body, coding = data.draw(compressed(body))
            deliver(loop, intake, signal, body, Encoding.JSON, coding)

    with bounded_memory("otlp_json"):
        one()


# -- real servers ------------------------------------------------------------------------------


class Running:
    """A receiver (both transports) with the fuzz pipelines, served from a thread of its own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz receiver", daemon=True)
        self.thread.start()
        telemetry = SelfTelemetry()
        config = factory.parse({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 1},
                                              "http": {"endpoint": "127.0.0.1:0", "max_request_body_size": LIMIT}}})

        async def start() -> OTLPReceiver:
            receiver = OTLPReceiver(config, ComponentContext(id="otlp", telemetry=telemetry), pipelines(telemetry))
            await receiver.start()
            return receiver

        self.receiver = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.receiver.shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def running() -> Iterator[Running]:
    server = Running()
    yield server
    server.stop()


def test_http_server(running: Running) -> None:
    host, _, port = str(running.receiver.http_address).rpartition(":")

    @fuzz_settings("otlp_http_server")
    @given(signal=SIGNALS, json_encoded=st.booleans(), data=st.data())
    def one(signal: Signal, json_encoded: bool, data: st.DataObject) -> None:
        with case("otlp_http_server"):
            message = data.draw(REQUESTS[signal.value])
            raw = otlp_json.encode(message) if json_encoded else message.SerializeToString()
            body, coding = data.draw(compressed(data.draw(damaged(raw))))
            headers = {"Content-Type": "application/json" if json_encoded else "application/x-protobuf"}
            if coding != "identity":
                headers["Content-Encoding"] = coding
            connection = http.client.HTTPConnection(host, int(port), timeout=10)
            try:
                connection.request("POST", f"/v1/{signal}", body=body, headers=headers)
                status = connection.getresponse().status
            finally:
                connection.close()
            assert status in (200, 400, 413, 415), status

    with bounded_memory("otlp_http_server"):
        one()


def test_grpc_server(running: Running) -> None:
    services = {Signal.METRICS: "metrics.v1.MetricsService", Signal.LOGS: "logs.v1.LogsService",
                Signal.TRACES: "trace.v1.TraceService"}
    channel = grpc.insecure_channel(str(running.receiver.grpc_address))

    @fuzz_settings("otlp_grpc_server")
    @given(signal=SIGNALS, data=st.data())
    def one(signal: Signal, data: st.DataObject) -> None:
        with case("otlp_grpc_server"):
            raw = data.draw(damaged(data.draw(REQUESTS[signal.value]).SerializeToString()))
            call = channel.unary_unary(f"/opentelemetry.proto.collector.{services[signal]}/Export")
            try:
                call(raw, timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.INVALID_ARGUMENT, f"{exc.code()}: {exc.details()}"

    try:
        with bounded_memory("otlp_grpc_server"):
            one()
    finally:
        channel.close()
