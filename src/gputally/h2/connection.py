"""One HTTP/2 connection, either end: frames in, stream events out, flow control both ways.

:class:`Connection` is an ``asyncio.Protocol``. It parses frames straight from the bytes the
event loop hands it (no thread, no copy of a frame before its payload is taken), answers
SETTINGS and PING itself, keeps both directions' flow-control windows, assembles header
blocks (HEADERS + CONTINUATION) and decodes them, and tells its subclass of each stream's
headers, data, reset and the peer's GOAWAY. A connection error (RFC 9113 section 5.4.1) sends
GOAWAY with its code and closes; a stream error resets that stream alone.

Receiving, a stream's window is large (``STREAM_WINDOW``), so a request of gRPC's usual size
needs no WINDOW_UPDATE of its own; the connection's window is topped up once half is used.
Sending, data beyond what the peer's windows allow waits in its stream, in order with the
headers behind it, until the peer's WINDOW_UPDATE.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
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

__all__ = ["CONNECTION_WINDOW", "STREAM_WINDOW", "Connection", "ProtocolError", "Stream"]

log = logging.getLogger(__name__)

STREAM_WINDOW = 4 * 2**20
"""What the peer may send on one stream before we say we consumed it."""
CONNECTION_WINDOW = 16 * 2**20
"""What the peer may send on the whole connection before we say we consumed it."""
MAX_HEADER_LIST_SIZE = 64 * 1024
"""Largest decoded header list accepted (names, values and 32 bytes an entry)."""
RECEIVE_FRAME_SIZE = 1 * 2**20
"""Largest frame the peer may send us; fewer, larger DATA frames cost less to parse."""

# Plain ints on the hot path: an IntFlag's ``&`` builds a new enum member every time.
_END_STREAM = int(Flag.END_STREAM)
_END_HEADERS = int(Flag.END_HEADERS)
_PADDED = int(Flag.PADDED)
_PRIORITY = int(Flag.PRIORITY)
_ACK = int(Flag.ACK)
_DATA, _HEADERS, _CONTINUATION = int(Type.DATA), int(Type.HEADERS), int(Type.CONTINUATION)


class ProtocolError(Exception):
    """A connection error: the peer broke HTTP/2; answered with GOAWAY and closing."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """One stream's send side: its window and what waits for it."""

    __slots__ = ("id", "pending", "received", "window")

    def __init__(self, stream_id: int, window: int) -> None:
        self.id = stream_id
        self.window = window
        self.received = 0
        """DATA bytes taken since this stream's last WINDOW_UPDATE."""
        self.pending: deque[tuple[bool, bytes | memoryview, bool]] = deque()
        """(is headers, bytes, end of stream), in the order they must go out."""


