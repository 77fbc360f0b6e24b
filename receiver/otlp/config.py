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

__all__ = ["GRPCKeepalive", "GRPCLimits", "GRPCServerParameters", "GRPCSettings", "HTTPSettings", "OTLPReceiverConfig", "Protocols"]

_MIB = 1024 * 1024


class GRPCServerParameters(Strict):
    """``keepalive.server_parameters``, as grpc-go's (0 = for ever)."""

    max_connection_idle: Duration = Field(0.0, ge=0)
    """A connection without streams for this long gets GOAWAY."""
    max_connection_age: Duration = Field(0.0, ge=0)
    """A connection older than this (+-10 %) gets GOAWAY."""
    max_connection_age_grace: Duration = Field(0.0, ge=0)
    """After that GOAWAY, its streams get this long before it is closed (0: as long as they run)."""
    time: Duration = Field(7200.0, ge=0)
    """A connection silent this long gets a PING (0: never)."""
    timeout: Duration = Field(20.0, gt=0)
    """That PING's acknowledgement must come within this, else the connection is closed."""


class GRPCKeepalive(Strict):
    """``protocols.grpc.keepalive``: the Collector's keys (``enforcement_policy`` is not read)."""

    server_parameters: GRPCServerParameters = Field(default_factory=GRPCServerParameters)


class GRPCLimits(Strict):
    """``protocols.grpc.limits``: gputally's own bounds on one peer (native implementation;
    defaults from Go's x/net/http2 and nghttp2)."""

    max_header_list_size: int = Field(65536, ge=4096, le=16 * _MIB)
    """Largest header list in bytes (RFC 7541 sizes); a larger one fails its call alone."""
    max_continuation_frames: int = Field(8, ge=1, le=10_000)
    """CONTINUATION frames after one HEADERS (nghttp2's 8); more close the connection."""
    max_queued_control_frames: int = Field(10_000, ge=100, le=1_000_000)
    """Acknowledgements and resets owed to a peer that does not read (Go's 10,000)."""
    max_settings_entries: int = Field(32, ge=8, le=10_000)
    """Entries in one SETTINGS frame (nghttp2's 32)."""
    reset_burst: int = Field(1000, ge=1, le=1_000_000)
    """Stream resets a peer may cause at once (nghttp2's 1,000)..."""
    reset_rate: float = Field(33.0, gt=0, le=1_000_000)
    """...and a second after that (nghttp2's 33); beyond, GOAWAY ENHANCE_YOUR_CALM."""
    max_buffered_request_mib: int = Field(128, ge=1, le=64 * 1024)
    """Request bytes one connection may have buffered for handlers not yet started."""
    max_process_buffered_request_mib: int = Field(512, ge=1, le=64 * 1024)
    """The same over every connection of the process."""
    max_output_buffer_kib: int = Field(1024, ge=16, le=1024 * 1024)
    """Answers written and not yet read before reading from the peer stops."""
    write_timeout: Duration = Field(30.0, ge=0)
    """A peer that leaves our writes unread this long is closed (0: never)."""
    read_timeout: Duration = Field(60.0, ge=0)
    """A request's body must end this long after its headers (0: no limit)."""


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
    max_concurrent_streams: int = Field(250, ge=1, le=100_000)
    """Streams one connection may have open at once (Go's default); more are refused."""
    keepalive: GRPCKeepalive = Field(default_factory=GRPCKeepalive)
    """As the Collector's ``keepalive``: only ``server_parameters`` is read."""
    limits: GRPCLimits = Field(default_factory=GRPCLimits)
    """gputally's own keys: what one peer may cost the native server (see the README)."""

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

