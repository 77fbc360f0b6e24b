"""The gRPC server's side of one HTTP/2 connection: requests read, checked, handed to their
methods' handlers, and answered.

Handlers get the request's bytes and custom metadata and return the response's bytes, or
raise :class:`~gputally.h2.grpc.GrpcError` to answer with that status. Requests are checked as
gRPC core checks them: ``POST``, an ``application/grpc`` content type, a known method, one
length-prefixed message (``identity`` or ``gzip``), at most ``max_receive_message_length``
bytes (RESOURCE_EXHAUSTED beyond, without reading the rest); ``grpc-timeout`` bounds the
handler (DEADLINE_EXCEEDED). A client's RST_STREAM cancels its handler. A gzip request is
inflated as :func:`~.calls.inflate` says: one at a time per connection, its bytes held against
the connection's and the process's budgets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from . import hpack
from .calls import Call, Method, OverBudget, RequestBudget, inflate
from .connection import Connection
from .frames import ErrorCode
from .grpc import (
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
from .states import StreamState

if TYPE_CHECKING:
    from .server import Server

__all__ = ["PREFACE_TIMEOUT", "ServerConnection"]

log = logging.getLogger("gputally.h2.server")  # one logger for the server's lines

PREFACE_TIMEOUT = 10.0
"""Seconds a new connection has to send the HTTP/2 preface; a silent one is closed."""

_RESPONSE = hpack.encode([(":status", "200"), ("content-type", "application/grpc")])
_OK = hpack.encode([("grpc-status", "0")])
_OK_ONLY = hpack.encode([(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "0")])
"""A trailers-only OK: a stream that ended without a message."""
_ACCEPT = "identity,gzip"


_Request = tuple[list[tuple[str, str]], Method, str | None, float | None, Metadata]
"""A request's headers, method, grpc-encoding, grpc-timeout and custom metadata."""


