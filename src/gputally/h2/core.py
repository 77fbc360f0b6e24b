"""The HTTP/2 protocol of one connection, either end, without I/O: bytes in, events out.

:meth:`Core.receive` takes the peer's bytes; each stream's headers, data and reset, the peer's
GOAWAY and PING acknowledgements come out as calls of the ``_on_*`` methods a subclass
implements; what to send accumulates until :meth:`Core.data_to_send` takes it. Nothing here
owns a socket, a timer or a task, so the machine runs (and is tested) on plain bytes.

Streams follow RFC 9113 section 5.1 explicitly: idle (never seen), open, half-closed (local)
or (remote), closed (gone from the table; how it closed is remembered for a while, so that a
late frame on it is ignored, a stream error or a connection error as the RFC says). Every
limit of :class:`~.limits.Limits` is counted where it is decoded: a header block's bytes and
frames as each CONTINUATION arrives, the decoded list as it is decoded, a stream's and the
connection's receive windows at each DATA frame, resets in a token bucket, answers owed in a
counter that only the output being drained resets. No frame costs more than its length
(plus a walk of at most ``max_concurrent_streams`` streams when the peer's initial window
changes or the connection window reopens).

Receiving, a stream's window is large (``STREAM_WINDOW``), so a request of gRPC's usual size
needs no WINDOW_UPDATE of its own; the connection's window is topped up once half is used.
Sending, data beyond what the peer's windows allow waits in its stream, in order with the
headers behind it, until the peer's WINDOW_UPDATE; while :attr:`Core.send_paused` (the
transport is full) all stream output waits, and once the output owed passes
``max_output_buffer`` parsing stops until it is drained (:meth:`Core.resume_input`).
"""

from __future__ import annotations

import enum
import re
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from itertools import chain
from typing import cast

from . import hpack
from .frames import (
    DEFAULT_FRAME_SIZE,
    DEFAULT_WINDOW,
    HEADER,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    PREFACE,
    ErrorCode,
    Flag,
    Setting,
    Type,
    frame,
    goaway,
    read_settings,
    read_u32,
    rst_stream,
    settings,
    window_update,
)
from .limits import Limits

__all__ = [
    "CONNECTION_WINDOW",
    "RECEIVE_FRAME_SIZE",
    "STREAM_WINDOW",
    "Core",
    "ProtocolError",
    "Stream",
    "StreamError",
    "StreamState",
]

STREAM_WINDOW = 4 * 2**20
"""What the peer may send on one stream before we say we consumed it."""
CONNECTION_WINDOW = 16 * 2**20
"""What the peer may send on the whole connection before we say we consumed it."""
RECEIVE_FRAME_SIZE = 1 * 2**20
"""Largest frame the peer may send us; fewer, larger DATA frames cost less to parse."""

# Plain ints on the hot path: an IntFlag's ``&`` builds a new enum member every time.
_END_STREAM = int(Flag.END_STREAM)
_END_HEADERS = int(Flag.END_HEADERS)
_PADDED = int(Flag.PADDED)
_PRIORITY = int(Flag.PRIORITY)
_ACK = int(Flag.ACK)
_DATA, _HEADERS, _CONTINUATION = int(Type.DATA), int(Type.HEADERS), int(Type.CONTINUATION)
_WINDOW_UPDATE, _SETTINGS, _PING = int(Type.WINDOW_UPDATE), int(Type.SETTINGS), int(Type.PING)
_RST_STREAM, _PRIORITY_FRAME, _GOAWAY = int(Type.RST_STREAM), int(Type.PRIORITY), int(Type.GOAWAY)


class StreamState(enum.IntEnum):
    """RFC 9113 section 5.1 (no push, so never reserved)."""

    IDLE = 0
    OPEN = 1
    HALF_CLOSED_LOCAL = 2
    HALF_CLOSED_REMOTE = 3
    CLOSED = 4


_OPEN, _HALF_LOCAL, _HALF_REMOTE = int(StreamState.OPEN), int(StreamState.HALF_CLOSED_LOCAL), int(
    StreamState.HALF_CLOSED_REMOTE)
_CLOSED = int(StreamState.CLOSED)
# How a closed stream closed, which decides what a late frame on it is (RFC 9113 section 5.1).
_RESET_SENT, _RESET_RECEIVED, _ENDED = 1, 2, 3

