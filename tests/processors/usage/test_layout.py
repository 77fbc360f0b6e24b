"""Reading a request through its layout gives what the general reading gives, and only then.

The layout path (`processors/usage/layout.py`) reads numbers from cached offsets after an
exact skeleton check; the general path parses the usage schema. They must agree on every
request a layout is built for, on every later request that matches it, and a request that
differs anywhere but in its numbers must not match.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from gputally.otlp.shapes import Shapes
from gputally.otlp.wire import encode_varint
from gputally.processors.usage.config import UsageConfig
from gputally.processors.usage.layout import Layout, Malformed
from gputally.processors.usage.observe import Observation, Observer
from gputally.processors.usage.owners import OwnerRules
from tests.processors.usage.helpers import runtime
from tests.processors.usage.series import HOLDER_PID, NOTEBOOK_PID, TRAINER_PID, probe_requests, recording, with_attributes

WANTED = ["hw.gpu.utilization", "hw.energy", "hw.gpu.memory.usage", "hw.gpu.memory.limit",
          "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
          "gputally.gpu.process.utilization", "gputally.gpu.process.memory.usage",
          "gputally.inference.tokens", "gputally.inference.busy.time"]
OTHER = ["hw.gpu.temperature", "hw.power", "x"]


def observer() -> Observer:
    return Observer(OwnerRules(UsageConfig().owners))


def held(observations: Iterable[Observation]) -> dict[tuple[str, int], tuple[Any, dict[str, Any]]]:
    """What the ledger holds from ``observations``, by (GPU, time): its reading and its
    processes', a later one replacing an earlier (as ``Ledger.add_all`` merges them). The
    layout path gives one observation per GPU, the general one per resource: these agree."""
    out: dict[tuple[str, int], tuple[Any, dict[str, Any]]] = {}
    for hw_id, time_ns, device, processes in observations:
        before, known = out.get((hw_id, time_ns), (None, {}))
        out[(hw_id, time_ns)] = (device if device is not None else before, {**known, **processes})
    return out


def served(reader: Observer) -> dict[tuple[Any, int], dict[Any, tuple[int, float]]]:
    """What the ledger would hold of the engine readings the reader gathered: by (endpoint,
    time), each series' (start, value), a later resource's replacing an earlier's."""
    out: dict[tuple[Any, int], dict[Any, tuple[int, float]]] = {}
    for reading in reader.take_engines():
        out.setdefault((reading.decision, reading.time_ns), {}).update(reading.points)
    return out


def laid_out(reader: Observer, layout: Layout, raw: bytes) -> tuple[dict[Any, Any], dict[Any, Any]]:
    return held(reader._laid_out(layout, raw)), served(reader)


def parsed(reader: Observer, raw: bytes) -> tuple[dict[Any, Any], dict[Any, Any]]:
    return held(reader._parsed(raw)), served(reader)


def both(raw: bytes) -> tuple[tuple[dict[Any, Any], dict[Any, Any]], tuple[dict[Any, Any], dict[Any, Any]]]:
    """What the ledger would hold, GPUs' and engines' (through a layout built from ``raw``, the general way)."""
    reader = observer()
    layout = reader._layout(raw)
    assert layout.matches(raw)
    return laid_out(reader, layout, raw), parsed(reader, raw)


def _kv(key: str, value: Any) -> KeyValue:
    kv = KeyValue(key=key)
    if isinstance(value, str):
        kv.value.string_value = value
    elif isinstance(value, list):
        kv.value.array_value.values.extend(_kv("", v).value for v in value)
    else:
        kv.value.int_value = value
    return kv