class ServerConnection(Connection):
    """A server connection: its calls, from their headers to their answers."""

    client = False

    def __init__(self, server: Server) -> None:
        super().__init__(read_buffer=server.read_buffer, limits=server.limits)
        self._server = server
        self._calls: dict[int, Call] = {}
        self._last_stream = 0
        self._draining = False
        self._budget = RequestBudget(self.limits)
        self._inflating = asyncio.Lock()
        """Held while one of this connection's requests inflates: they inflate one at a time."""
        self._requests: dict[int, _Request] = {}
        """What a header list the core remembers asked for, by the list's id (the entry holds
        the list, so the id stays its own): the same block's next call reads no field again.
        Forgotten with the core's memo (its generation), so it is as bounded."""
        self._requests_generation = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server._connections.add(self)
        self._silent = asyncio.get_running_loop().call_later(PREFACE_TIMEOUT, self._close_if_silent)
        if self._server._closing:
            self.drain()

    def tasks(self) -> list[asyncio.Task[None]]:
        """The handlers running now."""
        return [call.task for call in self._calls.values() if call.task is not None]

    def _close_if_silent(self) -> None:
        if self.h2.awaiting_preface:
            log.debug("closing a connection that sent no HTTP/2 preface in %.0f s", PREFACE_TIMEOUT)
            self.abort()

    def on_limit(self, limit: str, detail: str) -> None:
        self._server._throttle.log(limit, logging.WARNING, "gRPC peer %s hit %s: %s", self.peer, limit, detail)

    def drain(self) -> None:
        """GOAWAY: the streams already opened finish, no new one is taken."""
        if not self._draining:
            self._draining = True
            self.h2.goaway(self._last_stream)
            if not self._calls:
                self.close()

    def _retire(self, why: str) -> None:
        self.drain()

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        if stream_id <= self._last_stream:  # the request's trailers (the core saw they end it)
            call = self._calls.get(stream_id)
            if call is not None and call.task is None:
                self._dispatch(stream_id, call)
            return
        self._last_stream = stream_id
        if self._draining:
            self.h2.reset(stream_id, ErrorCode.REFUSED_STREAM)
            return
        known = self._requests.get(id(headers))
        if known is None or known[0] is not headers:
            known = self._request(stream_id, headers)
            if known is None:
                return
            memo = self.h2.memo
            if memo.remembers(headers):
                if memo.generation != self._requests_generation:  # the memo forgot its lists since
                    self._requests.clear()
                    self._requests_generation = memo.generation
                self._requests[id(headers)] = known
        _, method, encoding, timeout, metadata = known
        call = self._calls[stream_id] = Call(method, encoding, timeout, metadata)
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

    def on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        self._last_stream = stream_id
        self._answer_early(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Header list of {size} bytes exceeds the limit of {self.limits.max_header_list_size}")

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
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
        try:
            self._budget.charge(call, size)
        except OverBudget as exc:
            self._over_budget(stream_id, exc)
            return
        if end_stream:
            self._dispatch(stream_id, call)

    def _over_budget(self, stream_id: int, exc: OverBudget) -> None:
        self.on_limit(exc.limit, f"{exc.held} request bytes already held; stream {stream_id} refused")
        self._drop(stream_id)
        self._answer_early(stream_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           "the server holds too many unfinished requests; retry later")

    def _drop(self, stream_id: int) -> Call | None:
        """Forget a call and give back the request bytes it held."""
        call = self._calls.pop(stream_id, None)
        if call is not None:
            self._release(call)
        return call

    def _release(self, call: Call) -> None:
        self._budget.release(call)
        call.parts = []

    def _answer_early(self, stream_id: int, code: grpc.StatusCode, details: str) -> None:
        """Answer before the request ended, then stop the upload (the answer is complete)."""
        self._answer_status(stream_id, code, details)
        if self.h2.stream_state(stream_id) is not StreamState.CLOSED:
            self.h2.reset(stream_id, ErrorCode.NO_ERROR)

    def on_reset(self, stream_id: int, code: int) -> None:
        call = self._drop(stream_id)
        if call is not None and call.task is not None:
            call.task.cancel()
        self._maybe_close()

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
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
        late = self.h2.unfinished(now - timeout)
        for stream_id in late:
            call = self._drop(stream_id)
            if call is not None and call.task is None:
                self._answer_early(stream_id, grpc.StatusCode.DEADLINE_EXCEEDED,
                                   f"the request did not end within {timeout:g} s")
            else:
                self.h2.reset(stream_id, ErrorCode.NO_ERROR)
        if late:
            self.on_limit("read_timeout", f"{len(late)} request(s) unfinished after {timeout:g} s; reset")
            self._maybe_close()

    def _dispatch(self, stream_id: int, call: Call) -> None:
        parts = call.parts
        body = parts[0] if len(parts) == 1 else b"".join(parts)
        call.parts = []
        if body[:1] != b"\x01" or call.encoding != "gzip":  # a gzip one is held (counted) until inflated
            self._budget.release(call)  # :meth:`_release`, inlined: once a call
        call.task = self._loop.create_task(self._run(stream_id, call, body))

    async def _run(self, stream_id: int, call: Call, body: bytes) -> None:
        try:
            try:
                request = self._message(call, body)
                del body  # a gzip request's inflating (in a thread, maybe) holds only its payload
                if isinstance(request, Inflater):
                    try:
                        request = await inflate(call, request, budget=self._budget, turn=self._inflating,
                                                executor=self._server.inflate_executor, keep=self._keep(call))
                    finally:
                        self._budget.release(call)
            except OverBudget as exc:
                self.on_limit(exc.limit, f"{exc.held} request bytes already held; stream {stream_id} refused")
                raise GrpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "the server holds too many unfinished requests; retry later") from None
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
                # bounded by its grpc-timeout (the connection's deadline timer); once a call, so inline
                call.deadline = deadline = self._loop.time() + call.timeout
                call.expired = False
                self._arm_deadline(deadline)
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
                self.h2.send(stream_id, _RESPONSE, message(response), _OK)
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
            if self._draining:  # :meth:`_maybe_close`'s first test, made here: no call while not draining
                self._maybe_close()

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

    def _message(self, call: Call, body: bytes) -> bytes | int | Inflater:
        """The request message, or an :class:`Inflater` for a gzip one (:func:`~.calls.inflate`); only
        its size when it is larger than the method's ``max_request`` and the method has a
        ``too_large`` answer."""
        limit = self._server._message_limit
        payload, compressed = split_message(body, call.encoding, limit)
        method = call.method  # :meth:`_keep`, inlined: once a call
        keep = method.max_request if method.max_request is not None and method.too_large is not None else limit
        if not compressed:
            return payload if len(payload) <= keep else len(payload)
        return Inflater(payload, keep=keep, limit=limit)

    def _keep(self, call: Call) -> int:
        """The largest request the call's handler takes (the server's limit unless its method says)."""
        method = call.method
        if method.max_request is not None and method.too_large is not None:
            return method.max_request
        return self._server._message_limit

    async def _stream(self, stream_id: int, call: Call, request: bytes) -> None:
        started = False

        def send(response: bytes) -> None:
            nonlocal started
            if stream_id in self._calls:
                self.h2.send(stream_id, None if started else _RESPONSE, message(response), end_stream=False)
                started = True

        await call.method.handler(request, call.metadata, send)  # type: ignore[call-arg]
        if self._calls.pop(stream_id, None) is not None:
            self.h2.send(stream_id, None, None, _OK if started else _OK_ONLY)

    def _answer_status(self, stream_id: int, code: grpc.StatusCode, details: str, trailers: Metadata = ()) -> None:
        """A trailers-only response: the status in the one header block."""
        block = hpack.encode([(":status", "200"), ("content-type", "application/grpc"),
                              *status_headers(code, details, trailers)])
        self.h2.send(stream_id, block)

    def _http_error(self, stream_id: int, status: str) -> None:
        self.h2.send(stream_id, hpack.encode([(":status", status)]))

    def on_local_end(self, stream_id: int) -> None:
        if self._draining:  # as in :meth:`_run`: no call while not draining
            self._maybe_close()

    def _maybe_close(self) -> None:
        if self._draining and not self._calls and not self.h2.has_blocked:
            self.close()


