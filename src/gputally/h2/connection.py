"""One HTTP/2 connection on asyncio: the protocol core (:mod:`.core`) behind a thin shell that
owns the socket, the timers and write backpressure.

The shell hands the core each read and writes what the core owes. It never lets the peer
make it hold more than it takes back: when the transport's buffer passes ``max_output_buffer``
(asyncio's ``pause_writing``) reading from the peer stops and stream answers wait in their
streams until ``resume_writing``; a peer that leaves our writes unread for ``write_timeout``,
or leaves an answer waiting on a zero flow-control window as long, is closed. One timer per
connection ticks the rest: ``max_connection_idle``, ``max_connection_age`` (GOAWAY, then the
grace), and keepalive (a PING after ``keepalive_time`` of silence, closed when its ACK takes
longer than ``keepalive_timeout``). Calls' deadlines (``grpc-timeout``) share one more timer,
armed for the earliest only (:meth:`Connection._arm_deadline`): a timer created and cancelled
per call (``asyncio.timeout``) cost about 5 us of CPU, a tenth of a call's own work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time

from .core import CONNECTION_WINDOW, RECEIVE_FRAME_SIZE, STREAM_WINDOW, Core, ProtocolError, Stream, StreamError
from .frames import ErrorCode
from .limits import Limits

__all__ = [
    "CONNECTION_WINDOW",
    "MAX_HEADER_LIST_SIZE",
    "RECEIVE_FRAME_SIZE",
    "STREAM_WINDOW",
    "Connection",
    "ProtocolError",
    "Stream",
    "StreamError",
]

log = logging.getLogger(__name__)

LINGER = 1.0
"""Seconds a connection closed for an error still reads (and drops) the peer's bytes."""
MAX_HEADER_LIST_SIZE = Limits().max_header_list_size
"""Largest decoded header list accepted by default (names, values and 32 bytes an entry)."""


