"""``exporters: otlphttp:`` (OTLP over HTTP/1.1 POSTs): its keys, and the per-signal URLs they
and the environment make."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlsplit

from pydantic import field_validator

from gputally.exporterhelper.otlpconfig import (
    EnvView,
    OTLPExporterSettings,
    Target,
    check_http_url,
    request_settings,
)
from gputally.otlp.signals import SIGNALS, Signal
from gputally.util.once import Once

__all__ = ["OTLPHttpConfig"]


class OTLPHttpConfig(OTLPExporterSettings):
    """``exporters: otlphttp:`` — OTLP over HTTP/1.1 POSTs."""

    endpoint: str = "http://localhost:4318"
    """Base URL; ``/v1/metrics``, ``/v1/logs`` or ``/v1/traces`` is appended per signal."""
    metrics_endpoint: str | None = None
    """Full URL for metrics, used as written (overrides ``endpoint``)."""
    logs_endpoint: str | None = None
    """Full URL for logs, used as written (overrides ``endpoint``)."""
    traces_endpoint: str | None = None
    """Full URL for traces, used as written (overrides ``endpoint``)."""
    encoding: Literal["proto", "json"] = "proto"
    """``proto`` (binary protobuf) or ``json`` (OTLP/JSON, hex trace and span IDs)."""

    @field_validator("endpoint", "metrics_endpoint", "logs_endpoint", "traces_endpoint")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        return None if url is None else check_http_url(url.strip())

    def targets(self, environ: Mapping[str, str]) -> dict[Signal, Target]:
        """One target (full URL and request settings) per signal: the keys written here, then the
        OTEL_EXPORTER_OTLP_* variables in ``environ``, then the defaults."""
        targets: dict[Signal, Target] = {}
        warned: Once[str] = Once()
        for signal in Signal:
            env = EnvView(environ, signal, warned)
            url = _http_url(self, env, signal)
            targets[signal] = Target(url, *request_settings(self, env, insecure=urlsplit(url).scheme == "http"))
        return targets


def _join(base: str, signal: Signal) -> str:
    return base.rstrip("/") + SIGNALS[signal].http_path


def _env_url(found: tuple[str, str], env: EnvView) -> str | None:
    name, url = found
    try:
        return check_http_url(url)
    except ValueError as exc:
        env.warn(f"{name}: {exc}; ignoring it")
        return None


def _http_url(config: OTLPHttpConfig, env: EnvView, signal: Signal) -> str:
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
