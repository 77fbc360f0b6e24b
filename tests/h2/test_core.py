"""The sans-IO core (gputally.h2.core) on generated frame sequences, no sockets, fixed time:
what it does does not depend on how the bytes were split, its stream accounting and limits
hold after every read, and it never answers with much more than it was sent."""

from __future__ import annotations

import struct

import hypothesis.strategies as st
from hypothesis import given, settings

from gputally.h2 import hpack as encoder
from gputally.h2.core import Core, StreamState
from gputally.h2.frames import PREFACE, ErrorCode, Flag, Setting, Type, frame
from gputally.h2.limits import Limits

REQUEST = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/a.B/C"), (":authority", "x"),
                          ("content-type", "application/grpc")])
LIMITS = Limits(max_concurrent_streams=4, max_queued_control_frames=50, reset_burst=20, reset_rate=1,
                max_continuation_frames=2, max_header_list_size=4096)


class Recorder(Core):
    """A server core that records its events and answers every request at once (half of them
    with a message the peer's window may hold back)."""

    def __init__(self) -> None:
        super().__init__(limits=LIMITS, clock=lambda: 100.0)
        self.events: list[tuple[object, ...]] = []

    def _on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        self.events.append(("headers", stream_id, tuple(headers), end_stream))
        if end_stream:
            self.send(stream_id, b"\x88", b"x" * (stream_id % 4) * 30_000, b"\x40\x01a\x01b")

    def _on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.events.append(("data", stream_id, data, end_stream))

    def _on_reset(self, stream_id: int, code: int) -> None:
        self.events.append(("reset", stream_id, code))

    def _on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.events.append(("goaway", last_stream_id, code))

    def _on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        self.events.append(("too large", stream_id))
        super()._on_headers_too_large(stream_id, size, end_stream)


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


PAYLOADS = st.sampled_from([
    b"", REQUEST, b"\x00\x00\x00\x00\x02hi", u32(0), u32(1), u32(65_535), u32(2**31 - 1), u32(3) + b"\x10",
    struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, 0), struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, 70_000),
    struct.pack(">HI", Setting.MAX_FRAME_SIZE, 20_000), b"12345678", b"\x00" * 5000, b"\xff\xff",
])
FRAMES = st.lists(
    st.builds(frame, st.sampled_from([*Type, 0xA]), st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x25]),
              st.sampled_from([0, 1, 3, 5, 7, 9, 2]), PAYLOADS),
    max_size=40,
)


def feed(wire: bytes, cuts: list[int]) -> Recorder:
    core = Recorder()
    core.initiate()
    core.data_to_send()
    bounds = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    for start, end in zip(bounds, bounds[1:], strict=False):
        core.receive(wire[start:end])
        check_invariants(core)
    return core


def check_invariants(core: Recorder) -> None:
    peer = [s for s in core._streams.values() if not s.local]
    assert core._active_peer == len(peer) <= LIMITS.max_concurrent_streams
    assert all(s.state in (StreamState.OPEN, StreamState.HALF_CLOSED_LOCAL, StreamState.HALF_CLOSED_REMOTE)
               for s in core._streams.values())
    assert set(core._blocked) <= set(core._streams)
    assert core._control_queued <= LIMITS.max_queued_control_frames
    assert len(core._closed_streams) <= core._closed_memory
    assert all(s.recv_window >= 0 for s in core._streams.values())
    assert core._recv_window >= 0


@settings(max_examples=400, deadline=None)
@given(FRAMES, st.lists(st.integers(0, 10**6), max_size=8))
def test_the_split_of_the_bytes_changes_nothing(frames: list[bytes], cuts: list[int]) -> None:
    wire = PREFACE + b"".join(frames)
    whole, split = feed(wire, []), feed(wire, cuts)
    assert whole.events == split.events
    assert whole.data_to_send() == split.data_to_send()
    assert (whole.closed, whole.error and whole.error.code) == (split.closed, split.error and split.error.code)


@settings(max_examples=300, deadline=None)
@given(FRAMES)
def test_control_answers_never_outgrow_what_the_peer_sent(frames: list[bytes]) -> None:
    """No amplification from the protocol itself: beyond the answers to requests (which the
    handler chose), what the core writes is at most about what it read."""
    core = Recorder()
    core.send = lambda *args, **kwargs: None  # type: ignore[method-assign]  # no handler answers
    wire = PREFACE + b"".join(frames)
    core.receive(wire)
    check_invariants(core)
    assert len(core.data_to_send()) <= 2 * len(wire) + 300  # a GOAWAY carries up to 256 bytes of debug


def test_streams_go_through_the_rfc_states() -> None:
    core = Recorder()
    core.receive(PREFACE + frame(Type.HEADERS, Flag.END_HEADERS, 1, REQUEST))
    assert core.stream_state(1) is StreamState.OPEN
    assert core.stream_state(3) is StreamState.IDLE
    core.receive(frame(Type.DATA, Flag.END_STREAM, 1, b"\x00\x00\x00\x00\x00"))
    assert core.stream_state(1) is StreamState.HALF_CLOSED_REMOTE
    core.send(1, b"\x88", None, end_stream=False)
    core.send(1, None, None, b"\x40\x01a\x01b")
    assert core.stream_state(1) is StreamState.CLOSED
    core.receive(frame(Type.DATA, 0, 1, b"x"))  # after both ends ended: a connection error
    assert core.error is not None and core.error.code == ErrorCode.STREAM_CLOSED


def test_the_concurrent_stream_limit_counts_streams_until_closed() -> None:
    core = Recorder()
    core.receive(PREFACE + frame(Type.SETTINGS, 0, 0, struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, 0)))
    for stream in range(1, 13, 2):  # answers wait on a zero window: the streams stay half-closed
        core.receive(frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, stream, REQUEST))
    assert core._active_peer == LIMITS.max_concurrent_streams
    assert b"".join(frame(Type.RST_STREAM, 0, s, u32(ErrorCode.REFUSED_STREAM)) for s in (9, 11)) in core.data_to_send()


def test_reset_rate_ends_the_connection() -> None:
    core = Recorder()
    core.receive(PREFACE)
    for stream in range(1, 2 * LIMITS.reset_burst + 6, 2):
        core.receive(frame(Type.HEADERS, Flag.END_HEADERS, stream, REQUEST) + frame(Type.RST_STREAM, 0, stream, u32(8)))
    assert core.error is not None and core.error.limit == "reset_rate"
