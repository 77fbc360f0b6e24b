"""A gRPC client channel's HTTP/2 connection: its calls by stream, from the request's frames to
the answer's status, and the room the server's SETTINGS_MAX_CONCURRENT_STREAMS leaves."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import grpc

from .connection import Connection
from .frames import ErrorCode
from .grpc import GrpcError, http_status_code, status_from

if TYPE_CHECKING:
    from .client import Channel

__all__ = ["ClientConnection", "Pending"]

log = logging.getLogger("gputally.h2.client")

_LAST_STREAM_ID = 2**31 - 1

_RESET_CODES: dict[int, grpc.StatusCode] = {
    ErrorCode.REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE, ErrorCode.CANCEL: grpc.StatusCode.CANCELLED,
    ErrorCode.ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.INADEQUATE_SECURITY: grpc.StatusCode.PERMISSION_DENIED,
}


class Pending:
    """One call in flight: its future and the response as it comes."""


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


class ClientConnection(Connection):
    """The channel's connection: its calls by stream, and room for more."""

    client = True

    def __init__(self, channel: Channel) -> None:
        super().__init__(read_buffer=channel.read_buffer, limits=channel.connection_limits)
        self._channel = channel
        self._next_stream = 1
        self._calls: dict[int, Pending] = {}
        self._room = asyncio.Event()
        self._room.set()
        self.draining = False
        self._peer_max: int | None = None
        """The core's ``peer_max_streams``, kept at each SETTINGS (the only frame that changes
        it): :attr:`full` is asked at every call."""

    @property
    def in_flight(self) -> int:
        """Calls waiting for their answers."""
        return len(self._calls)

    @property
    def usable(self) -> bool:
        return not self.h2.closed and not self.draining and self._next_stream < _LAST_STREAM_ID

    @property
    def full(self) -> bool:
        """The peer's SETTINGS_MAX_CONCURRENT_STREAMS allows no more streams now."""
        peer_max = self._peer_max
        return peer_max is not None and len(self._calls) >= peer_max

    async def wait_for_room(self) -> None:
        while self.full and not self.h2.closed:
            self._room.clear()
            await self._room.wait()

    def start(self, block: bytes, body: bytes, deadline: float | None = None,
              ) -> tuple[int, asyncio.Future[tuple[GrpcError | None, bytes, str | None]]]:
        stream_id = self._next_stream
        self._next_stream += 2
        future: asyncio.Future[tuple[GrpcError | None, bytes, str | None]] = self._loop.create_future()
        self._calls[stream_id] = Pending(future, deadline)
        if deadline is not None:
            self._arm_deadline(deadline)
        self.h2.open(stream_id)
        self.h2.send(stream_id, block, body)
        return stream_id, future

    def cancel(self, stream_id: int) -> None:
        if self._calls.pop(stream_id, None) is not None:
            self.h2.reset(stream_id, ErrorCode.CANCEL)
            self._freed()

    def _expire(self, now: float) -> float | None:
        """Calls past their deadline end DEADLINE_EXCEEDED and their streams are cancelled."""
        late = [stream_id for stream_id, call in self._calls.items()
                if call.deadline is not None and call.deadline <= now]
        for stream_id in late:
            self._calls.pop(stream_id).fail(GrpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))
            self.h2.reset(stream_id, ErrorCode.CANCEL)
        if late:
            self._freed()
        return min((call.deadline for call in self._calls.values() if call.deadline is not None), default=None)

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        if call.headers is None:
            call.headers = headers
            status = ""
            for name, value in headers:  # a loop, not next() over a generator: no call per call
                if name == ":status":
                    status = value
                    break
            if status != "200":
                self._finish(stream_id, GrpcError(http_status_code(status), f"HTTP status {status or 'missing'}"))
                return
            if end_stream:  # trailers-only
                self._finish(stream_id, status_from(headers))
        elif end_stream:
            self._finish(stream_id, status_from(headers))

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        call = self._calls.get(stream_id)
        if call is None:
            return
        call.body.append(data)
        call.size += len(data)
        if call.size > self._channel.max_response + 5:  # never hold more than the largest answer we would read
            self._calls.pop(stream_id)
            self.h2.reset(stream_id, ErrorCode.CANCEL)
            call.fail(GrpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"response larger than {self._channel.max_response} bytes"))
            self._freed()
            return
        if end_stream:
            self._finish(stream_id, GrpcError(grpc.StatusCode.INTERNAL, "the server ended the stream without trailers"))

    def _finish(self, stream_id: int, error: GrpcError | None) -> None:
        call = self._calls.pop(stream_id, None)
        self.h2.forget(stream_id)
        if call is None:
            return
        encoding = None
        for name, value in call.headers or ():
            if name == "grpc-encoding":
                encoding = value
                break
        if not call.future.done():
            call.future.set_result((error, b"".join(call.body), encoding))
        self._freed()

    def on_reset(self, stream_id: int, code: int) -> None:
        call = self._calls.pop(stream_id, None)
        if call is not None:
            status = _RESET_CODES.get(code, grpc.StatusCode.INTERNAL)  # ErrorCode keys hash as their ints
            call.fail(GrpcError(status, f"stream reset by the server (HTTP/2 error {code})"))
        self._freed()

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.draining = True
        for stream_id in [s for s in self._calls if s > last_stream_id]:
            self._calls.pop(stream_id).fail(GrpcError(grpc.StatusCode.UNAVAILABLE, "the server went away before the call"))
            self.h2.forget(stream_id)
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

    def on_settings(self) -> None:
        self._peer_max = self.h2.peer_max_streams
        self._freed()

    def _may_ping(self) -> bool:
        return bool(self._calls) or self._channel.keepalive_without_calls

    def on_limit(self, limit: str, detail: str) -> None:
        log.debug("connection to %s hit %s: %s", self._channel.description, limit, detail)

    def _freed(self) -> None:
        self._room.set()
        if self.draining and not self._calls:
            self.close()
