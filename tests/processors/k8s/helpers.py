"""Builders for the k8s processor's tests: pods as the API writes them, probe-shaped resources."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue

from gputally.kubelet.devices import DeviceMap, Holder, device_key
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext
from gputally.processors.k8s import K8sConfig
from gputally.processors.k8s.processor import K8sProcessor, create
from gputally.telemetry import SelfTelemetry

FIXTURES = Path(__file__).resolve().parents[4] / "shared" / "fixtures" / "nvml"
H200 = FIXTURES / "h200-two-workloads.json"
GPU = "GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9"
POD_UID = "6ee8558e-a273-417d-9a57-57f3c7773bd4"
CONTAINER = "2cbbbe2a9f38fa2255006fd6faed661a55f92bf6f924aae08261634ab5ff0f67"
CGROUP_629 = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6ee8558e_a273_417d_9a57_57f3c7773bd4.slice/"
    f"cri-containerd-{CONTAINER}.scope"
)
CGROUP_628 = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"


def cid(seed: str) -> str:
    """A 64-hex container id."""
    return (uuid.uuid5(uuid.NAMESPACE_DNS, seed).hex * 2)[:64]


def uid_of(namespace: str, name: str) -> str:
    """The uid `pod_json` gives a pod when none is named."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}"))


def pod_json(
    name: str,
    *,
    namespace: str = "ml",
    uid: str | None = None,
    node: str = "node-a",
    owner: tuple[str, str, str] | None = None,
    containers: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner_api: str = "apps/v1",
) -> dict[str, Any]:
    """A Pod as the API server returns it (JSON). ``owner`` is (kind, name, uid);
    ``containers`` maps container name -> bare container id."""
    metadata: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": uid or uid_of(namespace, name),
        "resourceVersion": "1", "labels": dict(labels or {}), "annotations": dict(annotations or {}),
    }
    if owner:
        kind, owner_name, owner_uid = owner
        metadata["ownerReferences"] = [
            {"apiVersion": owner_api, "kind": kind, "name": owner_name, "uid": owner_uid, "controller": True}
        ]
    statuses = [{"name": c, "containerID": f"containerd://{i}"} for c, i in (containers or {}).items()]
    return {"metadata": metadata, "spec": {"nodeName": node}, "status": {"containerStatuses": statuses}}


def kv(key: str, value: Any) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, list | tuple):  # an array of strings (the probe's holders hint)
        return KeyValue(key=key, value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value])))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def process_resource(pid: int, *, cgroup: str | None = None, gpu: str = GPU, start: str | None = None,
                     **extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {"hw.id": gpu, "host.name": "node-a", "process.pid": pid}
    if cgroup is not None:
        attrs["process.linux.cgroup"] = cgroup
    if start is not None:
        attrs["process.creation.time"] = start
    attrs.update(extra)
    return attrs


def gpu_resource(uuid_: str = GPU, *, index: int = 0, **extra: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {"hw.id": uuid_, "hw.type": "gpu", "gputally.gpu.index": index, "host.name": "node-a"}
    attrs.update(extra)
    return attrs


def metrics_request(*resources: Mapping[str, Any], points: int = 3) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for attrs in resources:
        rm = request.resource_metrics.add()
        rm.resource.attributes.extend(kv(k, v) for k, v in attrs.items())
        metric = rm.scope_metrics.add().metrics.add()
        metric.name = "hw.gpu.memory.usage"
        for i in range(points):
            metric.gauge.data_points.add().as_int = i
    return request


def metrics_batch(*resources: Mapping[str, Any]) -> Batch:
    return Batch.decode(Signal.METRICS, metrics_request(*resources).SerializeToString())


def logs_batch(*resources: Mapping[str, Any]) -> Batch:
    request = ExportLogsServiceRequest()
    for attrs in resources:
        rl = request.resource_logs.add()
        rl.resource.attributes.extend(kv(k, v) for k, v in attrs.items())
        rl.scope_logs.add().log_records.add().body.string_value = "xid 79"
    return Batch.decode(Signal.LOGS, request.SerializeToString())


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def attrs(resource: Any) -> dict[str, Any]:
    """A resource's attributes; fails on a duplicated key (OTLP forbids them)."""
    out: dict[str, Any] = {}
    for item in resource.attributes:
        assert item.key not in out, f"duplicate attribute {item.key}"
        out[item.key] = value(item.value)
    return out


def resource_attrs(batch: Batch) -> list[dict[str, Any]]:
    """Each resource's attributes, as the next stage would decode them."""
    decoded = Batch.decode(batch.signal, batch.serialize())
    field = {Signal.METRICS: "resource_metrics", Signal.LOGS: "resource_logs", Signal.TRACES: "resource_spans"}
    return [attrs(entry.resource) for entry in getattr(decoded.message, field[batch.signal])]


def k8s_only(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes the processor wrote."""
    return {k: v for k, v in attributes.items()
            if k.startswith(("k8s.", "container.", "cloud.", "host.type", "gputally.k8s."))}


def context(component_id: str = "k8s", telemetry: SelfTelemetry | None = None) -> ComponentContext:
    return ComponentContext(id=component_id, telemetry=telemetry or SelfTelemetry())


def make(config: Mapping[str, Any] | None = None, *, signal: Signal = Signal.METRICS,
         ctx: ComponentContext | None = None) -> K8sProcessor:
    """A processor in gateway mode unless said otherwise, not started: tests fill its caches."""
    section = {"mode": "gateway", **(config or {})}
    return create(K8sConfig.model_validate(section), ctx or context(), signal, environ={})


def allocate(proc: K8sProcessor, *holders: tuple[str, Holder]) -> None:
    """Hand ``proc``'s PodResources client these (device id, holder) allocations, as if read."""
    by_key: dict[str, list[Holder]] = {}
    for device_id, holder in holders:
        by_key.setdefault(device_key(device_id), []).append(holder)
    assert proc.runtime.podresources is not None
    proc.runtime.podresources.devices = DeviceMap(by_key)
