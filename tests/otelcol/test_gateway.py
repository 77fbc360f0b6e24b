"""Shape 1, the gateway, as shipped in collector-config/gateway/, end to end:

    NVML replay (the probe's OTLP, with the holders it read from the node's kubelet)
        --> gputally serve (gateway/gputally.yaml: k8s + slurm)
        --> otelcol (gateway/otelcol.yaml, its backend a file exporter)

with a real kube-apiserver (the pod the recording's container runs in and whose GPU it is),
a PodResources stand-in on a real unix socket on the "node" (what the probe DaemonSet mounts)
and a real Slurm cluster through slurmrestd (the job the recording's other process runs in).
The API server and slurmctld pick the pod uid and the job id, so the recording's cgroups are
moved into them.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from harness.kube.cluster import KubeCluster, create_node, create_pod, create_statefulset, set_pod_status
from harness.otelcol.collector import Otelcol
from harness.slurm.cluster import SlurmCluster

from tests.processors.k8s.kubelet import Kubelet, kubelet_socket
from tests.otelcol.shapes import (
    K8S_ADDED,
    METRICS_EXPORT,
    RECORDED_CONTAINER,
    RECORDED_GPU,
    SLURM_ADDED,
    GputallyProcess,
    Key,
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

ADDED_BY_GATEWAY = K8S_ADDED + SLURM_ADDED


@dataclass(frozen=True)
class GatewayRun:
    """What `run_gateway_shape` leaves behind: the backend's file and what was sent."""

    out: Path
    """The backend's file exporter output (JSON lines): read it with `file_resources` / `points_at`."""
    sent: Counter[Key]
    """Every point sent, as `request_points` counts them."""
    times: set[int]
    """The sent points' timestamps (the warm-up's copies have others)."""


async def run_gateway_shape(
    otelcol: Callable[..., Otelcol], kube: KubeCluster, slurm: SlurmCluster, tmp_path: Path, *, requests: list[Any],
    changes: Mapping[str, Any] | None = None, warm: tuple[str, ...] = ("k8s.pod.name", "slurm.job.user"),
) -> GatewayRun:
    """The gateway shape as shipped, fed ``requests`` (`replay_requests`, with ``pod_resources``
    for the node's holders): otelcol.yaml with a file backend, gputally.yaml with only addresses
    and credentials changed, plus ``changes`` (dotted keys, see `override`: e.g. another
    processor in its pipelines). Waits until every sent point reached the backend; both
    processes exit 0."""
    sent = request_points(requests)
    out = tmp_path / "backend.json"

    backend_config = file_backend(override(shipped("gateway", "otelcol.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "receivers.otlp.protocols.http.endpoint": "127.0.0.1:0",
    }), out, ["metrics", "logs"])
    backend = otelcol(backend_config, name="backend")

    token = tmp_path / "slurm-token"
    token.write_text(slurm.token("root"))
    gateway = GputallyProcess(override(override(shipped("gateway", "gputally.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "receivers.otlp.protocols.http.endpoint": "127.0.0.1:0",
        "processors.k8s.kubeconfig": str(kube.limited_kubeconfig),
        "processors.slurm.slurmrestd.token_file": str(token),
        "service.telemetry.metrics.address": "127.0.0.1:0",
    }), changes or {}), tmp_path / "gateway", env={
        "SLURMRESTD_URL": slurm.restd_url,
        "SLURMRESTD_USER": "root",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{backend.port('otlp')}",
    })
    port = gateway.start().port("grpc")
    times = {key[3] for key in sent}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)

            # The pod list syncs and the job's metadata is looked up in the background.
            await warm_up(export, requests[0], out, warm, gateway.log_tail)
            for request in requests:
                await export(request.SerializeToString(), timeout=5)
        await wait_until(lambda: points_at(out, times).total() >= sent.total(), "every sent point at the backend")
    finally:
        assert await asyncio.to_thread(gateway.stop) == 0, gateway.log_tail()
    await quiet(out)
    assert await asyncio.to_thread(backend.stop) == 0, backend.log_tail()
    return GatewayRun(out, sent, times)