class Connection(Core, asyncio.Protocol):
    """The core on an asyncio transport; subclasses handle streams (``_on_*``) and may react
    to the timer (``_on_tick``) and to limits hit (``_report``)."""

    def __init__(self, *, limits: Limits | None = None) -> None:
        super().__init__(limits=limits, clock=time.monotonic)
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0
        self._write_paused_at: float | None = None
        self._last_read = self._started = time.monotonic()
        self._ping_sent_at: float | None = None
        limits = self.limits
        self._age_deadline = 0.0
        if limits.max_connection_age > 0:  # jittered, so connections made together do not all go at once
            self._age_deadline = self._started + limits.max_connection_age * random.uniform(0.9, 1.1)
        self._draining_since: float | None = None
        timeouts = [t for t in (limits.write_timeout, limits.read_timeout, limits.max_connection_idle,
                                limits.max_connection_age, limits.keepalive_time, limits.keepalive_timeout) if t > 0]
        self._tick = min(max(min(timeouts, default=1.0) / 4, 0.05), 1.0)

    @property
    def peer(self) -> str:
        """The peer's address, for log lines."""
        if self._transport is None:
            return "?"
        name = self._transport.get_extra_info("peername")
        if isinstance(name, tuple) and len(name) >= 2:
            return f"{name[0]}:{name[1]}"
        return str(name or "a unix socket peer")

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        high = self.limits.max_output_buffer
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self.initiate()
        self._push()
        self._timer = asyncio.get_running_loop().call_later(self._tick, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._on_closed(exc)

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        try:
            self.receive(data)
            if self.input_held:
                self._pump_input()
        except Exception as exc:  # a bug, not the peer's fault: close this connection, never the loop
            log.error("HTTP/2 connection from %s failed on its input: %r", self.peer, exc, exc_info=True)
            self._fail(ProtocolError(ErrorCode.INTERNAL_ERROR, "internal error"))

    def _pump_input(self) -> None:
        """Parse frames held back for output room while the transport has room (a loop, not
        recursion: a fast reader may drain many rounds of answers)."""
        while self.input_held and not self.send_paused and not self.closed:
            self.resume_input()

    def pause_writing(self) -> None:
        self.send_paused = True
        self._write_paused_at = time.monotonic()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.send_paused = False
        self._write_paused_at = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        self.flush_all()
        self._pump_input()

    def _on_closed(self, exc: Exception | None) -> None:
        raise NotImplementedError

    # the core's output

    def _output_ready(self) -> None:
        self._push()

    def _push(self) -> None:
        transport = self._transport
        if transport is None:
            return
        if self._out:
            data = self.data_to_send()
            if not transport.is_closing():
                transport.write(data)
        # answers owed start from 0 once the peer took all (nothing to reset while none is owed)
        if self._control_queued and not transport.get_write_buffer_size():
            self.output_drained()

    def _terminate(self) -> None:
        error = self.error
        if error is not None:
            if error.limit is not None:
                self._report(error.limit, f"{error}; connection closed (GOAWAY {error.code.name})")
            else:
                log.debug("HTTP/2 connection error from %s, %s: %s", self.peer, error.code.name, error)
        transport = self._transport
        if transport is None:
            return
        self._push()
        if not transport.can_write_eof() or transport.is_closing():
            self.close()
            return
        # Lingering close: closing with the peer's bytes unread would make the kernel answer
        # with a TCP reset, which can overtake the GOAWAY. Shut our side, read and drop what
        # still comes (the core is closed) for a moment, then close.
        transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER, self.abort)

    def _report(self, limit: str, detail: str) -> None:
        """A peer hit ``limit``: subclasses log it (rate-limited); this one at DEBUG."""
        log.debug("HTTP/2 peer %s hit %s: %s", self.peer, limit, detail)

    def _limit_hit(self, limit: str, detail: str) -> None:
        self._report(limit, detail)

    def close(self) -> None:
        """Close once what is owed is written (a close called from a hook comes before the
        core's output is pushed)."""
        if self._transport is not None:
            self._push()
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def _last_peer_stream_id(self) -> int:
        return self._last_peer_stream

    # the timer

    def _on_timer(self) -> None:
        self._timer = None
        if self._transport is None or self._transport.is_closing():
            return
        try:
            self._check(time.monotonic())
        finally:
            if self._transport is not None and not self._transport.is_closing():
                self._timer = asyncio.get_running_loop().call_later(self._tick, self._on_timer)

    def _check(self, now: float) -> None:
        limits = self.limits
        if self._write_paused_at is not None and limits.write_timeout > 0 \
                and now - self._write_paused_at > limits.write_timeout:
            self._report("write_timeout", f"left {self._transport_backlog()} bytes unread for "
                                          f"{limits.write_timeout:g} s; connection aborted")
            self.abort()
            return
        if self.blocked_since is not None and not self.send_paused and limits.write_timeout > 0 \
                and now - self.blocked_since > limits.write_timeout:
            self._fail(ProtocolError(ErrorCode.ENHANCE_YOUR_CALM,
                                     f"answers held by a closed flow-control window for {limits.write_timeout:g} s",
                                     limit="write_timeout"))
            return
        if self._ping_sent_at is not None and limits.keepalive_timeout > 0 \
                and now - self._ping_sent_at > limits.keepalive_timeout and self._last_read <= self._ping_sent_at:
            self._report("keepalive_timeout", f"no PING acknowledgement in {limits.keepalive_timeout:g} s; "
                                              "connection aborted")
            self.abort()
            return
        if limits.keepalive_time > 0 and self._ping_sent_at is None and now - self._last_read > limits.keepalive_time \
                and self._may_ping():
            self._ping_sent_at = now
            self.ping(os.urandom(8))
        elif self._ping_sent_at is not None and self._last_read > self._ping_sent_at:
            self._ping_sent_at = None  # anything read proves the peer alive (as grpc-go counts it)
        if limits.max_connection_idle > 0 and self.idle_since is not None \
                and now - self.idle_since > limits.max_connection_idle:
            self._retire("idle")
        elif self._age_deadline and now > self._age_deadline:
            if self._draining_since is None:
                self._draining_since = now
                self._retire("age")
            elif limits.max_connection_age_grace > 0 and now - self._draining_since > limits.max_connection_age_grace:
                self.close()
        self._on_tick(now)

    def _transport_backlog(self) -> int:
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    def _may_ping(self) -> bool:
        """Whether a keepalive PING may go now (a client without calls may not, by default)."""
        return True

    def _retire(self, why: str) -> None:
        """``max_connection_idle`` or ``max_connection_age`` passed: stop taking streams."""
        self.goaway(self._last_peer_stream, ErrorCode.NO_ERROR, f"max connection {why}")
        if not self.open_streams:
            self.close()

    def _on_tick(self, now: float) -> None:
        """Once a tick, for subclasses' own timeouts."""

    # calls' deadlines

    def _arm_deadline(self, deadline: float) -> None:
        """A call must end by ``deadline`` (loop time): the deadline timer fires by then. Calls
        with the same timeout, one after another, arm it once per timeout, not once each."""
        timer = self._deadline_timer
        if timer is None or deadline < self._deadline_at:
            if timer is not None:
                timer.cancel()
            self._deadline_at = deadline
            self._deadline_timer = asyncio.get_running_loop().call_at(deadline, self._on_deadline_timer)

    def _on_deadline_timer(self) -> None:
        self._deadline_timer = None
        # the loop runs a timer up to its clock's resolution early: what it was armed for is due
        earliest = self._expire(max(asyncio.get_running_loop().time(), self._deadline_at))
        if earliest is not None:
            self._arm_deadline(earliest)

    def _expire(self, now: float) -> float | None:
        """End the calls whose deadline is ``now`` or earlier; the earliest deadline left."""
        return None
