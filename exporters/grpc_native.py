"""The ``otlp`` exporter's native transport (``implementation: native``, the default).

The same calls as :class:`~gputally.exporters.otlp_grpc.GrpcTransport`, on a
:class:`gputally.h2.Channel`: one HTTP/2 connection per endpoint, in the event loop's thread,
so a call costs a fraction of a grpc.aio one (``bench/grpc_floor.py``). Errors are classified
by the same rules (:func:`~gputally.exporters.grpc_errors.translate`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from google.protobuf.message import DecodeError

from gputally import __version__
from gputally.auth import BearerTokenAuth
from gputally.config.types import ClientTLSSettings, RetrySettings
from gputally.exporters.env import Target
from gputally.exporters.grpc_errors import translate
from gputally.exporters.transport import Receipt, receipt_from_response
from gputally.h2 import Channel, GrpcError
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.tls import client_ssl_context

__all__ = ["NativeGrpcTransport"]

log = logging.getLogger(__name__)

_ChannelKey = tuple[str, ClientTLSSettings]


class NativeGrpcTransport:
    """One channel per distinct endpoint and TLS setting (usually one for all signals)."""

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
        self._channels: dict[_ChannelKey, Channel] = {}
        self._reached: set[_ChannelKey] = set()
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
        for target in self._targets.values():
            key = (target.endpoint, target.tls)
            if key not in self._channels:
                self._channels[key] = await self._open(target)
                self._watchers.append(asyncio.create_task(self._watch(key), name=f"grpc watch {target.endpoint}"))

    async def _open(self, target: Target) -> Channel:
        tls = target.tls
        context = None if tls.insecure else await asyncio.to_thread(client_ssl_context, tls, key="tls")
        return Channel(
            target.endpoint,
            ssl_context=context,
            server_hostname=tls.server_name_override,
            user_agent=f"gputally/{__version__}",
            initial_backoff=self._initial_backoff,
            max_backoff=self._max_backoff,
        )

    async def _watch(self, key: _ChannelKey) -> None:
        """Mark the channel reached once it connects, without waiting for the first export."""
        channel = self._channels[key]
        delay = self._initial_backoff
        try:
            while key not in self._reached:
                try:
                    await channel.connect()
                except GrpcError:
                    await asyncio.sleep(delay)
                    delay = min(delay * 1.6, self._max_backoff)
                    continue
                self._reached.add(key)
        except asyncio.CancelledError:
            raise
        except Exception:  # never let a watcher die silently
            log.exception("watching the gRPC channel to %s failed", key[0])

    async def send(self, batch: Batch) -> Receipt:
        signal = batch.signal
        target = self._targets[signal]
        key = (target.endpoint, target.tls)
        metadata = list(target.headers)
        if self._auth is not None:
            metadata.append(("authorization", self._auth.header_value()))
        try:
            raw = await self._channels[key].unary(
                SIGNALS[signal].grpc_method,
                batch.serialize(),
                timeout=target.timeout,
                metadata=tuple(metadata),
                compress=target.compression == "gzip",
                wait_for_ready=self._draining,
            )
        except GrpcError as exc:
            details = exc.trailing("grpc-status-details-bin")
            raise translate(exc.code, exc.details, details if isinstance(details, bytes) else None) from exc
        self._reached.add(key)
        if not raw:
            return Receipt()  # an empty response: no partial success (the common answer)
        try:
            response = SIGNALS[signal].response.FromString(raw)
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
        await asyncio.gather(*(channel.close() for channel in self._channels.values()))
        self._watchers.clear()
