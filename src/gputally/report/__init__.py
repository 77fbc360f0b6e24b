"""``gputally report``: the ``usage`` processor's chargeback counters read back from a
Prometheus-compatible query API, as a terminal table, CSV or JSON.

Modules: `prometheus` (the HTTP client), `queries` (the PromQL and how counters become a
range's figures), `table` (grouping), `workload` (one job or pod), `render` (text, CSV,
JSON), `timerange`, `errors`, `cli` (the command). README.md shows it run on the replay.
"""

from __future__ import annotations

from .errors import NoData, PrometheusError, QueryFailed, ReportError, Unauthorized, Unreachable, UsageError

__all__ = ["NoData", "PrometheusError", "QueryFailed", "ReportError", "Unauthorized", "Unreachable", "UsageError"]
