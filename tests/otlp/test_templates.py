"""A rewrite through templates gives, byte for byte, what the rewrite itself gives."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gputally.otlp.signals import Signal
from gputally.otlp.skeleton import Malformed, number_spans
from gputally.otlp.splice import METRIC_KINDS, append_to_records
from gputally.otlp.templates import Templates
from tests.fuzz.strategies import REQUESTS
from tests.otlp.test_splice import _POINTS
from tests.processors.usage.series import probe_requests, recording


def _blob(klass: type[Any]) -> bytes:
    return bytes(klass(attributes=[KeyValue(key="env", value=AnyValue(string_value="prod"))]).SerializeToString())


def blobs_for(kinds: frozenset[str]) -> dict[str | None, bytes]:
    return {kind: _blob(_POINTS[kind]) for kind in kinds}


def appending(blobs: dict[str | None, bytes]) -> Templates:
    return Templates(lambda raw: append_to_records(Signal.METRICS, raw, blobs))


def next_cycle(raw: bytes, noise: bytes) -> bytes:
    """``raw`` with every data point's fixed-width numbers replaced, as a node's next request."""
    out = bytearray(raw)
    for n, (start, end) in enumerate(number_spans(raw)):
        for at in range(start, end):
            out[at] = noise[(at + n) % len(noise)]
    return bytes(out)


def _provable(raw: bytes) -> bool:
    try:
        number_spans(raw)
    except Malformed:
        return False
    return True


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=REQUESTS["metrics"], kinds=st.frozensets(st.sampled_from(METRIC_KINDS), min_size=1),
       noise=st.binary(min_size=1, max_size=64))
def test_templates_give_what_the_splice_gives(request: Any, kinds: frozenset[str], noise: bytes) -> None:
    raw = request.SerializeToString()
    blobs = blobs_for(kinds)
    templates = appending(blobs)
    # first sighting (general), second (built and used), a next cycle (matched)
    assert templates(raw) == append_to_records(Signal.METRICS, raw, blobs)
    assert templates(raw) == append_to_records(Signal.METRICS, raw, blobs)
    if not _provable(raw):
        return
    nxt = next_cycle(raw, noise)
    assert templates(nxt) == append_to_records(Signal.METRICS, nxt, blobs)
    assert templates.shapes.hits == 1, "a provable request's next cycle was not answered from its template"


def _series() -> list[bytes]:
    return [r.SerializeToString() for r in asyncio.run(probe_requests(recording(), base_ns=1_800_000_000 * 10**9))]


def test_a_node_series_is_answered_from_its_template() -> None:
    """The real H200 recording as the probe sends it: requests after the second match."""
    blobs = blobs_for(frozenset({"gauge", "sum"}))
    templates = appending(blobs)
    for raw in _series():
        assert templates(raw) == append_to_records(Signal.METRICS, raw, blobs)
    assert templates.shapes.hits > 0


def test_a_request_that_differs_beyond_its_numbers_goes_the_general_way() -> None:
    raw = _series()[0]
    blobs = blobs_for(frozenset({"gauge", "sum"}))
    templates = appending(blobs)
    templates(raw)
    templates(raw)
    hits = templates.shapes.hits
    at = raw.index(b"hw.gpu.utilization") + 3  # a metric renamed, same length
    changed = raw[:at] + b"G" + raw[at + 1:]
    assert templates(changed) == append_to_records(Signal.METRICS, changed, blobs)
    assert templates.shapes.hits == hits
    assert templates(next_cycle(raw, b"\x07\x99")) == append_to_records(
        Signal.METRICS, next_cycle(raw, b"\x07\x99"), blobs)
    assert templates.shapes.hits == hits + 1


def test_a_rewrite_that_changes_nothing_hands_the_request_back() -> None:
    raw = _series()[0]
    templates = Templates(lambda request: request)
    for _ in range(3):
        assert templates(raw) is raw
    assert templates.shapes.hits == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=REQUESTS["metrics"], noise=st.binary(min_size=1, max_size=64),
       context=st.sampled_from(["resource", "point"]), action=st.sampled_from(["insert", "upsert", "update", "delete"]),
       key=st.sampled_from(["env", "host.name", "k8s.pod.uid"]))
def test_the_attributes_processor_gives_the_same_through_templates(
        request: Any, noise: bytes, context: str, action: str, key: str) -> None:
    """A processor that has seen a shape (templates) and a new one for every request (the
    general way) give the same bytes for the request and its next cycle."""
    from gputally.otlp.batch import Batch
    from gputally.processors.attributes.config import AttributesConfig
    from gputally.processors.attributes.processor import AttributesProcessor

    spec = {"key": key, "action": action, "context": context}
    if action != "delete":
        spec["value"] = "v"
    config = AttributesConfig.model_validate({"actions": [spec]})
    warm = AttributesProcessor(config, signal=Signal.METRICS)
    raw = request.SerializeToString()

    def through(processor: AttributesProcessor, body: bytes) -> bytes:
        batch = Batch(Signal.METRICS, raw=body)
        asyncio.run(processor.process(batch))
        return batch.serialize()

    for body in (raw, raw, next_cycle(raw, noise) if _provable(raw) else raw):
        assert through(warm, body) == through(AttributesProcessor(config, signal=Signal.METRICS), body)
