"""The admin endpoint: ``/metrics`` (Prometheus), ``/healthz`` (live), ``/readyz`` (ready).

``/readyz`` answers 503 until every exporter has reached its backend, and names the ones
that have not, so a Kubernetes readiness probe and a person with curl see the same thing.
Components that work below par (a metadata source down, attribution from cache) are listed
under ``degraded`` without failing readiness: data still flows, and refusing it would lose it.

The endpoint listens on loopback by default. Exposed further, it takes the receiver's options:
``tls`` (HTTPS, optionally mutual) and ``auth`` (a bearer token that ``/metrics`` and
``/readyz`` require; ``/healthz`` says only that the process runs and stays open).
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

from aiohttp import hdrs, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gputally.errors import ConfigError

if TYPE_CHECKING:
    from gputally.auth import BearerTokenAuth

__all__ = ["AdminServer"]

log = logging.getLogger(__name__)


class AdminServer:
    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        not_ready: Callable[[], list[str]],
        degraded: Callable[[], dict[str, str]] = dict,
        *,
        reuse_port: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        auth: BearerTokenAuth | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"service.telemetry.metrics.address: {address!r} is not host:port")
        self._host, self._port = host.strip("[]"), int(port)
        self._registry = registry
        self._not_ready = not_ready
        self._degraded = degraded
        self._reuse_port = reuse_port
        self._ssl_context = ssl_context
        self._auth = auth
        self._runner: web.AppRunner | None = None
        self.address: str | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._guarded(self._metrics))
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._guarded(self._readyz))
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, keepalive_timeout=30)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_port=self._reuse_port or None,
                           ssl_context=self._ssl_context)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            self._runner = None
            raise ConfigError(
                f"service.telemetry.metrics.address: cannot listen on {self._host}:{self._port}: {exc.strerror}"
            ) from exc
        # aiohttp exposes no bound port; its server is the loop's create_server() result.
        server = cast("asyncio.Server | None", site._server)  # noqa: SLF001
        sockets = server.sockets if server else []
        port = sockets[0].getsockname()[1] if sockets else self._port
        self.address = f"{self._host}:{port}"

    async def shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _guarded(self, handler: Callable[[web.Request], Awaitable[web.Response]]) -> Callable[
        [web.Request], Awaitable[web.Response]
    ]:
        """``handler`` behind the bearer token, when ``auth`` is set."""
        auth = self._auth
        if auth is None:
            return handler

        async def guarded(request: web.Request) -> web.Response:
            if not auth.verify(request.headers.get(hdrs.AUTHORIZATION)):
                return web.Response(status=401, text="unauthenticated\n", headers={hdrs.WWW_AUTHENTICATE: "Bearer"})
            return await handler(request)

        return guarded

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        waiting = self._not_ready()
        status = 503 if waiting else 200
        body = {"ready": not waiting, "waiting_for": waiting, "degraded": self._degraded()}
        return web.Response(status=status, text=json.dumps(body) + "\n", content_type="application/json")
