"""Config of the ``bridge`` receiver: where the Collector's ``gputally`` processor calls in."""

from __future__ import annotations

from pydantic import Field, field_validator

from gputally.config.types import AuthSettings, ServerTLSSettings, Strict
from gputally.endpoint import check_endpoint

__all__ = ["BridgeReceiverConfig"]

_MIB = 1024 * 1024


class BridgeReceiverConfig(Strict):
    """``receivers: bridge:``."""

    endpoint: str = "localhost:4320"
    """``host:port`` (``0.0.0.0:4320`` for every interface) or ``unix:///run/gputally/bridge.sock``
    (a sidecar beside the Collector, sharing a volume)."""
    max_recv_msg_size_mib: int = Field(64, ge=1, le=511)
    """Largest call accepted, in MiB after decompression: at least the Collector processor's
    ``max_message_size_mib`` (64 by default), or its large batches fail with RESOURCE_EXHAUSTED."""
    checked_shapes_mib: int = Field(32, ge=0)
    """Memory for metrics request shapes already checked, as the ``otlp`` receiver's key: a
    batch shaped like one seen before is proven valid by one compare instead of a parse."""
    tls: ServerTLSSettings | None = None
    """Serve TLS (and demand client certificates when ``client_ca_file`` is set); plain text when unset."""
    auth: AuthSettings | None = None
    """A ``bearertokenauth`` extension whose token every call must carry in ``authorization``."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        return check_endpoint(value, allow_unix=True)

    @property
    def max_recv_msg_size(self) -> int:
        return self.max_recv_msg_size_mib * _MIB
