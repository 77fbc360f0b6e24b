"""Header blocks: the literal-only encoder, and the decoder's memo of blocks that leave the
peer's dynamic table as it was, which must follow that table exactly."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputally.h2 import hpack as encoder
from gputally.h2.hpack import MEMO_BYTES, Memo

NAMES = st.sampled_from([":status", "content-type", "grpc-status", "grpc-message", "x-a", "x-b", "user-agent"])
VALUES = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=12))
def test_literal_blocks_decode_to_what_was_encoded(headers: list[tuple[str, str]]) -> None:
    decoder = hpack.Decoder()
    assert [tuple(h) for h in decoder.decode(encoder.encode(headers))] == headers
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing was added to the peer's table


def test_the_memo_forgets_when_the_table_changes() -> None:
    memo = Memo(max_header_list_size=128 * 1024)
    peer = hpack.Encoder()
    first = peer.encode([("x-a", "1")])  # literal with incremental indexing: x-a at index 62
    assert memo.decode(first)[0] == [("x-a", "1")]
    indexed = bytes([0x80 | 62])
    assert memo.decode(indexed)[0] == [("x-a", "1")]
    assert indexed in memo
    memo.decode(peer.encode([("x-b", "2")]))  # now x-b is 62 and x-a 63
    assert memo.decode(indexed)[0] == [("x-b", "2")]
    assert memo.decode(bytes([0x80 | 63]))[0] == [("x-a", "1")]


@given(st.lists(st.lists(st.tuples(st.sampled_from(["x-a", "x-b", "x-c", "grpc-status"]),
                                   st.sampled_from(["0", "1", "2"])), min_size=1, max_size=4), max_size=30))
def test_memoised_decoding_equals_plain_decoding(blocks: list[list[tuple[str, str]]]) -> None:
    """A peer encoder that indexes (as Go's and gRPC core's do) over many calls: the memo never
    gives other headers than a fresh decoder would."""
    peer = hpack.Encoder()
    peer.header_table_size = 128  # small: entries are evicted and indices shift
    memo, plain = Memo(max_header_list_size=128 * 1024), hpack.Decoder()
    for headers in blocks:
        block = peer.encode(headers)
        assert [tuple(h) for h in memo.decode(block)[0]] == [tuple(h) for h in plain.decode(block)]


FIELDS = st.lists(st.tuples(st.sampled_from(["x-a", "x-b", "grpc-status", "content-type", ":path"]),
                            st.sampled_from(["0", "1", "application/grpc", "v" * 200])), max_size=5)
WAYS = st.sampled_from(["indexing", "indexing, huffman", "never indexed", "literal-only"])


def _encode(peer: hpack.Encoder, headers: list[tuple[str, str]], way: str) -> bytes:
    if way == "literal-only":
        return encoder.encode(headers)
    if way == "never indexed":
        return peer.encode([hpack.NeverIndexedHeaderTuple(name, value) for name, value in headers])
    return peer.encode(headers, huffman=way.endswith("huffman"))


@given(st.lists(st.tuples(FIELDS, WAYS), max_size=30))
def test_leaves_table_only_says_so_of_blocks_that_leave_it(blocks: list[tuple[list[tuple[str, str]], str]]) -> None:
    peer, decoder = hpack.Encoder(), hpack.Decoder()
    peer.header_table_size = 256  # entries are evicted and indices shift; the first block updates the size
    for headers, way in blocks:
        block = _encode(peer, headers, way)
        before = list(decoder.header_table.dynamic_entries)
        decoder.decode(block)
        if encoder.leaves_table(block):
            assert list(decoder.header_table.dynamic_entries) == before
        elif way == "literal-only":
            raise AssertionError(f"a literal-only block said to change the table: {block.hex()}")


@given(st.lists(st.tuples(FIELDS, WAYS), max_size=30))
def test_memoised_decoding_equals_plain_decoding_for_every_representation(
        blocks: list[tuple[list[tuple[str, str]], str]]) -> None:
    """Indexed fields, literals with and without indexing, never indexed, huffman or not, and
    gputally's literal-only blocks, repeated: the memo never gives other headers than a fresh
    decoder would."""
    peer = hpack.Encoder()
    peer.header_table_size = 256
    memo, plain = Memo(max_header_list_size=128 * 1024), hpack.Decoder()
    for headers, way in blocks * 2:
        block = _encode(peer, headers, way)
        assert [tuple(h) for h in memo.decode(block)[0]] == [tuple(h) for h in plain.decode(block)]


def test_the_memo_is_bounded_in_bytes() -> None:
    """Literal-only blocks are remembered too, so a peer's large ones must not make a
    connection hold much: the memo keeps at most 64 KiB of blocks and headers."""
    memo = Memo(max_header_list_size=128 * 1024)
    for i in range(200):
        block = encoder.encode([("x-big", f"{i:05d}" + "v" * 3000)])
        assert memo.decode(block)[0][0][1].startswith(f"{i:05d}")
        assert memo.held <= MEMO_BYTES
        assert sum(len(b) + size for b, (_, size) in memo._decoded.items()) == memo.held
    small = encoder.encode([("grpc-status", "0")])
    assert memo.decode(small)[0] == [("grpc-status", "0")]
    assert small in memo
    huge = encoder.encode([("x-huge", "v" * 70_000)])
    memo.decode(huge)
    assert huge not in memo and small in memo


@pytest.mark.parametrize("value", [0, 14, 15, 126, 127, 128, 300, 70_000])
def test_integers_of_every_prefix_length_round_trip(value: int) -> None:
    header = ("x-n", "v" * value)
    assert hpack.Decoder(max_header_list_size=1 << 20).decode(encoder.encode([header])) == [header]
