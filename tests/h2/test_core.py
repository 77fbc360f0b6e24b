"""The sans-IO core (gputally.h2.core) on generated frame sequences, no sockets, fixed time:
what it does does not depend on how the bytes were split, its stream accounting and limits
hold after every read, every stream moves only along the transition table
(gputally.h2.states), and it never answers with much more than it was sent."""

from __future__ import annotations

import struct

import hypothesis.strategies as st
from hypothesis import given, settings

from gputally.h2 import hpack as encoder
from gputally.h2.core import Core
from gputally.h2.frames import PREFACE, ErrorCode, Flag, Setting, Type, frame
from gputally.h2.limits import Limits
from gputally.h2.states import LIVE, StreamState, reachable

REQUEST = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", "/a.B/C"), (":authority", "x"),
                          ("content-type", "application/grpc")])
LIMITS = Limits(max_concurrent_streams=4, max_queued_control_frames=50, reset_burst=20, reset_rate=1,
                max_continuation_frames=2, max_header_list_size=4096)


class Recorder:
    """A server core's events recorded; every request is answered at once (half of them with
    a message the peer's window may hold back) unless ``answers`` is off."""

    def __init__(self, *, answers: bool = True) -> None:
        self.core = Core(self, client=False, limits=LIMITS, clock=lambda: 100.0)
        self.answers = answers
        self.events: list[tuple[object, ...]] = []
        self.states: dict[int, StreamState] = {}
        """Each stream's state when last looked at (:func:`check_invariants`)."""

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        self.events.append(("headers", stream_id, tuple(headers), end_stream))
        if end_stream and self.answers:
            self.core.send(stream_id, b"\x88", b"x" * (stream_id % 4) * 30_000, b"\x40\x01a\x01b")

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        self.events.append(("data", stream_id, data, end_stream))

    def on_reset(self, stream_id: int, code: int) -> None:
        self.events.append(("reset", stream_id, code))

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.events.append(("goaway", last_stream_id, code))

    def on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        self.events.append(("too large", stream_id))
        self.core.reset(stream_id, ErrorCode.REFUSED_STREAM)

    def on_settings(self) -> None:
        pass

    def on_local_end(self, stream_id: int) -> None:
        pass

    def on_output(self) -> None:
        pass

    def on_terminate(self) -> None:
        pass

    def on_limit(self, limit: str, detail: str) -> None:
        self.events.append(("limit", limit))


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


STREAM_IDS = range(0, 12)
"""Every stream id FRAMES uses, and a few it does not."""


def feed(wire: bytes, cuts: list[int]) -> Recorder:
    recorder = Recorder()
    recorder.core.initiate()
    recorder.core.data_to_send()
    check_invariants(recorder)
    bounds = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    for start, end in zip(bounds, bounds[1:], strict=False):
        recorder.core.receive(wire[start:end])
        check_invariants(recorder)
    return recorder


def check_invariants(recorder: Recorder) -> None:
    """What must hold after every step: the stream accounting, the limits, and the transition
    table's invariant: each stream's state is one the table reaches from its state at the
    last check (a stream never goes back, never skips to a state the table cannot reach, and
    a live one is never IDLE or CLOSED)."""
    core = recorder.core
    table = core.streams
    peer = [s for s in table.live.values() if not s.local]
    assert table.active_peer == len(peer) <= LIMITS.max_concurrent_streams
    assert all(s.state in LIVE for s in table.live.values())
    assert all(isinstance(s.state, StreamState) for s in table.live.values())  # the enum, never a bare int
    assert set(core._sender.blocked) <= set(table.live)
    assert core.answers_owed <= LIMITS.max_queued_control_frames
    assert len(table.closed) <= table.memory
    assert not set(table.closed) & set(table.live)
    assert all(s.recv_window >= 0 for s in table.live.values())
    assert core._reader.recv_window >= 0
    for stream_id in STREAM_IDS:
        now = core.stream_state(stream_id)
        before = recorder.states.get(stream_id, StreamState.IDLE)
        assert now in reachable(before), f"stream {stream_id} went from {before.name} to {now.name}"
        recorder.states[stream_id] = now


@settings(max_examples=400, deadline=None)
@given(FRAMES, st.lists(st.integers(0, 10**6), max_size=8))
def test_the_split_of_the_bytes_changes_nothing(frames: list[bytes], cuts: list[int]) -> None:
    wire = PREFACE + b"".join(frames)
    whole, split = feed(wire, []), feed(wire, cuts)
    assert whole.events == split.events
    assert whole.core.data_to_send() == split.core.data_to_send()
    assert (whole.core.closed, whole.core.error and whole.core.error.code) == (
        split.core.closed, split.core.error and split.core.error.code)
    assert whole.states == split.states


@settings(max_examples=300, deadline=None)
@given(FRAMES)
def test_control_answers_never_outgrow_what_the_peer_sent(frames: list[bytes]) -> None:
    """No amplification from the protocol itself: beyond the answers to requests (which the
    handler chose), what the core writes is at most about what it read."""
    recorder = Recorder(answers=False)
    wire = PREFACE + b"".join(frames)
    recorder.core.receive(wire)
    check_invariants(recorder)
    assert len(recorder.core.data_to_send()) <= 2 * len(wire) + 300  # a GOAWAY carries up to 256 bytes of debug


def test_streams_go_through_the_rfc_states() -> None:
    core = Recorder().core
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
    core = Recorder().core
    core.receive(PREFACE + frame(Type.SETTINGS, 0, 0, struct.pack(">HI", Setting.INITIAL_WINDOW_SIZE, 0)))
    for stream in range(1, 13, 2):  # answers wait on a zero window: the streams stay half-closed
        core.receive(frame(Type.HEADERS, Flag.END_HEADERS | Flag.END_STREAM, stream, REQUEST))
    assert core.streams.active_peer == LIMITS.max_concurrent_streams
    assert b"".join(frame(Type.RST_STREAM, 0, s, u32(ErrorCode.REFUSED_STREAM)) for s in (9, 11)) in core.data_to_send()


def test_reset_rate_ends_the_connection() -> None:
    core = Recorder().core
    core.receive(PREFACE)
    for stream in range(1, 2 * LIMITS.reset_burst + 6, 2):
        core.receive(frame(Type.HEADERS, Flag.END_HEADERS, stream, REQUEST) + frame(Type.RST_STREAM, 0, stream, u32(8)))
    assert core.error is not None and core.error.limit == "reset_rate"