_REQUEST_PSEUDO = frozenset({":method", ":scheme", ":path", ":authority"})
_REQUIRED_PSEUDO = frozenset({":method", ":scheme", ":path"})
_CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"})
_BAD_NAMES = re.compile(r"[^!#$%&'*+\-.^_`|~0-9a-z\x01]")
"""In names joined by \\x01: a character outside a lower-case token (RFC 9110 5.6.2, RFC 9113
8.2.1); a pseudo-header after a regular field is caught by its ':'."""
_BAD_VALUES = re.compile(r"[\x00\r\n]|(?:^|\x01)[ \t]|[ \t](?:\x01|$)")
"""In values joined by \\x01: NUL, CR, LF, or white space at either end of one (RFC 9113 8.2.1)."""
_CONNECTION_WORDS = re.compile(r"connection|keep-alive|transfer-encoding|upgrade")
_MEMO_BLOCKS = 64
"""Header blocks remembered decoded (:meth:`Core._decode_sized`) at most, per connection..."""
_MEMO_BYTES = 64 * 1024
"""...and their bytes and headers' sizes at most, so a peer's large blocks cannot make it hold
more than this."""


class ProtocolError(Exception):
    """A connection error: GOAWAY with ``code``, then close. ``limit`` names the bound the peer
    hit when it is one of :class:`~.limits.Limits` (logged as an attack, not a bug)."""

    def __init__(self, code: ErrorCode, message: str, *, limit: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.limit = limit


class StreamError(Exception):
    """A stream error: RST_STREAM with ``code`` on that stream alone."""

    def __init__(self, stream_id: int, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.code = code


class Stream:
    """One stream: its state, both directions' windows and what waits to be sent."""

    __slots__ = ("expected", "headers_seen", "id", "length", "local", "opened", "pending", "received",
                 "recv_window", "state", "window")

    def __init__(self, stream_id: int, window: int, recv_window: int, *, local: bool, opened: float) -> None:
        self.id = stream_id
        self.state = _OPEN
        self.local = local
        """We opened it (a client's request)."""
        self.window = window
        """What we may still send on it."""
        self.recv_window = recv_window
        """What the peer may still send on it."""
        self.received = 0
        """DATA bytes taken since this stream's last WINDOW_UPDATE."""
        self.expected = -1
        """The peer's content-length, -1 when it sent none."""
        self.length = 0
        """DATA payload bytes the peer sent."""
        self.headers_seen = not local
        """The peer's first header block arrived (so another one is trailers)."""
        self.opened = opened
        self.pending: deque[tuple[bool, bytes | memoryview, bool]] = deque()
        """(is headers, bytes, end of stream), in the order they must go out."""


class Core:
    """One HTTP/2 connection's protocol state; subclasses handle the stream events."""

    client: bool = False

    def __init__(self, *, limits: Limits | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits = limits or Limits()
        self._clock = clock
        self._buffer = bytearray()
        self._awaiting_preface = not self.client
        self._decoder = hpack.Decoder(max_header_list_size=2 * limits.max_header_list_size)
        self._decoded: dict[bytes, tuple[list[tuple[str, str]], int]] = {}
        self._checked: dict[int, int] = {}  # id of a remembered request's headers -> its check
        self._memo_bytes = 0  # the remembered blocks' bytes and their headers' sizes
        self._streams: dict[int, Stream] = {}
        self._blocked: dict[int, Stream] = {}
        # recently closed stream -> how (_RESET_SENT...), oldest first (popitem(last=False) is O(1),
        # where deleting a dict's first key leaves a hole each next iter() must skip)
        self._closed_streams: OrderedDict[int, int] = OrderedDict()
        self._closed_memory = 4 * limits.max_concurrent_streams + 64
        # a header block awaiting CONTINUATION: stream, HEADERS flags, parts, bytes, frames, stream error
        self._block: tuple[int, int, list[bytes], int, int, str | None] | None = None
        self._active_peer = 0  # peer-initiated streams not closed
        self._last_peer_stream = 0
        self._last_local_stream = 0
        self._send_window = DEFAULT_WINDOW
        self._recv_window = DEFAULT_WINDOW  # grows with our first WINDOW_UPDATE
        self._received = 0  # connection DATA bytes taken since our last WINDOW_UPDATE
        self._peer_frame_size = DEFAULT_FRAME_SIZE
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_streams: int | None = None
        self._local_settings: dict[Setting, int] = {
            Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            Setting.MAX_FRAME_SIZE: RECEIVE_FRAME_SIZE,
            Setting.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        }
        if self.client:
            self._local_settings[Setting.ENABLE_PUSH] = 0
        else:
            self._local_settings[Setting.MAX_CONCURRENT_STREAMS] = limits.max_concurrent_streams
        self._reset_tokens = float(limits.reset_burst)
        self._reset_stamp = clock()
        self._out: list[bytes] = []
        self._out_size = 0
        self._control_queued = 0
        self.input_held = False
        """Parsing stopped with whole frames unread, because the output owed is full."""
        self.send_paused = False
        """The transport is full: stream output waits in its streams (set by the adapter)."""
        self.blocked_since: float | None = None
        """Since when some stream's answer waits for the peer's flow-control window."""
        self.idle_since: float | None = clock()
        """Since when no stream is open (None while one is)."""
        self._goaway_sent = False
        self.closed = False
        self.error: ProtocolError | None = None
        """The connection error that closed it, if one did."""

    # bytes in, bytes out

    def initiate(self) -> None:
        """Queue what this end sends first: a client's preface, both ends' SETTINGS and the
        connection window's first top-up."""
        self._write((PREFACE if self.client else b"") + settings(self._local_settings)
                    + window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW))
        self._recv_window = CONNECTION_WINDOW

    def receive(self, data: bytes) -> None:
        """Take the peer's bytes: handle every whole frame (until the output owed is full)."""
        if self.closed:
            return
        if self._buffer or self.input_held:
            self._buffer += data
            if not self.input_held:
                self._parse()
            return
        # Nothing left over from earlier reads (the usual case): the frames are read from
        # ``data`` itself and only what follows the last whole one is kept, one copy of each
        # request less.
        self._parse(data)

    def resume_input(self) -> None:
        """The output was drained: go on with frames left unread."""
        if self.input_held and not self.closed:
            self.input_held = False
            self._parse()

    def data_to_send(self) -> bytes:
        """What to write now; the core forgets it."""
        if not self._out:
            return b""
        out = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._out_size = 0
        return out

    def output_drained(self) -> None:
        """The peer took everything written: answers owed are counted from 0 again."""
        self._control_queued = 0

    def _parse(self, data: bytes | None = None) -> None:
        """Handle the whole frames of the buffer, or of ``data`` when the buffer is empty."""
        buffer = self._buffer
        try:
            consumed = self._frames(buffer if data is None else data)
        except ProtocolError as exc:
            self._fail(exc)
            return
        except hpack.OversizedHeaderListError:
            self._fail(ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header list beyond twice the allowed size",
                                     limit="max_header_list_size"))
            return
        except hpack.HeaderError as exc:
            self._fail(ProtocolError(ErrorCode.COMPRESSION_ERROR, f"undecodable header block: {exc}"))
            return
        if data is None:
            try:
                del buffer[:consumed]
            except BufferError:  # a view of it still lives somewhere: start a new buffer instead
                self._buffer = bytearray(buffer[consumed:])
        elif consumed < len(data) and not self.closed:
            buffer += memoryview(data)[consumed:]
        self._output_ready()

    # what subclasses implement

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        raise NotImplementedError

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def _on_reset(self, stream_id: int, code: int) -> None:
        raise NotImplementedError

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        raise NotImplementedError

    def _on_settings(self) -> None:
        """The peer's settings changed (a client may now open more streams)."""

    def _on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        """The peer's header list on this stream decoded to more than ``max_header_list_size``;
        the stream is open for an answer. By default it is reset."""
        self.reset(stream_id, ErrorCode.REFUSED_STREAM)

    def _on_ping_ack(self, payload: bytes) -> None:
        """The peer acknowledged our PING."""

    def _local_end(self, stream_id: int) -> None:
        """Our side of the stream has ended (its END_STREAM is written)."""

    def _output_ready(self) -> None:
        """Output was queued outside :meth:`receive` (an answer, a reset): write it now."""

    def _terminate(self) -> None:
        """A connection error: the GOAWAY is queued; write it and close."""

    # receiving

    def _frames(self, buffer: bytes | bytearray) -> int:
        """Handle whole frames in ``buffer``; the bytes consumed."""
        pos = 0
        if self._awaiting_preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return 0
            if buffer[: len(PREFACE)] != PREFACE:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self._awaiting_preface = False
            pos = len(PREFACE)
        end = len(buffer)
        view = memoryview(buffer)
        out_limit = self.limits.max_output_buffer
        try:
            while end - pos >= 9:
                if self._out_size > out_limit:
                    self.input_held = True  # the peer reads slower than it makes us answer
                    break
                high, low, kind, flags, stream_id = HEADER.unpack_from(buffer, pos)
                length = (high << 16) | low
                if length > RECEIVE_FRAME_SIZE:
                    raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                start = pos + 9
                if end - start < length:
                    break
                pos = start + length
                stream_id &= 0x7FFFFFFF
                try:
                    if self._block is not None:
                        if kind != _CONTINUATION:
                            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a header block interrupted by another frame")
                        self._continuation(stream_id, flags, view[start:pos])
                    elif kind == _DATA:
                        self._data(stream_id, flags, view[start:pos])
                    elif kind == _HEADERS:
                        self._headers(stream_id, flags, view[start:pos])
                    else:
                        self._control(kind, stream_id, flags, view[start:pos])
                except StreamError as exc:
                    self._stream_error(exc.stream_id, exc.code)
                if self.closed:
                    break
        finally:
            view.release()
        return pos

    def _control(self, kind: int, stream_id: int, flags: int, payload: memoryview) -> None:
        length = len(payload)
        if kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _SETTINGS:
            self._settings(stream_id, flags, payload)
        elif kind == _PING:
            if stream_id:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
            if length != 8:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a PING not of 8 bytes")
            if flags & _ACK:
                self._on_ping_ack(bytes(payload))
            else:
                self._write_control(frame(Type.PING, _ACK, 0, payload))
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

    def _is_idle(self, stream_id: int) -> bool:
        """Never opened by either end (RFC 9113 section 5.1.1: ids only grow)."""
        if (stream_id & 1) == (0 if self.client else 1):  # the peer's ids
            return stream_id > self._last_peer_stream
        return stream_id > self._last_local_stream

    def _not_live(self, stream_id: int, what: str) -> None:
        """``what`` arrived on a stream not in the table: idle is a connection error; a stream
        we reset is ignored (frames in flight); one the peer reset is a stream error, one that
        ended normally a connection error (both STREAM_CLOSED)."""
        if self._is_idle(stream_id):
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        how = self._closed_streams.get(stream_id)
        if how == _RESET_RECEIVED:
            raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, f"{what} on a stream the peer reset")
        if how == _ENDED:
            raise ProtocolError(ErrorCode.STREAM_CLOSED, f"{what} on closed stream {stream_id}")

    def _data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)  # padding included: flow control counts the whole frame
        self._recv_window -= size
        if self._recv_window < 0:
            raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self._received += size
        if self._received >= CONNECTION_WINDOW // 2:
            self._write_control(window_update(0, self._received))
            self._recv_window += self._received
            self._received = 0
        if flags & _PADDED:
            payload = _unpad(payload)
        stream = self._streams.get(stream_id)
        if stream is None:
            self._not_live(stream_id, "DATA")
            return
        if stream.state == _HALF_REMOTE:
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
                self._write_control(window_update(stream_id, stream.received))
                stream.recv_window += stream.received
                stream.received = 0
        self._on_data(stream_id, bytes(payload), bool(end))
        if end:
            self._remote_end(stream)

    def _headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & _PADDED:
            payload = _unpad(payload)
        problem = None
        if flags & _PRIORITY:
            if len(payload) < 5:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if read_u32(payload) == stream_id:
                problem = "a stream depending on itself"  # a stream error, once the block is decoded
            payload = payload[5:]
        if flags & _END_HEADERS:
            self._header_block(stream_id, flags, bytes(payload), problem)
            return
        size = len(payload)
        if size > 2 * self.limits.max_header_list_size:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header block beyond twice the allowed size",
                                limit="max_header_list_size")
        self._block = (stream_id, flags, [bytes(payload)], size, 0, problem)

    def _continuation(self, stream_id: int, flags: int, payload: memoryview) -> None:
        assert self._block is not None
        block_stream, first_flags, parts, size, count, problem = self._block
        if stream_id != block_stream:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION on another stream than its HEADERS")
        count += 1
        if count > self.limits.max_continuation_frames:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, f"a header block in more than {count - 1} CONTINUATIONs",
                                limit="max_continuation_frames")
        size += len(payload)
        if size > 2 * self.limits.max_header_list_size:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header block beyond twice the allowed size",
                                limit="max_header_list_size")
        parts.append(bytes(payload))
        if flags & _END_HEADERS:
            self._block = None
            self._header_block(stream_id, first_flags, b"".join(parts), problem)
        else:
            self._block = (stream_id, first_flags, parts, size, count, problem)

    def _header_block(self, stream_id: int, flags: int, block: bytes, problem: str | None) -> None:
        headers, size = self._decode_sized(block)  # always: the peer's table changed either way
        end = bool(flags & _END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is None:
            if (stream_id & 1) == (0 if self.client else 1) and stream_id > self._last_peer_stream:
                self._new_peer_stream(stream_id, headers, size, end, problem, block)
                return
            self._not_live(stream_id, "HEADERS")
            if stream_id in self._closed_streams:
                return  # a stream we reset: ignored
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream_id}, which can no longer open")
        if stream.state == _HALF_REMOTE:
            raise StreamError(stream_id, ErrorCode.STREAM_CLOSED, "HEADERS after the peer ended the stream")
        if problem is not None:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, problem)
        if size > self.limits.max_header_list_size:
            self._limit_hit("max_header_list_size", f"a header list of {size} bytes on stream {stream_id}")
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a header list beyond the allowed size")
        if stream.headers_seen:  # trailers
            if not end:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "trailers without END_STREAM")
            if any(name[:1] == ":" for name, _ in headers):
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a pseudo-header in trailers")
            if stream.expected >= 0 and stream.length != stream.expected:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA disagreeing with content-length")
        stream.headers_seen = True
        self._on_headers(stream_id, headers, end)
        if end:
            self._remote_end(stream)

    def _new_peer_stream(self, stream_id: int, headers: list[tuple[str, str]], size: int, end: bool,
                         problem: str | None, block: bytes) -> None:
        if self.client:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"HEADERS opening stream {stream_id} from a server")
        self._last_peer_stream = stream_id
        if problem is not None:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, problem)
        if self._active_peer >= self.limits.max_concurrent_streams:
            self._limit_hit("max_concurrent_streams", f"more than {self._active_peer} streams open")
            raise StreamError(stream_id, ErrorCode.REFUSED_STREAM, "over SETTINGS_MAX_CONCURRENT_STREAMS")
        expected = -1
        if size <= self.limits.max_header_list_size:
            # A remembered block's headers were checked when first seen (a malformed one raised).
            known = self._checked.get(id(headers))
            if known is None:
                known = _check_request(stream_id, headers)
                if len(block) and self._decoded.get(block, (None,))[0] is headers:
                    self._checked[id(headers)] = known
            expected = known
            if end and expected > 0:
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "DATA disagreeing with content-length")
        stream = self._open_stream(stream_id, local=False)
        stream.expected = expected
        if end:
            stream.state = _HALF_REMOTE
        if size > self.limits.max_header_list_size:
            self._limit_hit("max_header_list_size", f"a header list of {size} bytes on stream {stream_id}")
            self._on_headers_too_large(stream_id, size, end)
            return
        self._on_headers(stream_id, headers, end)

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        return self._decode_sized(block)[0]

    def _decode_sized(self, block: bytes) -> tuple[list[tuple[str, str]], int]:
        """The headers of a block (a list the caller must not change) and their RFC 7541 size.

        A block made only of indexed fields and literals that are not to be indexed reads the
        peer's table without changing it, so while nothing else was decoded since, the same
        bytes mean the same headers: such blocks, the steady state of a peer's repeated calls
        (an indexing encoder's, such as Go's and gRPC core's, once its table holds the call's
        fields; a literal-only one's, such as gputally's, from the first call), are remembered
        instead of decoded again (~14 us and more each through hpack). Any other block may
        change the table and forgets them all.
        """
        known = self._decoded.get(block)
        if known is not None:
            return known
        # hpack gives (str, str) tuples unless asked for raw bytes.
        headers = cast(list[tuple[str, str]], self._decoder.decode(block))
        sized = headers, 32 * len(headers) + sum(map(len, chain.from_iterable(headers)))
        # one-byte indexed fields only (every byte 0x80-0xFE), or a walk of the representations
        if block and ((min(block) >= 0x80 and 0xFF not in block) or hpack.leaves_table(block)):
            cost = sized[1] + len(block)
            if cost > _MEMO_BYTES:
                return sized  # too large to keep; the table did not change
            if len(self._decoded) >= _MEMO_BLOCKS or self._memo_bytes + cost > _MEMO_BYTES:
                self._forget_decoded()
            self._decoded[block] = sized
            self._memo_bytes += cost
        elif self._decoded:
            self._forget_decoded()
        return sized

    def _forget_decoded(self) -> None:
        """The peer's table changed (or the memo is full): forget every remembered block."""
        self._decoded.clear()
        self._checked.clear()
        self._memo_bytes = 0

    def _is_remembered(self, headers: list[tuple[str, str]]) -> bool:
        """Whether the header list of the peer's request now handled is a remembered one: the
        same object comes back for the same bytes until :meth:`_forget_decoded`."""
        return id(headers) in self._checked

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a WINDOW_UPDATE not of 4 bytes")
        increment = read_u32(payload)
        if not stream_id:
            if not increment:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            was = self._send_window
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "the connection window beyond 2^31-1")
            if was <= 0:
                self._flush_blocked()
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {stream_id}")
            return  # a stream closed since; its window no longer matters
        if not increment:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
        if stream.window + increment > MAX_WINDOW:
            raise StreamError(stream_id, ErrorCode.FLOW_CONTROL_ERROR, "a stream window beyond 2^31-1")
        stream.window += increment
        if stream.pending:
            if self.blocked_since is not None:
                self.blocked_since = self._clock()  # progress
            self._flush(stream)

    def _settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS acknowledgement with a payload")
            return
        if len(payload) % 6:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a SETTINGS payload not a multiple of 6 bytes")
        if len(payload) // 6 > self.limits.max_settings_entries:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, f"a SETTINGS of {len(payload) // 6} entries",
                                limit="max_settings_entries")
        delta = 0
        for key, value in read_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE beyond 2^31-1")
                delta += value - self._peer_initial_window
                self._peer_initial_window = value
            elif key == Setting.MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE:
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame_size = value
            elif key == Setting.MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH neither 0 nor 1")
        if delta:  # one walk of the (bounded) stream table, only when a window really changed
            for stream in self._streams.values():
                stream.window += delta
                if stream.window > MAX_WINDOW:
                    raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "a stream window beyond 2^31-1")
        self._write_control(frame(Type.SETTINGS, _ACK, 0))
        if delta > 0:
            self._flush_blocked()
        self._on_settings()

    def _rst_stream(self, stream_id: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a RST_STREAM not of 4 bytes")
        stream = self._streams.get(stream_id)
        if stream is None:
            if self._is_idle(stream_id):
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {stream_id}")
            return
        self._charge_reset()
        self._close_stream(stream, _RESET_RECEIVED)
        self._on_reset(stream_id, read_u32(payload))

    def _charge_reset(self) -> None:
        """A stream reset the peer caused; a token bucket (nghttp2's) against Rapid Reset."""
        limits = self.limits
        now = self._clock()
        self._reset_tokens = min(float(limits.reset_burst),
                                 self._reset_tokens + (now - self._reset_stamp) * limits.reset_rate) - 1
        self._reset_stamp = now
        if self._reset_tokens < 0:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "stream resets faster than allowed",
                                limit="reset_rate")

    def _stream_error(self, stream_id: int, code: ErrorCode) -> None:
        """RST_STREAM for a stream error; the stream's side hears the code the peer was sent."""
        self._charge_reset()
        stream = self._streams.get(stream_id)
        self._write_control(rst_stream(stream_id, code))
        if stream is not None:
            self._close_stream(stream, _RESET_SENT)
            self._on_reset(stream_id, code)
        else:
            self._remember_closed(stream_id, _RESET_SENT)

    def _remote_end(self, stream: Stream) -> None:
        """The peer's END_STREAM arrived on ``stream`` (if the hook left it open)."""
        if self._streams.get(stream.id) is not stream:
            return
        if stream.state == _HALF_LOCAL:
            self._close_stream(stream, _ENDED)
        else:
            stream.state = _HALF_REMOTE

    # streams

    def _open(self, stream_id: int) -> Stream:
        """Open a stream of our own (a client's request)."""
        self._last_local_stream = max(self._last_local_stream, stream_id)
        return self._open_stream(stream_id, local=True)

    def _open_stream(self, stream_id: int, *, local: bool) -> Stream:
        stream = self._streams[stream_id] = Stream(stream_id, self._peer_initial_window, STREAM_WINDOW,
                                                   local=local, opened=self._clock())
        if not local:
            self._active_peer += 1
        self.idle_since = None
        return stream

    def _close_stream(self, stream: Stream, how: int) -> None:
        stream_id = stream.id
        if self._streams.pop(stream_id, None) is None:
            return
        stream.state = _CLOSED
        if not stream.local:
            self._active_peer -= 1
        if self._blocked:
            self._unblock(stream_id)
        closed = self._closed_streams
        closed[stream_id] = how
        if len(closed) > self._closed_memory:
            closed.popitem(last=False)
        if not self._streams:
            self.idle_since = self._clock()

    def _remember_closed(self, stream_id: int, how: int) -> None:
        closed = self._closed_streams
        closed[stream_id] = how
        if len(closed) > self._closed_memory:
            closed.popitem(last=False)

    def _forget(self, stream_id: int) -> None:
        """Close a stream without a word to the peer (it ended, or we no longer care)."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._close_stream(stream, _ENDED)

    def _unblock(self, stream_id: int) -> None:
        if self._blocked.pop(stream_id, None) is not None and not self._blocked:
            self.blocked_since = None

    def stream_state(self, stream_id: int) -> StreamState:
        stream = self._streams.get(stream_id)
        if stream is not None:
            return StreamState(stream.state)
        return StreamState.IDLE if self._is_idle(stream_id) else StreamState.CLOSED

    @property
    def open_streams(self) -> int:
        """Streams not closed, either end's."""
        return len(self._streams)

    # sending

    def send(self, stream_id: int, headers: bytes | None, data: bytes | memoryview | None = None,
             trailers: bytes | None = None, *, end_stream: bool = True) -> None:
        """Queue a header block, data and a trailer block on a stream we have not ended, in that
        order, and write what the windows allow. ``end_stream`` ends the stream with the last part."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.state == _HALF_LOCAL or self.closed:
            return  # reset or closed meanwhile: nothing to say any more
        pending = stream.pending
        if headers is not None:
            pending.append((True, headers, end_stream and data is None and trailers is None))
        if data is not None:
            pending.append((False, data, end_stream and trailers is None))
        if trailers is not None:
            pending.append((True, trailers, end_stream))
        self._flush(stream)
        self._output_ready()

    def _flush_blocked(self, *, by_window: bool = True) -> None:
        """Send what waits in blocked streams. When only a window reopened (``by_window``),
        every blocked stream waits for DATA room, so the walk stops once the connection
        window is spent: a peer's 1-byte updates cost one stream each, not the whole table."""
        for blocked in list(self._blocked.values()):
            if self.send_paused or (by_window and self._send_window <= 0):
                break
            self._flush(blocked)

    def flush_all(self) -> None:
        """The transport takes data again: send what waited for it."""
        self._flush_blocked(by_window=False)
        self._output_ready()

    def _flush(self, stream: Stream) -> None:
        pending = stream.pending
        sid = stream.id
        if self.send_paused:
            if pending:
                self._mark_blocked(stream)
            return
        out: list[bytes] = []
        frame_size = self._peer_frame_size
        ended = False
        while pending:
            is_headers, payload, end = pending[0]
            if is_headers:
                out.append(self._header_frames(sid, payload, end))
                pending.popleft()
                ended = end
                continue
            size = len(payload)
            if 0 < size <= frame_size and size <= self._send_window and size <= stream.window:
                out.append(frame(_DATA, _END_STREAM if end else 0, sid, payload))  # one frame: most answers
                self._send_window -= size
                stream.window -= size
                pending.popleft()
                ended = end
                continue
            allowed = min(size, self._send_window, stream.window)
            if allowed <= 0 and size:
                break
            view = memoryview(payload)
            for offset in range(0, allowed, frame_size):
                chunk = view[offset : min(offset + frame_size, allowed)]
                last = offset + len(chunk) == size
                out.append(frame(_DATA, _END_STREAM if (last and end) else 0, sid, chunk))
            if not size:
                out.append(frame(_DATA, _END_STREAM if end else 0, sid))
            self._send_window -= allowed
            stream.window -= allowed
            if allowed == size:
                pending.popleft()
                ended = end
            else:
                pending[0] = (False, view[allowed:], end)
                break
        if pending:
            self._mark_blocked(stream)
        elif self._blocked:
            self._unblock(sid)
        if out:
            self._write(b"".join(out))
        if ended:
            if stream.state == _HALF_REMOTE:
                self._close_stream(stream, _ENDED)
            else:
                stream.state = _HALF_LOCAL
            self._local_end(sid)

    def _mark_blocked(self, stream: Stream) -> None:
        if not self._blocked:
            self.blocked_since = self._clock()
        self._blocked[stream.id] = stream

    def _header_frames(self, stream_id: int, block: bytes | memoryview, end_stream: bool) -> bytes:
        size = self._peer_frame_size
        flags = _END_STREAM if end_stream else 0
        if len(block) <= size:
            return frame(_HEADERS, flags | _END_HEADERS, stream_id, block)
        chunks = [block[i : i + size] for i in range(0, len(block), size)]
        out = [frame(_HEADERS, flags, stream_id, chunks[0])]
        for index, chunk in enumerate(chunks[1:], 1):
            out.append(frame(_CONTINUATION, _END_HEADERS if index == len(chunks) - 1 else 0, stream_id, chunk))
        return b"".join(out)

    def reset(self, stream_id: int, code: ErrorCode) -> None:
        """Reset one stream (a stream error of ours); what waited for it is dropped."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._close_stream(stream, _RESET_SENT)
        self._write(rst_stream(stream_id, code))
        self._output_ready()

    def ping(self, payload: bytes) -> None:
        self._write(frame(Type.PING, 0, 0, payload))
        self._output_ready()

    def goaway(self, last_stream_id: int, code: ErrorCode = ErrorCode.NO_ERROR, debug: str = "") -> None:
        """Tell the peer no stream above ``last_stream_id`` will be handled."""
        self._goaway_sent = True
        self._write(goaway(last_stream_id, code, debug.encode("utf-8", "replace")[:256]))
        self._output_ready()

    def _write(self, data: bytes) -> None:
        if not self.closed:
            self._out.append(data)
            self._out_size += len(data)

    def _write_control(self, data: bytes) -> None:
        """An answer the peer's frame made us owe (ACK, reset, window update): counted."""
        self._control_queued += 1
        if self._control_queued > self.limits.max_queued_control_frames:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "more control frames owed than the peer reads",
                                limit="max_queued_control_frames")
        self._write(data)

    def _limit_hit(self, limit: str, detail: str) -> None:
        """A stream-level limit refused something (the connection goes on); the adapter logs it."""

    def _fail(self, error: ProtocolError) -> None:
        """A connection error: GOAWAY with its code, then close."""
        if self.closed:
            return
        self.error = error
        self._buffer = bytearray()  # nothing the peer sent is read any more
        self._block = None
        self._write(goaway(self._last_peer_stream, error.code, str(error).encode("utf-8", "replace")[:256]))
        self._goaway_sent = True
        self.closed = True
        self._terminate()


