"""A stream's life (RFC 9113 section 5.1) as data: states, the inputs that move a stream, and
the ``(state, input) -> state`` table that is the only way a stream changes state.

The core never writes a stream's state by hand: it calls :func:`advance` with what happened
(the peer's HEADERS, our END_STREAM, a reset either way), which looks the pair up in
:data:`TRANSITIONS` and raises :class:`StateError` for a pair the table does not have, a bug
of the core rather than of the peer (a peer's frame that is not allowed in a state is
refused before it reaches the table, with the error the RFC asks for). The property tests
(tests/h2/test_core.py) check after every read that each stream moved only along the
table. No server push here, so the reserved states never occur.

How a closed stream closed (:class:`Closure`) is remembered for a while beside the table,
since it decides what a late frame on it is: ignored (we reset it), a stream error (the peer
reset it) or a connection error (it ended normally).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import NoReturn

__all__ = ["AFTER", "LIVE", "TRANSITIONS", "Closure", "StateError", "StreamInput", "StreamState", "advance", "reachable",
           "refuse"]


class StreamState(enum.IntEnum):
    """RFC 9113 section 5.1 (no push, so never reserved)."""

    IDLE = 0
    OPEN = 1
    HALF_CLOSED_LOCAL = 2
    HALF_CLOSED_REMOTE = 3
    CLOSED = 4


class StreamInput(enum.IntEnum):
    """What moves a stream: a header block or END_STREAM either way, a reset either way."""

    SEND_HEADERS = 0
    """We open the stream (a client's request)."""
    RECV_HEADERS = 1
    """The peer's header block (opening the stream, or its trailers)."""
    SEND_END_STREAM = 2
    """Our last frame on the stream is written."""
    RECV_END_STREAM = 3
    """The peer's END_STREAM arrived."""
    SEND_RST_STREAM = 4
    """We reset the stream (a stream error, a refusal, a cancel) or forget it without a word."""
    RECV_RST_STREAM = 5
    """The peer reset it."""


class Closure(enum.Enum):
    """How a closed stream closed, which decides what a late frame on it is."""

    ENDED = "ended"
    """Both ends ended it (or we forgot it once our side had what it wanted)."""
    RESET_SENT = "reset sent"
    """We reset it: the peer's frames already in flight are ignored."""
    RESET_RECEIVED = "reset received"
    """The peer reset it: its own later frames are a stream error."""


_S, _I = StreamState, StreamInput
_LIVE = (_S.OPEN, _S.HALF_CLOSED_LOCAL, _S.HALF_CLOSED_REMOTE)

TRANSITIONS: Mapping[tuple[StreamState, StreamInput], StreamState] = MappingProxyType({
    (_S.IDLE, _I.SEND_HEADERS): _S.OPEN,
    (_S.IDLE, _I.RECV_HEADERS): _S.OPEN,
    (_S.OPEN, _I.RECV_HEADERS): _S.OPEN,  # the response's headers, or trailers before END_STREAM
    (_S.HALF_CLOSED_LOCAL, _I.RECV_HEADERS): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, _I.SEND_END_STREAM): _S.HALF_CLOSED_LOCAL,
    (_S.OPEN, _I.RECV_END_STREAM): _S.HALF_CLOSED_REMOTE,
    (_S.HALF_CLOSED_LOCAL, _I.RECV_END_STREAM): _S.CLOSED,
    (_S.HALF_CLOSED_REMOTE, _I.SEND_END_STREAM): _S.CLOSED,
    **{(state, reset): _S.CLOSED for state in _LIVE for reset in (_I.SEND_RST_STREAM, _I.RECV_RST_STREAM)},
})
"""Every move a stream may make; any other pair is a bug (:class:`StateError`)."""

LIVE = frozenset(_LIVE)
"""The states of a stream in the core's table (it leaves the table when it closes)."""

AFTER: tuple[tuple[StreamState | None, ...], ...] = tuple(
    tuple(TRANSITIONS.get((state, event)) for state in StreamState) for event in StreamInput)
"""The table by input, then state: ``AFTER[event][state]`` is the state :data:`TRANSITIONS`
gives, None where it has no move. Derived from it, never written by hand, so that the hot
path moves a stream with one index (a row per input, bound once by the caller) and no tuple
built; a None there goes to :func:`refuse`."""


class StateError(Exception):
    """A move the transition table does not have: the core's bug, never the peer's."""


def refuse(state: StreamState, event: StreamInput) -> NoReturn:
    """Raise the :class:`StateError` for a pair the table does not have."""
    raise StateError(f"no transition from {state.name} on {event.name}")


def advance(state: StreamState, event: StreamInput) -> StreamState:
    """The state after ``event`` in ``state``, by :data:`TRANSITIONS`."""
    after = AFTER[event][state]
    if after is None:
        refuse(state, event)
    return after


def reachable(state: StreamState) -> frozenset[StreamState]:
    """The states ``state`` can reach by zero or more moves of the table (for the tests'
    check that a stream seen twice moved only along it)."""
    seen = {state}
    todo = [state]
    while todo:
        current = todo.pop()
        for (before, _), after in TRANSITIONS.items():
            if before is current and after not in seen:
                seen.add(after)
                todo.append(after)
    return frozenset(seen)
