"""Config of the ``otlp`` receiver; keys and defaults as in the OpenTelemetry Collector's.

::

    receivers:
      otlp:
        protocols:
          grpc:                       # present (even empty) = enabled; absent = disabled
            endpoint: localhost:4317  # or unix:///run/gputally/otlp.sock
            max_recv_msg_size_mib: 16
          http:
            endpoint: localhost:4318
            max_request_body_size: 16777216
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gputally.config.types import AuthSettings, Duration, ServerTLSSettings, Strict
from gputally.endpoint import check_endpoint

__all__ = ["GRPCSettings", "HTTPSettings", "OTLPReceiverConfig", "Protocols"]

_MIB = 1024 * 1024


class GRPCSettings(Strict):
    """``protocols.grpc``: OTLP over gRPC."""

    endpoint: str = "localhost:4317"
    """``host:port`` to listen on (``0.0.0.0:4317`` for every interface), or ``unix:///path.sock``."""
    max_recv_msg_size_mib: int = Field(16, ge=1, le=511)
    """Largest request accepted, in MiB after decompression; larger ones get INVALID_ARGUMENT."""
    tls: ServerTLSSettings | None = None
    """Serve TLS (and demand client certificates when ``client_ca_file`` is set); plain text when unset."""
    auth: AuthSettings | None = None
    """Require the ``authorization`` metadata checked by this authenticator extension."""
    implementation: Literal["native", "grpcio"] = "native"
    """gputally's own key (not the Collector's): ``native`` serves gRPC from the event loop's
    thread (:mod:`gputally.h2`, about half grpc.aio's CPU per request); ``grpcio`` serves it
    with grpc.aio, gRPC core's server, as before."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return check_endpoint(value, allow_unix=True)

    @property
    def max_recv_bytes(self) -> int:
        return self.max_recv_msg_size_mib * _MIB


class HTTPSettings(Strict):
    """``protocols.http``: OTLP over HTTP (``/v1/metrics``, ``/v1/logs``, ``/v1/traces``)."""

    endpoint: str = "localhost:4318"
    """``host:port`` to listen on (``0.0.0.0:4318`` for every interface)."""
    max_request_body_size: int = Field(16 * _MIB, ge=1, le=1024 * _MIB)
    """Largest request body accepted, in bytes, both as sent and after decompression; larger ones get 413.
    At most 1 GiB: a request is held in memory whole."""
    tls: ServerTLSSettings | None = None
    """Serve HTTPS (and demand client certificates when ``client_ca_file`` is set); plain HTTP when unset."""
    auth: AuthSettings | None = None
    """Require the ``Authorization`` header checked by this authenticator extension."""
    read_header_timeout: Duration = Field(30.0, gt=0)
    """A connection must send a complete request line and headers within this; it is also how
    long an idle keep-alive connection stays open. Slow clients are closed, not waited for."""
    read_timeout: Duration = Field(60.0, gt=0)
    """A request's whole body must arrive within this once its headers did; else 408 and close."""
    max_connections: int = Field(1000, ge=1, le=100_000)
    """Most connections open at once; one more is closed as soon as it is accepted (counted)."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return check_endpoint(value, allow_unix=False)


class Protocols(Strict):
    """``protocols``: which transports to serve. A key written with no value enables it with defaults."""

    grpc: GRPCSettings | None = None
    """OTLP/gRPC; disabled when the key is absent."""
    http: HTTPSettings | None = None
    """OTLP/HTTP; disabled when the key is absent."""

    @model_validator(mode="before")
    @classmethod
    def _present_means_enabled(cls, data: Any) -> Any:
        # YAML `grpc:` with nothing after it is None: the Collector reads that as "on, defaults".
        if isinstance(data, dict):
            return {key: {} if value is None and key in ("grpc", "http") else value for key, value in data.items()}
        return data


class OTLPReceiverConfig(Strict):
    """``receivers.otlp``: accepts OTLP metrics, logs and traces over gRPC and/or HTTP."""

    protocols: Protocols = Field(default_factory=Protocols)
    """The transports to serve; at least one of ``grpc`` and ``http``."""
    checked_shapes_mib: int = Field(32, ge=0, le=4096)
    """gputally's own key (not the Collector's): memory for the metrics request shapes already
    checked, so that a node's next request of the same shape is proven valid by a byte compare
    instead of a parse (``gputally.otlp.known``); about twice a request's size per shape.
    0: parse every request."""

    @model_validator(mode="before")
    @classmethod
    def _null_protocols(cls, data: Any) -> Any:
        if isinstance(data, dict) and "protocols" in data and data["protocols"] is None:
            return {**data, "protocols": {}}
        return data

    @model_validator(mode="after")
    def _one_protocol(self) -> OTLPReceiverConfig:
        if self.protocols.grpc is None and self.protocols.http is None:
            raise ValueError(
                "protocols: enable at least one of grpc and http (write `grpc:` with no value for the defaults)"
            )
        return self
