"""gRPC over HTTP/2 (the "PROTOCOL-HTTP2" document of grpc/grpc): what rides on the frames.

A message is a 5-byte prefix (compressed flag, 32-bit length) and its bytes; the status is
``grpc-status`` / ``grpc-message`` (percent-encoded) / ``grpc-status-details-bin`` (base64 of
a ``google.rpc.Status``) in the trailers, or in the headers of a trailers-only response;
``grpc-timeout`` is a number of at most 8 digits and a unit. Status codes are grpcio's
``grpc.StatusCode``, so both implementations' callers see one type.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

import grpc

__all__ = [
    "CODES",
    "INFLATE_SLICE",
    "INFLATE_STEP",
    "INLINE_INFLATE",
    "GrpcError",
    "Inflater",
    "MessageTooLarge",
    "Metadata",
    "decode_metadata",
    "format_timeout",
    "gunzip",
    "gzip",
    "message",
    "metadata_value",
    "parse_timeout",
    "read_message",
    "split_message",
    "status_headers",
]

Metadata = tuple[tuple[str, str | bytes], ...]
"""Custom metadata: lower-case names; a ``-bin`` name has a bytes value."""

CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}
_PREFIX = struct.Struct(">BI")
_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_RESERVED = frozenset({"te", "content-type", "grpc-timeout", "grpc-encoding", "grpc-accept-encoding",
                       "grpc-message-type", "user-agent", "grpc-status", "grpc-message",
                       "connection", "host"})
# grpc-message is percent-encoded outside printable ASCII, and '%' itself.
_MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


class MessageTooLarge(Exception):
    """A message (after decompression) above the receiver's limit."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"received message larger than max ({size} vs. {limit})")
        self.size = size
        self.limit = limit


@dataclass(frozen=True)
class GrpcError(Exception):
    """A call that ended with a status other than OK."""

    code: grpc.StatusCode
    details: str
    trailers: Metadata = ()

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"

    def trailing(self, key: str) -> str | bytes | None:
        return metadata_value(self.trailers, key)


def metadata_value(metadata: Metadata, key: str) -> str | bytes | None:
    """The first value of ``key`` (lower-case, as received) in ``metadata``; None without one."""
    return next((value for name, value in metadata if name == key), None)


def message(payload: bytes, *, compressed: bool = False) -> bytes:
    """``payload`` with its length prefix."""
    return _PREFIX.pack(1 if compressed else 0, len(payload)) + payload


INLINE_INFLATE = 1 * 2**20
"""Bytes a gzip message may inflate to on the event loop before the rest goes to a thread: a
usual OTLP request inflates to well under this, so it costs no thread hop, and no request
holds the loop longer than a step's inflating (about a millisecond)."""
INFLATE_SLICE = 4 * 2**20
"""Bytes inflated per turn in a thread; between turns the budgets are charged and other
connections' slices run."""
INFLATE_STEP = 1 * 2**20
"""Bytes one ``decompress`` call may produce."""


def read_message(body: bytes, encoding: str | None, limit: int) -> bytes:
    """The one message of a unary call's body, decompressed; ValueError when it is not one."""
    if len(body) < 5:
        raise ValueError("the body is shorter than a message prefix")
    compressed, length = _PREFIX.unpack_from(body)
    if length != len(body) - 5:
        raise ValueError(f"the body holds {len(body) - 5} bytes after a prefix of {length}")
    payload = body[5:]
    if not compressed:
        if length > limit:
            raise MessageTooLarge(length, limit)
        return payload
    if compressed != 1:
        raise ValueError(f"compressed flag {compressed}")
    if encoding != "gzip":
        raise ValueError(f"a compressed message in grpc-encoding {encoding or 'identity'}")
    return gunzip(payload, limit)


def gzip(payload: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, 31)
    return compressor.compress(payload) + compressor.flush()


def split_message(body: bytes, encoding: str | None, limit: int) -> tuple[bytes, bool]:
    """The one message of a unary call's body and whether it is gzip (to be inflated by an
    :class:`Inflater`); ValueError when it is not one, MessageTooLarge for a plain one over ``limit``."""
    if len(body) < 5:
        raise ValueError("the body is shorter than a message prefix")
    compressed, length = _PREFIX.unpack_from(body)
    if length != len(body) - 5:
        raise ValueError(f"the body holds {len(body) - 5} bytes after a prefix of {length}")
    if not compressed:
        if length > limit:
            raise MessageTooLarge(length, limit)
        return body[5:], False
    if compressed != 1:
        raise ValueError(f"compressed flag {compressed}")
    if encoding != "gzip":
        raise ValueError(f"a compressed message in grpc-encoding {encoding or 'identity'}")
    return body[5:], True


