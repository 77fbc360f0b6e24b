"""Header blocks: the literal-only encoder, and the decoder's memo of indexed-only blocks,
which must follow the peer's dynamic table exactly."""

from __future__ import annotations

import hpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gputally.h2 import hpack as encoder
from gputally.h2.connection import Connection

NAMES = st.sampled_from([":status", "content-type", "grpc-status", "grpc-message", "x-a", "x-b", "user-agent"])
VALUES = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=12))
def test_literal_blocks_decode_to_what_was_encoded(headers: list[tuple[str, str]]) -> None:
    decoder = hpack.Decoder()
    assert [tuple(h) for h in decoder.decode(encoder.encode(headers))] == headers
    assert len(decoder.header_table.dynamic_entries) == 0  # nothing was added to the peer's table


def test_the_memo_forgets_when_the_table_changes() -> None:
    connection = Connection()
    peer = hpack.Encoder()
    first = peer.encode([("x-a", "1")])  # literal with incremental indexing: x-a at index 62
    assert connection._decode(first) == [("x-a", "1")]
    indexed = bytes([0x80 | 62])
    assert connection._decode(indexed) == [("x-a", "1")]
    assert indexed in connection._decoded
    connection._decode(peer.encode([("x-b", "2")]))  # now x-b is 62 and x-a 63
    assert connection._decode(indexed) == [("x-b", "2")]
    assert connection._decode(bytes([0x80 | 63])) == [("x-a", "1")]


@given(st.lists(st.lists(st.tuples(st.sampled_from(["x-a", "x-b", "x-c", "grpc-status"]),
                                   st.sampled_from(["0", "1", "2"])), min_size=1, max_size=4), max_size=30))
def test_memoised_decoding_equals_plain_decoding(blocks: list[list[tuple[str, str]]]) -> None:
    """A peer encoder that indexes (as Go's and gRPC core's do) over many calls: the memo never
    gives other headers than a fresh decoder would."""
    peer = hpack.Encoder()
    peer.header_table_size = 128  # small: entries are evicted and indices shift
    connection, plain = Connection(), hpack.Decoder()
    for headers in blocks:
        block = peer.encode(headers)
        assert [tuple(h) for h in connection._decode(block)] == [tuple(h) for h in plain.decode(block)]


@pytest.mark.parametrize("value", [0, 14, 15, 126, 127, 128, 300, 70_000])
def test_integers_of_every_prefix_length_round_trip(value: int) -> None:
    header = ("x-n", "v" * value)
    assert hpack.Decoder(max_header_list_size=1 << 20).decode(encoder.encode([header])) == [header]