async def test_gateway_attributes_every_point_once_to_its_pod_and_job(
    otelcol: Callable[..., Otelcol], kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str,
    slurm_cluster: SlurmCluster, tmp_path: Path,
) -> None:
    ns, node = kube_namespace, f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node, labels={"topology.kubernetes.io/zone": "us-east-2a"})
    owner = create_statefulset(kube_admin, ns, "jupyter-alice", labels={"team": "nlp"})
    pod = create_pod(kube_admin, ns, "jupyter-alice-0", owner=owner, node_name=node, labels={"team": "nlp"},
                     containers=["notebook"], resources={"notebook": {"nvidia.com/gpu": "1"}})
    set_pod_status(kube_admin, ns, "jupyter-alice-0", container_ids={"notebook": f"containerd://{RECORDED_CONTAINER}"})
    kubelet = Kubelet()  # on the node: the device plugin gave the H200 to the notebook
    kubelet.allocate(ns, "jupyter-alice-0", "notebook", "nvidia.com/gpu", RECORDED_GPU)
    job = slurm_cluster.sbatch("sleep 300\n", "--job-name=gateway-shape", "--account=physics")
    try:
        slurm_cluster.wait_job_state(job, ["RUNNING"])
        async with kubelet_socket(tmp_path / "node", kubelet) as socket:
            requests = await replay_requests(h200_recording(pod_uid=pod.metadata.uid, slurm_job=job), 3, node,
                                             pod_resources=socket)
        run = await run_gateway_shape(otelcol, kube_cluster, slurm_cluster, tmp_path, requests=requests,
                                      warm=("k8s.pod.name", "slurm.job.user", "cloud.availability_zone"))
    finally:
        slurm_cluster.run(["scancel", str(job)], check=False)
    assert kubelet.calls == 3  # the probe asked every cycle

    # Every point once, its resource as sent plus what the gateway added.
    assert points_at(run.out, run.times, added=ADDED_BY_GATEWAY) == run.sent

    resources = [a for a, rm in file_resources(run.out) if resource_times(rm) <= run.times]
    by_pid: dict[str, list[dict[str, str]]] = {}
    for attributes in resources:
        by_pid.setdefault(attributes.get("process.pid", "gpu"), []).append(attributes)
    assert set(by_pid) == {"gpu", "628", "629"}
    for notebook in by_pid["629"]:
        assert notebook["k8s.pod.name"] == "jupyter-alice-0" and notebook["k8s.namespace.name"] == ns
        assert notebook["k8s.statefulset.name"] == "jupyter-alice" and notebook["k8s.pod.label.team"] == "nlp"
        assert notebook["container.id"] == RECORDED_CONTAINER and notebook["k8s.container.name"] == "notebook"
        assert notebook["gputally.k8s.attribution"] == "cgroup" and "slurm.job.id" not in notebook
    for worker in by_pid["628"]:
        assert worker["slurm.job.id"] == str(job) and worker["slurm.job.step"] == "0"
        assert worker["slurm.job.user"] == "root" and worker["slurm.job.account"] == "physics"
        assert worker["slurm.job.name"] == "gateway-shape" and worker["gputally.k8s.attribution"] == "none"
        assert not any(k.startswith("k8s.") for k in worker)
    # The GPU is the notebook's in every cycle, also in the last one, when nothing runs on it:
    # the probe read the allocation on the node, the gateway named the pod from its cluster-wide cache.
    gpu_times = {t for a, rm in file_resources(run.out) if "process.pid" not in a for t in resource_times(rm)}
    assert gpu_times >= run.times
    last = max(run.times)
    assert not [a for a, rm in file_resources(run.out) if "process.pid" in a and last in resource_times(rm)]
    for gpu in by_pid["gpu"]:
        assert gpu["gputally.k8s.podresources.holders"] == f'["{ns}/jupyter-alice-0/notebook/nvidia.com/gpu"]'
        assert gpu["gputally.k8s.attribution"] == "podresources" and gpu["k8s.pod.name"] == "jupyter-alice-0"
        assert gpu["k8s.namespace.name"] == ns and gpu["k8s.container.name"] == "notebook"
        assert gpu["container.id"] == RECORDED_CONTAINER and gpu["k8s.statefulset.name"] == "jupyter-alice"
        assert gpu["k8s.node.name"] == node and gpu["cloud.availability_zone"] == "us-east-2a"
        assert gpu["gputally.k8s.pods"] == f'["{ns}/jupyter-alice-0"]' and "slurm.job.id" not in gpu

    # ...and so is its time in the usage counters (the shipped config's usage processor): the
    # notebook holds the GPU for all of it, idle or not. The recording's Slurm worker is gone
    # from the second reading on, so every interval is idle: its time and energy are the
    # notebook's, and the job, which held memory at the first reading, gets an account of zeros.
    usage = usage_at_backend(run.out)
    observed = (max(run.times) - min(run.times)) / 1e9
    notebook_usage = usage[pod.metadata.uid]  # pods are accounted by uid, named on their counters
    assert math.isclose(notebook_usage["allocated"], observed, rel_tol=1e-9)
    assert notebook_usage["attributes"]["gputally.usage.owner.kind"] == "k8s.pod"
    assert notebook_usage["attributes"]["k8s.pod.name"] == "jupyter-alice-0"
    assert notebook_usage["attributes"]["k8s.statefulset.name"] == "jupyter-alice"
    assert notebook_usage["attributes"]["hw.id"] == RECORDED_GPU
    job_usage = usage[str(job)]
    assert job_usage["allocated"] == job_usage["busy"] == job_usage["energy"] == 0
    assert notebook_usage["energy"] > 0 and notebook_usage["idle"] == notebook_usage["allocated"]
    assert job_usage["attributes"]["slurm.job.account"] == "physics"
    assert "unallocated" not in usage  # the GPU always had its owner
