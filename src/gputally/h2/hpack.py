"""Header blocks: decoding through the ``hpack`` library, encoding by literals alone.

Decoding must follow the peer's dynamic table, so it is the library's (python-hyper's
``hpack``, the reference decoder of the Python HTTP/2 stack). Encoding here never adds to a
table (RFC 7541 section 6.2.2, "literal header field without indexing"), so an encoded block
depends on nothing but its headers: the blocks gRPC sends on every call (the request line,
the response headers, the OK trailers) are encoded once and reused on any connection.

A peer's repeated calls send the same block again and again once its table holds their
fields; :class:`Memo` remembers such blocks decoded (and what the core checked of them), for
as long as the peer's table cannot have changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import cast

import hpack

__all__ = ["MEMO_BLOCKS", "MEMO_BYTES", "Decoder", "HeaderError", "Memo", "OversizedHeaderListError", "encode",
           "indexed", "leaves_table"]

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


MEMO_BLOCKS = 64
"""Header blocks a :class:`Memo` remembers decoded at most, per connection..."""
MEMO_BYTES = 64 * 1024
"""...and their bytes and headers' sizes at most, so a peer's large blocks cannot make it hold
more than this."""

Headers = list[tuple[str, str]]


class Memo:
    """One connection's decoder, with the blocks that left the peer's table as it was
    remembered decoded.

    A block made only of indexed fields and literals that are not to be indexed reads the
    peer's table without changing it, so while nothing else was decoded since, the same bytes
    mean the same headers: such blocks, the steady state of a peer's repeated calls (an
    indexing encoder's, such as Go's and gRPC core's, once its table holds the call's fields;
    a literal-only one's, such as gputally's, from the first call), are remembered instead of
    decoded again (~14 us and more each through hpack). Any other block may change the table
    and forgets them all (:attr:`generation` counts the forgettings, so that what a user of
    the memo keeps by a remembered list can be dropped with it).
    """

    __slots__ = ("_bytes", "_decoded", "_decoder", "checks", "generation")

    def __init__(self, *, max_header_list_size: int) -> None:
        self._decoder = Decoder(max_header_list_size=max_header_list_size)
        self._decoded: dict[bytes, tuple[Headers, int]] = {}
        self.checks: dict[int, int] = {}
        """The id of a remembered request's headers -> its check's result (:meth:`remember_check`
        writes it; read it, as :meth:`checked` does, where a call a request costs too much)."""
        self._bytes = 0  # the remembered blocks' bytes and their headers' sizes
        self.generation = 0

    def decode(self, block: bytes) -> tuple[Headers, int]:
        """The headers of a block (a list the caller must not change) and their RFC 7541 size;
        a remembered block's are the same list as last time."""
        known = self._decoded.get(block)
        if known is not None:
            return known
        # hpack gives (str, str) tuples unless asked for raw bytes.
        headers = cast(Headers, self._decoder.decode(block))
        sized = headers, 32 * len(headers) + sum(map(len, chain.from_iterable(headers)))
        # one-byte indexed fields only (every byte 0x80-0xFE), or a walk of the representations
        if block and ((min(block) >= 0x80 and 0xFF not in block) or leaves_table(block)):
            cost = sized[1] + len(block)
            if cost > MEMO_BYTES:
                return sized  # too large to keep; the table did not change
            if len(self._decoded) >= MEMO_BLOCKS or self._bytes + cost > MEMO_BYTES:
                self.forget()
            self._decoded[block] = sized
            self._bytes += cost
        elif self._decoded:
            self.forget()
        return sized

    def __contains__(self, block: bytes) -> bool:
        """Whether ``block`` is remembered decoded."""
        return block in self._decoded

    @property
    def held(self) -> int:
        """The remembered blocks' bytes and their headers' sizes (at most :data:`MEMO_BYTES`)."""
        return self._bytes

    def forget(self) -> None:
        """The peer's table changed (or the memo is full): forget every remembered block."""
        self._decoded.clear()
        self.checks.clear()
        self._bytes = 0
        self.generation += 1

    def checked(self, headers: Headers) -> int | None:
        """What :meth:`remember_check` kept for a remembered request's headers."""
        return self.checks.get(id(headers))

    def remember_check(self, block: bytes, headers: Headers, result: int) -> None:
        """Keep a request check's ``result`` (its content-length) while ``block`` is remembered
        as ``headers``."""
        if block and self._decoded.get(block, (None,))[0] is headers:
            self.checks[id(headers)] = result

    def remembers(self, headers: Headers) -> bool:
        """Whether the header list of the peer's request now handled is a remembered one: the
        same object comes back for the same bytes until :meth:`forget`."""
        return id(headers) in self.checks
