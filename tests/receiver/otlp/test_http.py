"""OTLP/HTTP: protobuf and JSON exports, status codes (OTLP spec "OTLP/HTTP"), auth, limits."""

from __future__ import annotations

import gzip
import json
import logging
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2

from gputally.errors import Refused
from gputally.otlp.signals import SIGNALS, Signal
from tests.receiver.otlp.helpers import (
    PARENT_ID,
    REQUESTS,
    SPAN_ID,
    TOKEN,
    TRACE_ID,
    Env,
    StartReceiver,
    http_post,
    metrics_request,
    noncanonical,
)

HTTP_ONLY = {"protocols": {"http": {"endpoint": "127.0.0.1:0"}}}
PROTOBUF = "application/x-protobuf"
JSON = "application/json"

TRACE_HEX, SPAN_HEX, PARENT_HEX = TRACE_ID.hex(), SPAN_ID.hex(), PARENT_ID.hex()
JSON_REQUESTS: dict[Signal, tuple[dict[str, Any], int]] = {
    Signal.METRICS: (
        {
            "resourceMetrics": [
                {
                    "resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "node-1"}}]},
                    "scopeMetrics": [
                        {
                            "metrics": [
                                {
                                    "name": "gpu.utilization",
                                    "unknownFieldFromTheFuture": {"x": 1},
                                    "sum": {
                                        "aggregationTemporality": 2,
                                        "isMonotonic": True,
                                        "dataPoints": [
                                            {
                                                "asInt": "5",
                                                "timeUnixNano": "1700000000000000000",
                                                "exemplars": [
                                                    {"asDouble": 1.5, "traceId": TRACE_HEX, "spanId": SPAN_HEX}
                                                ],
                                            },
                                            {"asInt": 7},
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ]
        },
        2,
    ),
    Signal.LOGS: (
        {
            "resourceLogs": [
                {
                    "scopeLogs": [
                        {
                            "logRecords": [
                                {
                                    "body": {"stringValue": "hello"},
                                    "traceId": TRACE_HEX,
                                    "spanId": SPAN_HEX,
                                    "severityNumber": 9,
                                },
                            ]
                        }
                    ]
                }
            ]
        },
        1,
    ),
    Signal.TRACES: (
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "name": "step",
                                    "kind": 2,
                                    "traceId": TRACE_HEX,
                                    "spanId": SPAN_HEX,
                                    "parentSpanId": PARENT_HEX,
                                    "links": [{"traceId": TRACE_HEX, "spanId": PARENT_HEX}],
                                }
                            ]
                        }
                    ]
                }
            ]
        },
        1,
    ),
}


def _ids(signal: Signal, message: Any) -> list[bytes]:
    """Every ID field of the one record in a JSON_REQUESTS request, as parsed."""
    if signal is Signal.METRICS:
        exemplar = message.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0].exemplars[0]
        return [exemplar.trace_id, exemplar.span_id]
    if signal is Signal.LOGS:
        record = message.resource_logs[0].scope_logs[0].log_records[0]
        return [record.trace_id, record.span_id]
    span = message.resource_spans[0].scope_spans[0].spans[0]
    return [span.trace_id, span.span_id, span.parent_span_id, span.links[0].trace_id, span.links[0].span_id]


EXPECTED_IDS = {
    Signal.METRICS: [TRACE_ID, SPAN_ID],
    Signal.LOGS: [TRACE_ID, SPAN_ID],
    Signal.TRACES: [TRACE_ID, SPAN_ID, PARENT_ID, TRACE_ID, PARENT_ID],
}


def _status(result_body: bytes, content_type: str) -> status_pb2.Status:
    status = status_pb2.Status()
    if content_type == JSON:
        json_format.Parse(result_body, status)
    else:
        status.ParseFromString(result_body)
    return status


@pytest.mark.parametrize("signal", list(Signal))
async def test_protobuf_export_forwards_the_received_bytes(
    env: Env, start_receiver: StartReceiver, signal: Signal
) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    build, items = REQUESTS[signal]
    body = noncanonical(build())

    result = await http_post(receiver.http_address, f"/v1/{signal}", body)

    assert result.status == 200
    assert result.headers["Content-Type"] == PROTOBUF
    assert SIGNALS[signal].response.FromString(result.body) == SIGNALS[signal].response()
    assert env.consumers[signal].raw == [body]
    assert env.count("accepted", "http", signal) == items


@pytest.mark.parametrize("signal", list(Signal))
async def test_json_export_with_hex_ids(env: Env, start_receiver: StartReceiver, signal: Signal) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    request, items = JSON_REQUESTS[signal]

    result = await http_post(receiver.http_address, f"/v1/{signal}", json.dumps(request).encode(), content_type=JSON)

    assert result.status == 200, result.body
    assert result.headers["Content-Type"] == JSON
    assert json.loads(result.body) == {}
    (batch,) = env.consumers[signal].batches
    assert _ids(signal, batch.message) == EXPECTED_IDS[signal]
    assert batch.items == items
    assert env.count("accepted", "http", signal) == items


