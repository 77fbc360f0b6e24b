"""Splicing attributes into an encoded request gives what merging them into the decoded one gives."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.otlp.splice import METRIC_KINDS, append_to_records, split
from tests.fuzz.strategies import REQUESTS

_POINTS = {
    "gauge": metrics_pb2.NumberDataPoint,
    "sum": metrics_pb2.NumberDataPoint,
    "histogram": metrics_pb2.HistogramDataPoint,
    "exponential_histogram": metrics_pb2.ExponentialHistogramDataPoint,
    "summary": metrics_pb2.SummaryDataPoint,
}
_RECORDS = {Signal.LOGS: LogRecord, Signal.TRACES: Span}
KV = KeyValue(key="added", value=AnyValue(string_value="v"))


def _blob(klass: type[Any]) -> bytes:
    return bytes(klass(attributes=[KV]).SerializeToString())


def _merged(signal: Signal, raw: bytes, kinds: frozenset[str]) -> Any:
    """The reference: the decoded request with the blob merged into each chosen record."""
    spec = SIGNALS[signal]
    message = spec.request.FromString(raw)
    for resource in getattr(message, spec.resource_field):
        for scope in getattr(resource, spec.scope_field):
            for record in getattr(scope, spec.record_field):
                if signal is not Signal.METRICS:
                    record.MergeFromString(_blob(_RECORDS[signal]))
                    continue
                kind = record.WhichOneof("data")
                if kind in kinds:
                    for point in getattr(record, kind).data_points:
                        point.MergeFromString(_blob(_POINTS[kind]))
    return message


@settings(max_examples=200, deadline=None)
@given(signal=st.sampled_from(list(Signal)), kinds=st.frozensets(st.sampled_from(METRIC_KINDS)), data=st.data())
def test_records_spliced_as_merged(signal: Signal, kinds: frozenset[str], data: st.DataObject) -> None:
    raw = data.draw(REQUESTS[signal.value]).SerializeToString()
    if signal is Signal.METRICS:
        blobs: dict[str | None, bytes] = {kind: _blob(_POINTS[kind]) for kind in kinds}
    else:
        blobs = {None: _blob(_RECORDS[signal])}
    spliced = SIGNALS[signal].request.FromString(append_to_records(signal, raw, blobs))
    assert spliced == _merged(signal, raw, kinds)


@settings(max_examples=100, deadline=None)
@given(signal=st.sampled_from(list(Signal)), data=st.data())
def test_resources_spliced_as_merged(signal: Signal, data: st.DataObject) -> None:
    spec = SIGNALS[signal]
    raw = data.draw(REQUESTS[signal.value]).SerializeToString()
    request = split(raw)
    for entry in request.entries:
        entry.resource = entry.resource + _blob(Resource)
    expected = spec.request.FromString(raw)
    for resource in getattr(expected, spec.resource_field):
        resource.resource.attributes.append(KV)
    assert spec.request.FromString(request.SerializeToString()) == expected


def test_nothing_to_append_keeps_the_bytes() -> None:
    request = SIGNALS[Signal.LOGS].request()
    request.resource_logs.add().scope_logs.add().log_records.add(body=AnyValue(string_value="x"))
    raw = request.SerializeToString()
    assert append_to_records(Signal.LOGS, raw, {}) == raw


def test_rewrite_replaces_the_encoding_and_drops_the_tree() -> None:
    request = SIGNALS[Signal.LOGS].request()
    request.resource_logs.add().scope_logs.add().log_records.add()
    batch = Batch(Signal.LOGS, message=request)
    spliced = append_to_records(Signal.LOGS, batch.serialize(), {None: _blob(LogRecord)})
    batch.rewrite(spliced)
    assert batch.serialize() == spliced and batch.items == 1
    assert batch.message.resource_logs[0].scope_logs[0].log_records[0].attributes == [KV]
