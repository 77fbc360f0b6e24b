"""Exporters: send batches to a backend (``otlp`` over gRPC, ``otlphttp``) or print them (``debug``).

Both OTLP exporters are a :class:`QueuedExporter` (bounded, optionally persistent queue ->
retry -> timeout) over a transport; OTEL_EXPORTER_OTLP_* variables supply defaults for keys
the config leaves out. The factories are registered as entry points in the
``gputally.exporters`` group.
"""

from gputally.exporters.config import DebugConfig, OTLPGrpcConfig, OTLPHttpConfig
from gputally.exporters.debug import DebugExporter
from gputally.exporters.debug import factory as debug_factory
from gputally.exporters.otlp_grpc import factory as otlp_grpc_factory
from gputally.exporters.otlp_http import factory as otlp_http_factory
from gputally.exporters.sender import QueuedExporter

__all__ = [
    "DebugConfig",
    "DebugExporter",
    "OTLPGrpcConfig",
    "OTLPHttpConfig",
    "QueuedExporter",
    "debug_factory",
    "otlp_grpc_factory",
    "otlp_http_factory",
]
