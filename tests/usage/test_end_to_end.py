"""The usage counters end to end, through ``gputally serve`` with the real parts:

    H200 time series (the probe's OTLP) --> gputally serve: k8s (node mode, real kube-apiserver,
        PodResources on a real unix socket) -> slurm (real slurmctld, slurmrestd) -> usage
        --> otelcol (its backend a file exporter)

The GPU is time-sliced between the trainer's and the notebook's pods (``nvidia.com/gpu.shared``
replicas), and the recording's memory holder runs in a real Slurm job. The counters that come
out equal the split rules applied to the readings that went in (`series.expected`).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from harness.kube.cluster import KubeCluster, create_node, create_pod, create_statefulset
from harness.otelcol.collector import Otelcol
from harness.processes import free_port
from harness.slurm.cluster import SlurmCluster

from tests.k8s.kubelet import Kubelet, kubelet_socket
from tests.otelcol.shapes import METRICS_EXPORT, GputallyProcess, file_backend, file_resources, metrics_of, \
    override, points_of, shipped, wait_until
from tests.usage.series import GPU, HOLDER_PID, NOTEBOOK_PID, TRAINER_PID, expected, probe_requests, readings, \
    recorded_uid, recording

COUNTERS = {"gputally.usage.allocated.time": "allocated", "gputally.usage.busy.time": "busy",
            "gputally.usage.idle.time": "idle", "gputally.usage.energy": "energy"}


def usage_at_backend(out: Path) -> dict[str, dict[str, Any]]:
    """owner id -> the newest value of each usage counter, and the owner's resource attributes."""
    found: dict[str, dict[str, Any]] = {}
    newest: dict[tuple[str, str], int] = {}
    for attributes, rm in file_resources(out):
        owner = attributes.get("gputally.usage.owner.id")
        if owner is None:
            continue
        entry = found.setdefault(owner, {"attributes": attributes})
        for metric in metrics_of(rm):
            name = COUNTERS.get(metric["name"])
            for point in points_of(metric) if name else ():
                at = int(point["timeUnixNano"])
                if at >= newest.get((owner, name), 0):
                    newest[(owner, name)] = at
                    entry[name] = float(point.get("asDouble", 0.0))
                    entry["attributes"] = attributes
    return found


async def test_usage_counters_through_serve_with_k8s_and_slurm(
    otelcol: Callable[..., Otelcol], kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str,
    slurm_cluster: SlurmCluster, tmp_path: Path,
) -> None:
    ns, node = kube_namespace, f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node)
    trainer_set = create_statefulset(kube_admin, ns, "trainer", labels={"team": "vision"})
    trainer = create_pod(kube_admin, ns, "trainer-0", owner=trainer_set, node_name=node, labels={"team": "vision"},
                         containers=["train"], resources={"train": {"nvidia.com/gpu.shared": "1"}})
    notebook = create_pod(kube_admin, ns, "jupyter-bob-0", node_name=node, labels={"team": "nlp"},
                          containers=["notebook"], resources={"notebook": {"nvidia.com/gpu.shared": "1"}})
    kubelet = Kubelet()  # time-slicing: each pod holds a replica of the one H200
    kubelet.allocate(ns, "trainer-0", "train", "nvidia.com/gpu.shared", f"{GPU}::0")
    kubelet.allocate(ns, "jupyter-bob-0", "notebook", "nvidia.com/gpu.shared", f"{GPU}::1")
    job = slurm_cluster.sbatch("sleep 300\n", "--job-name=holder", "--account=physics")
    try:
        slurm_cluster.wait_job_state(job, ["RUNNING"])
        data = recording(uids={recorded_uid(TRAINER_PID): trainer.metadata.uid,
                               recorded_uid(NOTEBOOK_PID): notebook.metadata.uid}, job=job)
        requests = await probe_requests(data, base_ns=time.time_ns() - 60 * 10**9, node=node)
        async with kubelet_socket(tmp_path, kubelet) as socket:
            out = await _run(otelcol, kube_cluster, slurm_cluster, socket, requests, node, tmp_path)
    finally:
        slurm_cluster.run(["scancel", str(job)], check=False)

    owners = {TRAINER_PID: f"{ns}/trainer-0", NOTEBOOK_PID: f"{ns}/jupyter-bob-0", HOLDER_PID: str(job)}
    want = expected(readings(requests), owner_of=owners.__getitem__,
                    holders=[f"{ns}/jupyter-bob-0", f"{ns}/trainer-0"])
    got = usage_at_backend(out)
    assert set(got) == set(want), got.keys()
    for owner, counters in want.items():
        for name in COUNTERS.values():
            assert math.isclose(got[owner][name], counters[name], rel_tol=1e-9, abs_tol=1e-6), (owner, name)

    trainer_attributes = got[f"{ns}/trainer-0"]["attributes"]
    assert trainer_attributes["gputally.usage.owner.kind"] == "k8s.pod"
    assert trainer_attributes["k8s.namespace.name"] == ns and trainer_attributes["k8s.pod.name"] == "trainer-0"
    assert trainer_attributes["gputally.k8s.owner.kind"] == "StatefulSet"
    assert trainer_attributes["k8s.pod.label.team"] == "vision" and trainer_attributes["hw.id"] == GPU
    holder = got[str(job)]["attributes"]
    assert holder["gputally.usage.owner.kind"] == "slurm.job" and holder["slurm.job.account"] == "physics"
    assert holder["slurm.job.name"] == "holder" and holder["slurm.job.user"] == "root"
    assert got[str(job)]["busy"] == 0 and got[str(job)]["allocated"] == 0  # holds memory, computes nothing
    # Both pods hold the GPU: each has half its observed time, the notebook idle once it stopped.
    assert math.isclose(got[f"{ns}/trainer-0"]["allocated"], got[f"{ns}/jupyter-bob-0"]["allocated"])
    assert got[f"{ns}/jupyter-bob-0"]["idle"] > 0 and got[f"{ns}/trainer-0"]["idle"] == 0


