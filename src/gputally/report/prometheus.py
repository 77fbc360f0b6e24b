"""A small client of the Prometheus HTTP query API: ``/api/v1/query`` only, standard JSON.

Only the instant query endpoint is used (a range selector in an instant query returns the raw
samples when those are needed), so anything that speaks Prometheus' query API answers:
Prometheus, Thanos Query, Grafana Mimir (under its ``/prometheus`` prefix: pass the URL with
it), VictoriaMetrics. Queries are POSTed as forms, which all of them accept, so a long
``=~`` matcher never meets a URL length limit.

Why urllib and not aiohttp (a dependency already): ``gputally report`` is a short-lived
command that asks one question at a time and waits for the answer; urllib does that without
an event loop, with the standard library's TLS (``ssl.SSLContext`` from `gputally.tls.client`) and
errors that name their cause (``ConnectionRefusedError``, ``SSLCertVerificationError``),
which this module turns into the one-line errors of `errors`.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gputally.util.once import Once

from .errors import QueryFailed, Unauthorized, Unreachable

__all__ = ["Prometheus", "Sample", "Series"]


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    """One element of a range vector: raw samples, oldest first."""

    labels: dict[str, str]
    points: list[tuple[float, float]]


class Prometheus:
    """The query API under ``url`` (``http://prom:9090``, ``https://mimir/prometheus``).

    ``token`` is sent as ``Authorization: Bearer``; ``headers`` are sent as given (a Mimir
    tenant's ``X-Scope-OrgID``); ``context`` verifies the server for ``https`` URLs.
    """

    def __init__(self, url: str, *, token: str | None = None, headers: Mapping[str, str] | None = None,
                 context: ssl.SSLContext | None = None, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"Accept": "application/json", "User-Agent": "gputally-report",
                         "Content-Type": "application/x-www-form-urlencoded", **(headers or {})}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._context = context
        self._timeout = timeout
        self.queries = 0
        """Queries sent (the README's cost figures)."""
        self._warned: Once[str] = Once()

    def vector(self, promql: str, at: float) -> list[Sample]:
        """An instant query that returns a vector (an aggregation, ``last_over_time(...)``)."""
        data = self._query(promql, at)
        if data.get("resultType") != "vector":
            raise QueryFailed(f"Prometheus at {self.url} answered a {data.get('resultType')} to {promql!r}, "
                              "not a vector")
        return [Sample(dict(item["metric"]), float(item["value"][1])) for item in data["result"]]

    def matrix(self, promql: str, at: float) -> list[Series]:
        """An instant query of a range selector (``metric{...}[5m]``): the raw samples."""
        data = self._query(promql, at)
        if data.get("resultType") != "matrix":
            raise QueryFailed(f"Prometheus at {self.url} answered a {data.get('resultType')} to {promql!r}, "
                              "not a matrix")
        return [Series(dict(item["metric"]), [(float(t), float(v)) for t, v in item["values"]])
                for item in data["result"]]

    # -- transport ---------------------------------------------------------------------------

    def _query(self, promql: str, at: float) -> dict[str, Any]:
        body = urllib.parse.urlencode({"query": promql, "time": f"{at:.3f}"}).encode()
        request = urllib.request.Request(f"{self.url}/api/v1/query", data=body, headers=self._headers, method="POST")
        self.queries += 1
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._context) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from exc
        except urllib.error.URLError as exc:
            raise Unreachable(f"cannot reach Prometheus at {self.url}: {_reason(exc.reason)}") from exc
        except (OSError, ssl.SSLError) as exc:  # a timeout or reset while reading the answer
            raise Unreachable(f"cannot reach Prometheus at {self.url}: {_reason(exc)}") from exc
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise QueryFailed(f"{self.url} did not answer with the Prometheus API's JSON: is it the base URL of a "
                              "Prometheus query API (the part before /api/v1/query)?") from exc
        if not isinstance(answer, dict) or answer.get("status") != "success" or not isinstance(answer.get("data"), dict):
            error = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise QueryFailed(f"Prometheus at {self.url} refused the query {promql!r}: {error}")
        self._warn(answer.get("warnings") or [])
        return answer["data"]

    def _http_error(self, exc: urllib.error.HTTPError) -> Exception:
        detail = _detail(exc)
        if exc.code in (401, 403):
            hint = ("a token (--bearer-token-file or GPUTALLY_PROMETHEUS_TOKEN)" if "Authorization" not in self._headers
                    else "the token (--bearer-token-file or GPUTALLY_PROMETHEUS_TOKEN)")
            return Unauthorized(f"Prometheus at {self.url} refused the request: HTTP {exc.code} {exc.reason}"
                                f"{': ' + detail if detail else ''} (check {hint})")
        if exc.code == 404:
            return QueryFailed(f"{self.url}/api/v1/query does not exist (HTTP 404): is {self.url} the base URL of a "
                               "Prometheus query API?")
        return QueryFailed(f"Prometheus at {self.url} answered HTTP {exc.code} {exc.reason}"
                           f"{': ' + detail if detail else ''}")

    def _warn(self, warnings: Sequence[str]) -> None:
        """The API's warnings (Thanos' partial answers, VictoriaMetrics' limits) go to stderr, once each:
        a figure computed from a partial answer is wrong, and the reader must know."""
        for warning in warnings:
            if self._warned.first(warning):
                print(f"gputally: warning from Prometheus: {warning}", file=sys.stderr)


def _detail(exc: urllib.error.HTTPError) -> str:
    """The API's ``error`` when the body is its JSON, else the body's first line (a proxy's page)."""
    try:
        text = exc.read().decode(errors="replace").strip()
    except OSError:
        return ""
    try:
        body = json.loads(text)
    except ValueError:
        return text.splitlines()[0][:200] if text else ""
    return str(body.get("error", "")) if isinstance(body, dict) else ""


_PLAIN_HTTP = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                         "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})
"""OpenSSL's reasons when an https client meets a plain-http server (its answer read as a TLS record)."""


def _reason(reason: object) -> str:
    """The cause of a failed connection as a person says it."""
    if isinstance(reason, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted ({reason.verify_message}): pass --ca-file, or --insecure-skip-verify"
    if isinstance(reason, ssl.SSLError):
        if reason.reason in _PLAIN_HTTP:  # the server's first bytes were not a TLS record
            return (f"TLS failed ({reason.reason}): the server answers plain http, not https; "
                    "use an http:// URL")
        return f"TLS failed ({reason.reason or reason})"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "cannot resolve the host name"
    if isinstance(reason, TimeoutError | socket.timeout):
        return "timed out"
    if isinstance(reason, ConnectionResetError):
        return "connection reset"
    if isinstance(reason, OSError):
        return reason.strerror or str(reason)
    return str(reason)
