"""The checked census refuses exactly what the real parse refuses, and counts what it holds."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from gputally.otlp.checked import checked_census
from gputally.otlp.signals import SIGNALS, Signal
from tests.fuzz.strategies import REQUESTS, damaged


def _records(message: Any, signal: Signal) -> tuple[int, int]:
    """(items, nameless metrics), by walking the parsed request (the oracle)."""
    spec = SIGNALS[signal]
    items = nameless = 0
    for resource in getattr(message, spec.resource_field):
        for scope in getattr(resource, spec.scope_field):
            for record in getattr(scope, spec.record_field):
                if signal is not Signal.METRICS:
                    items += 1
                    continue
                kind = record.WhichOneof("data")
                items += len(getattr(record, kind).data_points) if kind else 0
                nameless += not record.name
    return items, nameless


@settings(max_examples=300, deadline=None)
@given(signal=st.sampled_from(list(Signal)), data=st.data())
def test_refuses_what_the_parse_refuses_and_counts_the_rest(signal: Signal, data: st.DataObject) -> None:
    raw = data.draw(damaged(data.draw(REQUESTS[signal.value]).SerializeToString()))
    try:
        message = SIGNALS[signal].request.FromString(raw)
    except DecodeError:
        with pytest.raises(DecodeError):
            checked_census(signal, raw)
        return
    census = checked_census(signal, raw)
    items, nameless = _records(message, signal)
    assert census.items == items
    if nameless:
        assert census.nameless_metrics != 0


@pytest.mark.parametrize(
    "raw",
    [
        # resource_metrics > resource > attributes > key with invalid UTF-8
        b"\x0a\x08\x0a\x06\x0a\x04\x0a\x02\xff\xfe",
        # resource_metrics > scope_metrics > metrics > name with invalid UTF-8
        b"\x0a\x08\x12\x06\x12\x04\x0a\x02\xc3\x28",
        # a gauge point whose length runs past the end
        b"\x0a\x0a\x12\x08\x12\x06\x2a\x04\x0a\x09\x11\x00",
    ],
    ids=["resource-key-utf8", "metric-name-utf8", "point-length"],
)
def test_refuses_malformed_nested_content(raw: bytes) -> None:
    with pytest.raises(DecodeError):
        SIGNALS[Signal.METRICS].request.FromString(raw)
    with pytest.raises(DecodeError):
        checked_census(Signal.METRICS, raw)
