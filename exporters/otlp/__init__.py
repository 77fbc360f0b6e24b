"""The ``otlp`` exporter: OTLP over gRPC (native ``gputally.h2`` channel or grpc.aio)."""

from .config import OTLPGrpcConfig
from .exporter import GrpcTransport, create_exporter
from .factory import factory

__all__ = ["GrpcTransport", "OTLPGrpcConfig", "create_exporter", "factory"]
