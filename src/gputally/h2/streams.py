"""The streams of one connection: the live ones, and for a while how closed ones closed.

A stream is in :attr:`StreamTable.live` from its first header block (or our request) until it
closes, and its state moves only by the transition table (:mod:`.states`). A closed stream
leaves the table; how it closed (:class:`~.states.Closure`) is kept for the last
``4 * max_concurrent_streams + 64`` of them, oldest forgotten first, so that a late frame on it
is handled as RFC 9113 section 5.1 says. Stream ids only grow, so an id above the highest
either end used is idle without being stored.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from .states import AFTER, Closure, StreamInput, StreamState, advance, refuse

__all__ = ["Stream", "StreamTable"]

_OPENED_LOCAL = advance(StreamState.IDLE, StreamInput.SEND_HEADERS)
_OPENED_REMOTE = advance(StreamState.IDLE, StreamInput.RECV_HEADERS)


class Stream:
    """One live stream: its state, both directions' windows and what waits to be sent."""

    __slots__ = ("expected", "headers_seen", "id", "length", "local", "opened", "pending", "received",
                 "recv_window", "state", "window")

    def __init__(self, stream_id: int, window: int, recv_window: int, *, local: bool, opened: float) -> None:
        self.id = stream_id
        self.state = _OPENED_LOCAL if local else _OPENED_REMOTE
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

    def advance(self, event: StreamInput) -> StreamState:
        """Move by the transition table (:func:`~.states.advance`); the new state. The core's
        hot paths do the same with their input's row of :data:`~.states.AFTER`."""
        state = AFTER[event][self.state]
        if state is None:
            refuse(self.state, event)
        self.state = state
        return state


class StreamTable:
    """Live streams by id, the recently closed ones' :class:`~.states.Closure`, and the counts
    the limits need."""

    __slots__ = ("_clock", "_memory", "active_peer", "closed", "idle_since", "last_local", "last_peer", "live",
                 "peer_parity")

    def __init__(self, *, client: bool, max_concurrent_streams: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        self.peer_parity = 0 if client else 1
        """``stream_id & 1`` of the peer's streams (odd ones a client's)."""
        self.live: dict[int, Stream] = {}
        """Streams not closed, either end's (read it; change it through this table's methods)."""
        # oldest first (popitem(last=False) is O(1), where deleting a dict's first key leaves a
        # hole each next iter() must skip)
        self.closed: OrderedDict[int, Closure] = OrderedDict()
        self._memory = 4 * max_concurrent_streams + 64
        self.active_peer = 0
        """Peer-initiated streams not closed."""
        self.last_peer = 0
        """The highest stream id the peer opened (or tried to)."""
        self.last_local = 0
        """The highest stream id we opened."""
        self.idle_since: float | None = clock()
        """Since when no stream is live (None while one is)."""

    @property
    def memory(self) -> int:
        """How many closed streams' closures are remembered at most."""
        return self._memory

    def is_idle(self, stream_id: int) -> bool:
        """Never opened by either end (RFC 9113 section 5.1.1: ids only grow)."""
        if (stream_id & 1) == self.peer_parity:
            return stream_id > self.last_peer
        return stream_id > self.last_local

    def open(self, stream_id: int, window: int, recv_window: int, *, local: bool) -> Stream:
        stream = self.live[stream_id] = Stream(stream_id, window, recv_window, local=local, opened=self._clock())
        if local:
            if stream_id > self.last_local:
                self.last_local = stream_id
        else:
            self.active_peer += 1
        self.idle_since = None
        return stream

    def close(self, stream: Stream, event: StreamInput, how: Closure) -> bool:
        """``stream`` closes by ``event`` (its END_STREAM or a reset); False when it had left the
        table already."""
        stream_id = stream.id
        live = self.live
        if live.pop(stream_id, None) is None:
            return False
        state = AFTER[event][stream.state]  # stream.advance and remember, inlined: once a call
        if state is None:
            refuse(stream.state, event)
        stream.state = state
        if not stream.local:
            self.active_peer -= 1
        closed = self.closed
        closed[stream_id] = how
        if len(closed) > self._memory:
            closed.popitem(last=False)
        if not live:
            self.idle_since = self._clock()
        return True

    def remember(self, stream_id: int, how: Closure) -> None:
        """How a stream that is not live closed (also one refused before it opened)."""
        closed = self.closed
        closed[stream_id] = how
        if len(closed) > self._memory:
            closed.popitem(last=False)

    def state(self, stream_id: int) -> StreamState:
        stream = self.live.get(stream_id)
        if stream is not None:
            return stream.state
        return StreamState.IDLE if self.is_idle(stream_id) else StreamState.CLOSED
