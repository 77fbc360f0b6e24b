"""Patch answers: what the bridge sends a caller that takes them, when its pipeline only annotates.

:class:`Patches` is checked against the resources it diffs (every attribute type, removal,
drops, an empty patch, and the changes a patch cannot say, which fall back to the whole
batch); a real ``Service`` is called through the generated client, with and without
``accept_patch``, and the patch applied to the request (by :func:`apply`, the contract's
rules written in Python) must give the whole-batch answer. Applying and refusing patches is
the Collector processor's job: its Go tests hold positions past the end and other shapes.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gputally.pipeline.config import validate
from gputally.pipeline.registry import Registry
from gputally.pipeline.service import Service
from gputally.proto.bridge.v1 import bridge_pb2, bridge_pb2_grpc
from gputally.receiver.bridge.patch import Patches

from .test_bridge import metrics_request


def every_type() -> list[KeyValue]:
    """One attribute of each AnyValue kind, nested ones included."""
    values = [
        KeyValue(key="s", value=AnyValue(string_value="trainer-0")),
        KeyValue(key="b", value=AnyValue(bool_value=True)),
        KeyValue(key="i", value=AnyValue(int_value=-7)),
        KeyValue(key="d", value=AnyValue(double_value=0.25)),
        KeyValue(key="raw", value=AnyValue(bytes_value=b"\x00\xff")),
        KeyValue(key="empty", value=AnyValue()),
    ]
    array = KeyValue(key="arr")
    array.value.array_value.values.add(string_value="a")
    array.value.array_value.values.add(int_value=2)
    kvlist = KeyValue(key="map")
    kvlist.value.kvlist_value.values.add(key="inner", value=AnyValue(string_value="x"))
    return [*values, array, kvlist]


def request_of(resources: list[Resource]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for resource in resources:
        entry = request.resource_metrics.add()
        entry.resource.CopyFrom(resource)
        entry.scope_metrics.add().metrics.add(name="gpu.utilization").gauge.data_points.add().as_double = 1.0
    return request


def resource(**attrs: str) -> Resource:
    out = Resource()
    for key, value in attrs.items():
        out.attributes.add(key=key).value.string_value = value
    return out


def apply(request: ExportMetricsServiceRequest, patch: bridge_pb2.Patch) -> ExportMetricsServiceRequest:
    """The patch applied to a copy of ``request`` by proto/bridge/README.md's rules (no checks)."""
    out = copy.deepcopy(request)
    dropped_metrics = []
    for rp in patch.resources:
        attrs = out.resource_metrics[rp.index].resource.attributes
        kept = [kv for kv in attrs if kv.key not in set(rp.attributes.remove)]
        for kv in rp.attributes.set:
            new = KeyValue.FromString(kv.SerializeToString())
            at = next((n for n, old in enumerate(kept) if old.key == new.key), None)
            if at is None:
                kept.append(new)
            else:
                kept[at] = new
        del attrs[:]
        attrs.extend(kept)
        for sp in rp.scopes:
            metrics = out.resource_metrics[rp.index].scope_metrics[sp.index].metrics
            dropped_metrics.append((metrics, [mp.index for mp in sp.metrics if mp.drop]))
    for metrics, positions in dropped_metrics:
        keep = [m for k, m in enumerate(metrics) if k not in positions]
        del metrics[:]
        metrics.extend(keep)
    return out


