"""What keeps the OTLP/HTTP listener healthy against clients that misbehave, on purpose or not.

* :class:`MalformedRequests` stands in for aiohttp's server logger. aiohttp logs every request
  it cannot parse (negative ``Content-Length``, 3,000 headers, an 8 KiB header line,
  ``Content-Length`` with ``Transfer-Encoding``) and every client that vanished mid-body as an
  ERROR with a traceback, so any unauthenticated client could flood the log. Here each is
  counted in ``gputally_receiver_malformed_requests_total{reason}`` and written as one line at
  most once a minute per reason (the next line says how many were held back). An exception
  that is none of these is a bug of ours and keeps its traceback (also at most once a minute).
* :class:`LimitedTCPSite` closes a connection as soon as it is accepted when
  ``max_connections`` are already open, so slow clients cannot exhaust file descriptors.
  (Header and body timeouts are set where the server is built.)
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry, Counter

from gputally.logthrottle.throttle import LogThrottle

__all__ = ["LimitedTCPSite", "MalformedRequests", "malformed_counter"]

log = logging.getLogger("gputally.receiver.otlp.http_server")

_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def malformed_counter(registry: CollectorRegistry) -> Counter:
    """``gputally_receiver_malformed_requests_total{receiver, transport, reason}`` in ``registry``."""
    family = _FAMILIES.get(registry)
    if family is None:
        family = Counter(
            "gputally_receiver_malformed_requests",
            "Requests turned away before they were OTLP: unparsable HTTP, a client gone mid-body, a body "
            "too slow, a connection over the limit.",
            ["receiver", "transport", "reason"],
            registry=registry,
        )
        _FAMILIES[registry] = family
    return family


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, HttpProcessingError):
        return "bad_request"
    if isinstance(exc, (ConnectionError, asyncio.IncompleteReadError)):
        return "client_gone"
    return "other"


def _summary(exc: BaseException | None) -> str:
    if isinstance(exc, HttpProcessingError):
        text = f"{exc.message} ({exc.code})" if exc.message else f"HTTP {exc.code}"
    else:
        text = f"{type(exc).__name__}: {exc}" if exc is not None else "unknown"
    text = " ".join(str(text).split())
    return text if len(text) <= 200 else text[:200] + "..."


class MalformedRequests:
    """A counting, throttled stand-in for the logger aiohttp's request handler writes to."""

    def __init__(self, *, name: str, registry: CollectorRegistry, interval: float = 60.0) -> None:
        self._name = name
        self._family = malformed_counter(registry)
        self._throttle = LogThrottle(log, interval=interval)
        self._traced = False

    def count(self, reason: str, remote: str | None = None, summary: str = "") -> None:
        """One request turned away for ``reason``; logged at most once a minute per reason."""
        self._family.labels(receiver=self._name, transport="http", reason=reason).inc()
        self._throttle.log(reason, logging.WARNING, "%s: HTTP request from %s refused (%s): %s; counted in "
                           "gputally_receiver_malformed_requests_total", self._name, remote or "?", reason, summary)

    # -- the logger interface aiohttp uses -------------------------------------------------

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        exc = exc_info if isinstance(exc_info, BaseException) else None
        reason = _reason(exc)
        remote = str(args[0]) if args else None
        if reason == "other":  # not the client's fault: a bug of ours; the first one with its traceback
            self._family.labels(receiver=self._name, transport="http", reason=reason).inc()
            if not self._traced:
                self._traced = True
                log.error("%s: error handling an HTTP request from %s", self._name, remote or "?", exc_info=exc_info)
            else:
                self._throttle.log("other", logging.ERROR, "%s: error handling an HTTP request from %s: %s",
                                   self._name, remote or "?", _summary(exc))
            return
        self.count(reason, remote, _summary(exc))

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.exception(msg, *args, **kwargs)

    def debug(self, msg: str, *args: Any, exc_info: Any = None, **kwargs: Any) -> None:
        if isinstance(exc_info, BaseException):  # aiohttp: non-HTTP bytes on an HTTP port
            self.count(_reason(exc_info), str(args[0]) if args else None, _summary(exc_info))
            return
        log.debug(msg, *args)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        log.warning(msg, *args)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        log.info(msg, *args)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        return log.isEnabledFor(level)


class _Closed(asyncio.Protocol):
    """What a connection over the limit gets: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()  # a TCP server's connections are stream transports


class LimitedTCPSite(web.TCPSite):
    """A TCP site that refuses connections beyond ``max_connections`` open at once."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *, max_connections: int,
                 on_refused: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(runner, host, port, **kwargs)
        self._max_connections = max_connections
        self._on_refused = on_refused

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        limit, refused = self._max_connections, self._on_refused

        def protocol() -> asyncio.Protocol:
            if len(server.connections) >= limit:
                refused()
                return _Closed()
            return server()

        self._server = await asyncio.get_running_loop().create_server(
            protocol,
            self._host,
            self._port,
            ssl=self._ssl_context,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
