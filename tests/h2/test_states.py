"""The stream transition table (gputally.h2.states) itself: RFC 9113 section 5.1's life of a
stream, without push, and nothing else."""

from __future__ import annotations

import pytest

from gputally.h2.states import AFTER, LIVE, TRANSITIONS, StateError, StreamInput, StreamState, advance, reachable

S, I = StreamState, StreamInput


def test_closed_is_final_and_idle_opens_only_by_headers() -> None:
    assert not [pair for pair in TRANSITIONS if pair[0] is S.CLOSED]
    assert {after for (before, _), after in TRANSITIONS.items() if before is S.IDLE} == {S.OPEN}
    assert {event for (before, event) in TRANSITIONS if before is S.IDLE} == {I.SEND_HEADERS, I.RECV_HEADERS}


def test_every_live_state_closes_by_a_reset_either_way() -> None:
    for state in LIVE:
        assert advance(state, I.SEND_RST_STREAM) is S.CLOSED
        assert advance(state, I.RECV_RST_STREAM) is S.CLOSED


def test_a_stream_closes_once_both_ends_ended_it_in_either_order() -> None:
    for first, second in ((I.SEND_END_STREAM, I.RECV_END_STREAM), (I.RECV_END_STREAM, I.SEND_END_STREAM)):
        half = advance(S.OPEN, first)
        assert half in (S.HALF_CLOSED_LOCAL, S.HALF_CLOSED_REMOTE)
        assert advance(half, second) is S.CLOSED
        with pytest.raises(StateError):
            advance(half, first)  # the same end cannot end it twice


def test_a_move_the_table_lacks_is_refused() -> None:
    with pytest.raises(StateError):
        advance(S.IDLE, I.RECV_END_STREAM)
    with pytest.raises(StateError):
        advance(S.CLOSED, I.RECV_HEADERS)
    with pytest.raises(StateError):
        advance(S.HALF_CLOSED_REMOTE, I.RECV_HEADERS)  # the core answers STREAM_CLOSED before this


def test_reachability() -> None:
    assert reachable(S.IDLE) == frozenset(StreamState)
    assert reachable(S.CLOSED) == {S.CLOSED}
    assert S.OPEN not in reachable(S.HALF_CLOSED_LOCAL)


RFC_9113_SECTION_5_1 = {
    # written from the RFC's figure, apart from the code: idle -> open by HEADERS sent or received;
    # open -> half-closed by END_STREAM one way; half-closed -> closed by END_STREAM the other way;
    # any live state -> closed by RST_STREAM either way; header blocks that leave the state as it is
    (S.IDLE, I.SEND_HEADERS): S.OPEN, (S.IDLE, I.RECV_HEADERS): S.OPEN,
    (S.OPEN, I.RECV_HEADERS): S.OPEN, (S.HALF_CLOSED_LOCAL, I.RECV_HEADERS): S.HALF_CLOSED_LOCAL,
    (S.OPEN, I.SEND_END_STREAM): S.HALF_CLOSED_LOCAL, (S.OPEN, I.RECV_END_STREAM): S.HALF_CLOSED_REMOTE,
    (S.HALF_CLOSED_LOCAL, I.RECV_END_STREAM): S.CLOSED, (S.HALF_CLOSED_REMOTE, I.SEND_END_STREAM): S.CLOSED,
    **{(state, event): S.CLOSED for state in (S.OPEN, S.HALF_CLOSED_LOCAL, S.HALF_CLOSED_REMOTE)
       for event in (I.SEND_RST_STREAM, I.RECV_RST_STREAM)},
}


def test_the_table_is_the_rfcs() -> None:
    assert dict(TRANSITIONS) == RFC_9113_SECTION_5_1


def test_the_rows_the_core_indexes_are_the_table() -> None:
    """``AFTER``, which the core indexes on its hot path instead of calling :func:`advance`,
    holds every pair of the table and no other: a pair it lacks is refused."""
    for state in StreamState:
        for event in StreamInput:
            assert AFTER[event][state] is TRANSITIONS.get((state, event))
            if (state, event) not in TRANSITIONS:
                with pytest.raises(StateError):
                    advance(state, event)