def _check_request(stream_id: int, headers: list[tuple[str, str]]) -> int:
    """A request's header list checked as RFC 9113 section 8.2-8.3 demands of a server; its
    content-length (-1 when none). A malformed request is a stream error (PROTOCOL_ERROR)."""
    seen: set[str] = set()
    regular = 0
    for name, _ in headers:
        if name[:1] != ":":
            break
        if name not in _REQUEST_PSEUDO or name in seen:
            raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"an unknown or repeated {name[:32]}")
        seen.add(name)
        regular += 1
    if not _REQUIRED_PSEUDO <= seen:
        raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a request without :method, :scheme and :path")
    fields = headers[regular:]
    names = "\x01".join(name for name, _ in fields)
    # one search each over all names and all values: cheaper than one per field
    if _BAD_NAMES.search(names) or _BAD_VALUES.search("\x01".join(value for _, value in fields)) \
            or not all(name for name, _ in fields):
        raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a misplaced pseudo-header, or a field HTTP/2 forbids")
    if not dict(headers[:regular]).get(":path"):
        raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "an empty :path")
    length = -1
    bounded = f"\x01{names}\x01"
    if "\x01te\x01" in bounded or "\x01content-length\x01" in bounded or _CONNECTION_WORDS.search(names):
        for name, value in fields:
            if name in _CONNECTION_SPECIFIC or (name == "te" and value != "trailers"):
                raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, f"the connection-specific field {name}")
            if name == "content-length":
                if not (value.isascii() and value.isdigit()) or length >= 0:
                    raise StreamError(stream_id, ErrorCode.PROTOCOL_ERROR, "a malformed content-length")
                length = int(value)
    return length


def _unpad(payload: memoryview) -> memoryview:
    if not payload:
        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
