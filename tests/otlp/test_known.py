"""Intake through checked shapes decides every request as the full check does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.errors import InvalidRequest
from gputally.otlp.batch import Batch
from gputally.otlp.checked import checked_census
from gputally.otlp.known import CheckedShapes
from gputally.otlp.signals import Signal
from gputally.otlp.skeleton import number_spans
from tests.fuzz.strategies import REQUESTS, damaged
from tests.otlp.test_templates import _provable, next_cycle
from tests.processors.usage.test_layout import probe_series  # noqa: F401  (a fixture)


def verdict(decode: Any, raw: bytes) -> tuple[int, int, str] | str:
    """What a decode says of ``raw``: its points, rejected points and why, or its refusal."""
    try:
        batch = decode(Signal.METRICS, raw)
    except InvalidRequest as exc:
        return f"invalid: {exc}"
    return batch.items, batch.rejected, batch.rejection


def learned(raw: bytes) -> CheckedShapes:
    """A cache that has seen ``raw`` twice (its shape is built on the second sighting)."""
    checked = CheckedShapes()
    checked.decode(Signal.METRICS, raw)
    checked.decode(Signal.METRICS, raw)
    return checked


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=REQUESTS["metrics"], noise=st.binary(min_size=1, max_size=64), data=st.data())
def test_a_learned_shape_decides_as_the_parse(request: Any, noise: bytes, data: st.DataObject) -> None:
    raw = request.SerializeToString()
    checked = learned(raw)
    assert verdict(checked.decode, raw) == verdict(Batch.decode, raw)
    cycle = next_cycle(raw, noise) if _provable(raw) else raw
    assert verdict(checked.decode, cycle) == verdict(Batch.decode, cycle)
    hurt = data.draw(damaged(cycle))
    assert verdict(checked.decode, hurt) == verdict(Batch.decode, hurt)
    if _provable(raw) and not checked_census(Signal.METRICS, raw).nameless_metrics:
        assert checked.shapes.hits >= 2, "a provable request's next cycle was parsed, not matched"


def test_every_byte_of_a_real_request(probe_series: list[bytes]) -> None:  # noqa: F811
    """A real node request with any one byte changed: a number byte is matched and counted
    as before, any other byte misses the shape and gets the full check."""
    raw = probe_series[-1]
    checked = learned(raw)
    numbers = {at for start, end in number_spans(raw) for at in range(start, end)}
    assert numbers
    expected = verdict(Batch.decode, raw)
    for at in range(len(raw)):
        changed = bytearray(raw)
        changed[at] ^= 0x40
        hits = checked.shapes.hits
        got = verdict(checked.decode, bytes(changed))
        if at in numbers:
            assert got == expected and checked.shapes.hits == hits + 1, at
        else:
            assert checked.shapes.hits == hits, at
            assert got == verdict(Batch.decode, bytes(changed)), at


def test_the_real_series_is_matched(probe_series: list[bytes]) -> None:  # noqa: F811
    checked = CheckedShapes()
    for raw in probe_series:
        assert verdict(checked.decode, raw) == verdict(Batch.decode, raw)
    assert checked.shapes.hits > 0


def test_nameless_metrics_are_never_waved_through() -> None:
    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    metrics.add(name="ok").gauge.data_points.add(as_double=1.0)
    metrics.add().gauge.data_points.add(as_double=2.0)
    raw = request.SerializeToString()
    checked = learned(raw)
    got = verdict(checked.decode, raw)
    assert got == verdict(Batch.decode, raw)
    assert got[:2] == (1, 1)
    assert checked.shapes.hits == 0 and checked.shapes.held == 0


@pytest.mark.parametrize("raw", [b"\x0a\x02\x0a", b"\x0b", b"\xff" * 8], ids=["truncated", "group", "varint"])
def test_bytes_that_do_not_parse_are_refused_every_time(raw: bytes) -> None:
    checked = CheckedShapes()
    for _ in range(4):
        assert verdict(checked.decode, raw) == verdict(Batch.decode, raw)
        assert str(verdict(checked.decode, raw)).startswith("invalid")
    assert checked.shapes.held == 0


def test_no_budget_parses_every_request(probe_series: list[bytes]) -> None:  # noqa: F811
    checked = CheckedShapes(budget=0)
    for raw in probe_series * 2:
        checked.decode(Signal.METRICS, raw)
    assert checked.shapes.hits == 0 and checked.shapes.held == 0


def test_other_signals_are_parsed() -> None:
    checked = CheckedShapes()
    for _ in range(3):
        with pytest.raises(InvalidRequest):
            checked.decode(Signal.LOGS, b"\x0b")
    assert checked.shapes.requests == 0


def test_a_key_past_four_shapes_drops_its_least_used() -> None:
    """Five shapes of one key (same length and first resource, another metric name each): the
    fifth, once earned, replaces the least used, and every request is still decided right."""
    def shaped(name: str) -> bytes:
        request = ExportMetricsServiceRequest()
        resource = request.resource_metrics.add()
        resource.resource.attributes.add(key="host.name").value.string_value = "node-1"
        resource.scope_metrics.add().metrics.add(name=name).gauge.data_points.add(as_double=1.0)
        return request.SerializeToString()

    raws = [shaped(f"gpu.metric.{n}") for n in range(5)]
    checked = CheckedShapes()
    for raw, extra in zip(raws[:4], (3, 0, 1, 2), strict=True):  # the second shape is the least used
        for _ in range(2 + 16 + extra):  # built on the second sighting, then hits that earn more builds
            assert verdict(checked.decode, raw) == (1, 0, "")
    held = checked.shapes.held
    for _ in range(2):
        assert verdict(checked.decode, raws[4]) == (1, 0, "")
    assert checked.shapes.builds == 5
    assert checked.shapes.held == held  # one shape out, one in, of the same size
    hits = checked.shapes.hits
    assert verdict(checked.decode, raws[4]) == (1, 0, "")
    assert verdict(checked.decode, raws[0]) == (1, 0, "")
    assert checked.shapes.hits == hits + 2
    assert verdict(checked.decode, raws[1]) == (1, 0, "")  # dropped: checked in full again
    assert checked.shapes.hits == hits + 2
