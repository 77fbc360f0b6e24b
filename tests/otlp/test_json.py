"""OTLP/JSON decoding and encoding: hex IDs, both key spellings, unknown fields."""

from __future__ import annotations

import json

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gputally.errors import InvalidRequest
from gputally.otlp import json as otlp_json
from tests.receiver.otlp.helpers import PARENT_ID, SPAN_ID, TRACE_ID, traces_request


def test_snake_case_keys_and_unknown_fields_are_accepted() -> None:
    body = json.dumps(
        {
            "resource_logs": [
                {
                    "scope_logs": [
                        {
                            "log_records": [
                                {"trace_id": TRACE_ID.hex().upper(), "span_id": SPAN_ID.hex(), "futureField": [1, 2]},
                            ]
                        }
                    ]
                }
            ],
            "alsoUnknown": {"traceId": TRACE_ID.hex(), "spanId": 5},
        }
    ).encode()

    message = otlp_json.decode(body, ExportLogsServiceRequest())

    record = message.resource_logs[0].scope_logs[0].log_records[0]
    assert (record.trace_id, record.span_id) == (TRACE_ID, SPAN_ID)


def test_attribute_named_like_an_id_is_left_alone() -> None:
    body = json.dumps(
        {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [
                            {"key": "traceId", "value": {"stringValue": "zz"}},
                        ]
                    }
                }
            ]
        }
    ).encode()

    message = otlp_json.decode(body, ExportTraceServiceRequest())

    assert message.resource_spans[0].resource.attributes[0].value.string_value == "zz"


def test_empty_ids_mean_unset() -> None:
    body = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "root", "parentSpanId": ""}]}]}]}'

    span = otlp_json.decode(body, ExportTraceServiceRequest()).resource_spans[0].scope_spans[0].spans[0]

    assert span.parent_span_id == b""


def test_encode_writes_hex_ids_and_integer_enums_and_round_trips() -> None:
    request = traces_request(1)
    request.resource_spans[0].scope_spans[0].spans[0].kind = 2

    data = json.loads(otlp_json.encode(request))

    span = data["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert (span["traceId"], span["spanId"], span["parentSpanId"]) == (TRACE_ID.hex(), SPAN_ID.hex(), PARENT_ID.hex())
    assert span["links"][0]["spanId"] == PARENT_ID.hex()
    assert span["kind"] == 2
    assert otlp_json.decode(otlp_json.encode(request), ExportTraceServiceRequest()) == request


@pytest.mark.parametrize("body", [b"\xff\xfe\x00", b"{" * 100_000, b'"text"', b'{"resourceSpans": {}}'])
def test_garbage_raises_invalid_request(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        otlp_json.decode(body, ExportTraceServiceRequest())
