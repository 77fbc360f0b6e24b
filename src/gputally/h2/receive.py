"""The peer's frames read: each kind checked as RFC 9113 says and turned into stream moves,
window and settings changes, answers owed, and events.

:class:`Reader` is the core's receiving half (:mod:`.core` finds the frames and routes them
here): a frame the peer may not send raises :class:`~.errors.ProtocolError` (the connection
ends) or :class:`~.errors.StreamError` (that stream is reset); a header list that opens a
stream is checked as a request (:mod:`.validation`) unless the memo remembers it checked.
"""

from __future__ import annotations

from collections.abc import Callable

from .blocks import Block, unpad
from .errors import ProtocolError, StreamError
from .events import Events
from .frames import DEFAULT_WINDOW, MAX_WINDOW, ErrorCode, Flag, Type, frame, read_u32, rst_stream, window_update
from .hpack import Memo
from .limits import Limits
from .send import Sender
from .states import AFTER, Closure, StreamInput, StreamState, refuse
from .streams import Stream, StreamTable
from .validation import check_request

__all__ = ["CONNECTION_WINDOW", "STREAM_WINDOW", "Reader"]

STREAM_WINDOW = 4 * 2**20
"""What the peer may send on one stream before we say we consumed it."""
CONNECTION_WINDOW = 16 * 2**20
"""What the peer may send on the whole connection before we say we consumed it."""

# Plain ints on the hot path: an IntFlag's ``&`` builds a new enum member every time.
_END_STREAM = int(Flag.END_STREAM)
_PADDED = int(Flag.PADDED)
_ACK = int(Flag.ACK)
_CONTINUATION = int(Type.CONTINUATION)
_WINDOW_UPDATE, _SETTINGS, _PING = int(Type.WINDOW_UPDATE), int(Type.SETTINGS), int(Type.PING)
_RST_STREAM, _PRIORITY_FRAME, _GOAWAY = int(Type.RST_STREAM), int(Type.PRIORITY), int(Type.GOAWAY)
_HALF_LOCAL, _HALF_REMOTE = StreamState.HALF_CLOSED_LOCAL, StreamState.HALF_CLOSED_REMOTE
_RECV_HEADERS, _RECV_END = StreamInput.RECV_HEADERS, StreamInput.RECV_END_STREAM
_SEND_RST, _RECV_RST = StreamInput.SEND_RST_STREAM, StreamInput.RECV_RST_STREAM
_ENDED, _RESET_SENT, _RESET_RECEIVED = Closure.ENDED, Closure.RESET_SENT, Closure.RESET_RECEIVED
# the transition table's rows of the moves made on every call (:data:`~.states.AFTER`)
_ON_RECV_HEADERS, _ON_RECV_END = AFTER[_RECV_HEADERS], AFTER[_RECV_END]

Close = Callable[[Stream, StreamInput, Closure], None]
Answer = Callable[[bytes], None]


