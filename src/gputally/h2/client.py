"""A gRPC client channel on asyncio: unary calls over one HTTP/2 connection, reconnecting.

Like the server, it runs in the event loop's thread: a call is one write of its frames, its
answer is parsed where the loop reads it. The channel keeps one connection, opens it on the
first call, and after a failed connect waits a growing, jittered backoff (as gRPC's
``initial_reconnect_backoff_ms`` / ``max_reconnect_backoff_ms``) during which calls fail at
once with UNAVAILABLE, unless ``wait_for_ready`` makes them wait for the connection within
their deadline. A GOAWAY sends new calls to a fresh connection; calls the server said it
never started, and calls on a connection that broke, end UNAVAILABLE (retryable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import ssl
from collections.abc import Mapping

import grpc

from gputally.util.backoff import Backoff

from . import hpack
from .client_connection import ClientConnection
from .connection import READ_SIZE
from .limits import Limits
from .grpc import (
    GrpcError,
    Metadata,
    encode_metadata,
    format_timeout,
    gzip,
    message,
    read_message,
)
from .proxy import Proxy, proxy_for, tunnel
from .target import Target, parse_target

__all__ = ["Channel", "Proxy", "Target", "parse_target", "proxy_for"]

log = logging.getLogger(__name__)

MAX_RESPONSE = 64 * 2**20
"""Largest response message read (gRPC's default would be 4 MiB; OTLP answers are tiny)."""
class Channel:
    """Unary gRPC calls to one target over one reconnecting HTTP/2 connection."""

    def __init__(
        self,
        target: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        user_agent: str = "gputally",
        initial_backoff: float = 1.0,
        max_backoff: float = 120.0,
        connect_timeout: float = 20.0,
        rng: random.Random | None = None,
        keepalive_time: float = 0.0,
        keepalive_timeout: float = 20.0,
        keepalive_permit_without_stream: bool = False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._target = parse_target(target)
        self.max_response = MAX_RESPONSE
        """Largest response message read."""
        self.read_buffer = bytearray(READ_SIZE)
        """What the channel's connections read into (see :mod:`.connection`)."""
        self.connection_limits = Limits(keepalive_time=keepalive_time, keepalive_timeout=keepalive_timeout, read_timeout=0)
        self.keepalive_without_calls = keepalive_permit_without_stream
        """Keepalive PINGs go even while no call is in flight."""
        self._proxy = proxy_for(self._target, os.environ if environ is None else environ)
        self.description = target
        self._ssl = ssl_context
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        self._server_hostname = server_hostname
        self._scheme = "https" if ssl_context is not None else "http"
        self._user_agent = user_agent
        self._backoff = Backoff(initial=initial_backoff, maximum=max_backoff, factor=1.6, jitter=0.2, rng=rng)
        """Between failed connects, as gRPC's connection backoff: x1.6, +-20 %."""
        self._connect_timeout = connect_timeout
        self._connection: ClientConnection | None = None
        self._connecting: asyncio.Task[ClientConnection] | None = None
        self._retry_at = 0.0
        self._last_error = ""
        self._request_blocks: dict[tuple[str, float | None, Metadata, bool], bytes] = {}
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._connection is not None and self._connection.usable

    async def unary(
        self,
        path: str,
        request: bytes,
        *,
        timeout: float | None = None,
        metadata: Metadata = (),
        compress: bool = False,
        wait_for_ready: bool = False,
    ) -> bytes:
        """The response's bytes; GrpcError for any other status (UNAVAILABLE when unreachable,
        DEADLINE_EXCEEDED past ``timeout``)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        connection = self._connection
        if connection is None or not connection.usable or connection.full:
            # Waits for a connection or for room are bounded here; the answer, by the
            # connection's deadline timer (no timer of its own for a call that need not wait).
            try:
                async with asyncio.timeout_at(deadline):
                    connection = await self._ready(connection, deadline, wait_for_ready)
            except TimeoutError:
                raise GrpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        block = self._request_blocks.get((path, timeout, metadata, compress)) \
            or self._request_block(path, timeout, metadata, compress)  # a call only the first time
        body = message(gzip(request) if compress else request, compressed=compress)
        stream_id, future = connection.start(block, body, deadline)
        try:
            error, raw, encoding = await future
        except asyncio.CancelledError:
            connection.cancel(stream_id)
            raise
        if error is not None:
            raise error
        try:
            return read_message(raw, encoding, self.max_response) if raw else b""
        except ValueError as exc:
            raise GrpcError(grpc.StatusCode.INTERNAL, f"undecodable response: {exc}") from exc

    async def _ready(self, connection: ClientConnection | None, deadline: float | None,
                     wait_for_ready: bool) -> ClientConnection:
        """A usable connection with room for one more stream."""
        if connection is None or not connection.usable:
            connection = await self._usable(deadline, wait_for_ready)
        if connection.full:
            await connection.wait_for_room()
            if not connection.usable:
                connection = await self._usable(deadline, wait_for_ready)
        return connection

    def _request_block(self, path: str, timeout: float | None, metadata: Metadata, compress: bool) -> bytes:
        key = (path, timeout, metadata, compress)
        block = self._request_blocks.get(key)
        if block is None:
            if len(self._request_blocks) >= 64:  # a rotating token or changing metadata: start over
                self._request_blocks.clear()
            block = self._request_blocks[key] = self._encode(path, timeout, metadata, compress)
        return block

    def _encode(self, path: str, timeout: float | None, metadata: Metadata, compress: bool) -> bytes:
        """A request's header block; stateless (no table), so the same call reuses it."""
        headers = [
            (":method", "POST"), (":scheme", self._scheme), (":path", path),
            (":authority", self._server_hostname or self._target.authority),
            ("content-type", "application/grpc"), ("te", "trailers"), ("user-agent", self._user_agent),
        ]
        if timeout is not None:
            headers.append(("grpc-timeout", format_timeout(timeout)))
        if compress:
            headers.append(("grpc-encoding", "gzip"))
        headers.append(("grpc-accept-encoding", "identity,gzip"))
        headers.extend(encode_metadata(metadata))
        return hpack.encode(headers)

    async def connect(self) -> None:
        """Connect now (as a call would), raising GrpcError UNAVAILABLE when it fails."""
        await self._usable(None, wait_for_ready=False)

    async def _usable(self, deadline: float | None, wait_for_ready: bool) -> ClientConnection:
        while True:
            if self._closed:
                raise GrpcError(grpc.StatusCode.UNAVAILABLE, "the channel is closed")
            connection = self._connection
            if connection is not None and connection.usable:
                return connection
            loop = asyncio.get_running_loop()
            now = loop.time()
            if now < self._retry_at:
                if not wait_for_ready:
                    raise GrpcError(grpc.StatusCode.UNAVAILABLE, self._last_error)
                wake = self._retry_at if deadline is None else min(self._retry_at, deadline)
                await asyncio.sleep(max(wake - now, 0))
                continue
            if self._connecting is None:
                self._connecting = loop.create_task(self._connect(), name=f"connect {self.description}")
            try:
                return await asyncio.shield(self._connecting)
            except OSError as exc:
                if not wait_for_ready:
                    raise GrpcError(grpc.StatusCode.UNAVAILABLE, self._last_error) from exc

    async def _connect(self) -> ClientConnection:
        target = self._target
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                def made() -> ClientConnection:
                    return ClientConnection(self)

                hostname = (self._server_hostname or target.host) if self._ssl else None
                if target.path is not None:
                    transport, connection = await loop.create_unix_connection(
                        made, target.path, ssl=self._ssl,
                        server_hostname=self._server_hostname or ("localhost" if self._ssl else None))
                elif self._proxy is not None:
                    sock = await tunnel(self._proxy, target)
                    transport, connection = await loop.create_connection(made, sock=sock, ssl=self._ssl,
                                                                         server_hostname=hostname)
                else:
                    transport, connection = await loop.create_connection(made, target.host, target.port, ssl=self._ssl,
                                                                         server_hostname=hostname)
                if self._ssl is not None:
                    tls = transport.get_extra_info("ssl_object")
                    if tls is None or tls.selected_alpn_protocol() != "h2":
                        transport.abort()
                        raise OSError("the server did not select h2 by ALPN")
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            self._failed(exc)
            raise OSError(self._last_error) from exc
        finally:
            self._connecting = None
        self._backoff.reset()
        self._retry_at = 0.0
        old, self._connection = self._connection, connection
        if old is not None and not old.in_flight:
            old.close()
        return connection

    def _failed(self, exc: BaseException) -> None:
        reason = "timed out" if isinstance(exc, TimeoutError) else (str(exc) or type(exc).__name__)
        self._last_error = f"failed to connect to {self.description}: {reason}"
        self._retry_at = asyncio.get_running_loop().time() + self._backoff.next()

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(BaseException):
                await self._connecting
        if self._connection is not None:
            self._connection.close()
            self._connection = None