class Inflater:
    """A compressed message inflated in bounded steps (``zlib`` with ``max_length``): never
    more than ``limit`` + one step is inflated, and only the first ``keep`` bytes are kept;
    past them the rest is only counted (its size decides the answer, its bytes are not
    needed). A bomb costs one step of memory and stops at ``limit``. gzip by default;
    ``wbits`` as zlib's for deflate or zlib, and ``members`` to read concatenated ones."""

    def __init__(self, payload: bytes, *, keep: int, limit: int, wbits: int = 31, members: bool = False) -> None:
        self._wbits = wbits
        self._members = members
        self._decompressor = zlib.decompressobj(wbits)
        self._input = payload
        self._keep = keep
        self._limit = limit
        self._parts: list[bytes] | None = []
        self.size = 0
        """Bytes inflated so far."""
        self.held = 0
        """Of them, the bytes kept (0 once past ``keep``)."""
        self.done = False

    def run(self, budget: int) -> None:
        """Inflate about ``budget`` bytes more (all of it when ``budget`` is large enough)."""
        decompressor = self._decompressor
        spent = 0
        while not self.done and spent < budget:
            try:
                chunk = decompressor.decompress(self._input, min(INFLATE_STEP, self._limit + 1 - self.size))
            except zlib.error as exc:
                raise ValueError(f"not {'gzip' if self._wbits == 31 else 'deflate'}: {exc}") from exc
            self._input = decompressor.unconsumed_tail
            self.size += len(chunk)
            spent += len(chunk) or 1
            if self.size > self._limit:
                self._parts = None
                self.held = 0
                raise MessageTooLarge(self.size, self._limit)
            if self._parts is not None:
                if self.size <= self._keep:
                    self._parts.append(chunk)
                    self.held = self.size
                else:
                    self._parts = None  # past what the handler takes: count only
                    self.held = 0
            if decompressor.eof:
                rest = decompressor.unused_data
                if self._members and rest:
                    decompressor = self._decompressor = zlib.decompressobj(self._wbits)
                    self._input = rest
                else:
                    self.done = True
            elif not chunk and not self._input:
                raise ValueError(f"truncated {'gzip' if self._wbits == 31 else 'deflate'}")

    @property
    def message(self) -> bytes | None:
        """The whole message once done; None when it was larger than ``keep``."""
        return None if self._parts is None else b"".join(self._parts)


def gunzip(payload: bytes, limit: int) -> bytes:
    """Decompressed, never past ``limit`` + 1 bytes (a small request cannot become a huge one)."""
    decompressor = zlib.decompressobj(31)
    try:
        out = decompressor.decompress(payload, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"not gzip: {exc}") from exc
    if len(out) > limit:
        raise MessageTooLarge(len(out), limit)
    if not decompressor.eof:
        raise ValueError("truncated gzip")
    return out


def parse_timeout(value: str) -> float | None:
    """Seconds of a ``grpc-timeout`` value; None when it is malformed (then ignored)."""
    digits = value[:-1]
    if not 2 <= len(value) <= 9 or not (digits.isascii() and digits.isdigit()) or value[-1] not in _UNITS:
        return None
    return int(digits) * _UNITS[value[-1]]


def format_timeout(seconds: float) -> str:
    """``seconds`` as a ``grpc-timeout`` value: milliseconds, or a coarser unit past 8 digits."""
    millis = max(int(seconds * 1000), 1)
    if millis < 10**8:
        return f"{millis}m"
    if seconds < 10**8:
        return f"{int(seconds)}S"
    return f"{min(int(seconds / 3600), 10**8 - 1)}H"


def decode_metadata(headers: list[tuple[str, str]]) -> Metadata:
    """The custom metadata of a header list: pseudo-headers and gRPC's own dropped, ``-bin`` decoded."""
    out: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name.startswith(":") or name in _RESERVED:
            continue
        if name.endswith("-bin"):
            try:
                out.append((name, base64.b64decode(value + "=" * (-len(value) % 4))))
            except (binascii.Error, ValueError):
                continue
        else:
            out.append((name, value))
    return tuple(out)


def encode_metadata(metadata: Metadata) -> list[tuple[str, str]]:
    """Metadata as headers: ``-bin`` values in unpadded base64."""
    out = []
    for name, value in metadata:
        if name.endswith("-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append((name, base64.b64encode(raw).decode("ascii").rstrip("=")))
        else:
            out.append((name, value if isinstance(value, str) else value.decode("latin-1")))
    return out


def status_headers(code: grpc.StatusCode, details: str, trailers: Metadata = ()) -> list[tuple[str, str]]:
    """The status part of trailers (or of a trailers-only response)."""
    out = [("grpc-status", str(code.value[0]))]
    if details:
        out.append(("grpc-message", quote(details, safe=_MESSAGE_SAFE)))
    out.extend(encode_metadata(trailers))
    return out


def status_from(headers: list[tuple[str, str]]) -> GrpcError | None:
    """The error that trailers say, or None for OK; no ``grpc-status`` at all is UNKNOWN."""
    code: grpc.StatusCode | None = None
    details = ""
    for name, value in headers:
        if name == "grpc-status":
            code = CODES.get(int(value)) if value.isascii() and value.isdigit() else None
            code = code or grpc.StatusCode.UNKNOWN
        elif name == "grpc-message":
            details = unquote(value, errors="replace")
    if code is None:
        return GrpcError(grpc.StatusCode.UNKNOWN, "the server sent no grpc-status", decode_metadata(headers))
    if code is grpc.StatusCode.OK:
        return None
    return GrpcError(code, details, decode_metadata(headers))


_HTTP_CODES = {400: grpc.StatusCode.INTERNAL, 401: grpc.StatusCode.UNAUTHENTICATED,
               403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.UNIMPLEMENTED,
               429: grpc.StatusCode.UNAVAILABLE, 502: grpc.StatusCode.UNAVAILABLE,
               503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.UNAVAILABLE}


def http_status_code(status: str) -> grpc.StatusCode:
    """The gRPC code for a response that is not HTTP 200 (the spec's table)."""
    return _HTTP_CODES.get(int(status) if status.isascii() and status.isdigit() else 0, grpc.StatusCode.UNKNOWN)
