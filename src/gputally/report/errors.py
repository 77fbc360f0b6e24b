"""What can go wrong in ``gputally report``, as one tree, each with the exit status it ends in.

    ReportError (GputallyError)         exit 1 unless said otherwise
    ├── UsageError                      exit 2: the arguments cannot be honoured (bad time, range)
    ├── PrometheusError                 the query API could not answer
    │   ├── Unreachable                 connection refused, DNS, timeout, TLS handshake
    │   ├── Unauthorized                HTTP 401 / 403
    │   └── QueryFailed                 any other HTTP or API error, or an answer that is not the API's
    └── NoData                          the range holds no usage counters (for the workload asked)

Every message is one line meant for a terminal: the command prints ``gputally: <message>``
and exits, never a traceback. Foreign exceptions (urllib, ssl, json) are translated in
``prometheus.py`` with ``raise ... from exc``.
"""

from __future__ import annotations

from gputally.errors import GputallyError

__all__ = ["NoData", "PrometheusError", "QueryFailed", "ReportError", "Unauthorized", "Unreachable", "UsageError"]


class ReportError(GputallyError):
    """Root of the report's errors; ``exit_code`` is what the command returns."""

    exit_code = 1


class UsageError(ReportError):
    """Arguments that parse but cannot be honoured (an end before the start, a bad time)."""

    exit_code = 2


class PrometheusError(ReportError):
    """The Prometheus-compatible query API did not give an answer."""


class Unreachable(PrometheusError):
    """No HTTP answer at all."""


class Unauthorized(PrometheusError):
    """HTTP 401 or 403: a missing or wrong token, or a tenant header the proxy wants."""


class QueryFailed(PrometheusError):
    """An HTTP error other than 401/403, an API ``status: error``, or an answer that is not JSON."""


class NoData(ReportError):
    """Nothing to report: no usage counters in the range (or none for the job or pod asked)."""
