"""One HTTP/2 connection on asyncio: the protocol core (:mod:`.core`) behind a thin shell that
owns the socket, the timers and write backpressure.

The shell holds its core (:attr:`Connection.h2`), hears it through the :class:`~.events.Events`
it implements, and drives it only through the core's public methods and attributes. It hands
the core each read and writes what the core owes. It never lets the peer
make it hold more than it takes back: when the transport's buffer passes ``max_output_buffer``
(asyncio's ``pause_writing``) reading from the peer stops and stream answers wait in their
streams until ``resume_writing``; a peer that leaves our writes unread for ``write_timeout``,
or leaves an answer waiting on a zero flow-control window as long, is closed. One timer per
connection ticks the rest: ``max_connection_idle``, ``max_connection_age`` (GOAWAY, then the
grace), and keepalive (a PING after ``keepalive_time`` of silence, closed when its ACK takes
longer than ``keepalive_timeout``). Calls' deadlines (``grpc-timeout``) share one more timer,
armed for the earliest only (:meth:`Connection._arm_deadline`): a timer created and cancelled
per call (``asyncio.timeout``) cost about 5 us of CPU, a tenth of a call's own work.

Reads go into a buffer the connection's owner (its server or channel) keeps for all of its
connections (asyncio's ``BufferedProtocol``), and the core gets an exact-size copy of what
arrived. asyncio's plain ``Protocol`` instead allocates 256 KiB for every read and shrinks it:
above glibc's mmap threshold, that is an mmap, an mremap and an munmap per read, which cost a
gRPC client about a fifth of its CPU a call (``bench/h2_hotpath.py``, strace). Sharing is
safe because asyncio fills the buffer and reports it in one step (``get_buffer``, then
``buffer_updated``, on the loop's thread), and the copy is taken in that step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time

from .core import Core
from .errors import ProtocolError
from .frames import ErrorCode
from .limits import Limits

__all__ = ["READ_SIZE", "Connection"]

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024
"""Bytes a read may take at most: asyncio's own ``max_size`` for a socket read."""

LINGER = 1.0
"""Seconds a connection closed for an error still reads (and drops) the peer's bytes."""


