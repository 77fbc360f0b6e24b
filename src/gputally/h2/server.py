"""A gRPC server on asyncio: unary methods (and server-streaming ones) over HTTP/2.

It runs in the event loop's own thread: a request is parsed from the socket's bytes where
the loop reads them, handled by a coroutine, and answered with one write. grpc.aio instead
polls gRPC core's completion queue from a thread of its own and wakes the loop for every
event of every call, which costs several times the whole request on this path (the
repository's ``bench/grpc_floor.py``).

Handlers get the request's bytes and custom metadata and return the response's bytes, or
raise :class:`~gputally.h2.grpc.GrpcError` to answer with that status. Requests are checked as
gRPC core checks them: ``POST``, an ``application/grpc`` content type, a known method, one
length-prefixed message (``identity`` or ``gzip``), at most ``max_receive_message_length``
bytes (RESOURCE_EXHAUSTED beyond, without reading the rest); ``grpc-timeout`` bounds the
handler (DEADLINE_EXCEEDED). A client's RST_STREAM cancels its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import grpc

from . import hpack
from gputally.logthrottle import LogThrottle

from .connection import Connection
from .core import StreamState
from .frames import ErrorCode
from .limits import Limits
from .grpc import (
    INLINE_INFLATE,
    GrpcError,
    Inflater,
    MessageTooLarge,
    Metadata,
    decode_metadata,
    message,
    parse_timeout,
    split_message,
    status_headers,
)

__all__ = ["Method", "Server", "StreamingHandler", "TooLargeHandler", "UnaryHandler"]

log = logging.getLogger(__name__)

UnaryHandler = Callable[[bytes, Metadata], Awaitable[bytes]]
"""Request bytes and metadata -> response bytes; raise GrpcError for another status."""
StreamingHandler = Callable[[bytes, Metadata, Callable[[bytes], None]], Awaitable[None]]
"""Request bytes, metadata and a ``send`` for each response message; returns when the stream ends."""
TooLargeHandler = Callable[[int, Metadata], Awaitable[bytes]]
"""The size of a request above its method's ``max_request`` and the metadata -> as a UnaryHandler."""

PREFACE_TIMEOUT = 10.0
"""Seconds a new connection has to send the HTTP/2 preface; a silent one is closed."""

