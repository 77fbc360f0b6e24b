"""OTLP/gRPC: exports, status codes (OTLP spec "Failures"), auth and self-metrics."""

from __future__ import annotations

import logging

import grpc
import pytest
from google.rpc import error_details_pb2

from gputally.errors import InvalidRequest, Refused
from gputally.otlp.batch import Signal
from tests.receiver.otlp.helpers import (
    REQUESTS,
    TOKEN,
    Env,
    StartReceiver,
    grpc_export,
    metrics_request,
    noncanonical,
)

GRPC_ONLY = {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}


@pytest.mark.parametrize("signal", list(Signal))
async def test_export_forwards_the_received_bytes(env: Env, start_receiver: StartReceiver, signal: Signal) -> None:
    receiver = await start_receiver(GRPC_ONLY)
    build, items = REQUESTS[signal]
    body = noncanonical(build())

    result = await grpc_export(receiver.grpc_address, signal, body)

    assert result.code == grpc.StatusCode.OK
    assert not result.response.HasField("partial_success")
    assert env.consumers[signal].raw == [body]
    assert env.count("accepted", "grpc", signal) == items
    assert env.count("rejected", "grpc", signal) == 0


async def test_gzip_compressed_requests_are_accepted(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(GRPC_ONLY)
    body = metrics_request(50).SerializeToString()

    result = await grpc_export(receiver.grpc_address, Signal.METRICS, body, compression=grpc.Compression.Gzip)

    assert result.code == grpc.StatusCode.OK
    assert env.consumers[Signal.METRICS].raw == [body]


async def test_undecodable_request_is_invalid_argument_and_the_server_goes_on(
    env: Env, start_receiver: StartReceiver
) -> None:
    receiver = await start_receiver(GRPC_ONLY)

    bad = await grpc_export(receiver.grpc_address, Signal.METRICS, b"\x0a\xff\xff\xff\xff")
    good = await grpc_export(receiver.grpc_address, Signal.METRICS, metrics_request().SerializeToString())

    assert bad.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "cannot decode" in bad.details
    assert env.count("refused", "grpc", Signal.METRICS, "invalid") == 0  # recorded, no items known
    assert good.code == grpc.StatusCode.OK
    assert len(env.consumers[Signal.METRICS].batches) == 1


async def test_request_over_the_limit_is_invalid_argument(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 1}}})
    limit = 1024 * 1024

    over = await grpc_export(receiver.grpc_address, Signal.METRICS, b"\x00" * (limit + 1))

    assert over.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"{limit + 1} bytes" in over.details and f"{limit} bytes" in over.details
    assert env.count("refused", "grpc", Signal.METRICS, "too_large") == 0
    assert env.consumers[Signal.METRICS].batches == []


async def test_request_over_four_times_the_limit_is_refused_by_grpc_core(start_receiver: StartReceiver) -> None:
    receiver = await start_receiver({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 1}}})

    result = await grpc_export(receiver.grpc_address, Signal.METRICS, b"\x00" * (4 * 1024 * 1024 + 1))

    assert result.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert result.status is None  # no RetryInfo: OTLP clients do not retry it