@pytest.mark.parametrize("content_type", [PROTOBUF, JSON])
async def test_gzip_bodies_are_inflated(env: Env, start_receiver: StartReceiver, content_type: str) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    request = metrics_request(4)
    plain = request.SerializeToString() if content_type == PROTOBUF else json_format.MessageToJson(request).encode()

    result = await http_post(
        receiver.http_address,
        "/v1/metrics",
        gzip.compress(plain),
        content_type=content_type,
        headers={"Content-Encoding": "gzip"},
    )

    assert result.status == 200, result.body
    (batch,) = env.consumers[Signal.METRICS].batches
    assert batch.message == request


async def test_deflate_and_multi_member_gzip(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    first, second = metrics_request(1).SerializeToString(), metrics_request(2).SerializeToString()

    deflated = await http_post(
        receiver.http_address, "/v1/metrics", zlib.compress(first), headers={"Content-Encoding": "deflate"}
    )
    members = await http_post(
        receiver.http_address,
        "/v1/metrics",
        gzip.compress(first) + gzip.compress(second),
        headers={"Content-Encoding": "gzip"},
    )

    assert (deflated.status, members.status) == (200, 200)
    assert env.consumers[Signal.METRICS].raw == [first, first + second]


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        (PROTOBUF, b"\x0a\xff\xff\xff\xff"),
        (JSON, b'{"resourceMetrics": '),
        (JSON, b'{"resourceLogs": [{"scopeLogs": 3}]}'),
        (JSON, b"[1, 2]"),
    ],
    ids=["protobuf", "json-syntax", "json-shape", "json-not-object"],
)
async def test_undecodable_body_is_400_and_the_server_goes_on(
    env: Env, start_receiver: StartReceiver, content_type: str, body: bytes
) -> None:
    receiver = await start_receiver(HTTP_ONLY)

    bad = await http_post(receiver.http_address, "/v1/logs", body, content_type=content_type)
    good = await http_post(receiver.http_address, "/v1/logs", REQUESTS[Signal.LOGS][0]().SerializeToString())

    assert bad.status == 400
    assert bad.headers["Content-Type"] == content_type
    status = _status(bad.body, content_type)
    assert status.code == code_pb2.INVALID_ARGUMENT and status.message
    assert env.count("refused", "http", Signal.LOGS, "invalid") == 0
    assert good.status == 200
    assert len(env.consumers[Signal.LOGS].batches) == 1


@pytest.mark.parametrize("trace_id", ["not-hex", "5b8e"], ids=["not-hex", "wrong-length"])
async def test_bad_hex_id_in_json_is_400(start_receiver: StartReceiver, trace_id: str) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x", "traceId": trace_id}]}]}]}

    result = await http_post(receiver.http_address, "/v1/traces", json.dumps(request).encode(), content_type=JSON)

    assert result.status == 400
    assert "traceId" in _status(result.body, JSON).message


