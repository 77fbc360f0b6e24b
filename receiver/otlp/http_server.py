"""OTLP/HTTP: ``POST /v1/{metrics,logs,traces}`` in protobuf or JSON, on an aiohttp server.

Answers are written in the request's content type, errors as a ``google.rpc.Status``
(OTLP spec, "OTLP/HTTP Response"). Compressed bodies are inflated here, not by aiohttp, so
the size limit holds after decompression too and a zip bomb costs at most the limit: the
first MiB on the event loop (a usual request needs no more), the rest in a thread, at most
``INFLATE_THREADS`` requests of the listener at once, so a stream of bombs neither holds the
loop nor more than that many limits' worth of memory.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import HttpVersion11, hdrs, web
from prometheus_client import CollectorRegistry

from gputally.endpoint import describe_bind_error, host_port, split_endpoint
from gputally.errors import ConfigError, InvalidRequest
from gputally.h2.grpc import INLINE_INFLATE, Inflater, MessageTooLarge
from gputally.otlp import json as otlp_json
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.tls.server import ServerTLS

from .config import HTTPSettings
from .http_guard import LimitedTCPSite, MalformedRequests
from .intake import Intake
from .json_enums import check_enum_names
from .status import Failure

__all__ = ["HTTPServer"]

log = logging.getLogger(__name__)

_SETTING = "max_request_body_size"
_WBITS = {"gzip": zlib.MAX_WBITS | 16, "deflate": zlib.MAX_WBITS, "zlib": zlib.MAX_WBITS}
INFLATE_THREADS = 2
"""Requests of one listener inflating in threads at once; more wait their turn."""


class Encoding(enum.Enum):
    PROTOBUF = "application/x-protobuf"
    JSON = "application/json"


_ENCODINGS = {e.value: e for e in Encoding}
_ACCEPTED = " or ".join(_ENCODINGS)


class HTTPServer:
    """The HTTP listener of one ``otlp`` receiver."""

    def __init__(
        self,
        settings: HTTPSettings,
        *,
        name: str,
        intake: Intake,
        tls: ServerTLS | None,
        reuse_port: bool,
        grace: float,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``registry``: where malformed requests are counted (the service's)."""
        registry = registry if registry is not None else CollectorRegistry()
        self._settings = settings
        self._name = name
        self._intake = intake
        self._tls = tls
        self._reuse_port = reuse_port
        self._grace = grace
        self._limit = settings.max_request_body_size
        self._runner: web.AppRunner | None = None
        self._address: str | None = None
        self._malformed = MalformedRequests(name=name, registry=registry)
        self._inflating = asyncio.Semaphore(INFLATE_THREADS)

    @property
    def address(self) -> str | None:
        """Where the server listens (the real port when configured with 0); None when it does not."""
        return self._address

    async def start(self) -> None:
        """Bind and serve; a port that cannot be bound raises ConfigError."""
        app = web.Application(client_max_size=self._limit)
        for signal in sorted(self._intake.signals):
            app.router.add_post(SIGNALS[signal].http_path, self._handler(signal), expect_handler=self._expect_handler(signal))
        runner = web.AppRunner(
            app,
            access_log=None,  # per-request events are self-metrics, not log lines
            auto_decompress=False,  # we inflate, with a bound
            # aiohttp reads a timeout of 0 as "wait forever".
            shutdown_timeout=max(self._grace, 0.001),
            # aiohttp closes a connection that has not sent complete headers (or sat idle
            # between requests) this long: the header timeout against slow clients.
            keepalive_timeout=self._settings.read_header_timeout,
            logger=self._malformed,  # counted, one line a minute, no tracebacks
            # After an early answer (413, 408) the unread rest of a body is drained this long at
            # most, so the client can read the answer, and a slow one cannot hold the connection.
            lingering_time=2.0,
        )
        await runner.setup()
        host, port = split_endpoint(self._settings.endpoint)
        site = LimitedTCPSite(
            runner,
            host or None,
            port,
            max_connections=self._settings.max_connections,
            on_refused=lambda: self._malformed.count("connection_limit", None,
                                                     f"{self._settings.max_connections} connections are open"),
            ssl_context=self._tls.ssl_context if self._tls else None,
            reuse_port=self._reuse_port,
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                f"receivers::{self._name}: http endpoint {self._settings.endpoint}: {describe_bind_error(exc)}"
            ) from exc
        self._runner = runner
        # With several addresses (a host name resolving to IPv4 and IPv6) the first is reported.
        bound = runner.addresses[0]
        self._address = host_port(host or bound[0], bound[1])
        log.info("%s: OTLP/HTTP listening on %s%s", self._name, self._address, " (TLS)" if self._tls else "")

    async def shutdown(self) -> None:
        """Stop listening and give requests in flight the grace period."""
        if self._runner is None:
            return
        runner, self._runner = self._runner, None
        await runner.cleanup()
        log.info("%s: OTLP/HTTP on %s stopped", self._name, self._address)
        self._address = None

    def _handler(self, signal: Signal) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        intake = self._intake

        async def export(request: web.Request) -> web.StreamResponse:
            encoding = _ENCODINGS.get(request.content_type)
            failure = intake.authorize(signal, request.headers.get(hdrs.AUTHORIZATION))
            if failure is not None:
                return _failure_response(failure, encoding)
            if encoding is None:
                message = f"Content-Type {request.content_type!r} is not supported; use {_ACCEPTED}"
                return _failure_response(intake.refuse(signal, Failure.unsupported_media(message)), None)
            body = await self._read_body(request)
            if isinstance(body, web.Response):
                return body
            if isinstance(body, Failure):
                return _failure_response(intake.refuse(signal, body), encoding)
            outcome = await intake.deliver(signal, lambda: _decode(intake, signal, body, encoding))
            if isinstance(outcome, Failure):
                return _failure_response(outcome, encoding)
            return web.Response(body=_encode(outcome, encoding), content_type=encoding.value)

        return export

    def _expect_handler(self, signal: Signal) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
        """``Expect: 100-continue``: a body announced over the limit is answered 413 at once,
        before the client sends it; otherwise "100 Continue", as aiohttp would."""
        intake, limit = self._intake, self._limit

        async def expect(request: web.Request) -> web.StreamResponse | None:
            if request.content_length is not None and request.content_length > limit:
                failure = intake.refuse(signal, Failure.too_large(request.content_length, limit, _SETTING))
                response = _failure_response(failure, _ENCODINGS.get(request.content_type))
                response.force_close()  # the body it announced is not read
                return response
            if request.version == HttpVersion11:
                if request.headers.get(hdrs.EXPECT, "").lower() != "100-continue":
                    raise web.HTTPExpectationFailed(text=f"Unknown Expect: {request.headers.get(hdrs.EXPECT)}")
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                request.writer.output_size = 0  # the response proper has not started
            return None

        return expect

    async def _inflate(self, data: bytes, wbits: int, limit: int) -> bytes | None:
        """``data`` decompressed (one or more members), or None once it exceeds ``limit`` bytes;
        in bounded steps, past the first MiB in a thread and at most ``INFLATE_THREADS`` at once."""
        inflater = Inflater(data, keep=limit, limit=limit, wbits=wbits, members=True)
        if not _inflate_step(inflater, INLINE_INFLATE):
            return None
        if not inflater.done:
            async with self._inflating:
                if not await asyncio.to_thread(_inflate_step, inflater, limit + 1):
                    return None
        return inflater.message

    async def _read_body(self, request: web.Request) -> bytes | Failure | web.Response:
        """The inflated body, or why it cannot be had (too large, bad compression), or the
        answer to a client that sent it too slowly or went away."""
        limit = self._limit
        if request.content_length is not None and request.content_length > limit:
            return Failure.too_large(request.content_length, limit, _SETTING)
        try:
            async with asyncio.timeout(self._settings.read_timeout):
                raw = await request.read()  # stops at client_max_size
        except web.HTTPRequestEntityTooLarge:
            return Failure.too_large(None, limit, _SETTING)
        except TimeoutError:
            self._malformed.count("body_timeout", request.remote,
                                  f"the body did not arrive within {self._settings.read_timeout:g} s")
            response = web.Response(status=408, text="request body not received in time\n")
            response.force_close()
            return response
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            self._malformed.count("client_gone", request.remote, f"connection lost mid-body ({exc})")
            response = web.Response(status=400, text="connection lost mid-body\n")
            response.force_close()
            return response
        coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
        if coding in ("", "identity"):
            return raw
        if coding not in _WBITS:
            return Failure.unsupported_media(f"Content-Encoding {coding!r} is not supported; use gzip, deflate or none")
        try:
            inflated = await self._inflate(raw, _WBITS[coding], limit)
        except InvalidRequest as exc:
            return Failure.invalid(str(exc))
        return inflated if inflated is not None else Failure.too_large(None, limit, f"{_SETTING}, after decompression")




