"""Config value types shared by components: durations, TLS, retry, queue, auth.

Key names and defaults follow the OpenTelemetry Collector's (configtls, configretry,
exporterhelper queue) so an otelcol user reads a gputally config at once.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, model_validator

__all__ = [
    "AuthSettings",
    "ClientTLSSettings",
    "Duration",
    "InputFile",
    "InputPath",
    "ServerTLSSettings",
    "Strict",
    "parse_duration",
]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d{1,20}(?:\.\d{1,20})?)(ns|us|µs|ms|s|m|h)")
MAX_DURATION = 10 * 365 * 24 * 3600.0
"""Longest duration accepted: ten years (``87600h``); anything longer is a typo, and timers
and deadlines that long overflow some clocks."""


def parse_duration(value: object) -> float:
    """Seconds from a Go-style duration (``"5s"``, ``"1m30s"``, ``"250ms"``) or a number of seconds.

    NaN, infinities, negatives and more than :data:`MAX_DURATION` are refused here, so a
    config that ``validate`` accepts never fails later on a timer.
    """
    if isinstance(value, bool):
        raise ValueError("expected a duration such as '5s' or '250ms'")
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError(f"a duration is at most {MAX_DURATION:.0f} seconds (87600h)") from None
    elif isinstance(value, str):
        text = value.strip()
        if text in ("0", ""):
            return 0.0
        if len(text) > 100:
            raise ValueError(f"{text[:20]!r}... is not a duration such as '5s', '250ms' or '1m30s'")
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"{value!r} is not a duration such as '5s', '250ms' or '1m30s'")
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        raise ValueError("expected a duration such as '5s' or '250ms'")
    if not math.isfinite(seconds):
        raise ValueError("a duration must be a finite number (not NaN or infinity)")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > MAX_DURATION:
        raise ValueError(f"a duration is at most {MAX_DURATION:.0f} seconds (87600h)")
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration)]
"""Seconds, written in config as ``"5s"``, ``"100ms"``, ``"1m"``."""


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors; field docstrings document keys;
    NaN and infinities are refused in every number."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True, allow_inf_nan=False)


class InputPath(type(Path())):  # type: ignore[misc]  # the concrete Path class of this system
    """A path the service reads at start (a certificate, a key): ``serve`` and ``validate``
    check it is a readable regular file of sane size (:mod:`gputally.config.files`)."""


def _input_path(path: Path) -> InputPath:
    return InputPath(path)


InputFile = Annotated[Path, AfterValidator(_input_path)]
"""A file read at start; see :class:`InputPath`."""


class ServerTLSSettings(Strict):
    """TLS for a listening endpoint (``tls:`` under a receiver protocol)."""

    cert_file: InputFile
    """PEM certificate chain the server presents."""
    key_file: InputFile
    """PEM private key for ``cert_file``."""
    client_ca_file: InputFile | None = None
    """When set, clients must present a certificate signed by this CA (mutual TLS)."""


class ClientTLSSettings(Strict):
    """TLS for an outgoing connection (``tls:`` under an exporter)."""

    insecure: bool = False
    """Plain text (no TLS) for gRPC; otlphttp follows the URL scheme instead."""
    ca_file: InputFile | None = None
    """CA bundle to verify the server with; the system roots when unset."""
    cert_file: InputFile | None = None
    """Client certificate, for servers that demand mutual TLS."""
    key_file: InputFile | None = None
    """Private key for ``cert_file``."""
    insecure_skip_verify: bool = False
    """Accept any server certificate. For tests only."""
    server_name_override: str | None = None
    """Name to verify the server certificate against, instead of the endpoint's host."""

    @model_validator(mode="after")
    def _pair(self) -> ClientTLSSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self


class AuthSettings(Strict):
    """``auth:`` under a receiver protocol or exporter: which authenticator extension to use."""

    authenticator: str
    """ID of a ``bearertokenauth`` extension, for example ``bearertokenauth`` or ``bearertokenauth/gpu``."""


Compression = Literal["gzip", "none", ""]
