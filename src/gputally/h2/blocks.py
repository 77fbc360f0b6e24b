"""A header block put together from its HEADERS frame and CONTINUATIONs, bounded as it comes.

Its bytes and its frames are counted as each frame arrives (twice ``max_header_list_size``,
``max_continuation_frames``), so a peer cannot make the core hold a block larger than that or
walk one frame at a time for ever; padding and the priority field are taken off here.
"""

from __future__ import annotations

from .errors import ProtocolError
from .frames import ErrorCode, Flag, read_u32
from .limits import Limits

__all__ = ["HeaderBlocks", "unpad"]

_END_HEADERS = int(Flag.END_HEADERS)
_PADDED = int(Flag.PADDED)
_PRIORITY = int(Flag.PRIORITY)

Block = tuple[int, int, bytes, str | None]
"""A whole block: its stream, the HEADERS frame's flags, its bytes, and the stream error its
HEADERS carried (a stream depending on itself), raised once the block is decoded."""


def unpad(payload: memoryview) -> memoryview:
    """A padded frame's payload without its pad length and padding."""
    if not payload:
        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "a padded frame without its pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1 : len(payload) - pad]


class HeaderBlocks:
    """The block awaiting CONTINUATION, if one is."""

    __slots__ = ("_block", "_max_bytes", "_max_frames", "pending")

    def __init__(self, limits: Limits) -> None:
        self._max_bytes = 2 * limits.max_header_list_size
        self._max_frames = limits.max_continuation_frames
        # stream, HEADERS flags, parts, bytes, frames, stream error
        self._block: tuple[int, int, list[bytes], int, int, str | None] | None = None
        self.pending = False
        """A block awaits CONTINUATION: no other frame may come before it ends (an attribute,
        not a property: the core reads it for every frame)."""

    def clear(self) -> None:
        self._block = None
        self.pending = False

    def headers(self, stream_id: int, flags: int, payload: memoryview) -> Block | None:
        """A HEADERS frame: its whole block, or None when CONTINUATIONs must follow."""
        if flags & _PADDED:
            payload = unpad(payload)
        problem = None
        if flags & _PRIORITY:
            if len(payload) < 5:
                raise ProtocolError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            if read_u32(payload) == stream_id:
                problem = "a stream depending on itself"  # a stream error, once the block is decoded
            payload = payload[5:]
        if flags & _END_HEADERS:
            return stream_id, flags, bytes(payload), problem
        size = len(payload)
        if size > self._max_bytes:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header block beyond twice the allowed size",
                                limit="max_header_list_size")
        self._block = (stream_id, flags, [bytes(payload)], size, 0, problem)
        self.pending = True
        return None

    def continuation(self, stream_id: int, flags: int, payload: memoryview) -> Block | None:
        """A CONTINUATION of the pending block: the whole block once it ends, else None."""
        assert self._block is not None
        block_stream, first_flags, parts, size, count, problem = self._block
        if stream_id != block_stream:
            raise ProtocolError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION on another stream than its HEADERS")
        count += 1
        if count > self._max_frames:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, f"a header block in more than {count - 1} CONTINUATIONs",
                                limit="max_continuation_frames")
        size += len(payload)
        if size > self._max_bytes:
            raise ProtocolError(ErrorCode.ENHANCE_YOUR_CALM, "a header block beyond twice the allowed size",
                                limit="max_header_list_size")
        parts.append(bytes(payload))
        if flags & _END_HEADERS:
            self._block = None
            self.pending = False
            return stream_id, first_flags, b"".join(parts), problem
        self._block = (stream_id, first_flags, parts, size, count, problem)
        return None
