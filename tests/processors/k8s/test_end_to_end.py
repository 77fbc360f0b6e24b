"""End to end: the NVML replay of the H200 recording -> ``serve`` with the k8s processor -> a sink.

Everything real but the GPU: the probe's replay source and OTLP shape, the OTLP receiver, a
kube-apiserver (the harness), a PodResources server on a unix socket, the OTLP exporter.

The API server assigns pod uids itself, so the recording's cgroup text for pid 629 gets the
uid of the pod created here in place of ``6ee8558e-...``; the container id
``2cbbbe2a...`` is the recorded one, reported by the kubelet (the status subresource).
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import grpc
import yaml
from harness.kube.cluster import KubeCluster, create_node, create_pod, create_statefulset, set_pod_status
from support.otlp import OtlpSink

from gputally.pipeline.config import load_config
from gputally.pipeline.registry import Registry
from gputally.pipeline.service import Service
from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.replay import ReplaySource, load_recording
from gputally.processors.k8s import factory
from gputally.processors.k8s.processor import K8sProcessor

from .helpers import CONTAINER, GPU, H200, POD_UID, attrs
from .kubelet import Kubelet, serve
from .test_kube_api import eventually

METRICS_EXPORT = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def gateway_config(port: int, sink: OtlpSink, *, node: str, kubeconfig: Path, socket: Path) -> str:
    return yaml.safe_dump({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {"k8s": {
            "mode": "node", "node_name": node, "kubeconfig": str(kubeconfig),
            "pod_resources": {"socket": str(socket), "refresh_interval": "100ms"},
            "extract": {"labels": ["app"]},
        }},
        "exporters": {"otlp": {"endpoint": sink.endpoint, "tls": {"insecure": True},
                               "retry_on_failure": {"initial_interval": "50ms", "max_elapsed_time": "0"}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["k8s"], "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": None}},
            "shutdown_timeout": "2s",
        },
    })


def with_registered_k8s() -> Registry:
    """The discovered registry, plus ``k8s`` if this checkout's entry point is not installed yet."""
    found = Registry.discover()
    return Registry(receivers=found.receivers, processors={**found.processors, "k8s": factory},
                    exporters=found.exporters, extensions=found.extensions)


async def test_replayed_h200_idle_holder_lands_on_its_pod_and_the_slurm_process_does_not(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, otlp_sink: OtlpSink, tmp_path: Path
) -> None:
    ns, node = kube_namespace, f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node, labels={"topology.kubernetes.io/region": "us-east-2",
                                          "node.kubernetes.io/instance-type": "p5en.48xlarge"})
    statefulset = create_statefulset(kube_admin, ns, "jupyter-alice", labels={"app": "jupyter"})
    pod = create_pod(kube_admin, ns, "jupyter-alice-0", owner=statefulset, node_name=node, labels={"app": "jupyter"},
                     containers=["notebook"], resources={"notebook": {"nvidia.com/gpu": "1"}})
    set_pod_status(kube_admin, ns, "jupyter-alice-0", container_ids={"notebook": f"containerd://{CONTAINER}"})
    uid = pod.metadata.uid

    kubelet = Kubelet()  # the device plugin gave the H200 to the notebook
    kubelet.allocate(ns, "jupyter-alice-0", "notebook", "nvidia.com/gpu", GPU)
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir()
    kubelet_server = await serve(socket, kubelet)

    recording = copy.deepcopy(load_recording(H200))
    for snapshot in recording["snapshots"]:
        facts = snapshot.get("proc_facts", {}).get("629")
        if facts:
            facts["cgroup"] = facts["cgroup"].replace(POD_UID.replace("-", "_"), uid.replace("-", "_"))

    service = Service(load_config(
        gateway_config(0, otlp_sink, node=node, kubeconfig=kube_cluster.limited_kubeconfig, socket=socket),
        registry=with_registered_k8s(),
    ))
    await service.start()
    try:
        address = service.receivers["otlp"].listening()["grpc"]
        (stage,) = service.pipelines["metrics"].stages
        processor = stage.processor
        assert isinstance(processor, K8sProcessor)
        runtime = processor.runtime
        await eventually(lambda: runtime.store.synced and runtime.podresources.devices is not None, timeout=10)  # type: ignore[union-attr]
        await eventually(lambda: runtime.nodes.get(node), timeout=5)

        source = ReplaySource(recording)
        probe = NvmlCollector(source, source, node_name=node, events=False)
        encoder = OtlpEncoder()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                export = channel.unary_unary(METRICS_EXPORT)
                for _ in range(3):  # busy+idle, idle holder only, no process
                    cycle = await probe.collect()
                    await export(encoder.metrics(cycle.entities, cycle.time_ns).SerializeToString(), timeout=5)
        finally:
            await probe.close()
        await otlp_sink.wait_for(lambda: len(otlp_sink.messages()) == 3)
    finally:
        await service.shutdown()
        await kubelet_server.stop(None)

    cycles = [[attrs(rm.resource) for rm in message.resource_metrics] for message in otlp_sink.messages()]
    first = {r.get("process.pid", "gpu"): r for r in cycles[0]}
    assert set(first) == {"gpu", 628, 629}
    holder, slurm, gpu = first[629], first[628], first["gpu"]

    expected_pod = {
        "k8s.pod.name": "jupyter-alice-0", "k8s.pod.uid": uid, "k8s.namespace.name": ns,
        "k8s.container.name": "notebook", "container.id": CONTAINER, "k8s.statefulset.name": "jupyter-alice",
        "gputally.k8s.owner.kind": "StatefulSet", "gputally.k8s.owner.name": "jupyter-alice",
        "k8s.pod.label.app": "jupyter", "k8s.node.name": node, "cloud.region": "us-east-2",
        "host.type": "p5en.48xlarge",
    }
    assert {k: holder.get(k) for k in expected_pod} == expected_pod
    assert holder["gputally.k8s.attribution"] == "cgroup"
    assert slurm["gputally.k8s.attribution"] == "none"
    assert not any(k.startswith(("k8s.", "container.", "cloud.")) for k in slurm)
    assert {k: gpu.get(k) for k in expected_pod} == expected_pod  # the GPU is the notebook's, allocated
    assert gpu["gputally.k8s.attribution"] == "podresources" and gpu["gputally.k8s.pods"] == [f"{ns}/jupyter-alice-0"]

    idle = {r.get("process.pid", "gpu"): r for r in cycles[1]}
    assert set(idle) == {"gpu", 629} and idle[629]["k8s.pod.name"] == "jupyter-alice-0"
    (empty_gpu,) = cycles[2]  # nothing runs, and someone still pays for the GPU
    assert "process.pid" not in empty_gpu and empty_gpu["k8s.pod.name"] == "jupyter-alice-0"
    assert empty_gpu["gputally.k8s.attribution"] == "podresources"
