"""A real Prometheus (and promtool) for gputally's tests: alert rules and the OTLP path.

Build it with ``tests/harness/prometheus/build.sh``; `harness.prometheus.server` runs and
queries it, `harness.prometheus.fixtures` is the pytest plugin with the
``prometheus_binaries``, ``promtool`` and ``prometheus`` fixtures.
"""
