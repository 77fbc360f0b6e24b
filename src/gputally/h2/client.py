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
import base64
import contextlib
import ipaddress
import logging
import os
import random
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import grpc

from gputally.util.backoff import Backoff

from . import hpack
from .connection import Connection
from .frames import ErrorCode
from .limits import Limits
from .grpc import (
    GrpcError,
    Metadata,
    encode_metadata,
    format_timeout,
    gzip,
    http_status_code,
    message,
    read_message,
    status_from,
)

__all__ = ["Channel", "Proxy", "Target", "parse_target", "proxy_for"]

log = logging.getLogger(__name__)

MAX_RESPONSE = 64 * 2**20
"""Largest response message read (gRPC's default would be 4 MiB; OTLP answers are tiny)."""
_LAST_STREAM_ID = 2**31 - 1

_RESET_CODES: dict[int, grpc.StatusCode] = {
    ErrorCode.REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.CANCEL: grpc.StatusCode.CANCELLED,
    ErrorCode.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}


@dataclass(frozen=True)
class Target:
    """Where a channel connects: a TCP host and port, or a unix socket path."""

    host: str = ""
    port: int = 0
    path: str | None = None

    @property
    def authority(self) -> str:
        if self.path is not None:
            return "localhost"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_target(target: str) -> Target:
    """A gRPC target string (``host:port``, ``dns:///host:port``, ``[::1]:port``, ``unix:path``,
    ``unix:///abs/path``, ``ipv4:addr:port``, ``ipv6:[addr]:port``); ValueError when malformed."""
    if target.startswith("unix:"):
        path = target.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ValueError(f"{target!r}: a unix target needs a path")
        return Target(path=path)
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target.removeprefix(scheme)
            break
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else ""
    else:
        host, sep, port_text = target.rpartition(":")
        if not sep:
            host, port_text = target, ""
    if not host:
        raise ValueError(f"{target!r}: no host")
    if not port_text:
        return Target(host=host, port=443)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{target!r}: the port is not a number from 1 to 65535")
    return Target(host=host, port=int(port_text))


class _Pending:
    __slots__ = ("body", "deadline", "future", "headers", "size")

    def __init__(self, future: asyncio.Future[tuple[GrpcError | None, bytes, str | None]],
                 deadline: float | None) -> None:
        self.future = future
        self.deadline = deadline
        """The loop time the call ends by (DEADLINE_EXCEEDED), if it has a timeout."""
        self.headers: list[tuple[str, str]] | None = None
        self.body: list[bytes] = []
        self.size = 0

    def fail(self, error: GrpcError) -> None:
        """End the call with ``error`` (unless it has ended already)."""
        if not self.future.done():
            self.future.set_result((error, b"", None))