class Reader:
    """The receiving half of one connection's core; ``close`` takes a stream out of the table
    (and out of the send side's waiting list), ``answer`` queues an answer the peer's frame
    made us owe (counted against ``max_queued_control_frames``)."""

    def __init__(self, events: Events, *, client: bool, limits: Limits, clock: Callable[[], float],
                 streams: StreamTable, sender: Sender, memo: Memo, close: Close, answer: Answer) -> None:
        self._client = client
        self._limits = limits
        self._clock = clock
        self._streams = streams
        self._live = streams.live
        self._sender = sender
        self._memo = memo
        self._checks = memo.checks
        self._close = close
        self._answer = answer
        self.recv_window = DEFAULT_WINDOW  # grows with our first WINDOW_UPDATE
        """What the peer may still send on the connection."""
        self._received = 0  # connection DATA bytes taken since our last WINDOW_UPDATE
        self._reset_tokens = float(limits.reset_burst)
        self._reset_stamp = clock()
        self._on_headers = events.on_headers
        self._on_data = events.on_data
        self._on_reset = events.on_reset
        self._on_goaway = events.on_goaway
        self._on_settings = events.on_settings
        self._on_headers_too_large = events.on_headers_too_large
        self._on_limit = events.on_limit

    def control(self, kind: int, stream_id: int, flags: int, payload: memoryview) -> None:
        length = len(payload)
        if kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _SETTINGS:
            if stream_id:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
            if flags & _ACK:
                if payload:
                    raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
                return
            self._sender.settings(payload, self._live.values())
            self._on_settings()
        elif kind == _PING:
            if stream_id:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if length != 8:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a PING not of 8 bytes")
            if not flags & _ACK:  # an ACK of ours: the shell counts any read as a sign of life
                self._answer(frame(Type.PING, _ACK, 0, payload))
        elif kind == _RST_STREAM:
            self._rst_stream(stream_id, payload)
        elif kind == _PRIORITY_FRAME:
            if not stream_id:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if length != 5:
                raise StreamError(stream_id, ErrorCode.FRAME_SIZE_ERROR, "a PRIORITY not of 5 bytes")
            if read_u32(payload) == stream_id:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a stream depending on itself")
        elif kind == _GOAWAY:
            if stream_id:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            if length < 8:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a GOAWAY shorter than 8 bytes")
            self._on_goaway(read_u32(payload), read_u32(payload, 4), bytes(payload[8:]))
        elif kind == Type.PUSH_PROMISE:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE, which no peer of ours may send")
        elif kind == _CONTINUATION:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        # any other type is an extension, ignored (RFC 9113 section 4.1)

    def _not_live(self, stream_id: int, what: str) -> None:
        """``what`` arrived on a stream not in the table: idle is a connection error; a stream
        we reset is ignored (frames in flight); one the peer reset is a stream error, one that
        ended normally a connection error (both STREAM_CLOSED)."""
        if self._streams.is_idle(stream_id):
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        how = self._streams.closed.get(stream_id)
        if how is _RESET_RECEIVED:
            raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, f"{what} on a stream the peer reset")
        if how is _ENDED:
            raise ProtocolError(ErrorCode.STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    def data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)  # padding included: flow control counts the whole frame
        self.recv_window -= size
        if self.recv_window < 0:
            raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self._received += size
        if self._received >= CONNECTION_WINDOW // 2:
            self._answer(window_update(0, self._received))
            self.recv_window += self._received
            self._received = 0
        if flags & _PADDED:
            payload = unpad(payload)
        stream = self._live.get(stream_id)
        if stream is None:
            self._not_live(stream_id, "DATA")
            return
        if stream.state is _HALF_REMOTE:
            raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "DATA after the peer ended the stream")
        stream.recv_window -= size
        if stream.recv_window < 0:
            raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the stream's window")
        end = flags & _END_STREAM
        if stream.expected >= 0:
            stream.length += len(payload)
            if stream.length > stream.expected or (end and stream.length != stream.expected):
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA disagreeing with content-length")
        if not end:
            stream.received += size
            if stream.received >= STREAM_WINDOW // 2:
                self._answer(window_update(stream_id, stream.received))
                stream.recv_window += stream.received
                stream.received = 0
        self._on_data(stream_id, bytes(payload), bool(end))
        if end:
            self._remote_end(stream)

    def header_block(self, whole: Block) -> None:
        stream_id, flags, block, problem = whole
        headers, size = self._memo.decode(block)  # always: the peer's table changed either way
        end = bool(flags & _END_STREAM)
        stream = self._live.get(stream_id)
        if stream is None:
            table = self._streams
            if (stream_id & 1) == table.peer_parity and stream_id > table.last_peer:
                self._new_peer_stream(stream_id, headers, size, end, problem, block)
                return
            self._not_live(stream_id, "HEADERS")
            if stream_id in self._streams.closed:
                return  # a stream we reset: ignored
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which can no longer open")
        if stream.state is _HALF_REMOTE:
            raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "HEADERS after the peer ended the stream")
        if problem is not None:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, problem)
        if size > self._limits.max_header_list_size:
            self._on_limit("max_header_list_size", f"a header list of {size} bytes on stream {stream_id}")
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a header list beyond the allowed size")
        if stream.headers_seen:  # trailers
            if not end:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
            if any(name[:1] == ":" for name, _ in headers):
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a pseudo-header in trailers")
            if stream.expected >= 0 and stream.length != stream.expected:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA disagreeing with content-length")
        stream.headers_seen = True
        state = _ON_RECV_HEADERS[stream.state]  # stream.advance(_RECV_HEADERS), inlined: twice a client's call
        if state is None:
            refuse(stream.state, _RECV_HEADERS)
        stream.state = state
        self._on_headers(stream_id, headers, end)
        if end:
            self._remote_end(stream)

    def _new_peer_stream(self, stream_id: int, headers: list[tuple[str, str]], size: int, end: bool,
                         problem: str | None, block: bytes) -> None:
        if self._client:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id} from a server")
        table = self._streams
        table.last_peer = stream_id
        if problem is not None:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, problem)
        if table.active_peer >= self._limits.max_concurrent_streams:
            self._on_limit("max_concurrent_streams", f"more than {table.active_peer} streams open")
            raise StreamError(stream_id, ErrorCode.REFUSED_STREAM, "over SETTINGS_MAX_CONCURRENT_STREAMS")
        expected = -1
        if size <= self._limits.max_header_list_size:
            # A remembered block's headers were checked when first seen (a malformed one raised).
            known = self._checks.get(id(headers))
            if known is None:
                known = check_request(stream_id, headers)
                self._memo.remember_check(block, headers, known)
            expected = known
            if end and expected > 0:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA disagreeing with content-length")
        stream = table.open(stream_id, self._sender.initial_window, STREAM_WINDOW, local=False)
        stream.expected = expected
        if end:
            stream.advance(_RECV_END)
        if size > self._limits.max_header_list_size:
            self._on_limit("max_header_list_size", f"a header list of {size} bytes on stream {stream_id}")
            self._on_headers_too_large(stream_id, size, end)
            return
        self._on_headers(stream_id, headers, end)

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        increment = read_u32(payload)
        if not stream_id:
            if not increment:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._sender.grow_connection(increment)
            return
        stream = self._live.get(stream_id)
        if stream is None:
            if self._streams.is_idle(stream_id):
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # a stream closed since; its window no longer matters
        if not increment:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        if stream.window + increment > MAX_WINDOW:
            raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "a stream window beyond 2^31-1")
        self._sender.grow_stream(stream, increment)

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a RST_STREAM not of 4 bytes")
        stream = self._live.get(stream_id)
        if stream is None:
            if self._streams.is_idle(stream_id):
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
            return
        self._charge_reset()
        self._close(stream, _RECV_RST, _RESET_RECEIVED)
        self._on_reset(stream_id, read_u32(payload))

    def _charge_reset(self) -> None:
        """A stream reset the peer caused; a token bucket (nghttp2's) against Rapid Reset."""
        limits = self._limits
        now = self._clock()
        self._reset_tokens = min(float(limits.reset_burst),
                                 self._reset_tokens + (now - self._reset_stamp) * limits.reset_rate) - 1
        self._reset_stamp = now
        if self._reset_tokens < 0:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "stream resets faster than allowed",
                                limit="reset_rate")

    def stream_error(self, stream_id: int, code: ErrorCode) -> None:
        """RST_STREAM for a stream error; the stream's side hears the code the peer was sent."""
        self._charge_reset()
        stream = self._live.get(stream_id)
        self._answer(rst_stream(stream_id, code))
        if stream is not None:
            self._close(stream, _SEND_RST, _RESET_SENT)
            self._on_reset(stream_id, code)
        else:
            self._streams.remember(stream_id, _RESET_SENT)

    def _remote_end(self, stream: Stream) -> None:
        """The peer's END_STREAM arrived on ``stream`` (if the event left it open)."""
        if self._live.get(stream.id) is not stream:
            return
        if stream.state is _HALF_LOCAL:
            self._close(stream, _RECV_END, _ENDED)
            return
        state = _ON_RECV_END[stream.state]  # stream.advance(_RECV_END), inlined: once a server's call
        if state is None:
            refuse(stream.state, _RECV_END)
        stream.state = state
