"""HTTP/2 on the wire (RFC 9113): frame types, flags, settings, error codes, one frame's bytes.

Only what gRPC uses. A frame is a 9-byte header (24-bit length, type, flags, 31-bit stream
id) and its payload; :func:`frame` builds one, and :data:`HEADER` reads the header with one
``unpack_from``.
"""

from __future__ import annotations

import enum
import struct

__all__ = [
    "DEFAULT_FRAME_SIZE",
    "DEFAULT_WINDOW",
    "HEADER",
    "MAX_WINDOW",
    "PREFACE",
    "ErrorCode",
    "Flag",
    "Setting",
    "Type",
    "frame",
    "goaway",
    "rst_stream",
    "settings",
    "window_update",
]

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a client sends before its first frame."""
HEADER = struct.Struct(">BHBBI")
"""A frame header: length (high byte, low two bytes), type, flags, stream id (with the reserved bit)."""
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_WINDOW = 2**31 - 1
MAX_FRAME_SIZE = 2**24 - 1

_U32 = struct.Struct(">I")
_SETTING = struct.Struct(">HI")


class Type(enum.IntEnum):
    DATA = 0x0
    HEADERS = 0x1
    PRIORITY = 0x2
    RST_STREAM = 0x3
    SETTINGS = 0x4
    PUSH_PROMISE = 0x5
    PING = 0x6
    GOAWAY = 0x7
    WINDOW_UPDATE = 0x8
    CONTINUATION = 0x9


class Flag(enum.IntFlag):
    END_STREAM = 0x1
    ACK = 0x1
    END_HEADERS = 0x4
    PADDED = 0x8
    PRIORITY = 0x20


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


def frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    """One frame's bytes; ``payload`` must fit the peer's SETTINGS_MAX_FRAME_SIZE."""
    n = len(payload)
    return HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def settings(values: dict[Setting, int]) -> bytes:
    return frame(Type.SETTINGS, 0, 0, b"".join(_SETTING.pack(key, value) for key, value in values.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(Type.WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: ErrorCode) -> bytes:
    return frame(Type.RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(Type.GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def read_u32(payload: bytes | memoryview, offset: int = 0) -> int:
    """A 31-bit value (the reserved bit dropped), as stream ids and window increments are."""
    return int(_U32.unpack_from(payload, offset)[0]) & 0x7FFFFFFF


def read_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]