async def test_truncated_gzip_is_400(start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    squeezed = gzip.compress(metrics_request().SerializeToString())

    result = await http_post(receiver.http_address, "/v1/metrics", squeezed[:-12], headers={"Content-Encoding": "gzip"})

    assert result.status == 400
    assert "truncated" in _status(result.body, PROTOBUF).message


LIMIT = 1000
SMALL = {"protocols": {"http": {"endpoint": "127.0.0.1:0", "max_request_body_size": LIMIT}}}


@pytest.mark.parametrize(
    ("body", "encoding"),
    [
        (b"\x00" * (LIMIT + 1), None),
        (gzip.compress(b"\x00" * (LIMIT + 1)), "gzip"),  # small when sent, too large inflated
    ],
    ids=["plain", "inflated"],
)
async def test_body_over_the_limit_is_413(
    env: Env, start_receiver: StartReceiver, body: bytes, encoding: str | None
) -> None:
    receiver = await start_receiver(SMALL)
    headers = {"Content-Encoding": encoding} if encoding else {}

    result = await http_post(receiver.http_address, "/v1/metrics", body, headers=headers)

    assert result.status == 413
    assert f"{LIMIT} bytes" in _status(result.body, PROTOBUF).message
    assert env.count("refused", "http", Signal.METRICS, "too_large") == 0
    assert env.consumers[Signal.METRICS].batches == []


async def test_chunked_body_over_the_limit_is_413(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(SMALL)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"\x00" * (LIMIT // 2)

    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://{receiver.http_address}/v1/metrics", data=chunks(), headers={"Content-Type": PROTOBUF}
        ) as response,
    ):
        status, body = response.status, await response.read()

    assert status == 413
    assert f"{LIMIT} bytes" in _status(body, PROTOBUF).message
    assert env.consumers[Signal.METRICS].batches == []


async def test_zip_bomb_is_refused_without_inflating_it(start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(
        {"protocols": {"http": {"endpoint": "127.0.0.1:0", "max_request_body_size": 1_000_000}}}
    )
    bomb = gzip.compress(b"\x00" * 50_000_000)  # 50 MB from about 50 KB
    assert len(bomb) < 1_000_000

    tracemalloc.start()
    try:
        result = await http_post(receiver.http_address, "/v1/metrics", bomb, headers={"Content-Encoding": "gzip"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert result.status == 413
    assert peak < 5_000_000  # the server (same process) inflated at most about the limit


async def test_body_at_the_limit_is_accepted(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(SMALL)
    request = metrics_request(1)
    pad = LIMIT - request.ByteSize() - 3
    while request.ByteSize() != LIMIT:  # length prefixes grow with the padding
        request.resource_metrics[0].schema_url = "x" * pad
        pad -= 1
    body = request.SerializeToString()
    assert len(body) == LIMIT

    plain = await http_post(receiver.http_address, "/v1/metrics", body)
    squeezed = await http_post(
        receiver.http_address, "/v1/metrics", gzip.compress(body), headers={"Content-Encoding": "gzip"}
    )

    assert (plain.status, squeezed.status) == (200, 200)


@pytest.mark.parametrize(("retry_after", "header"), [(2.1, "3"), (1.0, "1")])
async def test_backpressure_is_429_with_retry_after(
    env: Env, start_receiver: StartReceiver, retry_after: float, header: str
) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    env.consumers[Signal.METRICS].error = Refused("memory limit reached", retry_after=retry_after)

    result = await http_post(receiver.http_address, "/v1/metrics", metrics_request(3).SerializeToString())

    assert result.status == 429
    assert result.headers["Retry-After"] == header
    status = _status(result.body, PROTOBUF)
    assert status.code == code_pb2.RESOURCE_EXHAUSTED and status.message == "memory limit reached"
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info)
    assert info.retry_delay.ToNanoseconds() == round(retry_after * 1e9)
    assert env.count("refused", "http", Signal.METRICS, "backpressure") == 3


async def test_unexpected_error_is_500(
    env: Env, start_receiver: StartReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    env.consumers[Signal.METRICS].error = KeyError("bug")

    with caplog.at_level(logging.ERROR):
        result = await http_post(
            receiver.http_address,
            "/v1/metrics",
            json_format.MessageToJson(metrics_request(2)).encode(),
            content_type=JSON,
        )

    assert result.status == 500
    assert _status(result.body, JSON).code == code_pb2.INTERNAL
    assert len([r for r in caplog.records if r.exc_info]) == 1
    assert env.count("refused", "http", Signal.METRICS, "internal") == 2


async def test_partial_success_in_json(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(HTTP_ONLY)
    body = json_format.MessageToJson(metrics_request(3, nameless=2)).encode()

    result = await http_post(receiver.http_address, "/v1/metrics", body, content_type=JSON)

    assert result.status == 200
    partial = json.loads(result.body)["partialSuccess"]
    assert int(partial["rejectedDataPoints"]) == 2 and "name" in partial["errorMessage"]
    assert env.count("accepted", "http", Signal.METRICS) == 3
    assert env.count("rejected", "http", Signal.METRICS) == 2


@pytest.mark.parametrize(
    ("authorization", "status"),
    [(f"Bearer {TOKEN}", 200), (None, 401), ("Bearer nope", 401), (f"Basic {TOKEN}", 401)],
    ids=["right-token", "no-token", "wrong-token", "wrong-scheme"],
)
async def test_bearer_token_auth(
    env: Env, start_receiver: StartReceiver, authorization: str | None, status: int
) -> None:
    receiver = await start_receiver(
        {"protocols": {"http": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}}}
    )
    headers = {"Authorization": authorization} if authorization else {}

    result = await http_post(
        receiver.http_address, "/v1/metrics", metrics_request().SerializeToString(), headers=headers
    )

    assert result.status == status
    if status == 401:
        assert result.headers["WWW-Authenticate"] == "Bearer"
        assert _status(result.body, PROTOBUF).code == code_pb2.UNAUTHENTICATED
        assert env.count("refused", "http", Signal.METRICS, "unauthenticated") == 0
    assert len(env.consumers[Signal.METRICS].batches) == (status == 200)


@pytest.mark.parametrize(
    ("headers", "content_type"),
    [({}, "text/plain"), ({}, "application/octet-stream"), ({"Content-Encoding": "br"}, PROTOBUF)],
    ids=["text", "octet-stream", "brotli"],
)
async def test_unsupported_content_type_or_coding_is_415(
    env: Env, start_receiver: StartReceiver, headers: dict[str, str], content_type: str
) -> None:
    receiver = await start_receiver(HTTP_ONLY)

    result = await http_post(
        receiver.http_address,
        "/v1/metrics",
        metrics_request().SerializeToString(),
        content_type=content_type,
        headers=headers,
    )

    assert result.status == 415
    assert env.count("refused", "http", Signal.METRICS, "invalid") == 0
    assert env.consumers[Signal.METRICS].batches == []


async def test_wrong_method_and_unknown_paths(start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(HTTP_ONLY, signals=[Signal.METRICS])
    body = metrics_request().SerializeToString()

    get = await http_post(receiver.http_address, "/v1/metrics", b"", method="GET")
    unknown = await http_post(receiver.http_address, "/v1/profiles", body)
    no_pipeline = await http_post(receiver.http_address, "/v1/logs", body)

    assert get.status == 405
    assert unknown.status == 404
    assert no_pipeline.status == 404