class _ClientConnection(Connection):
    client = True

    def __init__(self, channel: Channel) -> None:
        super().__init__(limits=channel._limits)
        self._channel = channel
        self._next_stream = 1
        self._calls: dict[int, _Pending] = {}
        self._room = asyncio.Event()
        self._room.set()
        self.draining = False

    @property
    def usable(self) -> bool:
        return not self.closed and not self.draining and self._next_stream < _LAST_STREAM_ID

    @property
    def full(self) -> bool:
        """The peer's SETTINGS_MAX_CONCURRENT_STREAMS allows no more streams now."""
        return self._peer_max_streams is not None and len(self._calls) >= self._peer_max_streams

    async def wait_for_room(self) -> None:
        while self.full and not self.closed:
            self._room.clear()
            await self._room.wait()

    def start(self, block: bytes, body: bytes, deadline: float | None = None,
              ) -> tuple[int, asyncio.Future[tuple[GrpcError | None, bytes, str | None]]]:
        stream_id = self._next_stream
        self._next_stream += 2
        future: asyncio.Future[tuple[GrpcError | None, bytes, str | None]] = asyncio.get_running_loop().create_future()
        self._calls[stream_id] = _Pending(future, deadline)
        if deadline is not None:
            self._arm_deadline(deadline)
        self._open(stream_id)
        self.send(stream_id, block, body)
        return stream_id, future

    def cancel(self, stream_id: int) -> None:
        if self._calls.pop(stream_id, None) is not None:
            self.reset(stream_id, ErrorCode.CANCEL)
            self._freed()

    def _expire(self, now: float) -> float | None:
        """Calls past their deadline end DEADLINE_EXCEEDED and their streams are cancelled."""
        late = [stream_id for stream_id, call in self._calls.items()
                if call.deadline is not None and call.deadline <= now]
        for stream_id in late:
            self._calls.pop(stream_id).fail(GrpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            self.reset(stream_id, ErrorCode.CANCEL)
        if late:
            self._freed()
        return min((call.deadline for call in self._calls.values() if call.deadline is not None), default=None)

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        if call.headers is None:
            call.headers = headers
            status = next((value for name, value in headers if name == ":status"), "")
            if status != "200":
                self._finish(stream_id, GrpcError(http_status_code(status), f"HTTP status {status or 'missing'}"))
                return
            if end_stream:  # trailers-only
                self._finish(stream_id, status_from(headers))
        elif end_stream:
            self._finish(stream_id, status_from(headers))

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        call.body.append(data)
        call.size += len(data)
        if call.size > MAX_RESPONSE + 5:  # never hold more than the largest answer we would read
            self._calls.pop(stream_id)
            self.reset(stream_id, ErrorCode.CANCEL)
            call.fail(GrpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"response larger than {MAX_RESPONSE} bytes"))
            self._freed()
            return
        if end_stream:
            self._finish(stream_id, GrpcError(grpc.StatusCode.INTERNAL, "the server ended the stream without trailers"))

    def _finish(self, stream_id: int, error: GrpcError | None) -> None:
        call = self._calls.pop(stream_id, None)
        self._forget(stream_id)
        if call is None:
            return
        encoding = next((value for name, value in call.headers or () if name == "grpc-encoding"), None)
        if not call.future.done():
            call.future.set_result((error, b"".join(call.body), encoding))
        self._freed()

    def _on_reset(self, stream_id: int, code: int) -> None:
        call = self._calls.pop(stream_id, None)
        if call is not None:
            status = _RESET_CODES.get(code, grpc.StatusCode.INTERNAL)  # ErrorCode keys hash as their ints
            call.fail(GrpcError(status, f"stream reset by the server (HTTP/2 error {code})"))
        self._freed()

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.draining = True
        for stream_id in [s for s in self._calls if s > last_stream_id]:
            self._calls.pop(stream_id).fail(GrpcError(grpc.StatusCode.UNAVAILABLE, "the server went away before the call"))
            self._forget(stream_id)
        if code != ErrorCode.NO_ERROR:
            log.debug("GOAWAY from %s: %s %s", self._channel.description, code, debug[:200])
        self._freed()
        if not self._calls:
            self.close()

    def _on_closed(self, exc: Exception | None) -> None:
        why = f"connection to {self._channel.description} lost" + (f": {exc}" if exc else "")
        for call in self._calls.values():
            call.fail(GrpcError(grpc.StatusCode.UNAVAILABLE, why))
        self._calls.clear()
        self._room.set()

    def _on_settings(self) -> None:
        self._freed()

    def _may_ping(self) -> bool:
        return bool(self._calls) or self._channel._keepalive_without_calls

    def _report(self, limit: str, detail: str) -> None:
        log.debug("connection to %s hit %s: %s", self._channel.description, limit, detail)

    def _freed(self) -> None:
        self._room.set()
        if self.draining and not self._calls:
            self.close()


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
        self._limits = Limits(keepalive_time=keepalive_time, keepalive_timeout=keepalive_timeout, read_timeout=0)
        self._keepalive_without_calls = keepalive_permit_without_stream
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
        self._connection: _ClientConnection | None = None
        self._connecting: asyncio.Task[_ClientConnection] | None = None
        self._retry_at = 0.0
        self._last_error = ""
        self._blocks: dict[tuple[str, float | None, Metadata, bool], bytes] = {}
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
        block = self._block(path, timeout, metadata, compress)
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
            return read_message(raw, encoding, MAX_RESPONSE) if raw else b""
        except ValueError as exc:
            raise GrpcError(grpc.StatusCode.INTERNAL, f"undecodable response: {exc}") from exc

    async def _ready(self, connection: _ClientConnection | None, deadline: float | None,
                     wait_for_ready: bool) -> _ClientConnection:
        """A usable connection with room for one more stream."""
        if connection is None or not connection.usable:
            connection = await self._usable(deadline, wait_for_ready)
        if connection.full:
            await connection.wait_for_room()
            if not connection.usable:
                connection = await self._usable(deadline, wait_for_ready)
        return connection

    def _block(self, path: str, timeout: float | None, metadata: Metadata, compress: bool) -> bytes:
        key = (path, timeout, metadata, compress)
        block = self._blocks.get(key)
        if block is None:
            if len(self._blocks) >= 64:  # a rotating token or changing metadata: start over
                self._blocks.clear()
            block = self._blocks[key] = self._encode(path, timeout, metadata, compress)
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

    async def _usable(self, deadline: float | None, wait_for_ready: bool) -> _ClientConnection:
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

    async def _connect(self) -> _ClientConnection:
        target = self._target
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                if target.path is not None:
                    transport, connection = await loop.create_unix_connection(
                        lambda: _ClientConnection(self), target.path, ssl=self._ssl,
                        server_hostname=self._server_hostname or ("localhost" if self._ssl else None))
                elif self._proxy is not None:
                    sock = await _tunnel(self._proxy, target)
                    transport, connection = await loop.create_connection(
                        lambda: _ClientConnection(self), sock=sock, ssl=self._ssl,
                        server_hostname=(self._server_hostname or target.host) if self._ssl else None)
                else:
                    transport, connection = await loop.create_connection(
                        lambda: _ClientConnection(self), target.host, target.port, ssl=self._ssl,
                        server_hostname=(self._server_hostname or target.host) if self._ssl else None)
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
        if old is not None and not old._calls:
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


