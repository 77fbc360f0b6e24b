"""What one HTTP/2 connection (and one server process) may cost a peer's bytes: every bound the
protocol core and its asyncio adapter enforce, in one value.

The defaults are those of the stacks that met these attacks first: Go's ``x/net/http2`` (250
concurrent streams, 10,000 queued control frames), nghttp2 (RST_STREAM rate 1,000 burst and 33
a second, 8 CONTINUATION frames a block, 32 SETTINGS entries a frame) and grpc-go's keepalive
``ServerParameters`` (a PING after 2 h of silence, 20 s for its ACK). The header list stays at
64 KiB, gputally's documented bound (gRPC metadata is small; Go allows 1 MB).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]

_MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Limits:
    """Bounds on one connection's state and the time its peer may hold it; 0 disables a timeout."""

    max_concurrent_streams: int = 250
    """Peer streams open at once (counted until fully closed, answered or not); one more is refused
    with REFUSED_STREAM and counts as a reset."""
    max_header_list_size: int = 64 * 1024
    """Largest decoded header list (RFC 7541 sizes: name + value + 32 an entry). A larger one
    fails its call alone (RESOURCE_EXHAUSTED); one beyond twice this, or a block of more
    bytes, cannot be decoded safely and ends the connection (ENHANCE_YOUR_CALM)."""
    max_continuation_frames: int = 8
    """CONTINUATION frames after one HEADERS; more end the connection (empty ones too)."""
    max_queued_control_frames: int = 10_000
    """Answers the core owes the peer (PING and SETTINGS acknowledgements, resets, window
    updates) while its output is not drained; more end the connection."""
    max_settings_entries: int = 32
    """Entries in one SETTINGS frame; more end the connection."""
    reset_burst: int = 1000
    """Stream resets a peer may cause at once (its RST_STREAM, streams refused or malformed)."""
    reset_rate: float = 33.0
    """Resets a second the burst refills by; beyond it, GOAWAY ENHANCE_YOUR_CALM (Rapid Reset)."""
    max_buffered_request_bytes: int = 128 * _MIB
    """Request bytes held for handlers not started yet, summed over one connection's streams;
    the stream that would pass it is answered RESOURCE_EXHAUSTED and reset."""
    max_process_buffered_request_bytes: int = 512 * _MIB
    """The same, summed over every connection of every server in the process."""
    max_output_buffer: int = 1 * _MIB
    """Bytes written and not yet taken by the peer before reading from it stops and stream
    answers wait (write backpressure)."""
    write_timeout: float = 30.0
    """Seconds a peer may leave our writes (or a stream's answer, by a zero flow-control
    window) unread before the connection is closed."""
    read_timeout: float = 60.0
    """Seconds a request's body may take to end once its headers arrived; then its stream is
    answered DEADLINE_EXCEEDED and reset."""
    max_connection_idle: float = 0.0
    """Seconds a connection may stay without open streams before GOAWAY (0: for ever)."""
    max_connection_age: float = 0.0
    """Seconds a connection may live before GOAWAY (0: for ever); jittered by +-10 %."""
    max_connection_age_grace: float = 0.0
    """Seconds its streams get after that GOAWAY before it is closed (0: as long as they run)."""
    keepalive_time: float = 7200.0
    """Seconds without a frame from the peer before a PING (0: never)."""
    keepalive_timeout: float = 20.0
    """Seconds for that PING's acknowledgement before the connection is closed."""
