"""What the ``otlp`` and ``otlphttp`` exporters share: their common keys, and the
``OTEL_EXPORTER_OTLP_*`` environment variables that fill in the keys a config leaves out.

Resolution follows the OpenTelemetry specification ("OTLP Exporter Configuration"), so a
deployment that configures an OTel SDK configures gputally the same way:

* every option has a generic variable and a per-signal one
  (``OTEL_EXPORTER_OTLP_HEADERS`` / ``OTEL_EXPORTER_OTLP_METRICS_HEADERS``); the per-signal
  one wins as a whole;
* an empty variable counts as unset; an invalid value is logged and ignored;
* HTTP: the generic endpoint is a base URL that gets ``/v1/<signal>`` appended, a per-signal
  endpoint is used as written;
* gRPC: an ``http://`` endpoint means plain text and ``https://`` TLS, whatever
  ``..._INSECURE`` says; without a scheme, ``..._INSECURE`` decides;
* timeouts are milliseconds; headers are ``k=v,k2=v2`` with percent-encoded names and values.

Keys written in the config win over the environment (headers merge, the config's value
winning per name). Each exporter's config model resolves its targets from the environment it
is handed (``targets(environ)``); nothing here reads ``os.environ`` itself.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from pydantic import Field, field_validator

from gputally.config.types import (
    AuthSettings,
    ClientTLSSettings,
    Compression,
    Duration,
    Strict,
)
from gputally.exporterhelper.settings import QueueSettings, RetrySettings
from gputally.otlp.signals import Signal
from gputally.util.once import Once

__all__ = ["EnvView", "OTLPExporterSettings", "Target", "check_http_url", "parse_headers", "request_settings"]

log = logging.getLogger(__name__)

# RFC 9110 token characters: what a header name may hold.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def check_http_url(url: str) -> str:
    """The URL unchanged, or ValueError when it is not an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return url


class OTLPExporterSettings(Strict):
    """Keys both OTLP exporters share."""

    tls: ClientTLSSettings = ClientTLSSettings()
    """TLS towards the backend; fields left unset fall back to OTEL_EXPORTER_OTLP_CERTIFICATE etc."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Sent with every request, on top of OTEL_EXPORTER_OTLP_HEADERS (these win per name)."""
    compression: Compression = "gzip"
    """``gzip`` or ``none``: GPU metrics compress about tenfold, so gzip is the default."""
    timeout: Duration = 5.0
    """Limit on one request (not on its retries); 0 means no limit."""
    retry_on_failure: RetrySettings = RetrySettings()
    sending_queue: QueueSettings = QueueSettings()
    auth: AuthSettings | None = None
    """A ``bearertokenauth`` extension whose token goes out in the ``authorization`` header."""

    @field_validator("headers")
    @classmethod
    def _header_syntax(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if not _HEADER_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid header name")
            if "\r" in value or "\n" in value:
                raise ValueError(f"header {name!r}: value must not contain line breaks")
        return headers


_PREFIX = "OTEL_EXPORTER_OTLP_"
_HEADER_NAME_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True)
class Target:
    """Where and how one signal is sent, with config and environment merged."""

    endpoint: str
    """gRPC: the channel target (``host:port``); HTTP: the full URL."""
    tls: ClientTLSSettings
    """``tls.insecure`` is true for plain text (for HTTP: an ``http://`` URL)."""
    headers: tuple[tuple[str, str], ...]
    """Lower-case names, as gRPC metadata requires."""
    compression: Literal["gzip", "none"]
    timeout: float | None
    """Seconds per request; None for no limit."""


def _log_warning(message: str) -> None:
    log.warning("%s", message)


def parse_headers(
    text: str, *, source: str = "headers", warn: Callable[[str], None] = _log_warning
) -> dict[str, str]:
    """``k=v,k2=v2`` with percent-encoding, as OTEL_EXPORTER_OTLP_HEADERS holds; bad pairs are skipped."""
    headers: dict[str, str] = {}
    for pair in text.split(","):
        if not pair.strip():
            continue
        name, sep, value = pair.partition("=")
        name = unquote(name.strip()).lower()
        value = unquote(value.strip())
        if not sep or not name or not set(name) <= _HEADER_NAME_CHARS or "\n" in value or "\r" in value:
            warn(f"{source}: ignoring malformed header {pair.strip()!r}")
            continue
        headers[name] = value
    return headers


