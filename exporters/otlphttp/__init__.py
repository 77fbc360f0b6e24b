"""The ``otlphttp`` exporter: OTLP over HTTP/1.1 POSTs, protobuf or JSON."""

from .config import OTLPHttpConfig
from .exporter import HttpTransport, create_exporter, parse_retry_after
from .factory import factory

__all__ = ["HttpTransport", "OTLPHttpConfig", "create_exporter", "factory", "parse_retry_after"]