@st.composite
def requests(draw: st.DrawFn) -> ExportMetricsServiceRequest:
    """GPU, process, inference-engine and unrelated resources with wanted and other metrics,
    gauges, sums and histograms, several sample times and start times, double, int and missing
    values, GPU-engine (``hw.gpu.task``) and served-model attributes."""
    request = ExportMetricsServiceRequest()
    times = draw(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=3))
    for _ in range(draw(st.integers(0, 4))):
        rm = request.resource_metrics.add()
        gpu = f"GPU-{draw(st.integers(0, 2))}"
        kind = draw(st.sampled_from(["gpu", "process", "other", "empty", "engine"]))
        if kind == "engine":
            rm.resource.attributes.append(_kv("gputally.inference.engine", draw(st.sampled_from(["vllm", "tgi"]))))
            rm.resource.attributes.append(_kv("server.port", draw(st.integers(8000, 8001))))
            if draw(st.booleans()):
                rm.resource.attributes.append(_kv("gputally.inference.gpu.ids", [gpu]))
                rm.resource.attributes.append(_kv("gputally.inference.gpu.pids", [draw(st.integers(1, 3))]))
        elif kind != "empty":
            rm.resource.attributes.append(_kv("hw.id", gpu) if kind != "other" else _kv("host.name", "n"))
        if kind in ("process", "engine"):
            rm.resource.attributes.append(_kv("process.pid", draw(st.integers(1, 3))))
            if draw(st.booleans()):
                rm.resource.attributes.append(_kv("k8s.namespace.name", "ml"))
                rm.resource.attributes.append(_kv("k8s.pod.name", f"p{draw(st.integers(0, 1))}"))
        if kind == "gpu" and draw(st.booleans()):
            rm.resource.attributes.append(_kv("slurm.job.id", draw(st.integers(1, 3))))
        for _ in range(draw(st.integers(1, 2))):
            sm = rm.scope_metrics.add()
            for _ in range(draw(st.integers(0, 5))):
                metric = sm.metrics.add(name=draw(st.sampled_from(WANTED + OTHER)))
                shape = draw(st.sampled_from(["gauge", "sum", "histogram"]))
                if shape == "histogram":
                    point = metric.histogram.data_points.add(time_unix_nano=draw(st.sampled_from(times)), count=3)
                    point.bucket_counts.extend([1, 2])
                    point.explicit_bounds.append(0.5)
                    continue
                data = metric.gauge if shape == "gauge" else metric.sum
                for _ in range(draw(st.integers(0, 3))):
                    point = data.data_points.add()
                    if draw(st.booleans()):
                        point.time_unix_nano = draw(st.sampled_from(times))
                    value = draw(st.sampled_from(["double", "int", "none"]))
                    if value == "double":
                        point.as_double = draw(st.floats(allow_nan=False, allow_infinity=False, width=64))
                    elif value == "int":
                        point.as_int = draw(st.integers(-(2**63), 2**63 - 1))
                    if draw(st.booleans()):
                        point.start_time_unix_nano = draw(st.sampled_from(times))
                    task = draw(st.sampled_from([None, "general", "encoder"]))
                    if task is not None:
                        point.attributes.append(_kv("hw.gpu.task", task))
                    for key, values in (("gen_ai.request.model", ["m1", "m2"]), ("gen_ai.token.type", ["input", "output"])):
                        value = draw(st.sampled_from([None, *values]))
                        if value is not None:
                            point.attributes.append(_kv(key, value))
    return request


def renumbered(request: ExportMetricsServiceRequest, seed: int) -> ExportMetricsServiceRequest:
    """``request`` with every number point's time and value changed, as the next cycle would send it."""
    out = ExportMetricsServiceRequest.FromString(request.SerializeToString())
    for rm in out.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                data = metric.gauge if metric.HasField("gauge") else metric.sum
                for i, point in enumerate(data.data_points):
                    if point.time_unix_nano:
                        point.time_unix_nano = (point.time_unix_nano + seed * (i % 2 + 1)) % 2**64 or 1
                    if point.start_time_unix_nano:
                        point.start_time_unix_nano = (point.start_time_unix_nano + seed) % 2**64 or 1
                    if point.WhichOneof("value") == "as_double":
                        point.as_double = point.as_double * 0.5 + seed
                    elif point.WhichOneof("value") == "as_int":
                        point.as_int = (point.as_int + seed) % 2**62
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests(), st.integers(1, 10**9))
def test_a_layout_reads_what_the_parse_reads(request: ExportMetricsServiceRequest, seed: int) -> None:
    raw = request.SerializeToString()
    through_layout, through_parse = both(raw)
    assert through_layout == through_parse

    # The next cycle: only numbers changed, so the same layout matches and still agrees.
    reader = observer()
    layout = reader._layout(raw)
    nxt = renumbered(request, seed).SerializeToString()
    assert layout.matches(nxt)
    assert laid_out(reader, layout, nxt) == parsed(reader, nxt)


@pytest.fixture(scope="module")
def probe_series() -> list[bytes]:
    """The real H200 recording as the NVIDIA probe sends it, attributed as k8s and slurm would."""
    processes = {TRAINER_PID: {"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0"},
                 NOTEBOOK_PID: {"k8s.namespace.name": "ml", "k8s.pod.name": "jupyter-bob-0"},
                 HOLDER_PID: {"slurm.job.id": 90210}}
    sent = asyncio.run(probe_requests(recording(), base_ns=1_800_000_000 * 10**9))
    return [with_attributes(r, processes=processes, gpu={"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0"})
            .SerializeToString() for r in sent]