async def test_compressed_request_is_limited_after_decompression(start_receiver: StartReceiver) -> None:
    receiver = await start_receiver({"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "max_recv_msg_size_mib": 1}}})
    address = receiver.grpc_address
    assert address is not None

    over = await grpc_export(address, Signal.METRICS, b"\x00" * (2 * 1024 * 1024), compression=grpc.Compression.Gzip)
    bomb = await grpc_export(address, Signal.METRICS, b"\x00" * (20 * 1024 * 1024), compression=grpc.Compression.Gzip)

    assert over.code == grpc.StatusCode.INVALID_ARGUMENT  # small on the wire, too large inflated
    assert bomb.code == grpc.StatusCode.RESOURCE_EXHAUSTED  # gRPC core stops inflating at 4x the limit


async def test_backpressure_is_resource_exhausted_with_retry_info(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(GRPC_ONLY)
    env.consumers[Signal.METRICS].error = Refused("sending queue is full", retry_after=2.5)

    result = await grpc_export(receiver.grpc_address, Signal.METRICS, metrics_request(3).SerializeToString())

    assert result.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert result.details == "sending queue is full"
    assert result.status is not None
    (detail,) = result.status.details
    info = error_details_pb2.RetryInfo()
    assert detail.Unpack(info)
    assert info.retry_delay.ToNanoseconds() == 2_500_000_000
    assert env.count("refused", "grpc", Signal.METRICS, "backpressure") == 3
    assert env.count("accepted", "grpc", Signal.METRICS) == 0


async def test_invalid_request_from_the_pipeline_is_invalid_argument(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(GRPC_ONLY)
    env.consumers[Signal.LOGS].error = InvalidRequest("log record too old")

    result = await grpc_export(receiver.grpc_address, Signal.LOGS, REQUESTS[Signal.LOGS][0]().SerializeToString())

    assert result.code == grpc.StatusCode.INVALID_ARGUMENT
    assert result.details == "log record too old"
    assert env.count("refused", "grpc", Signal.LOGS, "invalid") == 2


async def test_unexpected_error_is_internal_and_logged_once(
    env: Env, start_receiver: StartReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = await start_receiver(GRPC_ONLY)
    consumer = env.consumers[Signal.TRACES]
    consumer.error = RuntimeError("secret internal detail")
    body = REQUESTS[Signal.TRACES][0]().SerializeToString()

    with caplog.at_level(logging.ERROR):
        failed = await grpc_export(receiver.grpc_address, Signal.TRACES, body)
    consumer.error = None
    recovered = await grpc_export(receiver.grpc_address, Signal.TRACES, body)

    assert failed.code == grpc.StatusCode.INTERNAL
    assert "secret internal detail" not in failed.details
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert len(errors) == 1
    assert "secret internal detail" in str(errors[0].exc_info and errors[0].exc_info[1])
    assert env.count("refused", "grpc", Signal.TRACES, "internal") == 2
    assert recovered.code == grpc.StatusCode.OK


async def test_nameless_metrics_are_reported_as_partial_success(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(GRPC_ONLY)

    result = await grpc_export(
        receiver.grpc_address, Signal.METRICS, metrics_request(3, nameless=2).SerializeToString()
    )

    assert result.code == grpc.StatusCode.OK
    assert result.response.partial_success.rejected_data_points == 2
    assert "name" in result.response.partial_success.error_message
    (batch,) = env.consumers[Signal.METRICS].batches
    assert batch.items == 3
    assert env.count("accepted", "grpc", Signal.METRICS) == 3
    assert env.count("rejected", "grpc", Signal.METRICS) == 2


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ((("authorization", f"Bearer {TOKEN}"),), grpc.StatusCode.OK),
        ((), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", "Bearer wrong"),), grpc.StatusCode.UNAUTHENTICATED),
        ((("authorization", TOKEN),), grpc.StatusCode.UNAUTHENTICATED),
    ],
    ids=["right-token", "no-token", "wrong-token", "no-scheme"],
)
async def test_bearer_token_auth(
    env: Env, start_receiver: StartReceiver, metadata: tuple[tuple[str, str], ...], code: grpc.StatusCode
) -> None:
    receiver = await start_receiver(
        {"protocols": {"grpc": {"endpoint": "127.0.0.1:0", "auth": {"authenticator": "bearertokenauth"}}}}
    )

    result = await grpc_export(
        receiver.grpc_address, Signal.METRICS, metrics_request().SerializeToString(), metadata=metadata
    )

    assert result.code == code
    delivered = 1 if code == grpc.StatusCode.OK else 0
    assert len(env.consumers[Signal.METRICS].batches) == delivered
    assert env.count("refused", "grpc", Signal.METRICS, "unauthenticated") == (None if delivered else 0)


async def test_signal_without_a_pipeline_is_unimplemented(env: Env, start_receiver: StartReceiver) -> None:
    receiver = await start_receiver(GRPC_ONLY, signals=[Signal.METRICS])

    logs = await grpc_export(receiver.grpc_address, Signal.LOGS, REQUESTS[Signal.LOGS][0]().SerializeToString())
    metrics = await grpc_export(receiver.grpc_address, Signal.METRICS, metrics_request().SerializeToString())

    assert logs.code == grpc.StatusCode.UNIMPLEMENTED
    assert metrics.code == grpc.StatusCode.OK
