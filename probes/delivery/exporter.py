"""The probe's exporter: the server's ``otlp`` / ``otlphttp`` exporter, configured from flags,
and the tally of what became of what the probe handed it.

Keys the flags leave out come from ``OTEL_EXPORTER_OTLP_*`` (the exporters resolve them), so
``OTEL_EXPORTER_OTLP_ENDPOINT=http://gateway:4317 gputally probe nvml`` works as with any
OpenTelemetry SDK. The exporter tells a :class:`DeliveryTally` of every settled batch
(:class:`~gputally.exporterhelper.sender.DeliveryListener`), so the probe knows what it delivered
without reading the exporter's metrics back.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import ValidationError

from gputally.errors import ConfigError
from gputally.exporterhelper.sender import DeliveryListener, QueuedExporter
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.pipeline.factory import ConfigT, ExporterFactory
from gputally.pipeline.registry import EXPORTER_GROUP, load_factory
from gputally.storage import FileStorageConfig
from gputally.telemetry import SelfTelemetry

__all__ = ["DeliveryTally", "ProbeExporter", "counted", "create_exporter", "parse_headers", "tls_mismatch"]


class ProbeExporter(Protocol):
    """What the runner needs of its exporter: the pipeline's calls, word of each batch's fate,
    and the queue's fill for the summary line. :class:`QueuedExporter` is one."""

    async def start(self) -> None: ...

    async def export(self, batch: Batch) -> None: ...

    async def shutdown(self) -> None: ...

    def add_listener(self, listener: DeliveryListener) -> None: ...

    @property
    def queued(self) -> int: ...

    @property
    def capacity(self) -> int: ...


class DeliveryTally:
    """What became of the batches handed to the exporter, told by the exporter itself, and the
    one reason worth acting on (a server without a logs pipeline). :meth:`wait_settled` wakes
    when everything handed over is sent or given up on."""

    def __init__(self, on_attempt_failed: Callable[[Signal, Exception], None]) -> None:
        self.expected = {Signal.METRICS: 0, Signal.LOGS: 0}
        self.sent = {Signal.METRICS: 0, Signal.LOGS: 0}
        self.failed_items = {Signal.METRICS: 0, Signal.LOGS: 0}
        self.logs_unimplemented = False
        self._on_attempt_failed = on_attempt_failed
        self._settled = asyncio.Event()
        self._settled.set()

    def handed(self, batch: Batch) -> None:
        """The exporter accepted ``batch``: its items are now awaited."""
        self.expected[batch.signal] += batch.items
        self._note()

    def attempt_failed(self, signal: Signal, error: Exception) -> None:
        self._on_attempt_failed(signal, error)

    def settled(self, signal: Signal, sent: int, failed: int, error: BaseException | None) -> None:
        self.sent[signal] += sent
        self.failed_items[signal] += failed
        if signal is Signal.LOGS and failed and error is not None and _unimplemented(error):
            self.logs_unimplemented = True
        self._note()

    def is_settled(self) -> bool:
        """True once the exporter has sent (or given up on) every item handed to it."""
        return all(self.sent[s] + self.failed_items[s] >= n for s, n in self.expected.items())

    async def wait_settled(self) -> None:
        await self._settled.wait()

    def failed(self) -> bool:
        """Something was lost, other than logs a server without a logs pipeline refused."""
        return self.failed_items[Signal.METRICS] > 0 or (
            self.failed_items[Signal.LOGS] > 0 and not self.logs_unimplemented
        )

    def summary(self) -> str:
        return (f"sent {counted(self.sent[Signal.METRICS], 'point')}, "
                f"{counted(self.sent[Signal.LOGS], 'log record')}; "
                f"failed {self.failed_items[Signal.METRICS] + self.failed_items[Signal.LOGS]}")

    def _note(self) -> None:
        if self.is_settled():
            self._settled.set()
        else:
            self._settled.clear()


def _unimplemented(error: BaseException) -> bool:
    """The server has no pipeline for the signal: gRPC UNIMPLEMENTED, HTTP 404."""
    text = str(error)
    return text.startswith("UNIMPLEMENTED") or text.startswith("HTTP 404")


def counted(n: int, noun: str, plural: str = "") -> str:
    """``1 point``, ``2 points``; ``plural`` where adding an s is wrong."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` as given to ``--header``; a pair without ``=`` is a ConfigError."""
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--header {pair!r}: expected KEY=VALUE")
        headers[key.strip()] = value.strip()
    return headers


_QUEUE_STORAGE = "file_storage"
"""The extension ID ``--queue-dir`` stands for."""


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
) -> tuple[str, QueuedExporter]:
    """``(exporter_id, exporter)``, not started. ``overrides`` are further config keys of the
    exporter (``retry_on_failure``, ``sending_queue``...), applied last."""
    section: dict[str, Any] = {}
    if endpoint:
        if protocol == "http" and "://" not in endpoint:
            endpoint = f"{'http' if insecure else 'https'}://{endpoint}"
        section["endpoint"] = endpoint
    if insecure:
        section["tls"] = {"insecure": True}
    if headers:
        section["headers"] = headers
    storage: dict[str, FileStorageConfig] = {}
    if queue_dir is not None:  # --queue-dir: the probe's own file_storage extension
        storage[_QUEUE_STORAGE] = FileStorageConfig(directory=queue_dir)
        section["sending_queue"] = {"storage": _QUEUE_STORAGE}
    section.update(overrides or {})
    # Found by type through the registry, as the service finds it: the probe builds the
    # server's exporter without importing another component.
    factory = load_factory(EXPORTER_GROUP, "otlp" if protocol == "grpc" else "otlphttp", ExporterFactory)
    type_name, exporter = _built(factory, section, telemetry, shutdown_timeout, storage)
    assert isinstance(exporter, QueuedExporter)  # both OTLP exporters are; the probe relies on its listener
    return type_name, exporter


def _built(factory: ExporterFactory[ConfigT], section: Mapping[str, Any], telemetry: SelfTelemetry,
           shutdown_timeout: float, storage: Mapping[str, FileStorageConfig]) -> tuple[str, Exporter]:
    """``(type name, exporter)`` of ``factory`` for ``section``. Generic in the factory's config
    type, so the config it parses is the one its ``create`` takes."""
    try:
        config = factory.parse(section)
    except ValidationError as exc:
        raise ConfigError([
            f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}" for error in exc.errors()
        ]) from exc
    context = ComponentContext(id=factory.type_name, telemetry=telemetry, shutdown_timeout=shutdown_timeout,
                               storage=storage)
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
