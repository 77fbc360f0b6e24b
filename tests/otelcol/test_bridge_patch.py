"""Patch answers between the real otelcol and gputally's bridge: the same batches come out of
the Collector whether gputally answers with what changed (``accept_patch: true``, the
processor's default) or with the whole batch (``accept_patch: false``), byte for byte once
attributes are sorted (a map's order is not part of its meaning, and pdata's ``Remove`` moves
the last attribute into the gap)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import pytest
from harness.otelcol.collector import Otelcol
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from gputally.receiver.bridge.patch import Patches
from support.otlp import OtlpSink
from tests.otelcol.shapes import METRICS_EXPORT
from tests.otelcol.test_bridge_processor import add_pipeline, bridge_config, serving


def node_request(node: int) -> ExportMetricsServiceRequest:
    """A node's GPUs and one process, gauges, sums and a histogram, points with attributes,
    one metric without a name (gputally drops it as invalid), resources that already hold a
    key the pipeline upserts and one it deletes."""
    request = ExportMetricsServiceRequest()
    for gpu in range(3):
        rm = request.resource_metrics.add()
        for key, value in (("host.name", f"node-{node}"), ("hw.id", f"GPU-{gpu}"), ("hw.type", "gpu"),
                           ("probe.build", "dev")):
            rm.resource.attributes.add(key=key).value.string_value = value
        if gpu == 1:
            rm.resource.attributes.add(key="k8s.cluster.name").value.string_value = "stale"
        scope = rm.scope_metrics.add()
        scope.scope.name = "gputally.probe.nvml"
        util = scope.metrics.add(name="hw.gpu.utilization")
        for task in ("general", "encoder"):
            point = util.gauge.data_points.add(as_double=0.5 + gpu, time_unix_nano=1_700_000_000_000_000_000 + node)
            point.attributes.add(key="hw.gpu.task").value.string_value = task
        energy = scope.metrics.add(name="hw.energy")
        energy.sum.aggregation_temporality = 2
        energy.sum.is_monotonic = True
        energy.sum.data_points.add(as_int=1000 * gpu + node, time_unix_nano=1_700_000_000_000_000_000)
        hist = scope.metrics.add(name="gpu.kernel.duration")
        hist.histogram.data_points.add(count=3, sum=1.5, bucket_counts=[1, 2], explicit_bounds=[0.5])
        if gpu == 2:
            scope.metrics.add().gauge.data_points.add(as_double=1.0)  # no name: dropped as invalid
    return request


def sorted_attributes(request: ExportMetricsServiceRequest) -> bytes:
    """The request's encoding with every resource's and point's attributes in key order."""

    def sort(attributes: Any) -> None:
        ordered = [KeyValue.FromString(kv.SerializeToString()) for kv in sorted(attributes, key=lambda kv: kv.key)]
        del attributes[:]
        attributes.extend(ordered)

    for rm in request.resource_metrics:
        sort(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    for point in getattr(metric, kind).data_points:
                        sort(point.attributes)
    return request.SerializeToString()


def annotating_bridge() -> dict[str, Any]:
    """gputally's bridge (port 0) with a pipeline that only annotates resources: an insert,
    an upsert of a key one resource holds, and a delete."""
    return {
        "receivers": {"bridge": {"endpoint": "127.0.0.1:0"}},
        "processors": {"attributes/annotate": {"actions": [
            {"key": "k8s.pod.name", "value": "trainer-0", "action": "insert", "context": "resource"},
            {"key": "k8s.cluster.name", "value": "prod", "action": "upsert", "context": "resource"},
            {"key": "probe.build", "action": "delete", "context": "resource"}]}},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"metrics/bridge": {"receivers": ["bridge"], "processors": ["attributes/annotate"],
                                                     "exporters": ["debug"]}},
                    "telemetry": {"metrics": {"address": None}}},
    }


async def test_patch_and_whole_batch_answers_come_out_of_otelcol_alike(
    otelcol: Callable[..., Otelcol], otlp_sink: OtlpSink, monkeypatch: pytest.MonkeyPatch,
) -> None:
    patches: list[bool] = []
    build = Patches.build

    def counted(self: Patches, *args: Any, **kwargs: Any) -> bytes | None:
        patch = build(self, *args, **kwargs)
        patches.append(patch is not None)
        return patch

    monkeypatch.setattr(Patches, "build", counted)  # a spy: every answer is still gputally's own
    async with serving(annotating_bridge()) as port:
        config = bridge_config(port, otlp_sink.endpoint, on_error="fail")
        add_pipeline(config, "whole", accept_patch=False)
        collector = otelcol(config)
        patch_port, whole_port = collector.port("otlp"), collector.port("otlp/whole")

        batches = [node_request(node) for node in range(3)]
        delivered: dict[int, list[bytes]] = {}
        for front in (patch_port, whole_port):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front}") as channel:
                export = channel.unary_unary(METRICS_EXPORT)
                for batch in batches:
                    seen = len(otlp_sink.received_metrics())
                    await export(batch.SerializeToString(), timeout=10)
                    await otlp_sink.wait_for(lambda seen=seen: len(otlp_sink.received_metrics()) == seen + 1)
            delivered[front] = [sorted_attributes(m) for m in otlp_sink.messages()[-len(batches):]]

    assert patches == [True] * len(batches), "the first pipeline's calls were answered with patches"
    assert delivered[patch_port] == delivered[whole_port]
    first = ExportMetricsServiceRequest.FromString(delivered[patch_port][0])
    attrs = {kv.key: kv.value.string_value for kv in first.resource_metrics[1].resource.attributes}
    assert attrs == {"host.name": "node-0", "hw.id": "GPU-1", "hw.type": "gpu", "k8s.cluster.name": "prod",
                     "k8s.pod.name": "trainer-0"}
    names = [m.name for m in first.resource_metrics[2].scope_metrics[0].metrics]
    assert names == ["hw.gpu.utilization", "hw.energy", "gpu.kernel.duration"], "the nameless metric is dropped"
