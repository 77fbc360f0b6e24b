"""What one connection sends: the bytes owed, the peer's flow-control windows and settings,
and the streams whose answers wait for them.

Data beyond what the peer's windows allow waits in its stream, in order with the headers
behind it, until the peer's WINDOW_UPDATE; while :attr:`Sender.send_paused` (the transport is
full) all stream output waits. Answers the peer's own frames made us owe (here the ACK of its
SETTINGS) go through the core's ``answer``, which counts them until the output is drained, so
a peer that does not read cannot make us queue them without end (``max_queued_control_frames``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .errors import ProtocolError
from .frames import (
    DEFAULT_FRAME_SIZE,
    DEFAULT_WINDOW,
    HEADER,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    ErrorCode,
    Flag,
    Setting,
    Type,
    frame,
    read_settings,
)
from .limits import Limits
from .streams import Stream

__all__ = ["Sender"]

# Plain ints on the hot path: an IntFlag's ``&`` builds a new enum member every time.
_END_STREAM = int(Flag.END_STREAM)
_END_HEADERS = int(Flag.END_HEADERS)
_ACK = int(Flag.ACK)
_DATA, _HEADERS, _CONTINUATION = int(Type.DATA), int(Type.HEADERS), int(Type.CONTINUATION)


class Sender:
    """The output owed and the send side's flow control of one connection. ``ended`` is told
    when a stream's last frame has been written; ``answer`` queues an answer owed to the peer
    (the core counts those, :attr:`~.core.Core.answers_owed`)."""

    def __init__(self, limits: Limits, *, clock: Callable[[], float], ended: Callable[[Stream], None],
                 answer: Callable[[bytes], None]) -> None:
        self._clock = clock
        self._ended = ended
        self._answer = answer
        self._max_settings = limits.max_settings_entries
        self.out: list[bytes] = []
        """Frames owed, in order (taken by :meth:`~.core.Core.data_to_send`); one list for the
        connection's life, which the core holds too."""
        self.out_size = 0
        """Their bytes."""
        self.closed = False
        """Nothing is written any more (the connection failed or was lost)."""
        self.send_paused = False
        """The transport is full: stream output waits in its streams."""
        self.window = DEFAULT_WINDOW
        """What the connection's window lets us send."""
        self.frame_size = DEFAULT_FRAME_SIZE
        self.initial_window = DEFAULT_WINDOW
        self.max_streams: int | None = None
        """The peer's SETTINGS_MAX_CONCURRENT_STREAMS, once it said one."""
        self.blocked: dict[int, Stream] = {}
        """Streams whose output waits for a window or the transport."""
        self.blocked_since: float | None = None
        """Since when some stream's answer waits (None while none does)."""

    # the bytes owed

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.out.append(data)
            self.out_size += len(data)

    # the peer's windows and settings

    def settings(self, payload: memoryview, streams: Iterable[Stream]) -> bool:
        """Apply the peer's SETTINGS (and owe its ACK); whether a stream window grew."""
        if len(payload) % 6:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6 bytes")
        if len(payload) // 6 > self._max_settings:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, f"a SETTINGS of {len(payload) // 6} entries",
                                limit="max_settings_entries")
        delta = 0
        for key, value in read_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE beyond 2^31-1")
                delta += value - self.initial_window
                self.initial_window = value
            elif key == Setting.MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE:
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self.frame_size = value
            elif key == Setting.MAX_CONCURRENT_STREAMS:
                self.max_streams = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH neither 0 nor 1")
        if delta:  # one walk of the (bounded) stream table, only when a window really changed
            for stream in streams:
                stream.window += delta
                if stream.window > MAX_WINDOW:
                    raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "a stream window beyond 2^31-1")
        self._answer(frame(Type.SETTINGS, _ACK, 0))
        if delta > 0:
            self.flush_blocked()
        return delta > 0

    def grow_connection(self, increment: int) -> None:
        """The peer's WINDOW_UPDATE on stream 0 (of a non-zero increment)."""
        was = self.window
        self.window += increment
        if self.window > MAX_WINDOW:
            raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "the connection window beyond 2^31-1")
        if was <= 0:
            self.flush_blocked()

    def grow_stream(self, stream: Stream, increment: int) -> None:
        """The peer's WINDOW_UPDATE on a live stream (checked by the caller)."""
        stream.window += increment
        if stream.pending:
            if self.blocked_since is not None:
                self.blocked_since = self._clock()  # progress
            self.flush(stream)

    # stream output

    def flush_blocked(self, *, by_window: bool = True) -> None:
        """Send what waits in blocked streams. When only a window reopened (``by_window``),
        every blocked stream waits for DATA room, so the walk stops once the connection
        window is spent: a peer's 1-byte updates cost one stream each, not the whole table."""
        for blocked in list(self.blocked.values()):
            if self.send_paused or (by_window and self.window <= 0):
                break
            self.flush(blocked)

    def flush(self, stream: Stream) -> None:
        pending = stream.pending
        sid = stream.id
        if self.send_paused:
            if pending:
                self._mark_blocked(stream)
            return
        # Frame headers and payloads side by side, joined once below: a payload is copied once
        # (a request's 40 KB, say), and a block or message that fits one frame (every answer of
        # the server's, and most requests) costs no call of :func:`~.frames.frame`.
        out: list[bytes | memoryview] = []
        frame_size = self.frame_size
        ended = False
        while pending:
            is_headers, payload, end = pending[0]
            size = len(payload)
            if is_headers:
                if size <= frame_size:
                    out.append(HEADER.pack(size >> 16, size & 0xFFFF, _HEADERS,
                                           (_END_STREAM | _END_HEADERS) if end else _END_HEADERS, sid))
                    out.append(payload)
                else:
                    out.append(self._header_frames(sid, payload, end))
                pending.popleft()
                ended = end
                continue
            if 0 < size <= frame_size and size <= self.window and size <= stream.window:
                out.append(HEADER.pack(size >> 16, size & 0xFFFF, _DATA, _END_STREAM if end else 0, sid))
                out.append(payload)
                self.window -= size
                stream.window -= size
                pending.popleft()
                ended = end
                continue
            allowed = min(size, self.window, stream.window)
            if allowed <= 0 and size:
                break
            view = memoryview(payload)
            for offset in range(0, allowed, frame_size):
                chunk = view[offset : min(offset + frame_size, allowed)]
                last = offset + len(chunk) == size
                out.append(frame(_DATA, _END_STREAM if (last and end) else 0, sid, chunk))
            if not size:
                out.append(frame(_DATA, _END_STREAM if end else 0, sid))
            self.window -= allowed
            stream.window -= allowed
            if allowed == size:
                pending.popleft()
                ended = end
            else:
                pending[0] = (False, view[allowed:], end)
                break
        if pending:
            self._mark_blocked(stream)
        elif self.blocked:
            self.unblock(sid)
        if out:
            self.write(b"".join(out))
        if ended:
            self._ended(stream)

    def _mark_blocked(self, stream: Stream) -> None:
        if not self.blocked:
            self.blocked_since = self._clock()
        self.blocked[stream.id] = stream

    def unblock(self, stream_id: int) -> None:
        if self.blocked.pop(stream_id, None) is not None and not self.blocked:
            self.blocked_since = None

    def _header_frames(self, stream_id: int, block: bytes | memoryview, end_stream: bool) -> bytes:
        size = self.frame_size
        flags = _END_STREAM if end_stream else 0
        if len(block) <= size:
            return frame(_HEADERS, flags | _END_HEADERS, stream_id, block)
        chunks = [block[i : i + size] for i in range(0, len(block), size)]
        out = [frame(_HEADERS, flags, stream_id, chunks[0])]
        for index, chunk in enumerate(chunks[1:], 1):
            out.append(frame(_CONTINUATION, _END_HEADERS if index == len(chunks) - 1 else 0, stream_id, chunk))
        return b"".join(out)
