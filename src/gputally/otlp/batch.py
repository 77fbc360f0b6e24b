"""The unit that flows through a pipeline: one OTLP export request and what is known of it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gputally.errors import InvalidRequest
from gputally.otlp.census import Census, census_logs, census_metrics, census_traces
from gputally.otlp.checked import checked_census
from gputally.otlp.signals import SIGNALS, Signal

__all__ = ["Batch", "Request", "Signal"]

Request: TypeAlias = ExportMetricsServiceRequest | ExportLogsServiceRequest | ExportTraceServiceRequest

_CENSUS: dict[Signal, Callable[[bytes], Census]] = {
    Signal.METRICS: census_metrics,
    Signal.LOGS: census_logs,
    Signal.TRACES: census_traces,
}


class Batch:
    """An OTLP export request with its serialized form cached until someone changes it.

    Processors that only read use :attr:`message`; processors that change anything must get
    the message through :meth:`mutable`, which drops the cached bytes so :meth:`serialize`
    encodes the changed message. A request that no processor changed is forwarded as the
    bytes that arrived, never re-encoded.

    ``items`` counts data points (metrics), log records (logs) or spans (traces). ``rejected``
    counts items refused as invalid, reported to the sender as OTLP partial success.
    """

    __slots__ = ("_message", "_raw", "items", "rejected", "rejection", "signal")

    def __init__(
        self,
        signal: Signal,
        *,
        message: Request | None = None,
        raw: bytes | None = None,
        items: int | None = None,
    ) -> None:
        if message is None and raw is None:
            raise ValueError("a Batch needs a message or its serialized bytes")
        self.signal = signal
        self._message = message
        self._raw = raw
        if items is None:
            items = _CENSUS[signal](self.serialize()).items
        self.items = items
        self.rejected = 0
        self.rejection = ""

    @classmethod
    def decode(cls, signal: Signal, raw: bytes) -> Batch:
        """Check and count a request as received; undecodable bytes raise InvalidRequest.

        The check is a parse (:mod:`gputally.otlp.checked`) that keeps no tree: a stage that
        reads the message parses it then, and a request no stage reads is never decoded.
        Metrics without a name break the OTLP data model: they are removed here and their
        points reported as rejected.
        """
        try:
            census = checked_census(signal, raw)
        except DecodeError as exc:
            raise InvalidRequest(f"cannot decode OTLP {signal} request: {exc}") from exc
        batch = cls(signal, raw=raw, items=census.items)
        if census.nameless_metrics:
            batch._drop_nameless_metrics()
        return batch

    @classmethod
    def concat(cls, batches: Iterable[Batch]) -> Batch:
        """One request holding all of ``batches`` (of one signal), without decoding them.

        An export request has a single repeated field, so concatenated encodings are the
        encoding of the concatenated request.
        """
        batches = list(batches)
        if not batches:
            raise ValueError("nothing to concatenate")
        signal = batches[0].signal
        if any(b.signal is not signal for b in batches):
            raise ValueError("cannot concatenate batches of different signals")
        if len(batches) == 1:
            return batches[0]
        raw = b"".join(b.serialize() for b in batches)
        return cls(signal, raw=raw, items=sum(b.items for b in batches))

    @property
    def message(self) -> Any:
        """The decoded request, for reading. Use :meth:`mutable` to change it."""
        if self._message is None:
            message = SIGNALS[self.signal].request()
            message.ParseFromString(self._raw)
            self._message = message
        return self._message

    def mutable(self) -> Any:
        """The decoded request, for changing: the cached encoding is dropped."""
        message = self.message
        self._raw = None
        return message

    def rewrite(self, raw: bytes) -> None:
        """Replace the request by ``raw``, its encoding with the same items (a splice that
        added attributes): the decoded message, if any, is dropped."""
        self._raw = raw
        self._message = None

    def serialize(self) -> bytes:
        """The request's encoding: the received bytes when nothing changed them."""
        if self._raw is None:
            assert self._message is not None
            self._raw = self._message.SerializeToString()
        return self._raw

    def recount(self) -> None:
        """Count items again after a processor removed some."""
        self.items = _CENSUS[self.signal](self.serialize()).items

    def copy(self) -> Batch:
        """An independent batch with the same content (for fan-out to several pipelines)."""
        twin = Batch(self.signal, raw=self.serialize(), items=self.items)
        twin.rejected, twin.rejection = self.rejected, self.rejection
        return twin

    def reject(self, items: int, reason: str) -> None:
        """Record ``items`` refused as invalid, to be reported as partial success."""
        self.rejected += items
        self.rejection = reason if not self.rejection else f"{self.rejection}; {reason}"

    def _drop_nameless_metrics(self) -> None:
        scopes = [scope for resource in self.message.resource_metrics for scope in resource.scope_metrics
                  if not all(m.name for m in scope.metrics)]
        if not scopes:
            return  # the census's count was off (a name sent twice), not a nameless metric
        self.mutable()
        before = self.items
        for scope in scopes:
            keep = [m for m in scope.metrics if m.name]
            del scope.metrics[:]
            scope.metrics.extend(keep)
        self.recount()
        self.reject(before - self.items, "metrics without a name are invalid")

    def __repr__(self) -> str:
        return f"Batch({self.signal}, items={self.items}, rejected={self.rejected})"