def _inflate_step(inflater: Inflater, budget: int) -> bool:
    """Inflate up to ``budget`` more bytes; False once the body is past its limit."""
    try:
        inflater.run(budget)
    except MessageTooLarge:
        return False
    except ValueError as exc:
        raise InvalidRequest(f"cannot decompress the request body: {exc}") from exc
    return True


def inflate(data: bytes, wbits: int, limit: int) -> bytes | None:
    """``data`` decompressed in one go, or None past ``limit``: what the handler does in steps
    (for tools and the fuzz tests, which have no listener)."""
    inflater = Inflater(data, keep=limit, limit=limit, wbits=wbits, members=True)
    return inflater.message if _inflate_step(inflater, limit + 1) else None


def _decode(intake: Intake, signal: Signal, body: bytes, encoding: Encoding) -> Batch:
    if encoding is Encoding.PROTOBUF:
        return intake.decode(signal, body)
    check_enum_names(body)  # protobuf's parser would read an unknown name as 0
    try:
        message = otlp_json.decode(body, SIGNALS[signal].request())
    except (SystemError, UnicodeError) as exc:
        # An escaped unpaired surrogate ("\udc00") is legal JSON but not a Unicode string;
        # protobuf's C parser fails on it with a SystemError (found by tests/fuzz).
        raise InvalidRequest("invalid OTLP/JSON: a string holds an unpaired surrogate (not valid Unicode)") from exc
    # Re-encoded and decoded as protobuf so JSON gets exactly the same checks (nameless
    # metrics rejected, items counted); the cost is small next to parsing the JSON.
    return intake.decode(signal, message.SerializeToString())


def _encode(message: Any, encoding: Encoding) -> bytes:
    if encoding is Encoding.JSON:
        return otlp_json.encode(message)
    return bytes(message.SerializeToString())


def _failure_response(failure: Failure, encoding: Encoding | None) -> web.Response:
    headers = {}
    if failure.retry_after_header is not None:
        headers[hdrs.RETRY_AFTER] = failure.retry_after_header
    if failure.http_status == 401:
        headers[hdrs.WWW_AUTHENTICATE] = "Bearer"
    if encoding is None:  # the sender's format is unknown or unsupported: say it in words
        return web.Response(status=failure.http_status, text=failure.message, headers=headers)
    return web.Response(
        status=failure.http_status,
        body=_encode(failure.rpc_status(), encoding),
        content_type=encoding.value,
        headers=headers,
    )
