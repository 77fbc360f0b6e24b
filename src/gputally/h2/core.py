"""The HTTP/2 protocol of one connection, either end, without I/O: bytes in, events out.

:meth:`Core.receive` takes the peer's bytes; each stream's headers, data and reset and the
peer's GOAWAY come out as calls of the :class:`~.events.Events` it was given; what to send
accumulates until :meth:`Core.data_to_send` takes it. Nothing here owns a socket, a timer or
a task, so the machine runs (and is tested) on plain bytes.

The parts, one job each: the stream table and each stream's state, moved only by the
transition table (:mod:`.streams`, :mod:`.states`); header blocks put together and bounded
(:mod:`.blocks`), decoded and remembered (:class:`~.hpack.Memo`), checked as requests
(:mod:`.validation`); the send side's windows, settings and output (:mod:`.send`). This
module reads frames and routes them. Every limit of :class:`~.limits.Limits` is counted where
it is decoded: a header block's bytes and frames as each CONTINUATION arrives, the decoded
list as it is decoded, a stream's and the connection's receive windows at each DATA frame,
resets in a token bucket, answers owed in a counter that only the output being drained
resets. No frame costs more than its length (plus a walk of at most
``max_concurrent_streams`` streams when the peer's initial window changes or the connection
window reopens).

Receiving, a stream's window is large (``STREAM_WINDOW``), so a request of gRPC's usual size
needs no WINDOW_UPDATE of its own; the connection's window is topped up once half is used.
Once the output owed passes ``max_output_buffer`` parsing stops until it is drained
(:meth:`Core.resume_input`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from . import hpack
from .blocks import HeaderBlocks
from .errors import ProtocolError, StreamError
from .events import Events
from .frames import DEFAULT_WINDOW, HEADER, PREFACE, ErrorCode, Setting, Type, frame, goaway, rst_stream, settings, window_update
from .limits import Limits
from .receive import CONNECTION_WINDOW, STREAM_WINDOW, Reader
from .send import Sender
from .states import AFTER, Closure, StreamInput, StreamState, refuse
from .streams import Stream, StreamTable

__all__ = ["CONNECTION_WINDOW", "RECEIVE_FRAME_SIZE", "STREAM_WINDOW", "Core", "ProtocolError", "StreamError"]

RECEIVE_FRAME_SIZE = 1 * 2**20
"""Largest frame the peer may send us; fewer, larger DATA frames cost less to parse."""

_ADDRESS = re.compile(r" (?:from |at )?<[^>]* at 0x[0-9a-f]+>")
_DATA, _HEADERS, _CONTINUATION = int(Type.DATA), int(Type.HEADERS), int(Type.CONTINUATION)
_HALF_LOCAL, _HALF_REMOTE = StreamState.HALF_CLOSED_LOCAL, StreamState.HALF_CLOSED_REMOTE
_SEND_END, _SEND_RST = StreamInput.SEND_END_STREAM, StreamInput.SEND_RST_STREAM
_ENDED, _RESET_SENT = Closure.ENDED, Closure.RESET_SENT
_ON_SEND_END = AFTER[_SEND_END]  # the transition table's row for our END_STREAM (:data:`~.states.AFTER`)


class Core:
    """One HTTP/2 connection's protocol state; ``events`` hears what the peer's frames mean."""

    def __init__(self, events: Events, *, client: bool, limits: Limits | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits = limits or Limits()
        self.client = client
        self._clock = clock
        self._buffer = bytearray()
        self.awaiting_preface = not client
        """A server waits for the client's connection preface."""
        self.memo = hpack.Memo(max_header_list_size=2 * limits.max_header_list_size)
        """The peer's header blocks decoded, the repeated ones remembered."""
        self.streams = StreamTable(client=client, max_concurrent_streams=limits.max_concurrent_streams, clock=clock)
        """Live streams and how recent ones closed (read it; the core changes it)."""
        self._live = self.streams.live
        self.answers_owed = 0
        """Answers to the peer's frames queued since the output was last drained (read it; an
        attribute, not a property: the shell reads it at every write)."""
        self._max_answers = limits.max_queued_control_frames
        self._blocks = HeaderBlocks(limits)
        self._sender = Sender(limits, clock=clock, ended=self._sent_end, answer=self._answer)
        self._out = self._sender.out
        self._reader = Reader(events, client=client, limits=limits, clock=clock, streams=self.streams,
                              sender=self._sender, memo=self.memo, close=self._close, answer=self._answer)
        self._local_settings: dict[Setting, int] = {
            Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            Setting.MAX_FRAME_SIZE: RECEIVE_FRAME_SIZE,
            Setting.MAX_HEADER_LIST_SIZE: limits.max_header_list_size,
        }
        if client:
            self._local_settings[Setting.ENABLE_PUSH] = 0
        else:
            self._local_settings[Setting.MAX_CONCURRENT_STREAMS] = limits.max_concurrent_streams
        self.input_held = False
        """Parsing stopped with whole frames unread, because the output owed is full."""
        self.closed = False
        self.error: ProtocolError | None = None
        """The connection error that closed it, if one did."""
        self._on_local_end = events.on_local_end
        self._on_output = events.on_output
        self._on_terminate = events.on_terminate

    # what the shell reads

    @property
    def send_paused(self) -> bool:
        """The transport is full: stream output waits in its streams (set by the shell)."""
        return self._sender.send_paused

    @send_paused.setter
    def send_paused(self, paused: bool) -> None:
        self._sender.send_paused = paused

    @property
    def blocked_since(self) -> float | None:
        """Since when some stream's answer waits for the peer's window (or the transport)."""
        return self._sender.blocked_since

    @property
    def idle_since(self) -> float | None:
        """Since when no stream is open (None while one is)."""
        return self.streams.idle_since

    @property
    def peer_max_streams(self) -> int | None:
        """The peer's SETTINGS_MAX_CONCURRENT_STREAMS, once it said one."""
        return self._sender.max_streams

    @property
    def unread(self) -> int:
        """Bytes of the peer's kept for a frame not yet whole (or held with the input)."""
        return len(self._buffer)

    def held_bytes(self) -> int:
        """What the core holds for its peer: unread input, output owed, answers waiting."""
        waiting = sum(len(part) for s in self._live.values() for _, part, _ in s.pending)
        return len(self._buffer) + self._sender.out_size + waiting

    def unfinished(self, opened_before: float) -> list[int]:
        """The peer's streams, opened before ``opened_before``, whose request has not ended."""
        return [s.id for s in self._live.values()
                if not s.local and s.state is not _HALF_REMOTE and s.opened < opened_before]

    def stream_state(self, stream_id: int) -> StreamState:
        return self.streams.state(stream_id)

    @property
    def open_streams(self) -> int:
        """Streams not closed, either end's."""
        return len(self._live)

    # bytes in, bytes out

    def initiate(self) -> None:
        """Queue what this end sends first: a client's preface, both ends' SETTINGS and the
        connection window's first top-up."""
        self._sender.write((PREFACE if self.client else b"") + settings(self._local_settings)
                           + window_update(0, CONNECTION_WINDOW - DEFAULT_WINDOW))
        self._reader.recv_window = CONNECTION_WINDOW

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
        out = self._out  # the send side's list, read here: the shell asks at every write
        if not out:
            return b""
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        self._sender.out_size = 0
        return data

    def output_drained(self) -> None:
        """The peer took everything written: answers owed are counted from 0 again."""
        self.answers_owed = 0

    def _answer(self, data: bytes) -> None:
        """Queue an answer the peer's frame made us owe (ACK, reset, window update): counted."""
        self.answers_owed += 1
        if self.answers_owed > self._max_answers:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "more control frames owed than the peer reads",
                                limit="max_queued_control_frames")
        self._sender.write(data)

    def close(self) -> None:
        """The connection is gone: nothing more is read or written."""
        self.closed = self._sender.closed = True

    def _parse(self, data: bytes | None = None) -> None:
        """Handle the whole frames of the buffer, or of ``data`` when the buffer is empty."""
        buffer = self._buffer
        try:
            consumed = self._frames(buffer if data is None else data)
        except ProtocolError as exc:
            self.fail(exc)
            return
        except hpack.OversizedHeaderListError:
            self.fail(ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header list beyond twice the allowed size",
                                    limit="max_header_list_size"))
            return
        except hpack.HeaderError as exc:
            # hpack's message may name a buffer's address, which the peer need not see
            detail = _ADDRESS.sub("", str(exc))
            self.fail(ProtocolError(ErrorCode.COMPRESSION_ERROR, f"undecodable header block: {detail}"))
            return
        if data is None:
            try:
                del buffer[:consumed]
            except BufferError:  # a view of it still lives somewhere: start a new buffer instead
                self._buffer = bytearray(buffer[consumed:])
        elif consumed < len(data) and not self.closed:
            buffer += memoryview(data)[consumed:]
        if self._out or self.answers_owed:  # else the shell would find nothing to write or reset
            self._on_output()

    # receiving

    def _frames(self, buffer: bytes | bytearray) -> int:
        """Handle whole frames in ``buffer``; the bytes consumed."""
        pos = 0
        if self.awaiting_preface:
            if len(buffer) < len(PREFACE):
                if not PREFACE.startswith(bytes(buffer)):
                    raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                return 0
            if buffer[: len(PREFACE)] != PREFACE:
                raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            self.awaiting_preface = False
            pos = len(PREFACE)
        end = len(buffer)
        view = memoryview(buffer)
        out_limit = self.limits.max_output_buffer
        sender, blocks, reader = self._sender, self._blocks, self._reader
        try:
            while end - pos >= 9:
                if sender.out_size > out_limit:
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
                    if blocks.pending:
                        if kind != _CONTINUATION:
                            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a header block interrupted by another frame")
                        block = blocks.continuation(stream_id, flags, view[start:pos])
                        if block is not None:
                            reader.header_block(block)
                    elif kind == _DATA:
                        reader.data(stream_id, flags, view[start:pos])
                    elif kind == _HEADERS:
                        if not stream_id:
                            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
                        block = blocks.headers(stream_id, flags, view[start:pos])
                        if block is not None:
                            reader.header_block(block)
                    else:
                        reader.control(kind, stream_id, flags, view[start:pos])
                except StreamError as exc:
                    reader.stream_error(exc.stream_id, exc.code)
                if self.closed:
                    break
        finally:
            view.release()
        return pos

    # streams

    def _close(self, stream: Stream, event: StreamInput, how: Closure) -> None:
        """Take ``stream`` out of the table (by ``event``) and out of the send side's waiting list."""
        if self.streams.close(stream, event, how) and self._sender.blocked:
            self._sender.unblock(stream.id)

    def _sent_end(self, stream: Stream) -> None:
        """Our last frame on ``stream`` is written (once a call: :meth:`_close` and
        ``stream.advance`` inlined)."""
        if stream.state is _HALF_REMOTE:
            if self.streams.close(stream, _SEND_END, _ENDED) and self._sender.blocked:
                self._sender.unblock(stream.id)
        else:
            state = _ON_SEND_END[stream.state]
            if state is None:
                refuse(stream.state, _SEND_END)
            stream.state = state
        self._on_local_end(stream.id)

    def open(self, stream_id: int) -> None:
        """Open a stream of our own (a client's request)."""
        self.streams.open(stream_id, self._sender.initial_window, STREAM_WINDOW, local=True)

    def forget(self, stream_id: int) -> None:
        """Close a stream without a word to the peer (it ended, or we no longer care)."""
        stream = self._live.get(stream_id)
        if stream is not None and self.streams.close(stream, _SEND_RST, _ENDED) and self._sender.blocked:
            self._sender.unblock(stream_id)  # :meth:`_close`, inlined: a client forgets each call's stream

    # sending

    def send(self, stream_id: int, headers: bytes | None, data: bytes | memoryview | None = None,
             trailers: bytes | None = None, *, end_stream: bool = True) -> None:
        """Queue a header block, data and a trailer block on a stream we have not ended, in that
        order, and write what the windows allow. ``end_stream`` ends the stream with the last part."""
        stream = self._live.get(stream_id)
        if stream is None or stream.state is _HALF_LOCAL or self.closed:
            return  # reset or closed meanwhile: nothing to say any more
        pending = stream.pending
        if headers is not None:
            pending.append((True, headers, end_stream and data is None and trailers is None))
        if data is not None:
            pending.append((False, data, end_stream and trailers is None))
        if trailers is not None:
            pending.append((True, trailers, end_stream))
        self._sender.flush(stream)
        self._on_output()

    @property
    def has_blocked(self) -> bool:
        """Some stream's output waits for a window or the transport."""
        return bool(self._sender.blocked)

    def flush_all(self) -> None:
        """The transport takes data again: send what waited for it."""
        self._sender.flush_blocked(by_window=False)
        self._on_output()

    def reset(self, stream_id: int, code: ErrorCode) -> None:
        """Reset one stream (a stream error of ours); what waited for it is dropped."""
        stream = self._live.get(stream_id)
        if stream is not None:
            self._close(stream, _SEND_RST, _RESET_SENT)
        self._sender.write(rst_stream(stream_id, code))
        self._on_output()

    def ping(self, payload: bytes) -> None:
        self._sender.write(frame(Type.PING, 0, 0, payload))
        self._on_output()

    def goaway(self, last_stream_id: int, code: ErrorCode = ErrorCode.NO_ERROR, debug: str = "") -> None:
        """Tell the peer no stream above ``last_stream_id`` will be handled."""
        self._sender.write(goaway(last_stream_id, code, debug.encode("utf-8", "replace")[:256]))
        self._on_output()

    def fail(self, error: ProtocolError) -> None:
        """A connection error: GOAWAY with its code, then close."""
        if self.closed:
            return
        self.error = error
        self._buffer = bytearray()  # nothing the peer sent is read any more
        self._blocks.clear()
        self._sender.write(goaway(self.streams.last_peer, error.code, str(error).encode("utf-8", "replace")[:256]))
        self.close()
        self._on_terminate()
