"""Regrouping a prometheus-receiver scrape of dcgm-exporter into one resource per GPU."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.processors.dcgm import DcgmProcessor, factory
from gputally.processors.dcgm.regroup import CONSTANTS, ROLE_KEYS
from gputally.telemetry import SelfTelemetry

from .scrape import (
    FAMILIES,
    GPU0,
    GPU0_UUID,
    GPU1,
    GPU1_UUID,
    RECEIVER_METRICS,
    SCOPE,
    SCOPE_VERSION,
    TARGET,
    TWO_GPUS,
    Series,
    attrs,
    batch,
    points,
    request,
)

DEFAULT_LABELS = {
    "uuid": "UUID", "index": "gpu", "device": "device", "model": "modelName", "pci_bus_id": "pci_bus_id",
    "driver_version": "DCGM_FI_DRIVER_VERSION", "hostname": "Hostname",
}
TARGET_RESOURCE = {"service.name": "dcgm-exporter", "service.instance.id": TARGET, "server.port": "9400",
                   "url.scheme": "http"}
GPU0_RESOURCE = {
    **TARGET_RESOURCE,
    "hw.id": GPU0_UUID, "gputally.gpu.index": 0, "hw.name": "nvidia0", "hw.model": "NVIDIA H200",
    "gputally.gpu.pci.bus_id": "00000000:19:00.0", "hw.driver_version": "570.124.06", "host.name": "gpu-7",
    "hw.type": "gpu", "hw.vendor": "NVIDIA",
}
GPU1_RESOURCE = {**GPU0_RESOURCE, "hw.id": GPU1_UUID, "gputally.gpu.index": 1, "hw.name": "nvidia1",
                 "gputally.gpu.pci.bus_id": "00000000:3B:00.0"}
NOTEBOOK_POD = {"namespace": "notebooks", "pod": "jupyter-alice-0"}
RECEIVER_NAMES = [name for name, _, _ in RECEIVER_METRICS]
DCGM_NAMES = [family.name for family in FAMILIES]


def processor(config: Mapping[str, Any] | None = None) -> DcgmProcessor:
    created = factory.create(factory.parse(config), ComponentContext(id="dcgm", telemetry=SelfTelemetry()),
                             Signal.METRICS)
    assert isinstance(created, DcgmProcessor)
    return created


async def run(given: Batch, config: Mapping[str, Any] | None = None) -> ExportMetricsServiceRequest:
    """The processor's output as the next stage decodes it (and the item count still right)."""
    items = given.items
    out = await processor(config).process(given)
    assert out is given
    decoded = Batch.decode(Signal.METRICS, out.serialize())
    assert decoded.items == out.items == items
    return decoded.message


def layout(message: ExportMetricsServiceRequest) -> list[tuple[dict[str, Any], list[str]]]:
    """Per resource: its attributes and the names of its metrics (scope by scope)."""
    return [(attrs(rm.resource), [metric.name for sm in rm.scope_metrics for metric in sm.metrics])
            for rm in message.resource_metrics]


def labels_as_scraped(resource: dict[str, Any], point_attrs: dict[str, Any],
                      labels: Mapping[str, str | None] = DEFAULT_LABELS, source: Mapping[str, Any] = TARGET_RESOURCE
                      ) -> dict[str, Any]:
    """A regrouped point's labels put back: what it carried, plus what its resource took from it."""
    out = dict(point_attrs)
    for role, key in ROLE_KEYS.items():
        label = labels.get(role)
        if label and key in resource and key not in source and label not in out:
            out[label] = str(resource[key])
    return out


def census(message: ExportMetricsServiceRequest, *, regrouped: bool,
           source: Mapping[str, Any] = TARGET_RESOURCE) -> Counter[tuple[Any, ...]]:
    """Every point with everything that identifies it, labels as dcgm-exporter wrote them."""
    found: Counter[tuple[Any, ...]] = Counter()
    added = {*ROLE_KEYS.values(), *(key for key, _ in CONSTANTS)} - set(source)
    for rm, sm, kind, metric, point in points(message):
        target = tuple(sorted((k, v) for k, v in attrs(rm.resource).items() if k not in added))
        point_attrs = attrs(point)
        if regrouped:
            point_attrs = labels_as_scraped(attrs(rm.resource), point_attrs, source=source)
        data = getattr(metric, kind)
        bare = type(point)()
        bare.CopyFrom(point)
        del bare.attributes[:]
        found[(
            target, sm.scope.name, sm.scope.version, sm.schema_url, metric.name, metric.unit, metric.description,
            tuple((kv.key, kv.value.string_value) for kv in metric.metadata), kind,
            getattr(data, "aggregation_temporality", None), getattr(data, "is_monotonic", None),
            bare.SerializeToString(deterministic=True), tuple(sorted(point_attrs.items())),
        )] += 1
    return found


