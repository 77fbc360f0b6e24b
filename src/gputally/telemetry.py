"""gputally's own metrics, kept in one Prometheus registry per running service.

Components never create metrics themselves: they get a small bound object from
:class:`SelfTelemetry` (``for_receiver``, ``for_processor``, ``for_exporter``) whose counters
are already labelled with the component's ID, so the hot path only calls ``inc``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from gputally.otlp.batch import Signal

__all__ = ["ExporterMetrics", "ProcessorMetrics", "ReceiverMetrics", "SelfTelemetry"]


def _by_signal(family: Counter, **labels: str) -> dict[Signal, Counter]:
    return {signal: family.labels(signal=signal.value, **labels) for signal in Signal}


@dataclass(frozen=True)
class ReceiverMetrics:
    accepted: dict[Signal, Counter]
    """Items (points, log records, spans) taken into the pipelines."""
    rejected: dict[Signal, Counter]
    """Items dropped as invalid inside an accepted request (OTLP partial success)."""
    _refused_family: Counter
    _labels: dict[str, str]

    def refused(self, signal: Signal, reason: str) -> Counter:
        """Items turned away, by reason: ``invalid``, ``too_large``, ``unauthenticated``, ``backpressure``."""
        return self._refused_family.labels(signal=signal.value, reason=reason, **self._labels)


@dataclass(frozen=True)
class ProcessorMetrics:
    incoming: dict[Signal, Counter]
    outgoing: dict[Signal, Counter]
    seconds: Counter
    """Time spent in the processor, summed."""


@dataclass(frozen=True)
class ExporterMetrics:
    sent: dict[Signal, Counter]
    """Items the backend acknowledged."""
    send_failed: dict[Signal, Counter]
    """Items given up on: permanent errors or retries exhausted."""
    enqueue_failed: dict[Signal, Counter]
    """Items dropped because the sending queue was full."""
    queue_size: Gauge
    """Batches waiting in the sending queue."""
    queue_capacity: Gauge


@dataclass
class SelfTelemetry:
    """The registry behind ``/metrics``; one per service, no process-global state."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        self._receiver_accepted = counter(
            "gputally_receiver_accepted_items", "Items taken into the pipelines.", "receiver", "transport", "signal"
        )
        self._receiver_refused = counter(
            "gputally_receiver_refused_items", "Items turned away (backpressure, invalid, auth).",
            "receiver", "transport", "signal", "reason",
        )
        self._receiver_rejected = counter(
            "gputally_receiver_rejected_items", "Invalid items dropped from accepted requests.",
            "receiver", "transport", "signal",
        )
        self._processor_in = counter("gputally_processor_incoming_items", "Items into a processor.", "processor", "signal")
        self._processor_out = counter("gputally_processor_outgoing_items", "Items out of a processor.", "processor", "signal")
        self._processor_seconds = counter("gputally_processor_seconds", "Time spent in a processor.", "processor")
        self._exporter_sent = counter("gputally_exporter_sent_items", "Items the backend acknowledged.", "exporter", "signal")
        self._exporter_failed = counter(
            "gputally_exporter_send_failed_items", "Items given up on (permanent error or retries exhausted).",
            "exporter", "signal",
        )
        self._exporter_dropped = counter(
            "gputally_exporter_enqueue_failed_items", "Items dropped because the sending queue was full.",
            "exporter", "signal",
        )
        self._queue_size = Gauge("gputally_exporter_queue_size", "Batches in the sending queue.", ["exporter"], registry=self.registry)
        self._queue_capacity = Gauge(
            "gputally_exporter_queue_capacity", "Most batches the sending queue holds.", ["exporter"], registry=self.registry
        )

    def for_receiver(self, receiver: str, transport: str) -> ReceiverMetrics:
        return ReceiverMetrics(
            accepted=_by_signal(self._receiver_accepted, receiver=receiver, transport=transport),
            rejected=_by_signal(self._receiver_rejected, receiver=receiver, transport=transport),
            _refused_family=self._receiver_refused,
            _labels={"receiver": receiver, "transport": transport},
        )

    def for_processor(self, processor: str) -> ProcessorMetrics:
        return ProcessorMetrics(
            incoming=_by_signal(self._processor_in, processor=processor),
            outgoing=_by_signal(self._processor_out, processor=processor),
            seconds=self._processor_seconds.labels(processor=processor),
        )

    def for_exporter(self, exporter: str) -> ExporterMetrics:
        return ExporterMetrics(
            sent=_by_signal(self._exporter_sent, exporter=exporter),
            send_failed=_by_signal(self._exporter_failed, exporter=exporter),
            enqueue_failed=_by_signal(self._exporter_dropped, exporter=exporter),
            queue_size=self._queue_size.labels(exporter=exporter),
            queue_capacity=self._queue_capacity.labels(exporter=exporter),
        )

