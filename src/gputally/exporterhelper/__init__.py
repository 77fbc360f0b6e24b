"""Shared library: what every exporter that sends over the network is built from.

A :class:`QueuedExporter` is a chain, each link with one job: a bounded queue in memory or on
disk (:mod:`.queue`, :mod:`.persistent_queue`), request combining, retry with jittered backoff
that honours the server's throttle (:mod:`.retry`), a timeout, and a :class:`Transport` that
sends one request. :mod:`.otlpconfig` holds the keys both OTLP exporters share and the
``OTEL_EXPORTER_OTLP_*`` variables. See ``README.md`` here.
"""

from .otlpconfig import OTLPExporterSettings, Target
from .sender import DeliveryListener, QueuedExporter
from .transport import Receipt, Transport

__all__ = ["DeliveryListener", "OTLPExporterSettings", "QueuedExporter", "Receipt", "Target", "Transport"]