def assert_well_formed(message: ExportMetricsServiceRequest) -> None:
    """Each metric once per (resource, scope); no resource twice; no empty metric, scope or resource."""
    seen_resources = []
    for rm in message.resource_metrics:
        resource = sorted(attrs(rm.resource).items())
        assert resource not in seen_resources
        seen_resources.append(resource)
        assert rm.scope_metrics
        for sm in rm.scope_metrics:
            names = [metric.name for metric in sm.metrics]
            assert names and len(names) == len(set(names)), names
            for metric in sm.metrics:
                assert len(getattr(metric, metric.WhichOneof("data")).data_points) > 0


# --- the realistic scrape ---------------------------------------------------------------------


async def test_a_scrape_of_two_gpus_becomes_one_resource_per_gpu() -> None:
    out = await run(batch(TWO_GPUS))
    assert layout(out) == [
        (TARGET_RESOURCE, RECEIVER_NAMES),
        (GPU0_RESOURCE, DCGM_NAMES),
        (GPU1_RESOURCE, DCGM_NAMES),
    ]
    for rm in out.resource_metrics:
        [sm] = rm.scope_metrics
        assert (sm.scope.name, sm.scope.version) == (SCOPE, SCOPE_VERSION)


async def test_only_kubernetes_and_other_labels_stay_on_the_points() -> None:
    out = await run(batch(TWO_GPUS))
    gpu0, gpu1 = out.resource_metrics[1:]
    for metric in gpu0.scope_metrics[0].metrics:
        [point] = getattr(metric, metric.WhichOneof("data")).data_points
        assert attrs(point) == {"container": "notebook", "namespace": "notebooks", "pod": "jupyter-alice-0"}
    for metric in gpu1.scope_metrics[0].metrics:
        [point] = getattr(metric, metric.WhichOneof("data")).data_points
        assert attrs(point) == {}  # an idle GPU: dcgm-exporter's pod labels were empty


async def test_metric_identity_is_kept() -> None:
    before = {metric.name: metric for _, _, _, metric, _ in points(request(TWO_GPUS))}
    out = await run(batch(TWO_GPUS))
    for rm in out.resource_metrics[1:]:
        for metric in rm.scope_metrics[0].metrics:
            original = before[metric.name]
            kind = metric.WhichOneof("data")
            assert kind == original.WhichOneof("data")
            assert (metric.unit, metric.description, list(metric.metadata)) == (
                original.unit, original.description, list(original.metadata))
            shell, original_shell = m.Metric(), m.Metric()
            shell.CopyFrom(metric)
            original_shell.CopyFrom(original)
            del getattr(shell, kind).data_points[:]
            del getattr(original_shell, kind).data_points[:]
            assert shell == original_shell
    energy = next(metric for metric in out.resource_metrics[1].scope_metrics[0].metrics
                  if metric.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert energy.sum.is_monotonic and energy.sum.aggregation_temporality == m.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert energy.sum.data_points[0].as_double == 912345678.0


async def test_every_point_comes_out_exactly_once() -> None:
    given = request(TWO_GPUS, TWO_GPUS)  # two scrape targets: each keeps its own GPUs
    before = census(given, regrouped=False)
    assert sum(before.values()) == 2 * (len(RECEIVER_METRICS) + 2 * len(FAMILIES)) == 34
    assert set(before.values()) == {1}  # every input point distinct: a duplicate would show
    out = await run(Batch.decode(Signal.METRICS, given.SerializeToString()))
    assert census(out, regrouped=True) == before
    assert_well_formed(out)
    assert len(out.resource_metrics) == 6
    assert [attrs(rm.resource)["service.instance.id"] for rm in out.resource_metrics] == [
        TARGET, "10.0.3.18:9400", TARGET, TARGET, "10.0.3.18:9400", "10.0.3.18:9400"]


async def test_a_request_without_gpu_points_is_forwarded_as_received() -> None:
    raw = request([]).SerializeToString()  # the receiver's own gauges only (a target that is down)
    given = Batch.decode(Signal.METRICS, raw)
    out = await processor().process(given)
    assert out is given and out.serialize() is raw


async def test_the_label_name_elsewhere_alone_does_not_cost_a_re_encode() -> None:
    given = request([])
    given.resource_metrics[0].resource.attributes.add(key="UUID").value.string_value = "not a point label"
    point = given.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    point.attributes.add(key="UUID").value.int_value = 7  # not a string: not a GPU UUID
    point.attributes.add(key="note").value.string_value = "UUID"
    raw = given.SerializeToString()
    out = await processor().process(Batch.decode(Signal.METRICS, raw))
    assert out is not None and out.serialize() is raw


async def test_regrouped_output_passes_through_again_untouched() -> None:
    once = await run(batch(TWO_GPUS))
    raw = once.SerializeToString()
    again = await processor().process(Batch.decode(Signal.METRICS, raw))
    assert again is not None and again.serialize() is raw


# --- labels that are missing, odd or already on the resource ----------------------------------


async def test_without_a_hostname_label_there_is_no_host_name() -> None:
    gpu = Series(0, GPU0_UUID, "00000000:19:00.0", GPU0.values, hostname=None)
    out = await run(batch([gpu]))
    resource = attrs(out.resource_metrics[1].resource)
    assert "host.name" not in resource and resource["hw.id"] == GPU0_UUID
    assert attrs(out.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0]) == {}