async def _run(otelcol: Callable[..., Otelcol], kube: KubeCluster, slurm: SlurmCluster, socket: Path,
               requests: list[Any], node: str, tmp_path: Path) -> Path:
    out = tmp_path / "backend.json"
    backend_port = free_port()
    otelcol(file_backend(override(shipped("gateway", "otelcol.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{backend_port}",
        "receivers.otlp.protocols.http.endpoint": f"127.0.0.1:{free_port()}",
    }), out, ["metrics", "logs"]), wait_for=backend_port, name="backend")

    token = tmp_path / "slurm-token"
    token.write_text(slurm.token("root"))
    port = free_port()
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}"}}}},
        "processors": {
            "k8s": {"mode": "node", "node_name": node, "kubeconfig": str(kube.limited_kubeconfig),
                    "pod_resources": {"socket": str(socket), "refresh_interval": "200ms"},
                    "extract": {"labels": ["team"]}},
            "slurm": {"backend": "slurmrestd", "slurmrestd": {"endpoint": slurm.restd_url, "user": "root",
                                                              "token_file": str(token)}},
            "usage": {"settle": "200ms", "emit_interval": "1s", "end_after": "1h"},
        },
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{backend_port}", "tls": {"insecure": True}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["k8s", "slurm", "usage"],
                                      "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": f"127.0.0.1:{free_port()}"}},
        },
    }
    gateway = GputallyProcess(config, tmp_path / "gputally")
    gateway.start(port)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            await _warm(export, requests[0], out, gateway)
            for request in requests:
                await export(request.SerializeToString(), timeout=5)
        await asyncio.sleep(1.5)  # the last samples settle and one emit goes out
    finally:
        assert await asyncio.to_thread(gateway.stop) == 0, gateway.log_tail()
    await wait_until(lambda: _has_final(out, requests), "the usage counters at the backend")
    return out


async def _warm(export: Any, request: Any, out: Path, gateway: GputallyProcess) -> None:
    """Wait until pods, the GPU's allocation and the job's metadata are known: a request sent
    before would be counted for a pod not yet named. A probe's request from an hour ago (its
    points far outside ``max_gap`` of the test's own) is sent until the backend shows them."""
    from tests.otelcol.shapes import retimed

    keys = ["k8s.statefulset.name", "gputally.k8s.pods", "slurm.job.user"]
    deadline = time.monotonic() + 60
    while True:
        seen = [a for a, _ in file_resources(out)]
        if all(any(k in a for a in seen) for k in keys):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"never attributed {keys}:\n{gateway.log_tail()}")
        await export(retimed(request, -3600 * 10**9).SerializeToString(), timeout=5)
        await asyncio.sleep(0.3)


def _has_final(out: Path, requests: list[Any]) -> bool:
    got = usage_at_backend(out)
    return len(got) >= 3 and all("allocated" in c for c in got.values())