class Connection(asyncio.BufferedProtocol):
    """The core on an asyncio transport; subclasses handle streams (the ``on_*`` events of
    :class:`~.events.Events`) and may react to the timer (``_on_tick``) and to limits hit
    (:meth:`on_limit`)."""

    client = False
    """Which end this connection is."""

    _loop: asyncio.AbstractEventLoop
    """The running loop, kept at :meth:`connection_made`: ``asyncio.get_running_loop()``
    costs a ``getpid`` system call, which a call's task and timer need not pay each time."""

    def __init__(self, *, read_buffer: bytearray, limits: Limits | None = None) -> None:
        self._read_view = memoryview(read_buffer)
        """A view, not the bytearray: asyncio's TLS reads fill ``buf[offset:]``, which of a
        bytearray would be a copy."""
        self.h2 = Core(self, client=self.client, limits=limits, clock=time.monotonic)
        """The protocol core."""
        self.limits = self.h2.limits
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
        self._loop = asyncio.get_running_loop()
        self._transport = transport
        high = self.limits.max_output_buffer
        transport.set_write_buffer_limits(high=high, low=high // 4)
        self.h2.initiate()
        self.on_output()
        self._timer = self._loop.call_later(self._tick, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.h2.close()
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._on_closed(exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._read_view[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self._last_read = time.monotonic()
        h2 = self.h2
        try:
            h2.receive(data)
            if h2.input_held:
                self._pump_input()
        except Exception as exc:  # a bug, not the peer's fault: close this connection, never the loop
            log.error("HTTP/2 connection from %s failed on its input: %r", self.peer, exc, exc_info=True)
            h2.fail(ProtocolError(ErrorCode.INTERNAL_ERROR, "internal error"))

    def _pump_input(self) -> None:
        """Parse frames held back for output room while the transport has room (a loop, not
        recursion: a fast reader may drain many rounds of answers)."""
        h2 = self.h2
        while h2.input_held and not h2.send_paused and not h2.closed:
            h2.resume_input()

    def pause_writing(self) -> None:
        self.h2.send_paused = True
        self._write_paused_at = time.monotonic()
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self.h2.send_paused = False
        self._write_paused_at = None
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()
        self.h2.flush_all()
        self._pump_input()

    def _on_closed(self, exc: Exception | None) -> None:
        raise NotImplementedError

    # the core's events (subclasses handle the streams')

    def on_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool) -> None:
        raise NotImplementedError

    def on_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def on_reset(self, stream_id: int, code: int) -> None:
        raise NotImplementedError

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        raise NotImplementedError

    def on_settings(self) -> None:
        """The peer's settings changed."""

    def on_headers_too_large(self, stream_id: int, size: int, end_stream: bool) -> None:
        """By default the stream is refused."""
        self.h2.reset(stream_id, ErrorCode.REFUSED_STREAM)

    def on_local_end(self, stream_id: int) -> None:
        """Our side of a stream ended."""

    def on_output(self) -> None:
        """Write what the core owes (the core's event, and what the shell calls itself before
        a close: one method, twice a call)."""
        transport = self._transport
        if transport is None:
            return
        h2 = self.h2
        data = h2.data_to_send()
        if data and not transport.is_closing():
            transport.write(data)
        # answers owed start from 0 once the peer took all (nothing to reset while none is owed)
        if h2.answers_owed and not transport.get_write_buffer_size():
            h2.output_drained()

    def on_terminate(self) -> None:
        error = self.h2.error
        if error is not None:
            if error.limit is not None:
                self.on_limit(error.limit, f"{error}; connection closed (GOAWAY {error.code.name})")
            else:
                log.debug("HTTP/2 connection error from %s, %s: %s", self.peer, error.code.name, error)
        transport = self._transport
        if transport is None:
            return
        self.on_output()
        if not transport.can_write_eof() or transport.is_closing():
            self.close()
            return
        # Lingering close: closing with the peer's bytes unread would make the kernel answer
        # with a TCP reset, which can overtake the GOAWAY. Shut our side, read and drop what
        # still comes (the core is closed) for a moment, then close.
        transport.write_eof()
        transport.resume_reading()
        asyncio.get_running_loop().call_later(LINGER, self.abort)

    def on_limit(self, limit: str, detail: str) -> None:
        """A peer hit ``limit``: subclasses log it (rate-limited); this one at DEBUG."""
        log.debug("HTTP/2 peer %s hit %s: %s", self.peer, limit, detail)

    def close(self) -> None:
        """Close once what is owed is written (a close called from a hook comes before the
        core's output is pushed)."""
        if self._transport is not None:
            self.on_output()
            self._transport.close()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

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
            self.on_limit("write_timeout", f"left {self._transport_backlog()} bytes unread for "
                                          f"{limits.write_timeout:g} s; connection aborted")
            self.abort()
            return
        h2 = self.h2
        if h2.blocked_since is not None and not h2.send_paused and limits.write_timeout > 0 \
                and now - h2.blocked_since > limits.write_timeout:
            h2.fail(ProtocolError(ErrorCode.ENHANCE_YOUR_CALM,
                                     f"answers held by a closed flow-control window for {limits.write_timeout:g} s",
                                     limit="write_timeout"))
            return
        if self._ping_sent_at is not None and limits.keepalive_timeout > 0 \
                and now - self._ping_sent_at > limits.keepalive_timeout and self._last_read <= self._ping_sent_at:
            self.on_limit("keepalive_timeout", f"no PING acknowledgement in {limits.keepalive_timeout:g} s; "
                                              "connection aborted")
            self.abort()
            return
        if limits.keepalive_time > 0 and self._ping_sent_at is None and now - self._last_read > limits.keepalive_time \
                and self._may_ping():
            self._ping_sent_at = now
            h2.ping(os.urandom(8))
        elif self._ping_sent_at is not None and self._last_read > self._ping_sent_at:
            self._ping_sent_at = None  # anything read proves the peer alive (as grpc-go counts it)
        idle_since = h2.idle_since
        if limits.max_connection_idle > 0 and idle_since is not None \
                and now - idle_since > limits.max_connection_idle:
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
        self.h2.goaway(self.h2.streams.last_peer, ErrorCode.NO_ERROR, f"max connection {why}")
        if not self.h2.open_streams:
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
            self._deadline_timer = self._loop.call_at(deadline, self._on_deadline_timer)

    def _on_deadline_timer(self) -> None:
        self._deadline_timer = None
        # the loop runs a timer up to its clock's resolution early: what it was armed for is due
        earliest = self._expire(max(asyncio.get_running_loop().time(), self._deadline_at))
        if earliest is not None:
            self._arm_deadline(earliest)

    def _expire(self, now: float) -> float | None:
        """End the calls whose deadline is ``now`` or earlier; the earliest deadline left."""
        return None