async def test_a_host_name_the_resource_has_is_kept() -> None:
    same_host = request(TWO_GPUS)
    same_host.resource_metrics[0].resource.attributes.add(key="host.name").value.string_value = "gpu-7"
    out = await run(Batch.decode(Signal.METRICS, same_host.SerializeToString()))
    assert attrs(out.resource_metrics[1].resource)["host.name"] == "gpu-7"
    assert [kv.key for kv in out.resource_metrics[1].resource.attributes].count("host.name") == 1
    assert "Hostname" not in attrs(out.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0])

    other_host = request(TWO_GPUS)
    other_host.resource_metrics[0].resource.attributes.add(key="host.name").value.string_value = "collector-1"
    out = await run(Batch.decode(Signal.METRICS, other_host.SerializeToString()))
    assert attrs(out.resource_metrics[1].resource)["host.name"] == "collector-1"
    # the resource cannot say it, so the point still does
    assert attrs(out.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0])["Hostname"] == "gpu-7"


async def test_a_gpu_index_that_is_not_a_number_stays_on_the_point() -> None:
    gpu = Series("all", GPU0_UUID, "00000000:19:00.0", GPU0.values, device="nvidia0")
    out = await run(batch([gpu]))
    resource = attrs(out.resource_metrics[1].resource)
    assert "gputally.gpu.index" not in resource and resource["hw.name"] == "nvidia0"
    assert attrs(out.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0]) == {"gpu": "all"}


async def test_a_resource_that_is_already_a_gpu_keeps_other_gpus_points() -> None:
    given = request(TWO_GPUS)
    given.resource_metrics[0].resource.attributes.add(key="hw.id").value.string_value = GPU0_UUID
    out = await run(Batch.decode(Signal.METRICS, given.SerializeToString()))
    source, gpu0 = out.resource_metrics
    assert attrs(source.resource) == {**TARGET_RESOURCE, "hw.id": GPU0_UUID}
    # GPU1's points are not this resource's to move (nor to re-label): they stay as they came
    assert layout(out)[0][1] == [*RECEIVER_NAMES, *DCGM_NAMES]
    assert all(attrs(p)["UUID"] == GPU1_UUID for rm, _, _, metric, p in points(out)
               if rm is source and metric.name.startswith("DCGM"))
    assert attrs(gpu0.resource) == {**TARGET_RESOURCE, **GPU0_RESOURCE}
    assert [kv.key for kv in gpu0.resource.attributes].count("hw.id") == 1
    names = Counter(metric.name for _, _, _, metric, _ in points(out))
    assert names == Counter(metric.name for _, _, _, metric, _ in points(given))


