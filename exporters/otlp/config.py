"""``exporters: otlp:`` (OTLP over gRPC): its keys, and the targets they and the environment make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from gputally.config.types import Duration, Strict
from gputally.exporterhelper.otlpconfig import EnvView, OTLPExporterSettings, Target, request_settings
from gputally.otlp.signals import Signal
from gputally.util.once import Once

__all__ = ["GrpcKeepalive", "OTLPGrpcConfig"]


class GrpcKeepalive(Strict):
    """``keepalive`` of the ``otlp`` exporter, as the Collector's (configgrpc's client keepalive)."""

    time: Duration = Field(10.0, gt=0)
    """PING the server after this long without activity."""
    timeout: Duration = Field(10.0, gt=0)
    """Drop the connection when the PING's acknowledgement takes longer."""
    permit_without_stream: bool = False
    """PING even while no call is in flight."""


class OTLPGrpcConfig(OTLPExporterSettings):
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

    def targets(self, environ: Mapping[str, str]) -> dict[Signal, Target]:
        """One target per signal: the keys written here, then the OTEL_EXPORTER_OTLP_* variables
        in ``environ``, then the defaults."""
        targets: dict[Signal, Target] = {}
        warned: Once[str] = Once()
        for signal in Signal:
            env = EnvView(environ, signal, warned)
            endpoint = self.endpoint
            if "endpoint" not in self.model_fields_set and (found := env.get("ENDPOINT")):
                endpoint = found[1]
            scheme, _, rest = endpoint.partition("://")
            if scheme in ("http", "https") and rest:
                # The SDKs' URL form: the scheme decides TLS, the path (if any) is meaningless to gRPC.
                insecure = scheme == "http"
                endpoint = urlsplit(endpoint).netloc
            elif "tls" in self.model_fields_set and "insecure" in self.tls.model_fields_set:
                insecure = self.tls.insecure
            else:
                insecure = bool(env.boolean("INSECURE"))
            targets[signal] = Target(endpoint, *request_settings(self, env, insecure=insecure))
        return targets
