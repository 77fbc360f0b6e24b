"""The ``otlp`` exporter's native transport (``implementation: native``, the default).

The same calls as :class:`~gputally.exporters.otlp.exporter.GrpcTransport`, on a
:class:`gputally.h2.Channel`: one HTTP/2 connection per endpoint, in the event loop's thread,
so a call costs a fraction of a grpc.aio one (``bench/grpc_floor.py``). Errors are classified
by the same rules (:func:`~gputally.exporters.otlp.channels.translate`).
"""

from __future__ import annotations

import asyncio
import logging

from gputally import __version__
from gputally.exporterhelper.otlpconfig import Target
from gputally.exporterhelper.transport import Receipt
from gputally.exporters.otlp.channels import ChannelKey, ChannelTransport, translate
from gputally.exporters.otlp.config import GrpcKeepalive
from gputally.h2 import Channel, GrpcError
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS
from gputally.tls.client import client_ssl_context
from gputally.util.backoff import Backoff

__all__ = ["NativeGrpcTransport"]

log = logging.getLogger(__name__)


class NativeGrpcTransport(ChannelTransport[Channel]):
    """The native transport: :class:`gputally.h2.Channel` per endpoint."""

    keepalive: GrpcKeepalive | None = None
    """Set by the factory from the ``keepalive`` key."""

    async def _open(self, target: Target) -> Channel:
        tls, keepalive = target.tls, self.keepalive
        context = None if tls.insecure else await asyncio.to_thread(client_ssl_context, tls, key="tls")
        return Channel(
            target.endpoint,
            ssl_context=context,
            server_hostname=tls.server_name_override,
            user_agent=f"gputally/{__version__}",
            initial_backoff=self._initial_backoff,
            max_backoff=self._max_backoff,
            keepalive_time=keepalive.time if keepalive else 0.0,
            keepalive_timeout=keepalive.timeout if keepalive else 20.0,
            keepalive_permit_without_stream=bool(keepalive and keepalive.permit_without_stream),
        )

    async def _watch(self, key: ChannelKey) -> None:
        """Mark the channel reached once it connects, without waiting for the first export."""
        channel = self._channels[key]
        waits = Backoff(initial=self._initial_backoff, maximum=self._max_backoff, factor=1.6)
        try:
            while key not in self._reached:
                try:
                    await channel.connect()
                except GrpcError:
                    await asyncio.sleep(waits.next())
                    continue
                self._reached.add(key)
        except asyncio.CancelledError:
            raise
        except Exception:  # never let a watcher die silently
            log.exception("watching the gRPC channel to %s failed", key[0])

    async def send(self, batch: Batch) -> Receipt:
        signal = batch.signal
        target = self._targets[signal]
        try:
            raw = await self._channels[(target.endpoint, target.tls)].unary(
                SIGNALS[signal].grpc_method,
                batch.serialize(),
                timeout=target.timeout,
                metadata=tuple(self._metadata(target)),
                compress=target.compression == "gzip",
                wait_for_ready=self._draining,
            )
        except GrpcError as exc:
            details = exc.trailing("grpc-status-details-bin")
            raise translate(exc.code, exc.details, details if isinstance(details, bytes) else None) from exc
        return self._receipt(signal, target, raw)

    async def _close(self, channel: Channel) -> None:
        await channel.close()