async def test_mig_instances_stay_apart_on_their_gpus_resource() -> None:
    mig = {"GPU_I_ID": "1", "GPU_I_PROFILE": "1g.18gb"}
    instances = [
        Series(0, GPU0_UUID, "00000000:19:00.0", GPU0.values, extra={**mig, **NOTEBOOK_POD}),
        Series(0, GPU0_UUID, "00000000:19:00.0", GPU1.values, extra={"GPU_I_ID": "2", "GPU_I_PROFILE": "1g.18gb"}),
    ]
    out = await run(batch(instances))
    assert layout(out) == [(TARGET_RESOURCE, RECEIVER_NAMES), (GPU0_RESOURCE, DCGM_NAMES)]
    util = out.resource_metrics[1].scope_metrics[0].metrics[1]
    assert [attrs(p) for p in util.gauge.data_points] == [
        {"GPU_I_ID": "1", "GPU_I_PROFILE": "1g.18gb", **NOTEBOOK_POD}, {"GPU_I_ID": "2", "GPU_I_PROFILE": "1g.18gb"}]


async def test_relabelled_names_are_read_and_roles_can_be_switched_off() -> None:
    given = request(TWO_GPUS)
    renames = {"UUID": "gpu_uuid", "gpu": "gpu_index", "Hostname": "node"}
    for _, _, _, _, point in points(given):
        for kv in point.attributes:
            kv.key = renames.get(kv.key, kv.key)
    config = {"labels": {"uuid": "gpu_uuid", "index": "gpu_index", "hostname": "node", "driver_version": None}}
    out = await run(Batch.decode(Signal.METRICS, given.SerializeToString()), config)
    resource = attrs(out.resource_metrics[1].resource)
    assert resource["hw.id"] == GPU0_UUID and resource["gputally.gpu.index"] == 0 and resource["host.name"] == "gpu-7"
    assert "hw.driver_version" not in resource
    assert attrs(out.resource_metrics[1].scope_metrics[0].metrics[0].gauge.data_points[0]) == {
        "DCGM_FI_DRIVER_VERSION": "570.124.06", "container": "notebook", "namespace": "notebooks",
        "pod": "jupyter-alice-0"}
    # with the default names nothing here is a GPU point
    raw = given.SerializeToString()
    untouched = await processor().process(Batch.decode(Signal.METRICS, raw))
    assert untouched is not None and untouched.serialize() is raw


# --- every data kind --------------------------------------------------------------------------


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def every_kind_request() -> ExportMetricsServiceRequest:
    """Each data kind with points of two GPUs and one without a UUID, in two scopes."""
    given = ExportMetricsServiceRequest()
    rm = given.resource_metrics.add()
    rm.resource.attributes.extend([_kv("service.name", "dcgm-exporter")])
    rm.schema_url = "https://opentelemetry.io/schemas/1.26.0"
    scopes = [rm.scope_metrics.add(), rm.scope_metrics.add()]
    scopes[0].scope.name, scopes[1].scope.name = "first", "second"
    scopes[1].schema_url = "https://example.com/scope"
    labelled = [[_kv("UUID", GPU0_UUID), _kv("gpu", "0"), _kv("le_note", "a")], [_kv("UUID", GPU1_UUID)], [_kv("x", "y")]]
    for position, kind in enumerate(("gauge", "sum", "histogram", "exponential_histogram", "summary")):
        metric = scopes[position % 2].metrics.add(name=f"m.{kind}", unit="By", description=kind)
        data = getattr(metric, kind)
        if kind in ("sum", "histogram", "exponential_histogram"):
            data.aggregation_temporality = m.AGGREGATION_TEMPORALITY_DELTA
        for index, attributes in enumerate(labelled):
            point = data.data_points.add(attributes=attributes, time_unix_nano=10 + index)
            if kind in ("gauge", "sum"):
                point.as_int = 100 * position + index
            elif kind == "histogram":
                point.count, point.sum = 2 + index, 1.5
                point.bucket_counts.extend([1, 1 + index])
                point.explicit_bounds.append(1.0)
            elif kind == "exponential_histogram":
                point.count, point.scale, point.zero_count = 1 + index, 3, index
                point.positive.bucket_counts.append(1)
            else:
                point.count, point.sum = 1 + index, 2.0
                point.quantile_values.add(quantile=0.5, value=float(index))
    return given