class EnvView:
    """One signal's view of the variables: per-signal first, then generic."""

    def __init__(self, environ: Mapping[str, str], signal: Signal, warned: Once[str]) -> None:
        self._environ = environ
        self._signal = signal.value.upper()
        self._warned = warned

    def warn(self, message: str) -> None:
        """Log each problem once, although every signal reads the generic variables."""
        if self._warned.first(message):
            log.warning("%s", message)

    def specific(self, option: str) -> tuple[str, str] | None:
        return self._get(f"{_PREFIX}{self._signal}_{option}")

    def generic(self, option: str) -> tuple[str, str] | None:
        return self._get(f"{_PREFIX}{option}")

    def get(self, option: str) -> tuple[str, str] | None:
        """(variable name, value) of the variable that applies, or None when neither is set."""
        return self.specific(option) or self.generic(option)

    def _get(self, name: str) -> tuple[str, str] | None:
        value = self._environ.get(name, "").strip()
        return (name, value) if value else None

    def boolean(self, option: str) -> bool | None:
        found = self.get(option)
        if found is None:
            return None
        name, value = found
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        self.warn(f"{name}={value!r} is not true or false; ignoring it")
        return None

    def timeout(self) -> float | None:
        """Seconds from the millisecond TIMEOUT variable, or None when unset or invalid."""
        found = self.get("TIMEOUT")
        if found is None:
            return None
        name, value = found
        try:
            millis = float(value)
        except ValueError:
            millis = -1.0
        if millis < 0 or not math.isfinite(millis):
            self.warn(f"{name}={value!r} is not a number of milliseconds; ignoring it")
            return None
        return millis / 1000

    def compression(self) -> Literal["gzip", "none"] | None:
        found = self.get("COMPRESSION")
        if found is None:
            return None
        name, value = found
        if value.lower() == "gzip":
            return "gzip"
        if value.lower() == "none":
            return "none"
        self.warn(f"{name}={value!r} is neither gzip nor none; ignoring it")
        return None


def _tls(config_tls: ClientTLSSettings, tls_written: bool, env: EnvView) -> ClientTLSSettings:
    """The config's TLS with the unwritten file keys taken from the environment."""
    written = config_tls.model_fields_set if tls_written else set()
    update: dict[str, Any] = {}
    if "ca_file" not in written and (ca := env.get("CERTIFICATE")):
        update["ca_file"] = Path(ca[1])
    if not {"cert_file", "key_file"} & written:
        cert, key = env.get("CLIENT_CERTIFICATE"), env.get("CLIENT_KEY")
        if cert and key:
            update["cert_file"], update["key_file"] = Path(cert[1]), Path(key[1])
        elif lone := cert or key:
            env.warn(f"{lone[0]} is set without its certificate/key partner; ignoring client TLS from the environment")
    return config_tls.model_copy(update=update)


def request_settings(
    config: OTLPExporterSettings, env: EnvView, *, insecure: bool
) -> tuple[ClientTLSSettings, tuple[tuple[str, str], ...], Literal["gzip", "none"], float | None]:
    written = config.model_fields_set
    tls = _tls(config.tls, "tls" in written, env).model_copy(update={"insecure": insecure})
    headers: dict[str, str] = {}
    if found := env.get("HEADERS"):
        headers.update(parse_headers(found[1], source=found[0], warn=env.warn))
    headers.update({name.lower(): value for name, value in config.headers.items()})
    compression: Literal["gzip", "none"] = "none" if config.compression in ("none", "") else "gzip"
    if "compression" not in written:
        compression = env.compression() or compression
    timeout: float | None = config.timeout
    if "timeout" not in written:
        env_timeout = env.timeout()
        timeout = config.timeout if env_timeout is None else env_timeout
    return tls, tuple(headers.items()), compression, timeout or None


