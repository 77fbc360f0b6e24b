"""Shape 2, the sidecar, as shipped in collector-config/sidecar/, end to end:

    NVML replay (the probe's OTLP) --> gputally serve (sidecar/gputally.yaml: k8s, node mode)
        --> the cluster's otelcol (gateway/otelcol.yaml, its backend a file exporter)

with a real kube-apiserver and the kubelet's PodResources API served on a real unix socket
(a stand-in kubelet: no kubelet runs here), which says the H200 is the notebook's. On the
node the GPU itself is attributed, idle or not: what the gateway shape cannot do.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from harness.kube.cluster import KubeCluster, create_node, create_pod, create_statefulset, set_pod_status
from harness.otelcol.collector import Otelcol

from tests.processors.k8s.test_podresources import Kubelet, serve
from tests.otelcol.shapes import (
    K8S_ADDED,
    METRICS_EXPORT,
    RECORDED_CONTAINER,
    RECORDED_GPU,
    GputallyProcess,
    file_backend,
    file_resources,
    h200_recording,
    override,
    points_at,
    quiet,
    replay_requests,
    request_points,
    resource_times,
    shipped,
    usage_at_backend,
    wait_until,
    warm_up,
)


async def test_sidecar_attributes_the_gpu_and_its_processes_on_the_node(
    otelcol: Callable[..., Otelcol], kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, tmp_path: Path,
) -> None:
    ns, node = kube_namespace, f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node, labels={"node.kubernetes.io/instance-type": "p5en.48xlarge"})
    owner = create_statefulset(kube_admin, ns, "jupyter-alice", labels={"app.kubernetes.io/name": "jupyter"})
    pod = create_pod(kube_admin, ns, "jupyter-alice-0", owner=owner, node_name=node,
                     labels={"app.kubernetes.io/name": "jupyter"},
                     containers=["notebook"], resources={"notebook": {"nvidia.com/gpu": "1"}})
    set_pod_status(kube_admin, ns, "jupyter-alice-0", container_ids={"notebook": f"containerd://{RECORDED_CONTAINER}"})

    kubelet = Kubelet()
    kubelet.allocate(ns, "jupyter-alice-0", "notebook", "nvidia.com/gpu", RECORDED_GPU)
    socket = tmp_path / "pod-resources" / "kubelet.sock"
    socket.parent.mkdir()
    kubelet_server = await serve(socket, kubelet)

    requests = await replay_requests(h200_recording(pod_uid=pod.metadata.uid), 3, node)
    sent = request_points(requests)
    times = {key[3] for key in sent}
    out = tmp_path / "backend.json"
    backend = otelcol(file_backend(override(shipped("gateway", "otelcol.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "receivers.otlp.protocols.http.endpoint": "127.0.0.1:0",
    }), out, ["metrics", "logs"]), name="cluster-otelcol")

    sidecar = GputallyProcess(override(shipped("sidecar", "gputally.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "processors.k8s.kubeconfig": str(kube_cluster.limited_kubeconfig),
        "processors.k8s.proc_root": None,  # no host /proc here: the probe's cgroup hints are used
        "processors.k8s.pod_resources.socket": str(socket),
        "processors.k8s.pod_resources.refresh_interval": "200ms",
        "service.telemetry.metrics.address": "127.0.0.1:0",
    }), tmp_path / "sidecar", env={
        "K8S_NODE_NAME": node,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{backend.port('otlp')}",
    })
    port = sidecar.start().port("grpc")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            await warm_up(export, requests[0], out, ["k8s.statefulset.name", "host.type"], sidecar.log_tail)
            await wait_until(lambda: kubelet.calls > 0, "a PodResources List call")
            for request in requests:
                await export(request.SerializeToString(), timeout=5)
        await wait_until(lambda: points_at(out, times).total() >= sent.total(), "every sent point at the backend")
    finally:
        assert await asyncio.to_thread(sidecar.stop) == 0, sidecar.log_tail()
        await kubelet_server.stop(None)
    await quiet(out)
    assert await asyncio.to_thread(backend.stop) == 0, backend.log_tail()

    assert points_at(out, times, added=K8S_ADDED) == sent

    ours = [a for a, rm in file_resources(out) if resource_times(rm) <= times]
    gpus = [a for a in ours if "process.pid" not in a]
    notebook = [a for a in ours if a.get("process.pid") == "629"]
    slurm = [a for a in ours if a.get("process.pid") == "628"]
    assert len(gpus) == 3 and notebook and slurm
    for gpu in gpus:  # busy, idle holder only, nothing running: always the notebook's
        assert gpu["k8s.pod.name"] == "jupyter-alice-0" and gpu["k8s.namespace.name"] == ns
        assert gpu["gputally.k8s.attribution"] == "podresources"
        assert gpu["k8s.statefulset.name"] == "jupyter-alice" and gpu["host.type"] == "p5en.48xlarge"
        assert gpu["k8s.pod.label.app.kubernetes.io/name"] == "jupyter"
    for process in notebook:
        assert process["gputally.k8s.attribution"] == "cgroup" and process["container.id"] == RECORDED_CONTAINER
    for process in slurm:  # on the notebook's GPU, yet not the notebook's
        assert process["gputally.k8s.attribution"] == "none" and "k8s.pod.name" not in process

    # The shipped usage processor: the notebook pays for the whole observed time of its GPU.
    usage = usage_at_backend(out)
    notebook_usage = usage[pod.metadata.uid]  # pods are accounted by uid, named on their counters
    assert math.isclose(notebook_usage["allocated"], (max(times) - min(times)) / 1e9, rel_tol=1e-9)
    assert notebook_usage["attributes"]["host.type"] == "p5en.48xlarge" and "unallocated" not in usage