def test_the_probe_series_reads_the_same_through_layouts(probe_series: list[bytes]) -> None:
    reader, general = observer(), observer()
    for raw in probe_series:
        assert held(reader.observe(raw)) == held(general._parsed(raw))
    assert reader.layouts.hits > 0, "no request of the recording was read through a layout"


def test_engines_beside_the_probe_series_read_the_same_through_layouts(probe_series: list[bytes]) -> None:
    """Two engines' resources in each cycle, their counters moving: each layout-read request
    gives the same engine readings (series, start times, values) as its parse."""
    from tests.processors.usage.engines import Engine, with_engines

    gpu = ExportMetricsServiceRequest.FromString(probe_series[0]).resource_metrics[0]
    hw_id = next(kv.value.string_value for kv in gpu.resource.attributes if kv.key == "hw.id")
    engines = [Engine("vllm", {"process.pid": 9, "k8s.pod.uid": "u", "gputally.inference.gpu.ids": [hw_id],
                               "gputally.inference.gpu.pids": [TRAINER_PID]}, 1_799_999_000 * 10**9),
               Engine("llamacpp", {"process.pid": 10, "server.port": 8080}, 1_799_999_000 * 10**9)]
    reader, general = observer(), observer()
    read = 0
    for n, raw in enumerate(probe_series):
        engines[0].tokens = {("m", "input"): 1000 + 17 * n, ("m", "output"): 10 + n}
        engines[0].busy = {"m": 0.5 * n, "m-lora": 0.25 * n}
        engines[1].tokens = {("tiny", "output"): 3 * n}
        engines[1].start_ns += 10**9 * (n == 5)  # a restart: its start time moves
        request = with_engines(ExportMetricsServiceRequest.FromString(raw), engines).SerializeToString()
        got = held(reader.observe(request)), served(reader)
        assert got == (held(general._parsed(request)), served(general))
        read += len(got[1])
    assert reader.layouts.hits > 0 and read == 2 * len(probe_series)


def test_only_numbers_may_change(probe_series: list[bytes]) -> None:
    raw = probe_series[0]
    layout = observer()._layout(raw)
    request = ExportMetricsServiceRequest.FromString(raw)
    # Same length, other bytes: an attribute value, a metric name, a varint (aggregation temporality).
    host = next(kv for kv in request.resource_metrics[0].resource.attributes if kv.key == "host.name")
    host.value.string_value = host.value.string_value[:-1] + "X"
    assert not layout.matches(request.SerializeToString())
    request = ExportMetricsServiceRequest.FromString(raw)
    metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
    metric.name = metric.name[:-1] + "X"
    assert not layout.matches(request.SerializeToString())
    request = ExportMetricsServiceRequest.FromString(raw)
    summed = next(m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  if m.HasField("sum"))
    summed.sum.aggregation_temporality = 3 - summed.sum.aggregation_temporality
    assert not layout.matches(request.SerializeToString())
    assert not layout.matches(raw + b"\x00")


def test_every_byte_but_the_numbers_is_checked(probe_series: list[bytes]) -> None:
    """The skeleton is compared eight bytes at a time plus a tail shorter than eight: a change
    to any single kept byte, in a whole word or in the tail, misses; a change to a blanked
    (number) byte still matches."""
    raw = next(r for r in probe_series if len(r) % 8)
    layout = observer()._layout(raw)
    skeleton = layout.skeleton
    kept = (skeleton.mask.tobytes()
            + skeleton.tail_mask.to_bytes(len(raw) % 8, "little"))
    assert len(kept) == len(raw)
    for at in range(len(raw)):
        changed = bytearray(raw)
        changed[at] ^= 0x01
        assert layout.matches(bytes(changed)) == (kept[at] == 0), at


@pytest.mark.parametrize("raw", [
    # a resource written twice (protobuf merges them), a metric name twice (the last counts)
    ExportMetricsServiceRequest().SerializeToString() + b"\x0a\x06\x0a\x00\x0a\x02\x0a\x00",
    b"\x0a\x0c\x12\x0a\x12\x08\x0a\x01a\x0a\x01b\x2a\x00",
    b"\x0a\x02\x0a",  # truncated
    b"\x0b",  # a group
], ids=["resource-twice", "name-twice", "truncated", "group"])
def test_what_a_layout_cannot_prove_is_read_the_general_way(raw: bytes) -> None:
    with pytest.raises(Malformed):
        observer()._layout(raw)


def _field(number: int, payload: bytes) -> bytes:
    return encode_varint(number << 3 | 2) + encode_varint(len(payload)) + payload


