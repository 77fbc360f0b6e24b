"""Header blocks: decoding through the ``hpack`` library, encoding by literals alone.

Decoding must follow the peer's dynamic table, so it is the library's (python-hyper's
``hpack``, the reference decoder of the Python HTTP/2 stack). Encoding here never adds to a
table (RFC 7541 section 6.2.2, "literal header field without indexing"), so an encoded block
depends on nothing but its headers: the blocks gRPC sends on every call (the request line,
the response headers, the OK trailers) are encoded once and reused on any connection.
"""

from __future__ import annotations

from collections.abc import Iterable

import hpack

__all__ = ["Decoder", "HeaderError", "OversizedHeaderListError", "encode", "indexed", "leaves_table"]

Decoder = hpack.Decoder
HeaderError = hpack.HPACKError
OversizedHeaderListError = hpack.OversizedHeaderListError

# RFC 7541 Appendix A: the static table entries gRPC's pseudo-headers and content type use.
_STATIC_NAMES = {":authority": 1, ":method": 2, ":path": 4, ":scheme": 6, ":status": 8, "content-type": 31,
                 "user-agent": 58}
_STATIC_PAIRS = {(":method", "POST"): 3, (":scheme", "http"): 6, (":scheme", "https"): 7, (":status", "200"): 8}


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(raw: bytes) -> bytes:
    return _integer(len(raw), 7, 0) + raw


def indexed(name: str, value: str) -> bytes | None:
    """The one-byte representation of a static table pair, if the pair is in it."""
    index = _STATIC_PAIRS.get((name, value))
    return None if index is None else bytes((0x80 | index,))


def encode(headers: Iterable[tuple[str, str | bytes]]) -> bytes:
    """A header block for ``headers`` (lower-case names), in order, that touches no table."""
    out = bytearray()
    for name, value in headers:
        raw = value.encode("latin-1") if isinstance(value, str) else value
        if isinstance(value, str) and (whole := indexed(name, value)) is not None:
            out += whole
            continue
        index = _STATIC_NAMES.get(name)
        out += _integer(index, 4, 0) if index is not None else b"\x00" + _string(name.encode("ascii"))
        out += _string(raw)
    return bytes(out)


def _skip_integer(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    """The prefix integer at ``pos`` (RFC 7541 section 5.1) and the position after it."""
    value = block[pos] & mask
    pos += 1
    if value == mask:
        shift = 0
        while True:
            byte = block[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    return value, pos


def leaves_table(block: bytes) -> bool:
    """Whether decoding ``block`` (one that decodes) leaves the decoder's dynamic table as it
    was: it holds only indexed fields and literals without indexing or never indexed (RFC 7541
    sections 6.1, 6.2.2, 6.2.3), no literal with incremental indexing and no size update. The
    same bytes then decode to the same headers for as long as the table does not change."""
    pos, end = 0, len(block)
    while pos < end:
        first = block[pos]
        if first & 0x80:  # indexed
            _, pos = _skip_integer(block, pos, 0x7F)
            continue
        if first & 0x60:  # literal with incremental indexing (01), dynamic table size update (001)
            return False
        index, pos = _skip_integer(block, pos, 0x0F)
        if not index:  # a literal name
            length, pos = _skip_integer(block, pos, 0x7F)
            pos += length
        length, pos = _skip_integer(block, pos, 0x7F)
        pos += length
    return pos == end
