"""The ``otlp`` exporter's ``keepalive`` key (the Collector's) reaches both gRPC implementations."""

from __future__ import annotations

from gputally.config.types import ClientTLSSettings
from gputally.exporterhelper.settings import RetrySettings
from gputally.exporters.otlp.config import GrpcKeepalive, OTLPGrpcConfig
from gputally.exporterhelper.otlpconfig import Target
from gputally.exporters.otlp.native import NativeGrpcTransport
from gputally.exporters.otlp.exporter import keepalive_options
from gputally.otlp.batch import Signal


def test_the_key_reads_as_the_collectors() -> None:
    config = OTLPGrpcConfig.model_validate({"keepalive": {"time": "30s", "permit_without_stream": True}})
    assert config.keepalive == GrpcKeepalive(time=30.0, timeout=10.0, permit_without_stream=True)
    assert OTLPGrpcConfig().keepalive is None
    assert keepalive_options(config.keepalive) == [("grpc.keepalive_time_ms", 30_000),
                                                   ("grpc.keepalive_timeout_ms", 10_000),
                                                   ("grpc.keepalive_permit_without_calls", 1)]


async def test_the_native_channel_gets_it() -> None:
    target = Target("127.0.0.1:4317", ClientTLSSettings(insecure=True), (), "none", 5.0)
    transport = NativeGrpcTransport({Signal.METRICS: target}, authenticator=None, retry=RetrySettings())
    assert (await transport._open(target)).connection_limits.keepalive_time == 0  # absent: no keepalive
    transport.keepalive = GrpcKeepalive(time=30.0, timeout=5.0)
    channel = await transport._open(target)
    assert (channel.connection_limits.keepalive_time, channel.connection_limits.keepalive_timeout) == (30.0, 5.0)
    assert not channel.keepalive_without_calls