class Connection(asyncio.Protocol):
    """The framing, settings and flow control both ends share; subclasses handle streams."""

    client: bool = False

    def __init__(self, *, max_concurrent_streams: int | None = None) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._awaiting_preface = not self.client
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_LIST_SIZE)
        self._decoded: dict[bytes, list[tuple[str, str]]] = {}
        self._streams: dict[int, Stream] = {}
        self._blocked: dict[int, Stream] = {}
        self._block: tuple[int, int, list[bytes]] | None = None  # a header block awaiting CONTINUATION
        self._send_window = DEFAULT_WINDOW
        self._received = 0  # connection DATA bytes taken since our last WINDOW_UPDATE
        self._peer_frame_size = DEFAULT_FRAME_SIZE
        self._peer_initial_window = DEFAULT_WINDOW
        self._peer_max_streams: int | None = None
        self._local_settings: dict[Setting, int] = {
            Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            Setting.MAX_FRAME_SIZE: RECEIVE_FRAME_SIZE,
            Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
        }
        if self.client:
            self._local_settings[Setting.ENABLE_PUSH] = 0
        if max_concurrent_streams is not None:
            self._local_settings[Setting.MAX_CONCURRENT_STREAMS] = max_concurrent_streams
        self._goaway_sent = False
        self.closed = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        start = PREFACE if self.client else b""
        transport.write(
            start
            + settings(self._local_settings)
            + window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        self._on_closed(exc)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        try:
            consumed = self._frames(buffer)
        except ProtocolError as exc:
            self._fail(exc.code, str(exc))
            return
        except hpack.HeaderError as exc:
            self._fail(ErrorCode.COMPRESSION_ERROR, f"undecodable header block: {exc}")
            return
        del buffer[:consumed]

    # what subclasses implement

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        raise NotImplementedError

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def _on_reset(self, stream_id: int, code: int) -> None:
        raise NotImplementedError

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        raise NotImplementedError

    def _on_closed(self, exc: Exception | None) -> None:
        raise NotImplementedError

    def _on_settings(self) -> None:
        """The peer's settings changed (a client may now open more streams)."""

    # receiving

    def _frames(self, buffer: bytearray) -> int:
        """Handle every whole frame in ``buffer``; the bytes consumed."""
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
        try:
            while end - pos >= 9:
                high, low, kind, flags, stream_id = HEADER.unpack_from(buffer, pos)
                length = (high << 16) | low
                if length > RECEIVE_FRAME_SIZE:
                    raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                start = pos + 9
                if end - start < length:
                    break
                pos = start + length
                stream_id &= 0x7FFFFFFF
                if self._block is not None and kind != _CONTINUATION:
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a header block interrupted by another frame")
                if kind == _DATA:
                    self._data(stream_id, flags, view[start:pos])
                elif kind == _HEADERS:
                    self._headers(stream_id, flags, view[start:pos])
                elif kind == _CONTINUATION:
                    self._continuation(stream_id, flags, view[start:pos])
                elif kind == Type.WINDOW_UPDATE:
                    self._window_update(stream_id, view[start:pos])
                elif kind == Type.SETTINGS:
                    self._settings(stream_id, flags, view[start:pos])
                elif kind == Type.PING:
                    if stream_id or length != 8:
                        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a malformed PING")
                    if not flags & _ACK:
                        self._write(frame(Type.PING, _ACK, 0, view[start:pos]))
                elif kind == Type.RST_STREAM:
                    if not stream_id or length != 4:
                        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a malformed RST_STREAM")
                    self._forget(stream_id)
                    self._on_reset(stream_id, read_u32(view[start:pos]))
                elif kind == Type.GOAWAY:
                    if stream_id or length < 8:
                        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a malformed GOAWAY")
                    payload = view[start:pos]
                    self._on_goaway(read_u32(payload), read_u32(payload, 4), bytes(payload[8:]))
                elif kind == Type.PUSH_PROMISE:
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE, though push is disabled")
                elif kind == Type.PRIORITY:
                    if length != 5:
                        raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a malformed PRIORITY")
                # any other type is an extension, ignored (RFC 9113 section 4.1)
                if self.closed:
                    break
        finally:
            view.release()
        return pos

    def _data(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        self._received += size
        if self._received >= CONNECTION_WINDOW // 2:
            self._write(window_update(0, self._received))
            self._received = 0
        if flags & _PADDED:
            payload = _unpad(payload)
        stream = self._streams.get(stream_id)
        if stream is not None and not flags & _END_STREAM:
            stream.received += size
            if stream.received >= STREAM_WINDOW // 2:
                self._write(window_update(stream_id, stream.received))
                stream.received = 0
        self._on_data(stream_id, bytes(payload), bool(flags & _END_STREAM))

    def _headers(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if not stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & _PADDED:
            payload = _unpad(payload)
        if flags & _PRIORITY:
            if len(payload) < 5:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            payload = payload[5:]
        if flags & _END_HEADERS:
            self._on_headers(stream_id, self._decode(bytes(payload)), bool(flags & _END_STREAM))
        else:
            self._block = (stream_id, flags, [bytes(payload)])

    def _continuation(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if self._block is None or self._block[0] != stream_id:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        _, first_flags, parts = self._block
        parts.append(bytes(payload))
        if sum(map(len, parts)) > MAX_HEADER_LIST_SIZE * 2:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header block beyond any allowed size")
        if flags & _END_HEADERS:
            self._block = None
            self._on_headers(stream_id, self._decode(b"".join(parts)), bool(first_flags & _END_STREAM))

    def _decode(self, block: bytes) -> list[tuple[str, str]]:
        """The headers of a block (a list the caller must not change).

        A block made only of one-byte indexed fields (every byte 0x80-0xFE) reads the peer's
        table without changing it, so while nothing else was decoded since, the same bytes
        mean the same headers: such blocks, the steady state of a peer's repeated calls, are
        remembered instead of decoded again (~14 us each through hpack). Any other block may
        change the table and forgets them all.
        """
        known = self._decoded.get(block)
        if known is not None:
            return known
        # hpack gives (str, str) tuples unless asked for raw bytes.
        headers = cast(list[tuple[str, str]], self._decoder.decode(block))
        if block and min(block) >= 0x80 and 0xFF not in block:
            if len(self._decoded) >= 64:
                self._decoded.clear()
            self._decoded[block] = headers
        elif self._decoded:
            self._decoded.clear()
        return headers

    def _window_update(self, stream_id: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = read_u32(payload)
        if not stream_id:
            if not increment:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > MAX_WINDOW:
                raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "the connection window beyond 2^31-1")
            for blocked in list(self._blocked.values()):
                self._flush(blocked)
            return
        stream = self._streams.get(stream_id)
        if stream is None:
            return  # a stream closed here since; its window no longer matters
        if not increment or stream.window + increment > MAX_WINDOW:
            code = ErrorCode.PROTOCOL_ERROR if not increment else ErrorCode.FLOW_CONTROL_ERROR
            self.reset(stream_id, code)
            self._on_reset(stream_id, code)  # the stream's side hears the code the peer was sent
            return
        stream.window += increment
        if stream.pending:
            self._flush(stream)

    def _settings(self, stream_id: int, flags: int, payload: memoryview) -> None:
        if stream_id or len(payload) % 6:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a malformed SETTINGS")
        if flags & _ACK:
            return
        for key, value in read_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE beyond 2^31-1")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for stream in self._streams.values():
                    stream.window += delta
            elif key == Setting.MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE:
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_MAX_FRAME_SIZE out of range")
                self._peer_frame_size = value
            elif key == Setting.MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "SETTINGS_ENABLE_PUSH neither 0 nor 1")
        self._write(frame(Type.SETTINGS, Flag.ACK, 0))
        for blocked in list(self._blocked.values()):
            self._flush(blocked)
        self._on_settings()

    # sending

    def _open(self, stream_id: int) -> Stream:
        stream = self._streams[stream_id] = Stream(stream_id, self._peer_initial_window)
        return stream

    def _forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)
        self._blocked.pop(stream_id, None)

    def send(self, stream_id: int, headers: bytes | None, data: bytes | memoryview | None = None,
             trailers: bytes | None = None, *, end_stream: bool = True) -> None:
        """Queue a header block, data and a trailer block on an open stream, in that order, and
        write what the windows allow. ``end_stream`` ends the stream with the last part."""
        stream = self._streams.get(stream_id)
        if stream is None or self._transport is None:
            return  # reset or closed meanwhile: nothing to say any more
        parts: list[tuple[bool, bytes | memoryview]] = [(True, block) for block in (headers,) if block is not None]
        if data is not None:
            parts.append((False, data))
        if trailers is not None:
            parts.append((True, trailers))
        for index, (is_headers, payload) in enumerate(parts):
            stream.pending.append((is_headers, payload, end_stream and index == len(parts) - 1))
        self._flush(stream)

    def _flush(self, stream: Stream) -> None:
        out: list[bytes] = []
        pending = stream.pending
        frame_size = self._peer_frame_size
        sid = stream.id
        ended = False
        while pending:
            is_headers, payload, end = pending[0]
            if is_headers:
                out.append(self._header_frames(sid, payload, end))
                pending.popleft()
                ended = end
                continue
            size = len(payload)
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
            self._blocked[sid] = stream
        else:
            self._blocked.pop(sid, None)
        if out:
            self._write(b"".join(out))
        if ended:
            self._local_end(sid)

    def _local_end(self, stream_id: int) -> None:
        """Our side of the stream has ended (its END_STREAM is written)."""

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
        """Reset one stream (a stream error); what waited for it is dropped."""
        self._forget(stream_id)
        self._write(rst_stream(stream_id, code))

    def goaway(self, last_stream_id: int, code: ErrorCode = ErrorCode.NO_ERROR, debug: str = "") -> None:
        """Tell the peer no stream above ``last_stream_id`` will be handled."""
        self._goaway_sent = True
        self._write(goaway(last_stream_id, code, debug.encode("utf-8", "replace")[:256]))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _fail(self, code: ErrorCode, message: str) -> None:
        """A connection error: GOAWAY with ``code``, then close."""
        log.debug("HTTP/2 connection error %s: %s", code.name, message)
        self._write(goaway(self._last_peer_stream(), code, message.encode("utf-8", "replace")[:256]))
        self.closed = True
        self.close()

    def _last_peer_stream(self) -> int:
        return 0


def _unpad(payload: memoryview) -> memoryview:
    if not payload:
        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]