@dataclass(frozen=True)
class Proxy:
    """An HTTP proxy reached with CONNECT: its address and its Basic credentials, if any."""

    host: str
    port: int
    authorization: str | None = None


def proxy_for(target: Target, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy a TCP target is reached through, as gRPC core chooses it: ``grpc_proxy``,
    else ``https_proxy`` / ``HTTPS_PROXY``, else ``http_proxy`` / ``HTTP_PROXY``, unless the
    host matches ``no_proxy`` / ``NO_PROXY`` (a name or a suffix of one, an IP, a CIDR, ``*``)."""
    if target.path is not None:
        return None
    url = next((environ[key] for key in ("grpc_proxy", "https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY")
                if environ.get(key)), "")
    if not url or _no_proxy(target.host, environ.get("no_proxy") or environ.get("NO_PROXY") or ""):
        return None
    parsed = urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme != "http" or not parsed.hostname:
        log.warning("ignoring proxy %r: only http:// proxies (CONNECT) are supported", url)
        return None
    authorization = None
    if parsed.username is not None:
        credentials = f"{unquote(parsed.username)}:{unquote(parsed.password or '')}".encode()
        authorization = "Basic " + base64.b64encode(credentials).decode("ascii")
    return Proxy(parsed.hostname, parsed.port or 80, authorization)


def _no_proxy(host: str, rules: str) -> bool:
    host = host.strip("[]").lower()
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for rule in (r.strip().lower() for r in rules.split(",")):
        if not rule:
            continue
        if rule == "*":
            return True
        if address is not None:
            try:
                if address in ipaddress.ip_network(rule.strip("[]"), strict=False):
                    return True
            except ValueError:
                pass
            continue
        rule = rule.lstrip(".")
        if host == rule or host.endswith("." + rule):
            return True
    return False


async def _tunnel(proxy: Proxy, target: Target) -> socket.socket:
    """A socket to ``target`` through ``proxy``'s HTTP CONNECT (the caller bounds the time)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(proxy.host, proxy.port, type=socket.SOCK_STREAM)
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, address)
        authority = target.authority
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
        if proxy.authorization:
            request += f"Proxy-Authorization: {proxy.authorization}\r\n"
        await loop.sock_sendall(sock, (request + "\r\n").encode("latin-1"))
        # Byte by byte: what follows the answer's head is the server's, and must stay unread.
        answer = bytearray()
        while not answer.endswith(b"\r\n\r\n"):
            byte = await loop.sock_recv(sock, 1)
            if not byte or len(answer) > 16384:
                raise OSError(f"proxy {proxy.host}:{proxy.port} closed or sent no CONNECT answer")
            answer += byte
        line = bytes(answer.split(b"\r\n", 1)[0])
        status = line.split()
        if len(status) < 2 or status[1] != b"200":
            raise OSError(f"proxy {proxy.host}:{proxy.port} refused CONNECT {authority}: "
                          f"{line.decode('latin-1')[:100]}")
    except BaseException:
        sock.close()
        raise
    return sock
