"""The ``otlphttp`` exporter: OTLP over HTTP POSTs, as the OpenTelemetry Collector's exporter.

Per the OTLP specification, 429, 502, 503 and 504 are retried (honouring ``Retry-After``, in
seconds or as an HTTP date), as are connection failures and timeouts; any other status is
permanent. Protobuf bodies are the batch's bytes as they arrived; ``encoding: json`` writes
OTLP/JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import ssl
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from gputally import __version__
from gputally.auth import BearerTokenAuth
from gputally.config.files import check_input_file
from gputally.config.types import ClientTLSSettings
from gputally.errors import ConfigError, InvalidRequest, PermanentExportError, TransientExportError
from gputally.exporterhelper.otlpconfig import Target
from gputally.exporterhelper.sender import QueuedExporter
from gputally.exporterhelper.transport import Receipt, receipt_from_response
from gputally.exporters.otlphttp.config import OTLPHttpConfig
from gputally.otlp import json as otlp_json
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.pipeline.component import ComponentContext
from gputally.tls.client import client_ssl_context

__all__ = ["HttpTransport", "create_exporter", "parse_retry_after"]

log = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
_CONTENT_TYPE = {"proto": "application/x-protobuf", "json": "application/json"}
_MAX_RESPONSE = 64 * 1024
"""Bytes of a response body read at most: enough for any partial success or error message."""
_THREAD_GZIP = 64 * 1024
"""Bodies larger than this are compressed in a thread, off the event loop."""
_HostPort = tuple[str, int]


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delay-seconds or HTTP-date); None if absent or bad."""
    if not value or not value.strip():
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


def _host_port(url: str) -> _HostPort:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)


def _error_text(body: bytes, content_type: str) -> str:
    """The message of a google.rpc.Status body, or the start of whatever else came back."""
    status = status_pb2.Status()
    try:
        if content_type == "application/x-protobuf":
            status.ParseFromString(body)
            return str(status.message)
        if content_type == "application/json":
            json_format.Parse(body, status, ignore_unknown_fields=True)
            return str(status.message)
    except (DecodeError, json_format.ParseError):
        pass
    return body[:200].decode("utf-8", "replace").strip()


def _encode_json(signal: Signal, raw: bytes) -> bytes:
    return otlp_json.encode(SIGNALS[signal].request.FromString(raw))


async def _read_limited(response: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(16 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size >= _MAX_RESPONSE:
            break
    return b"".join(chunks)[:_MAX_RESPONSE]


class HttpTransport:
    """POSTs batches with one aiohttp session, opened in start() and closed in close()."""

    def __init__(
        self,
        targets: Mapping[Signal, Target],
        *,
        authenticator: BearerTokenAuth | None,
        encoding: Literal["proto", "json"],
    ) -> None:
        self._targets = dict(targets)
        self._auth = authenticator
        self._encoding = encoding
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[ClientTLSSettings, ssl.SSLContext] = {}
        self._hosts = {_host_port(t.endpoint) for t in self._targets.values()}
        self._reached: set[_HostPort] = set()
        self._probes: list[asyncio.Task[None]] = []

    @property
    def description(self) -> str:
        return ", ".join(sorted({t.endpoint for t in self._targets.values()}))

    @property
    def ready(self) -> bool:
        return self._reached >= self._hosts

    async def start(self) -> None:
        if self._session is not None:
            return
        for target in self._targets.values():
            if not target.tls.insecure and target.tls not in self._ssl:
                _check_tls_files(target.tls)  # never hand OpenSSL a directory or a device to read
                self._ssl[target.tls] = await asyncio.to_thread(client_ssl_context, target.tls)
        self._session = aiohttp.ClientSession(headers={"User-Agent": f"gputally/{__version__}"})
        self._probes = [
            asyncio.create_task(self._probe(host_port), name=f"otlphttp probe {host_port[0]}:{host_port[1]}")
            for host_port in self._hosts
        ]

    async def _probe(self, host_port: _HostPort) -> None:
        """Mark the host reached once a TCP connection succeeds, without waiting for an export."""
        delay = 0.5
        while host_port not in self._reached:
            try:
                async with asyncio.timeout(5):  # not wait_for: it can swallow cancellation on 3.11
                    _, writer = await asyncio.open_connection(*host_port)
            except (OSError, TimeoutError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._reached.add(host_port)

    async def _body(self, batch: Batch, target: Target) -> bytes:
        raw = batch.serialize()
        if self._encoding == "json":
            raw = await asyncio.to_thread(_encode_json, batch.signal, raw)
        if target.compression == "gzip":
            if len(raw) > _THREAD_GZIP:
                return await asyncio.to_thread(gzip.compress, raw, 6)
            return gzip.compress(raw, 6)
        return raw

    async def send(self, batch: Batch) -> Receipt:
        if self._session is None:
            raise TransientExportError("exporter not started")
        target = self._targets[batch.signal]
        headers = {"Content-Type": _CONTENT_TYPE[self._encoding]}
        if target.compression == "gzip":
            headers["Content-Encoding"] = "gzip"
        headers.update(target.headers)
        if self._auth is not None:
            headers["Authorization"] = self._auth.header_value()
        body = await self._body(batch, target)
        try:
            async with self._session.post(
                target.endpoint,
                data=body,
                headers=headers,
                ssl=self._ssl.get(target.tls, True),
                server_hostname=target.tls.server_name_override,
                timeout=aiohttp.ClientTimeout(total=target.timeout),
            ) as response:
                payload = await _read_limited(response)
                status, content_type = response.status, response.content_type
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TransientExportError(f"{target.endpoint}: {exc or type(exc).__name__}") from exc
        if 200 <= status < 300:
            self._reached.add(_host_port(target.endpoint))
            return self._receipt(batch.signal, payload, content_type)
        message = f"HTTP {status} from {target.endpoint}: {_error_text(payload, content_type)}"
        if status in _RETRYABLE_STATUS:
            raise TransientExportError(message, retry_after=parse_retry_after(retry_after))
        raise PermanentExportError(message)

    def _receipt(self, signal: Signal, body: bytes, content_type: str) -> Receipt:
        if not body:
            return Receipt()
        response = SIGNALS[signal].response()
        try:
            if content_type == "application/json":
                otlp_json.decode(body, response)
            else:
                response.ParseFromString(body)
        except (DecodeError, InvalidRequest):
            log.debug("undecodable Export response (%s); ignoring it", content_type)
            return Receipt()
        return receipt_from_response(signal, response)

    def drain(self) -> None:
        """Nothing to do: each request opens or reuses a connection, with no backoff of its own."""

    async def close(self) -> None:
        for task in self._probes:
            task.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        self._probes.clear()
        if self._session is not None:
            await self._session.close()


def create_exporter(
    config: OTLPHttpConfig,
    context: ComponentContext,
    *,
    environ: Mapping[str, str],
) -> QueuedExporter:
    """Build the exporter, with ``environ`` supplying OTEL_EXPORTER_OTLP_* defaults."""
    transport = HttpTransport(
        config.targets(environ),
        authenticator=context.authenticator(config.auth),
        encoding=config.encoding,
    )
    return QueuedExporter.from_config(
        transport, retry=config.retry_on_failure, queue=config.sending_queue, context=context
    )




def _check_tls_files(tls: ClientTLSSettings) -> None:
    problems = [
        problem
        for key, path in (("tls.ca_file", tls.ca_file), ("tls.cert_file", tls.cert_file), ("tls.key_file", tls.key_file))
        if path is not None and (problem := check_input_file(path, key=key)) is not None
    ]
    if problems:
        raise ConfigError(problems)
