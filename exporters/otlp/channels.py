"""What the ``otlp`` exporter's two gRPC transports share: channels per endpoint, readiness,
metadata, the reading of a response, and gRPC statuses as export errors.

Statuses follow the OTLP specification's retry rules: CANCELLED, DEADLINE_EXCEEDED, ABORTED,
OUT_OF_RANGE, UNAVAILABLE and DATA_LOSS are retried, RESOURCE_EXHAUSTED only when the server
sent RetryInfo (its delay then replaces our backoff); anything else is permanent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from gputally.auth import BearerTokenAuth
from gputally.config.types import ClientTLSSettings
from gputally.errors import ExportError, PermanentExportError, TransientExportError
from gputally.exporterhelper.otlpconfig import Target
from gputally.exporterhelper.settings import RetrySettings
from gputally.exporterhelper.transport import Receipt, receipt_from_response
from gputally.otlp.signals import SIGNALS, Signal

__all__ = ["ChannelKey", "ChannelTransport", "translate"]

log = logging.getLogger(__name__)

ChannelKey = tuple[str, ClientTLSSettings]
ChannelT = TypeVar("ChannelT")

_RETRYABLE = frozenset({
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
})

def _retry_delay(details: bytes | None) -> float | None:
    """Seconds from a RetryInfo in a ``grpc-status-details-bin`` trailer, if the server sent one."""
    if not details:
        return None
    try:
        status = status_pb2.Status.FromString(details)
    except DecodeError:
        return None  # malformed grpc-status-details-bin
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return max(float(info.retry_delay.ToTimedelta().total_seconds()), 0.0)
    return None


def translate(code: grpc.StatusCode, details: str | None, status_details: bytes | None) -> ExportError:
    """The gputally error for a failed call (its code, message and ``grpc-status-details-bin``),
    per the OTLP specification's retry rules."""
    delay = _retry_delay(status_details)
    message = f"{code.name}: {details}"
    if code in _RETRYABLE or (code is grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None):
        return TransientExportError(message, retry_after=delay)
    return PermanentExportError(message)


class ChannelTransport(Generic[ChannelT]):
    """One channel per distinct endpoint and TLS setting (usually one for all signals), each
    watched in the background until it is first reached. Subclasses open, watch and call."""

    def __init__(
        self,
        targets: Mapping[Signal, Target],
        *,
        authenticator: BearerTokenAuth | None,
        retry: RetrySettings,
    ) -> None:
        self._targets = dict(targets)
        self._auth = authenticator
        # Reconnect at our own retry cadence, not gRPC's (up to 120 s), so a backend that came
        # back is used by the next retry rather than minutes later.
        self._initial_backoff = max(min(retry.initial_interval, 1.0), 0.01)
        self._max_backoff = max(retry.max_interval, self._initial_backoff)
        self._channels: dict[ChannelKey, ChannelT] = {}
        self._reached: set[ChannelKey] = set()
        self._watchers: list[asyncio.Task[None]] = []
        self._draining = False

    @property
    def description(self) -> str:
        return ", ".join(sorted({t.endpoint for t in self._targets.values()}))

    @property
    def ready(self) -> bool:
        return bool(self._channels) and self._reached >= self._channels.keys()

    async def start(self) -> None:
        if self._channels:
            return
        for signal, target in self._targets.items():
            key = (target.endpoint, target.tls)
            if key not in self._channels:
                self._channels[key] = await self._open(target)
                self._watchers.append(asyncio.create_task(self._watch(key), name=f"grpc watch {target.endpoint}"))
            self._opened(signal, self._channels[key])

    async def _open(self, target: Target) -> ChannelT:
        raise NotImplementedError

    def _opened(self, signal: Signal, channel: ChannelT) -> None:
        """``signal`` will be sent on ``channel``."""

    async def _watch(self, key: ChannelKey) -> None:
        raise NotImplementedError

    def _metadata(self, target: Target) -> list[tuple[str, str]]:
        metadata = list(target.headers)
        if self._auth is not None:
            metadata.append(("authorization", self._auth.header_value()))
        return metadata

    def _receipt(self, signal: Signal, target: Target, raw: bytes) -> Receipt:
        """The backend's answer, once it answered OK."""
        self._reached.add((target.endpoint, target.tls))
        if not raw:
            return Receipt()  # an empty response: no partial success (the common answer)
        try:
            response: Any = SIGNALS[signal].response.FromString(raw)
        except DecodeError:
            log.debug("undecodable Export response from %s; ignoring it", target.endpoint)
            return Receipt()
        return receipt_from_response(signal, response)

    def drain(self) -> None:
        self._draining = True

    async def close(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        await asyncio.gather(*(self._close(channel) for channel in self._channels.values()))
        self._watchers.clear()

    async def _close(self, channel: ChannelT) -> None:
        raise NotImplementedError
