"""Config sections of the ``otlp``, ``otlphttp`` and ``debug`` exporters.

Keys and defaults follow the OpenTelemetry Collector's exporters of the same names. Keys left
out of the YAML fall back to the ``OTEL_EXPORTER_OTLP_*`` environment variables (see
:mod:`gputally.exporters.env`), so the models record which keys were written
(``model_fields_set``) and must be validated from the section as written.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from gputally.config.types import (
    AuthSettings,
    ClientTLSSettings,
    Compression,
    Duration,
    QueueSettings,
    RetrySettings,
    Strict,
)

__all__ = ["DebugConfig", "OTLPGrpcConfig", "OTLPHttpConfig", "check_http_url"]

# RFC 9110 token characters: what a header name may hold.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def check_http_url(url: str) -> str:
    """The URL unchanged, or ValueError when it is not an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


class _OTLPExporterConfig(Strict):
    """Keys both OTLP exporters share."""

    tls: ClientTLSSettings = ClientTLSSettings()
    """TLS towards the backend; fields left unset fall back to OTEL_EXPORTER_OTLP_CERTIFICATE etc."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request, on top of OTEL_EXPORTER_OTLP_HEADERS (these win per name)."""
    compression: Compression = "gzip"
    """``gzip`` or ``none``: GPU metrics compress about tenfold, so gzip is the default."""
    timeout: Duration = 5.0
    """Limit on one request (not on its retries); 0 means no limit."""
    retry_on_failure: RetrySettings = RetrySettings()
    sending_queue: QueueSettings = QueueSettings()
    auth: AuthSettings | None = None
    """A ``bearertokenauth`` extension whose token goes out in the ``authorization`` header."""

    @field_validator("headers")
    @classmethod
    def _header_syntax(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid header name")
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name!r}: value must not contain line breaks")
        return headers


class GrpcKeepalive(Strict):
    """``keepalive`` of the ``otlp`` exporter, as the Collector's (configgrpc's client keepalive)."""

    time: Duration = Field(10.0, gt=0)
    """PING the server after this long without activity."""
    timeout: Duration = Field(10.0, gt=0)
    """Drop the connection when the PING's acknowledgement takes longer."""
    permit_without_stream: bool = False
    """PING even while no call is in flight."""


class OTLPGrpcConfig(_OTLPExporterConfig):
    """``exporters: otlp:`` — OTLP over gRPC."""

    endpoint: str = "http://localhost:4317"
    """``host:port`` (TLS unless ``tls.insecure``) or ``http(s)://host:port`` (the scheme decides)."""
    implementation: Literal["native", "grpcio"] = "native"
    """gputally's own key (not the Collector's): ``native`` sends from the event loop's thread
    (:mod:`gputally.h2`, a fraction of grpc.aio's CPU per call); ``grpcio`` sends through
    grpc.aio, gRPC core's client, as before."""
    keepalive: GrpcKeepalive | None = None
    """Keepalive PINGs (the Collector's key); none when absent."""

    @field_validator("endpoint")
    @classmethod
    def _not_blank(cls, endpoint: str) -> str:
        if not endpoint.strip():
            raise ValueError("must not be empty")
        return endpoint.strip()


class OTLPHttpConfig(_OTLPExporterConfig):
    """``exporters: otlphttp:`` — OTLP over HTTP/1.1 POSTs."""

    endpoint: str = "http://localhost:4318"
    """Base URL; ``/v1/metrics``, ``/v1/logs`` or ``/v1/traces`` is appended per signal."""
    metrics_endpoint: str | None = None
    """Full URL for metrics, used as written (overrides ``endpoint``)."""
    logs_endpoint: str | None = None
    """Full URL for logs, used as written (overrides ``endpoint``)."""
    traces_endpoint: str | None = None
    """Full URL for traces, used as written (overrides ``endpoint``)."""
    encoding: Literal["proto", "json"] = "proto"
    """``proto`` (binary protobuf) or ``json`` (OTLP/JSON, hex trace and span IDs)."""

    @field_validator("endpoint", "metrics_endpoint", "logs_endpoint", "traces_endpoint")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url.strip())


class DebugConfig(Strict):
    """``exporters: debug:`` — prints what would be exported."""

    verbosity: Literal["basic", "normal", "detailed"] = "basic"
    """``basic``: one line per batch (time, exporter, pipeline, counts); ``normal``: then a line
    per resource and one per data point, log record and span (value, attributes, time);
    ``detailed``: every field, readable, one block per resource."""
