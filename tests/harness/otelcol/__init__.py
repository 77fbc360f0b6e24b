"""A real OpenTelemetry Collector for gputally's end-to-end tests (issue 7).

Build it with ``tests/harness/otelcol/build.sh`` (from ``collector-config/builder.yaml``);
`harness.otelcol.collector` runs it, `harness.otelcol.fixtures` is the pytest plugin with
the ``otelcol_binary`` and ``otelcol`` fixtures.
"""
