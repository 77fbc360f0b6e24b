"""The probe's exporter: the server's ``otlp`` / ``otlphttp`` exporter, configured from flags.

Keys the flags leave out come from ``OTEL_EXPORTER_OTLP_*`` (the exporters resolve them), so
``OTEL_EXPORTER_OTLP_ENDPOINT=http://gateway:4317 gputally probe nvml`` works as with any
OpenTelemetry SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import ValidationError

from gputally.errors import ConfigError
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.telemetry import SelfTelemetry

__all__ = ["create_exporter", "parse_headers", "tls_mismatch"]


def parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` as given to ``--header``; a pair without ``=`` is a ConfigError."""
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--header {pair!r}: expected KEY=VALUE")
        headers[key.strip()] = value.strip()
    return headers


def create_exporter(
    *,
    protocol: Literal["grpc", "http"],
    endpoint: str | None,
    insecure: bool,
    headers: dict[str, str],
    queue_dir: Path | None,
    telemetry: SelfTelemetry,
    shutdown_timeout: float = 30.0,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[str, Exporter]:
    """``(exporter_id, exporter)``, not started. ``overrides`` are further config keys of the
    exporter (``retry_on_failure``, ``sending_queue``...), applied last."""
    from gputally.exporters import otlp_grpc, otlp_http

    factory = otlp_grpc.factory if protocol == "grpc" else otlp_http.factory
    section: dict[str, Any] = {}
    if endpoint:
        if protocol == "http" and "://" not in endpoint:
            endpoint = f"{'http' if insecure else 'https'}://{endpoint}"
        section["endpoint"] = endpoint
    if insecure:
        section["tls"] = {"insecure": True}
    if headers:
        section["headers"] = headers
    if queue_dir is not None:
        section["sending_queue"] = {"storage": str(queue_dir)}
    section.update(overrides or {})
    try:
        config = factory.parse(section)
    except ValidationError as exc:
        raise ConfigError([
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        ]) from exc
    context = ComponentContext(id=factory.type_name, telemetry=telemetry, shutdown_timeout=shutdown_timeout)
    return factory.type_name, factory.create(config, context)


async def tls_mismatch(destination: str, *, insecure: bool, timeout: float = 3.0) -> str | None:
    """Why the server at ``destination`` cannot be reached when it is our TLS setting: one TLS
    handshake, certificates unchecked, tells a plaintext server from a TLS one. None when the
    setting fits, or when the server does not answer at all (a different problem)."""
    first = destination.split(",")[0].strip()  # otlphttp lists one URL per signal
    split = urlsplit(first if "://" in first else f"//{first}")
    if split.hostname is None:
        return None
    port = split.port or (443 if split.scheme == "https" else 4317)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(split.hostname, port, ssl=context), timeout)
    except ssl.SSLError as exc:
        plaintext = "WRONG_VERSION_NUMBER" in str(exc) or "record layer failure" in str(exc)
        if plaintext and not insecure:
            return f"the server at {split.hostname}:{port} speaks plaintext: use --insecure"
        return None
    except (OSError, TimeoutError):
        return None
    writer.close()
    with contextlib.suppress(Exception):
        await writer.wait_closed()
    if insecure:
        return f"the server at {split.hostname}:{port} speaks TLS: drop --insecure"
    return None