_RESPONSE = hpack.encode([(":status", "200"), ("content-type", "application/grpc")])
_OK = hpack.encode([("grpc-status", "0")])
_OK_ONLY = hpack.encode([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")])
"""A trailers-only OK: a stream that ended without a message."""
_ACCEPT = "identity,gzip"


@dataclass(frozen=True)
class Method:
    """One RPC: its handler and whether it streams responses."""

    handler: UnaryHandler | StreamingHandler
    streaming: bool = False
    max_request: int | None = None
    """The largest request the handler takes; a gzip one inflating beyond it is only counted
    on (up to the server's limit), and ``too_large`` answers instead of the handler."""
    too_large: TooLargeHandler | None = None


class _Call:
    __slots__ = ("deadline", "encoding", "expired", "held", "method", "metadata", "parts", "size", "task",
                 "timeout")

    def __init__(self, method: Method, encoding: str | None, timeout: float | None, metadata: Metadata) -> None:
        self.method = method
        self.encoding = encoding
        self.timeout = timeout
        self.metadata = metadata
        self.parts: list[bytes] = []
        self.size = 0
        self.held = 0
        """Of ``size``, the bytes counted against the connection's and the process's budgets."""
        self.task: asyncio.Task[None] | None = None
        self.deadline: float | None = None
        """The loop time its handler must answer by (``timeout`` after it started), while it runs."""
        self.expired = False
        """The deadline passed and the handler was cancelled for it."""


_Request = tuple[list[tuple[str, str]], Method, str | None, float | None, Metadata]
"""A request's headers, method, grpc-encoding, grpc-timeout and custom metadata."""


class _Budget:
    """Request bytes held for handlers not started yet, across every server of the process."""

    held = 0


class _ServerConnection(Connection):
    client = False

    def __init__(self, server: Server) -> None:
        super().__init__(limits=server.limits)
        self._server = server
        self._calls: dict[int, _Call] = {}
        self._last_stream = 0
        self._draining = False
        self._buffered = 0
        self._requests: dict[int, _Request] = {}
        """What a header list the core remembers asked for, by the list's id (the entry holds
        the list, so the id stays its own): the same block's next call reads no field again.
        Forgotten with the core's memo, so it is as bounded."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server._connections.add(self)
        self._silent = asyncio.get_running_loop().call_later(PREFACE_TIMEOUT, self._close_if_silent)
        if self._server._closing:
            self.drain()

    def _close_if_silent(self) -> None:
        if self._awaiting_preface:
            log.debug("closing a connection that sent no HTTP/2 preface in %.0f s", PREFACE_TIMEOUT)
            self.abort()

    def _report(self, limit: str, detail: str) -> None:
        self._server._throttle.log(limit, logging.WARNING, "gRPC peer %s hit %s: %s", self.peer, limit, detail)

    def drain(self) -> None:
        """GOAWAY: the streams already opened finish, no new one is taken."""
        if not self._draining:
            self._draining = True
            self.goaway(self._last_stream)
            if not self._calls:
                self.close()

    def _retire(self, why: str) -> None:
        self.drain()

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        if stream_id <= self._last_stream:  # the request's trailers (the core saw they end it)
            call = self._calls.get(stream_id)
            if call is not None and call.task is None:
                self._dispatch(stream_id, call)
            return
        self._last_stream = stream_id
        if self._draining:
            self.reset(stream_id, ErrorCode.REFUSED_STREAM)
            return
        known = self._requests.get(id(headers))
        if known is None or known[0] is not headers:
            known = self._request(stream_id, headers)
            if known is None:
                return
            if self._is_remembered(headers):
                self._requests[id(headers)] = known
        _, method, encoding, timeout, metadata = known
        call = self._calls[stream_id] = _Call(method, encoding, timeout, metadata)
        if end_stream:
            self._dispatch(stream_id, call)

    def _request(self, stream_id: int, headers: list[tuple[str, str]]) -> _Request | None:
        """What a request's headers ask for (None when they were answered with an error)."""
        fields = dict(headers)
        if fields.get(":method") != "POST":
            self._http_error(stream_id, "405")
            return None
        if not fields.get("content-type", "").startswith("application/grpc"):
            self._http_error(stream_id, "415")
            return None
        path = fields[":path"]
        method = self._server._methods.get(path)
        if method is None:
            shown = path if len(path) <= 100 else path[:100] + "..."  # an echo must not amplify
            self._answer_status(stream_id, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {shown}")
            return None
        encoding = fields.get("grpc-encoding")
        if encoding not in (None, "identity", "gzip"):
            self._answer_status(stream_id, grpc.StatusCode.UNIMPLEMENTED,
                                f"grpc-encoding {encoding[:32]} is not supported", (("grpc-accept-encoding", _ACCEPT),))
            return None
        timeout = parse_timeout(fields["grpc-timeout"]) if "grpc-timeout" in fields else None
        return headers, method, encoding, timeout, decode_metadata(headers)

    def _forget_decoded(self) -> None:
        super()._forget_decoded()
        self._requests.clear()

    def _on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        self._last_stream = stream_id
        self._answer_early(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Header list of {size} bytes exceeds the limit of {self.limits.max_header_list_size}")

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        call = self._calls.get(stream_id)
        if call is None or call.task is not None:
            return  # a stream answered already: its remaining data is dropped
        size = len(data)
        call.parts.append(data)
        call.size += size
        if call.size > self._server._body_limit:
            self._drop(stream_id)
            self._answer_early(
                stream_id,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({call.size - 5} vs. {self._server._message_limit})",
            )
            return
        limits = self.limits
        if self._buffered + size > limits.max_buffered_request_bytes:
            self._over_budget(stream_id, "max_buffered_request_bytes", self._buffered)
            return
        if _Budget.held + size > limits.max_process_buffered_request_bytes:
            self._over_budget(stream_id, "max_process_buffered_request_bytes", _Budget.held)
            return
        call.held += size
        self._buffered += size
        _Budget.held += size
        if end_stream:
            self._dispatch(stream_id, call)

    def _over_budget(self, stream_id: int, limit: str, held: int) -> None:
        self._report(limit, f"{held} request bytes already held; stream {stream_id} refused")
        self._drop(stream_id)
        self._answer_early(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           "the server holds too many unfinished requests; retry later")

    def _drop(self, stream_id: int) -> _Call | None:
        """Forget a call and give back the request bytes it held."""
        call = self._calls.pop(stream_id, None)
        if call is not None:
            self._release(call)
        return call

    def _release(self, call: _Call) -> None:
        if call.held:
            self._buffered -= call.held
            _Budget.held -= call.held
            call.held = 0
        call.parts = []

    def _answer_early(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        """Answer before the request ended, then stop the upload (the answer is complete)."""
        self._answer_status(stream_id, code, details)
        if self.stream_state(stream_id) is not StreamState.CLOSED:
            self.reset(stream_id, ErrorCode.NO_ERROR)

    def _on_reset(self, stream_id: int, code: int) -> None:
        call = self._drop(stream_id)
        if call is not None and call.task is not None:
            call.task.cancel()
        self._maybe_close()

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.drain()

    def _on_closed(self, exc: Exception | None) -> None:
        self._silent.cancel()
        self._server._connections.discard(self)
        for call in self._calls.values():
            self._release(call)
            if call.task is not None:
                call.task.cancel()
        self._calls.clear()

    def _on_tick(self, now: float) -> None:
        """A request whose body did not end within ``read_timeout`` is answered and reset."""
        timeout = self.limits.read_timeout
        if timeout <= 0:
            return
        late = [s.id for s in self._streams.values()
                if s.state in (StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL) and now - s.opened > timeout]
        for stream_id in late:
            call = self._drop(stream_id)
            if call is not None and call.task is None:
                self._answer_early(stream_id, grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"the request did not end within {timeout:g} s")
            else:
                self.reset(stream_id, ErrorCode.NO_ERROR)
        if late:
            self._report("read_timeout", f"{len(late)} request(s) unfinished after {timeout:g} s; reset")
            self._maybe_close()

    def _dispatch(self, stream_id: int, call: _Call) -> None:
        parts = call.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        self._release(call)
        call.task = asyncio.get_running_loop().create_task(self._run(stream_id, call, body))

    async def _run(self, stream_id: int, call: _Call, body: bytes) -> None:
        try:
            try:
                request = self._message(call, body)
                del body  # a gzip request's inflating (in a thread, maybe) holds only its payload
                if isinstance(request, Inflater):
                    request = await self._inflate(request)
            except MessageTooLarge as exc:
                raise GrpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc).capitalize()) from exc
            except ValueError as exc:
                raise GrpcError(grpc.StatusCode.INTERNAL, f"Failed parsing the request: {exc}") from exc
            if call.method.streaming:
                assert isinstance(request, bytes)
                await self._stream(stream_id, call, request)
                return
            if isinstance(request, int):  # over the method's max_request: answered by its too_large
                assert call.method.too_large is not None
                answer = call.method.too_large(request, call.metadata)
            else:
                answer = call.method.handler(request, call.metadata)  # type: ignore[call-arg,assignment]
            if call.timeout is None:
                response = await answer
            else:
                self._start_deadline(call)
                try:
                    response = await answer
                except asyncio.CancelledError:
                    if not call.expired:
                        raise
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()  # the deadline's own cancel, answered here (as asyncio.timeout does)
                    raise GrpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
                finally:
                    call.deadline = None
            if self._calls.pop(stream_id, None) is not None:
                self.send(stream_id, _RESPONSE, message(response), _OK)
        except GrpcError as error:
            if self._calls.pop(stream_id, None) is not None:
                self._answer_status(stream_id, error.code, error.details, error.trailers)
        except asyncio.CancelledError:
            if self._calls.pop(stream_id, None) is not None:  # not the client's reset: the server stops
                self._answer_status(stream_id, grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        except Exception:
            log.exception("gRPC handler for stream %d failed", stream_id)
            if self._calls.pop(stream_id, None) is not None:
                self._answer_status(stream_id, grpc.StatusCode.UNKNOWN, "Unexpected error in the handler")
        finally:
            self._maybe_close()

    def _start_deadline(self, call: _Call) -> None:
        """Bound the call's handler by its ``grpc-timeout`` (the connection's deadline timer)."""
        assert call.timeout is not None
        call.deadline = asyncio.get_running_loop().time() + call.timeout
        call.expired = False
        self._arm_deadline(call.deadline)

    def _expire(self, now: float) -> float | None:
        """Cancel every handler past its deadline (it answers DEADLINE_EXCEEDED)."""
        earliest: float | None = None
        for call in self._calls.values():
            deadline = call.deadline
            if deadline is None:
                continue
            if deadline <= now:
                call.deadline = None
                call.expired = True
                if call.task is not None:
                    call.task.cancel()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        return earliest

    def _message(self, call: _Call, body: bytes) -> bytes | int | Inflater:
        """The request message, or an :class:`Inflater` for a gzip one (:meth:`_inflate`); only
        its size when it is larger than the method's ``max_request`` and the method has a
        ``too_large`` answer."""
        limit = self._server._message_limit
        payload, compressed = split_message(body, call.encoding, limit)
        method = call.method
        keep = method.max_request if method.max_request is not None and method.too_large is not None else limit
        if not compressed:
            return payload if len(payload) <= keep else len(payload)
        return Inflater(payload, keep=keep, limit=limit)

    async def _inflate(self, inflater: Inflater) -> bytes | int:
        """A gzip request inflated: at most ``INLINE_INFLATE`` bytes of it on the event loop,
        the rest in a thread (zlib lets go of the GIL)."""
        inflater.run(INLINE_INFLATE)
        if not inflater.done:
            await asyncio.to_thread(inflater.run, self._server._message_limit + 1)
        message = inflater.message
        return inflater.size if message is None else message

    async def _stream(self, stream_id: int, call: _Call, request: bytes) -> None:
        started = False

        def send(response: bytes) -> None:
            nonlocal started
            if stream_id in self._calls:
                self.send(stream_id, None if started else _RESPONSE, message(response), end_stream=False)
                started = True

        await call.method.handler(request, call.metadata, send)  # type: ignore[call-arg]
        if self._calls.pop(stream_id, None) is not None:
            self.send(stream_id, None, None, _OK if started else _OK_ONLY)

    def _answer_status(self, stream_id: int, code: grpc.StatusCode, details: str, trailers: Metadata = ()) -> None:
        """A trailers-only response: the status in the one header block."""
        block = hpack.encode([(":status", "200"), ("content-type", "application/grpc"),
                              *status_headers(code, details, trailers)])
        self.send(stream_id, block)

    def _http_error(self, stream_id: int, status: str) -> None:
        self.send(stream_id, hpack.encode([(":status", status)]))

    def _local_end(self, stream_id: int) -> None:
        self._maybe_close()

    def _maybe_close(self) -> None:
        if self._draining and not self._calls and not self._blocked:
            self.close()


class Server:
    """Serves ``methods`` (by ``/package.Service/Method`` path) on TCP or a unix socket."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        *,
        max_receive_message_length: int,
        ssl_context: ssl.SSLContext | None = None,
        reuse_port: bool = False,
        limits: Limits | None = None,
    ) -> None:
        self._methods = dict(methods)
        self.limits = limits or Limits()
        self._throttle = LogThrottle(log)
        """One WARNING line a minute per limit hit, naming the peer (the next one says how many
        more there were)."""
        self._message_limit = max_receive_message_length
        self._body_limit = max_receive_message_length + 5
        self._ssl = ssl_context
        self._reuse_port = reuse_port
        self._servers: list[asyncio.Server] = []
        self._connections: set[_ServerConnection] = set()
        self._closing = False

    async def listen_tcp(self, host: str, port: int) -> int:
        """Bind every address of ``host`` (every interface when empty) on one port; the port.
        An address that cannot be bound raises OSError."""
        loop = asyncio.get_running_loop()
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[int, object]] = set()
        sockets: list[socket.socket] = []
        try:
            for family, kind, proto, _, address in infos:
                if (family, address[0]) in seen:
                    continue
                seen.add((family, address[0]))
                sock = socket.socket(family, kind, proto)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if self._reuse_port:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((address[0], port, *address[2:]))
                port = port or sock.getsockname()[1]
            for sock in sockets:
                sock.setblocking(False)
                sock.listen(1024)
                self._servers.append(await loop.create_server(self._protocol, sock=sock, ssl=self._ssl))
        except BaseException:
            for sock in sockets:
                sock.close()
            await self.shutdown(0)
            raise
        return port

    async def listen_unix(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(self._protocol, path, ssl=self._ssl))

    def _protocol(self) -> _ServerConnection:
        return _ServerConnection(self)

    async def shutdown(self, grace: float) -> None:
        """Stop listening, GOAWAY every connection, give its calls ``grace`` seconds, then cancel them."""
        self._closing = True
        for server in self._servers:
            server.close()
        for connection in list(self._connections):
            connection.drain()
        tasks = [call.task for c in self._connections for call in c._calls.values() if call.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(0)  # let the answers written above reach the transports
        for connection in list(self._connections):
            connection.close()
        self._servers.clear()
