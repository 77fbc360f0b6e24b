"""What both transports do with a request once it is read: check auth, decode, consume, count.

Transports handle their own framing (content types, compression, size limits) and turn the
outcome into their own wire form; the rules for counting and for mapping errors live here
once, so gRPC and HTTP cannot drift apart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from gputally.auth import BearerTokenAuth
from gputally.errors import InvalidRequest, Refused
from gputally.otlp.batch import Batch
from gputally.otlp.known import CheckedShapes
from gputally.otlp.signals import SIGNALS, Signal
from gputally.pipeline.component import Consumer, ProcessorFailed
from gputally.telemetry import ReceiverMetrics

from .status import Failure

__all__ = ["Intake"]

log = logging.getLogger(__name__)

class Intake:
    """Hands decoded requests of one transport to the consumers and keeps its self-metrics."""

    def __init__(
        self,
        *,
        name: str,
        consumers: Mapping[Signal, Consumer],
        metrics: ReceiverMetrics,
        auth: BearerTokenAuth | None,
        checked: CheckedShapes | None = None,
    ) -> None:
        self._name = name
        self._consumers = dict(consumers)
        self._metrics = metrics
        self._auth = auth
        self._checked = checked or CheckedShapes(budget=0)

    @property
    def signals(self) -> frozenset[Signal]:
        return frozenset(self._consumers)

    def authorize(self, signal: Signal, header: str | bytes | None) -> Failure | None:
        """A failure when auth is configured and ``header`` does not carry the token."""
        if self._auth is None or self._auth.verify(header):
            return None
        return self.refuse(signal, Failure.unauthenticated())

    def decode(self, signal: Signal, raw: bytes) -> Batch:
        """``raw`` checked and counted (InvalidRequest if it is not a request of ``signal``);
        a metrics request shaped like one checked before is proven by a compare, not a parse."""
        return self._checked.decode(signal, raw)

    def refuse(self, signal: Signal, failure: Failure, items: int = 0) -> Failure:
        """Count a request turned away; ``items`` is 0 when it was never decoded."""
        self._metrics.refused(signal, failure.reason).inc(items)
        return failure

    async def deliver(self, signal: Signal, decode: Callable[[], Batch]) -> Any | Failure:
        """Decode and consume one request: the export response, or why it failed.

        Never raises (except cancellation): a bug anywhere downstream is logged once and
        answered as an internal error, so one bad request cannot take the server down.
        """
        batch: Batch | None = None
        try:
            batch = decode()
            await self._consumers[signal].consume(batch)
        except (InvalidRequest, Refused) as exc:
            return self.refuse(signal, Failure.from_error(exc), batch.items if batch is not None else 0)
        except ProcessorFailed:
            # A processor whose failure policy is "refuse": the pipeline logged the cause once.
            return self.refuse(signal, Failure.internal(), batch.items if batch is not None else 0)
        except Exception:
            log.exception("%s: unexpected error while handling a %s export request", self._name, signal)
            return self.refuse(signal, Failure.internal(), batch.items if batch is not None else 0)
        self._metrics.accepted[signal].inc(batch.items)
        spec = SIGNALS[signal]
        response = spec.response()
        if batch.rejected:
            self._metrics.rejected[signal].inc(batch.rejected)
            setattr(response.partial_success, spec.rejected_field, batch.rejected)
            response.partial_success.error_message = batch.rejection
        return response
