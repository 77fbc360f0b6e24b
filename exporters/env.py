"""``OTEL_EXPORTER_OTLP_*`` environment variables as defaults under the exporters' config.

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
winning per name). The factory resolves the environment when it creates an exporter; nothing
here reads ``os.environ`` itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from gputally.config.types import ClientTLSSettings
from gputally.exporters.config import OTLPGrpcConfig, OTLPHttpConfig, check_http_url
from gputally.otlp.signals import SIGNALS, Signal
from gputally.util.once import Once

__all__ = ["Target", "parse_headers", "resolve_grpc", "resolve_http"]

log = logging.getLogger(__name__)

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


class _Env:
    """Reads one signal's view of the variables: per-signal first, then generic."""

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


def _tls(config_tls: ClientTLSSettings, tls_written: bool, env: _Env) -> ClientTLSSettings:
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


def _common(
    config: OTLPGrpcConfig | OTLPHttpConfig, env: _Env, *, insecure: bool
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


def resolve_grpc(config: OTLPGrpcConfig, environ: Mapping[str, str]) -> dict[Signal, Target]:
    """One target per signal for the gRPC exporter."""
    targets: dict[Signal, Target] = {}
    warned: Once[str] = Once()
    for signal in Signal:
        env = _Env(environ, signal, warned)
        endpoint = config.endpoint
        if "endpoint" not in config.model_fields_set and (found := env.get("ENDPOINT")):
            endpoint = found[1]
        scheme, _, rest = endpoint.partition("://")
        if scheme in ("http", "https") and rest:
            # The SDKs' URL form: the scheme decides TLS, the path (if any) is meaningless to gRPC.
            insecure = scheme == "http"
            endpoint = urlsplit(endpoint).netloc
        elif "tls" in config.model_fields_set and "insecure" in config.tls.model_fields_set:
            insecure = config.tls.insecure
        else:
            insecure = bool(env.boolean("INSECURE"))
        targets[signal] = Target(endpoint, *_common(config, env, insecure=insecure))
    return targets


def _join(base: str, signal: Signal) -> str:
    return base.rstrip("/") + SIGNALS[signal].http_path


def _env_url(found: tuple[str, str], env: _Env) -> str | None:
    name, url = found
    try:
        return check_http_url(url)
    except ValueError as exc:
        env.warn(f"{name}: {exc}; ignoring it")
        return None


def _http_url(config: OTLPHttpConfig, env: _Env, signal: Signal) -> str:
    """Per-signal config URL, config base URL, per-signal env URL, env base URL, default; in that order."""
    written = config.model_fields_set
    own: str | None = getattr(config, f"{signal.value}_endpoint")
    if own is not None:
        return own
    if "endpoint" in written:
        return _join(config.endpoint, signal)
    if (found := env.specific("ENDPOINT")) and (url := _env_url(found, env)):
        # Used as written; a URL without a path posts to "/", as the specification says.
        return url if urlsplit(url).path else f"{url}/"
    if (found := env.generic("ENDPOINT")) and (url := _env_url(found, env)):
        return _join(url, signal)
    return _join(config.endpoint, signal)


def resolve_http(config: OTLPHttpConfig, environ: Mapping[str, str]) -> dict[Signal, Target]:
    """One target (full URL and request settings) per signal for the HTTP exporter."""
    targets: dict[Signal, Target] = {}
    warned: Once[str] = Once()
    for signal in Signal:
        env = _Env(environ, signal, warned)
        url = _http_url(config, env, signal)
        targets[signal] = Target(url, *_common(config, env, insecure=urlsplit(url).scheme == "http"))
    return targets