def sorted_attributes(request: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:
    out = copy.deepcopy(request)
    for entry in out.resource_metrics:
        attrs = sorted(entry.resource.attributes, key=lambda kv: kv.key)
        kept = [KeyValue.FromString(kv.SerializeToString()) for kv in attrs]
        del entry.resource.attributes[:]
        entry.resource.attributes.extend(kept)
    return out


def build(before: ExportMetricsServiceRequest, after: ExportMetricsServiceRequest, **options: Any) -> bridge_pb2.Patch | None:
    items = sum(len(m.gauge.data_points) for rm in before.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)
    raw = Patches().build(before.SerializeToString(), after.SerializeToString(), items=items, **options)
    return None if raw is None else bridge_pb2.Patch.FromString(raw)


def test_appended_attributes_of_every_type_are_set() -> None:
    before = request_of([resource(**{"hw.id": "GPU-0"}), resource(**{"hw.id": "GPU-1"})])
    after = copy.deepcopy(before)
    after.resource_metrics[1].resource.attributes.extend(every_type())

    patch = build(before, after)

    assert patch is not None
    assert (patch.resource_count, patch.item_count) == (2, 2)
    assert [rp.index for rp in patch.resources] == [1]
    assert [kv.SerializeToString() for kv in patch.resources[0].attributes.set] == [
        kv.SerializeToString() for kv in every_type()]
    assert list(patch.resources[0].attributes.remove) == []
    assert apply(before, patch) == after


def test_removed_and_replaced_attributes() -> None:
    before = request_of([resource(**{"hw.id": "GPU-0", "stale": "x", "k8s.pod.name": "old"})])
    after = request_of([resource(**{"hw.id": "GPU-0", "k8s.pod.name": "new"})])

    patch = build(before, after)

    assert patch is not None
    attributes = patch.resources[0].attributes
    assert list(attributes.remove) == ["stale"]
    assert [(kv.key, kv.value.string_value) for kv in attributes.set] == [("k8s.pod.name", "new")]
    assert apply(before, patch) == after


def test_nothing_changed_is_an_empty_patch() -> None:
    before = request_of([resource(**{"hw.id": "GPU-0"})])
    raw = before.SerializeToString()

    patch = bridge_pb2.Patch.FromString(Patches().build(raw, raw, items=1) or b"\xff")

    assert patch == bridge_pb2.Patch(resource_count=1, item_count=1)


def test_drops_are_addressed_by_position_as_sent() -> None:
    before = request_of([resource(**{"hw.id": "GPU-0"}), resource(**{"hw.id": "GPU-1"})])
    after = copy.deepcopy(before)
    after.resource_metrics[0].resource.attributes.add(key="k8s.pod.name").value.string_value = "p"

    patch = build(before, after, drops={1: {0: [0]}})

    assert patch is not None
    assert [(rp.index, len(rp.attributes.set), [(sp.index, [(m.index, m.drop) for m in sp.metrics]) for sp in rp.scopes])
            for rp in patch.resources] == [(0, 1, []), (1, 0, [(0, [(0, True)])])]


@pytest.mark.parametrize("change", ["dropped_attributes_count", "duplicate key", "an entry more"])
def test_what_a_patch_cannot_say_falls_back_to_the_whole_batch(change: str) -> None:
    before = request_of([resource(**{"hw.id": "GPU-0"})])
    after = copy.deepcopy(before)
    if change == "dropped_attributes_count":
        after.resource_metrics[0].resource.dropped_attributes_count = 3
    elif change == "duplicate key":
        after.resource_metrics[0].resource.attributes.add(key="hw.id").value.string_value = "GPU-9"
    else:
        after.resource_metrics.add()

    assert build(before, after) is None


def patch_config(port: int) -> dict[str, Any]:
    return {
        "receivers": {"bridge": {"endpoint": f"127.0.0.1:{port}"}},
        "processors": {
            "attributes/cluster": {"actions": [
                {"key": "k8s.cluster.name", "value": "prod", "action": "insert", "context": "resource"},
                {"key": "stale", "action": "delete", "context": "resource"}]},
            "attributes/points": {"actions": [{"key": "p", "value": "1", "action": "insert"}]},
        },
        "exporters": {"debug": {}},
        "service": {
            "pipelines": {
                "metrics/annotate": {"receivers": ["bridge"], "processors": ["attributes/cluster"], "exporters": ["debug"]},
                "metrics/points": {"receivers": ["bridge"], "processors": ["attributes/points"], "exporters": ["debug"]},
                "metrics/none": {"receivers": ["bridge"], "exporters": ["debug"]},
            },
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    }


@pytest.fixture
async def stub() -> AsyncIterator[bridge_pb2_grpc.BridgeStub]:
    service = Service(validate(patch_config(0), Registry.discover()))
    await service.start()
    channel = grpc.aio.insecure_channel(service.receivers["bridge"].listening()["grpc"])
    try:
        yield bridge_pb2_grpc.BridgeStub(channel)
    finally:
        await channel.close()
        await service.shutdown()


async def answers(stub: bridge_pb2_grpc.BridgeStub, sent: ExportMetricsServiceRequest,
                  pipeline: str) -> tuple[bridge_pb2.ProcessMetricsResponse, bridge_pb2.ProcessMetricsResponse]:
    """The same batch answered with and without accept_patch."""
    otlp = sent.SerializeToString()
    patched = await stub.ProcessMetrics(bridge_pb2.ProcessMetricsRequest(otlp=otlp, pipeline=pipeline, accept_patch=True))
    whole = await stub.ProcessMetrics(bridge_pb2.ProcessMetricsRequest(otlp=otlp, pipeline=pipeline))
    return patched, whole


async def test_an_annotating_pipeline_answers_a_patch_that_gives_the_whole_answer(
    stub: bridge_pb2_grpc.BridgeStub,
) -> None:
    sent = metrics_request("hw.gpu.utilization", attrs={"hw.id": "GPU-1", "stale": "x"})
    sent.resource_metrics.add().CopyFrom(metrics_request("hw.gpu.power", attrs={"hw.id": "GPU-2"}).resource_metrics[0])

    patched, whole = await answers(stub, sent, "metrics/annotate")

    assert patched.HasField("patch") and patched.otlp == b""
    assert not whole.HasField("patch") and whole.otlp
    assert sorted_attributes(apply(sent, patched.patch)) == sorted_attributes(
        ExportMetricsServiceRequest.FromString(whole.otlp))
    assert (patched.patch.resource_count, patched.patch.item_count) == (2, 2)


async def test_a_pipeline_that_changes_points_answers_the_whole_batch(stub: bridge_pb2_grpc.BridgeStub) -> None:
    patched, whole = await answers(stub, metrics_request("hw.gpu.utilization"), "metrics/points")

    assert not patched.HasField("patch")
    assert patched.otlp == whole.otlp != b""


async def test_no_processors_is_an_empty_patch(stub: bridge_pb2_grpc.BridgeStub) -> None:
    patched, _ = await answers(stub, metrics_request("hw.gpu.utilization"), "metrics/none")

    assert patched.HasField("patch")
    assert patched.patch == bridge_pb2.Patch(resource_count=1, item_count=1)


async def test_nameless_metrics_are_dropped_by_the_patch(stub: bridge_pb2_grpc.BridgeStub) -> None:
    sent = metrics_request("hw.gpu.utilization", "", "hw.gpu.power")

    patched, whole = await answers(stub, sent, "metrics/annotate")

    assert patched.dropped_items == whole.dropped_items == 1
    assert patched.patch.item_count == 3
    assert sorted_attributes(apply(sent, patched.patch)) == sorted_attributes(
        ExportMetricsServiceRequest.FromString(whole.otlp))


def test_a_request_of_the_same_lengths_gets_its_own_patch() -> None:
    """The last patch of a request shape is reused only for the same resources."""
    patches = Patches()
    answers = []
    for node in ("GPU-1", "GPU-2"):  # same lengths, other resources
        before = request_of([resource(**{"hw.id": node})])
        after = copy.deepcopy(before)
        after.resource_metrics[0].resource.attributes.add(key="k8s.pod.name").value.string_value = f"pod-{node[-1]}"
        for _ in range(2):
            raw = patches.build(before.SerializeToString(), after.SerializeToString(), items=1)
            assert raw is not None
            answers.append(bridge_pb2.Patch.FromString(raw))
            assert apply(before, answers[-1]) == after
    assert answers[0] == answers[1] != answers[2] == answers[3]
