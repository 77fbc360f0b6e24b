"""Exporters: one folder each (``otlp/`` over gRPC, ``otlphttp/``, ``debug/``).

The OTLP exporters are built on :mod:`gputally.exporterhelper` (queue -> retry -> timeout ->
send, and the ``OTEL_EXPORTER_OTLP_*`` variables); each is registered as an entry point in the
``gputally.exporters`` group, and none imports another.
"""