async def test_every_data_kind_is_moved_and_points_without_a_uuid_stay() -> None:
    given = every_kind_request()
    before = census(given, regrouped=False)
    out = await run(Batch.decode(Signal.METRICS, given.SerializeToString()))
    assert_well_formed(out)
    source, gpu0, gpu1 = out.resource_metrics
    kinds = ["m.gauge", "m.histogram", "m.summary", "m.sum", "m.exponential_histogram"]
    assert [metric.name for sm in source.scope_metrics for metric in sm.metrics] == kinds
    assert [metric.name for sm in gpu0.scope_metrics for metric in sm.metrics] == kinds
    for rm in out.resource_metrics:
        assert rm.schema_url == "https://opentelemetry.io/schemas/1.26.0"
        assert [(sm.scope.name, sm.schema_url) for sm in rm.scope_metrics] == [
            ("first", ""), ("second", "https://example.com/scope")]
    assert all(attrs(p) == {"x": "y"} for rm, _, _, _, p in points(out) if rm is source)
    assert all(attrs(p) == {"le_note": "a"} for rm, _, _, _, p in points(out) if rm is gpu0)
    assert attrs(gpu1.resource) == {"service.name": "dcgm-exporter", "hw.id": GPU1_UUID, "hw.type": "gpu",
                                    "hw.vendor": "NVIDIA"}
    assert census(out, regrouped=True, source={"service.name": 1}) == before
    assert sum(before.values()) == 15 and set(before.values()) == {1}


async def test_a_scope_and_resource_left_empty_are_removed() -> None:
    given = every_kind_request()
    for _, _, _, _, point in points(given):
        if not any(kv.key == "UUID" for kv in point.attributes):
            point.attributes.add(key="UUID").value.string_value = GPU1_UUID
    out = await run(Batch.decode(Signal.METRICS, given.SerializeToString()))
    assert [attrs(rm.resource)["hw.id"] for rm in out.resource_metrics] == [GPU0_UUID, GPU1_UUID]
    assert_well_formed(out)


# --- any scrape -------------------------------------------------------------------------------

labels_text = st.text(alphabet="abcdef0123456789-", min_size=1, max_size=6)
series_strategy = st.builds(
    Series,
    index=st.one_of(st.integers(0, 7), st.just("x")),
    uuid=st.sampled_from([GPU0_UUID, GPU1_UUID, "GPU-c0ffee00-0000-0000-0000-000000000000"]),
    pci_bus_id=st.sampled_from(["00000000:19:00.0", "00000000:3B:00.0"]),
    values=st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=len(FAMILIES), max_size=len(FAMILIES)),
    hostname=st.one_of(st.none(), st.sampled_from(["gpu-7", "gpu-8"])),
    extra=st.dictionaries(st.sampled_from(["pod", "namespace", "container", "GPU_I_ID", "err_code"]), labels_text,
                          max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(targets=st.lists(st.lists(series_strategy, max_size=4), min_size=1, max_size=3))
async def test_any_scrape_keeps_every_point_once(targets: list[list[Series]]) -> None:
    given = request(*targets)
    # every point distinct, so that a duplicate or a loss shows in the counts
    for number, (_, _, _, _, point) in enumerate(points(given)):
        point.time_unix_nano = number
    before = census(given, regrouped=False)
    out = await run(Batch.decode(Signal.METRICS, given.SerializeToString()))
    assert census(out, regrouped=True) == before
    assert_well_formed(out)
    gpu_resources = [attrs(rm.resource) for rm in out.resource_metrics if "hw.id" in attrs(rm.resource)]
    assert {(r["service.instance.id"], r["hw.id"]) for r in gpu_resources} == {
        (instance, s.uuid) for instance, target in zip((TARGET, "10.0.3.18:9400", "10.0.3.19:9400"), targets)
        for s in target}


@pytest.mark.parametrize("signal", [Signal.LOGS, Signal.TRACES])
def test_only_metrics_pipelines(signal: Signal) -> None:
    assert factory.signals == frozenset({Signal.METRICS})
    with pytest.raises(ValueError, match="metrics"):
        factory.create(factory.parse(None), ComponentContext(id="dcgm", telemetry=SelfTelemetry()), signal)