def test_a_point_with_two_values_is_not_proven() -> None:
    """as_double then as_int in one point: protobuf keeps the last; a layout does not guess."""
    point = b"\x21" + struct.pack("<d", 1.0) + b"\x31" + struct.pack("<q", 5)
    metric = _field(1, b"hw.energy") + _field(7, _field(1, point))
    raw = _field(1, _field(2, _field(2, metric)))
    assert ExportMetricsServiceRequest.FromString(raw).resource_metrics[0].scope_metrics[0].metrics[0].sum \
        .data_points[0].as_int == 5
    with pytest.raises(Malformed):
        observer()._layout(raw)


class TestLayouts:
    def layouts(self, budget: int = 1 << 20) -> tuple[Shapes[Layout], list[bytes]]:
        built: list[bytes] = []
        reader = observer()

        def build(raw: bytes) -> Layout:
            built.append(raw)
            return reader._layout(raw)

        return Shapes(build, budget=budget), built

    def test_built_on_the_second_sighting_then_reused(self, probe_series: list[bytes]) -> None:
        layouts, built = self.layouts()
        assert layouts.lookup(probe_series[1]) is None
        assert layouts.lookup(probe_series[2]) is not None
        for raw in probe_series[3:5]:
            assert layouts.lookup(raw) is not None
        assert len(built) == 1 and layouts.hits == 2

    def test_a_shape_that_keeps_changing_is_left_alone(self) -> None:
        layouts, built = self.layouts()
        counted = ExportMetricsServiceRequest()
        point = counted.resource_metrics.add().scope_metrics.add().metrics.add(name="n").sum.data_points.add()
        for flags in range(1, 128):  # a varint that changes on every request: never the same skeleton
            point.flags = flags
            layouts.lookup(counted.SerializeToString())
        assert len(built) == 4 and layouts.hits == 0  # its free builds, then it rests

    def test_a_full_budget_reads_newcomers_the_general_way(self, probe_series: list[bytes]) -> None:
        budget = 3 * len(probe_series[0])
        layouts, built = self.layouts(budget=budget)
        for raw in probe_series[:3]:
            layouts.lookup(raw)
        assert len(built) == 1
        other = with_host(probe_series[0], "another-node")
        for _ in range(5):
            assert layouts.lookup(other) is None
        assert len(built) == 1 and 0 < layouts.held <= budget


def with_host(raw: bytes, host: str) -> bytes:
    request = ExportMetricsServiceRequest.FromString(raw)
    for rm in request.resource_metrics:
        for kv in rm.resource.attributes:
            if kv.key == "host.name":
                kv.value.string_value = host
    return request.SerializeToString()


def test_a_sweep_makes_room_for_the_shapes_in_use(probe_series: list[bytes]) -> None:
    built: list[bytes] = []
    reader = observer()
    layouts: Shapes[Layout] = Shapes(lambda raw: built.append(raw) or reader._layout(raw), budget=3 * len(probe_series[0]))
    gone, new = probe_series[1], with_host(probe_series[1], "another-node")
    layouts.lookup(gone)
    assert layouts.lookup(gone) is not None
    for _ in range(2100):  # the first node went quiet for two sweeps; the new one keeps sending
        found = layouts.lookup(new)
    assert found is not None and found.matches(new) and len(built) == 2
    assert layouts.lookup(gone) is None  # swept: its next request is a first sighting again


def test_two_shapes_under_one_key_both_keep_their_layouts(probe_series: list[bytes]) -> None:
    """Two requests alike in length and first resource (one node's shapes, or two nodes') alternate."""
    built: list[bytes] = []
    reader = observer()
    layouts: Shapes[Layout] = Shapes(lambda raw: built.append(raw) or reader._layout(raw))
    first = probe_series[1]
    request = ExportMetricsServiceRequest.FromString(first)
    last = request.resource_metrics[-1].resource.attributes
    host = next(kv for kv in last if kv.key == "host.name")
    host.value.string_value = host.value.string_value[:-1] + "Z"
    second = request.SerializeToString()
    assert len(second) == len(first)
    for _ in range(20):
        layouts.lookup(first)
        layouts.lookup(second)
    assert len(built) == 2 and layouts.hits == 40 - 3


def test_no_layout_cache_reads_every_request_the_general_way(probe_series: list[bytes]) -> None:
    rt = runtime(layout_cache_mib=0)
    for raw in probe_series:
        rt.observe(raw)
    rt.account()
    layouts = rt.observer.layouts
    assert layouts.requests == len(probe_series) and layouts.hits == 0 and layouts.held == 0
