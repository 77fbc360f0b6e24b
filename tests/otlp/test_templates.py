"""Appending through templates gives, byte for byte, what the general splice gives."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2

from gputally.otlp.signals import Signal
from gputally.otlp.skeleton import Malformed, MetricsWalk
from gputally.otlp.splice import METRIC_KINDS, append_to_records
from gputally.otlp.templates import PointTemplates
from tests.fuzz.strategies import REQUESTS
from tests.usage.series import probe_requests, recording

_POINTS = {
    "gauge": metrics_pb2.NumberDataPoint,
    "sum": metrics_pb2.NumberDataPoint,
    "histogram": metrics_pb2.HistogramDataPoint,
    "exponential_histogram": metrics_pb2.ExponentialHistogramDataPoint,
    "summary": metrics_pb2.SummaryDataPoint,
}


def _blob(klass: type[Any]) -> bytes:
    return bytes(klass(attributes=[KeyValue(key="env", value=AnyValue(string_value="prod"))]).SerializeToString())


def blobs_for(kinds: frozenset[str]) -> dict[str | None, bytes]:
    return {kind: _blob(_POINTS[kind]) for kind in kinds}


def next_cycle(raw: bytes, noise: bytes) -> bytes:
    """``raw`` with every data point's fixed-width numbers replaced, as a node's next request."""
    walk = MetricsWalk(raw)
    walk.walk()
    out = bytearray(raw)
    for n, (start, end) in enumerate(walk.blanks):
        for at in range(start, end):
            out[at] = noise[(at + n) % len(noise)]
    return bytes(out)


def _provable(raw: bytes) -> bool:
    try:
        MetricsWalk(raw).walk()
    except Malformed:
        return False
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=REQUESTS["metrics"], kinds=st.frozensets(st.sampled_from(METRIC_KINDS), min_size=1),
       noise=st.binary(min_size=1, max_size=64))
def test_templates_give_what_the_splice_gives(request: Any, kinds: frozenset[str], noise: bytes) -> None:
    raw = request.SerializeToString()
    blobs = blobs_for(kinds)
    templates = PointTemplates(blobs)
    # first sighting (general), second (built and used), a next cycle (matched)
    assert templates.append(raw) == append_to_records(Signal.METRICS, raw, blobs)
    assert templates.append(raw) == append_to_records(Signal.METRICS, raw, blobs)
    if not _provable(raw):
        return
    nxt = next_cycle(raw, noise)
    assert templates.append(nxt) == append_to_records(Signal.METRICS, nxt, blobs)
    assert templates.shapes.hits == 1, "a provable request's next cycle was not answered from its template"


def _series() -> list[bytes]:
    return [r.SerializeToString() for r in asyncio.run(probe_requests(recording(), base_ns=1_800_000_000 * 10**9))]


def test_a_node_series_is_answered_from_its_template() -> None:
    """The real H200 recording as the probe sends it: requests after the second match."""
    blobs = blobs_for(frozenset({"gauge", "sum"}))
    templates = PointTemplates(blobs)
    for raw in _series():
        assert templates.append(raw) == append_to_records(Signal.METRICS, raw, blobs)
    assert templates.shapes.hits > 0


def test_a_request_that_differs_beyond_its_numbers_goes_the_general_way() -> None:
    raw = _series()[0]
    blobs = blobs_for(frozenset({"gauge", "sum"}))
    templates = PointTemplates(blobs)
    templates.append(raw)
    templates.append(raw)
    hits = templates.shapes.hits
    at = raw.index(b"hw.gpu.utilization") + 3  # a metric renamed, same length
    changed = raw[:at] + b"G" + raw[at + 1:]
    assert templates.append(changed) == append_to_records(Signal.METRICS, changed, blobs)
    assert templates.shapes.hits == hits
    assert templates.append(next_cycle(raw, b"\x07\x99")) == append_to_records(
        Signal.METRICS, next_cycle(raw, b"\x07\x99"), blobs)
    assert templates.shapes.hits == hits + 1
