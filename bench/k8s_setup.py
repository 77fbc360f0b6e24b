"""Shared pieces of the k8s benchmarks: a populated real API server, a fake kubelet, a server launcher.

    .venv/bin/python bench/k8s_setup.py serve CONFIG   # `gputally serve` with the k8s processor registered

The launcher exists because a checkout may not have the ``k8s`` entry point installed yet;
it builds the same registry ``gputally serve`` discovers, plus ``k8s``, and runs the same
``serve`` function.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the Kubernetes harness (tests/harness/kube)


def serve_main(config_path: str) -> int:
    from gputally.cli.serve import serve
    from gputally.pipeline.config import load_config
    from gputally.pipeline.registry import Registry
    from gputally.processors.k8s import factory

    found = Registry.discover()
    registry = Registry(receivers=found.receivers, processors={**found.processors, "k8s": factory},
                        exporters=found.exporters, extensions=found.extensions)
    return serve(load_config(Path(config_path), registry=registry))


def cluster() -> Any:
    """A started harness control plane (etcd + kube-apiserver); the caller stops it."""
    from harness.kube.cluster import KubeCluster

    return KubeCluster().start()


def realistic_pod(index: int, *, namespace: str, node: str, owner: dict[str, str] | None) -> dict[str, Any]:
    """A pod shaped like a training job's: labels, a kubectl last-applied annotation, two containers."""
    name = f"trainer-{index:05d}"
    labels = {"app": "trainer", "team": f"team-{index % 40}", "app.kubernetes.io/name": "trainer",
              "app.kubernetes.io/instance": name, "pod-template-hash": hashlib.sha1(name.encode()).hexdigest()[:10],
              "tier": "gpu"}
    spec = {"nodeName": node, "containers": [
        {"name": "main", "image": "nvcr.io/nvidia/pytorch:25.01-py3", "command": ["torchrun", "train.py"],
         "env": [{"name": f"VAR_{i}", "value": "x" * 20} for i in range(8)],
         "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "8", "memory": "64Gi"}}},
        {"name": "sidecar", "image": "busybox", "resources": {"limits": {"cpu": "100m"}}},
    ]}
    body: dict[str, Any] = {"metadata": {"name": name, "labels": labels, "annotations": {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps({"spec": spec})[:1200],
        "prometheus.io/scrape": "true", "cost-center": f"cc-{index % 7}"}}, "spec": spec}
    if owner:
        body["metadata"]["ownerReferences"] = [{**owner, "controller": True}]
    return body


def container_id(seed: str) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()


def populate(admin: Any, *, pods: int, namespaces: int, nodes: int, replicasets: int, threads: int = 8,
             progress: bool = True) -> list[dict[str, Any]]:
    """Create ``pods`` pods (with ReplicaSet owners and running container statuses); returns them as created."""
    from kubernetes import client

    admin.configuration.connection_pool_maxsize = threads * 2
    core, apps = client.CoreV1Api(admin), client.AppsV1Api(admin)
    names = [f"bench-{i:02d}-{uuid.uuid4().hex[:4]}" for i in range(namespaces)]
    for ns in names:
        core.create_namespace({"metadata": {"name": ns}})
    owners: list[dict[str, str]] = []
    for i in range(replicasets):
        ns = names[i % namespaces]
        rs = apps.create_namespaced_replica_set(ns, {
            "metadata": {"name": f"trainer-{i:04d}-5d8f7c", "labels": {"app": "trainer"}},
            "spec": {"selector": {"matchLabels": {"app": "trainer"}}, "template": {
                "metadata": {"labels": {"app": "trainer"}}, "spec": {"containers": [{"name": "main", "image": "x"}]}}},
        }, _preload_content=False)
        meta = json.loads(rs.data)["metadata"]
        owners.append({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta["name"], "uid": meta["uid"],
                       "namespace": ns})
    created: list[dict[str, Any]] = []
    started = time.monotonic()

    def one(index: int) -> dict[str, Any]:
        owner = dict(owners[index % len(owners)]) if owners else None
        ns = owner.pop("namespace") if owner else names[index % namespaces]
        body = realistic_pod(index, namespace=ns, node=f"gpu-node-{index % nodes:04d}", owner=owner)
        pod = json.loads(core.create_namespaced_pod(ns, body, _preload_content=False).data)
        statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True, "restartCount": 0,
                     "started": True, "containerID": f"containerd://{container_id(pod['metadata']['uid'] + c['name'])}",
                     "state": {"running": {"startedAt": "2026-11-29T00:00:00Z"}}} for c in body["spec"]["containers"]]
        core.patch_namespaced_pod_status(pod["metadata"]["name"], ns, {"status": {
            "phase": "Running", "podIP": f"10.244.{index // 250 % 250}.{index % 250 + 1}",
            "containerStatuses": statuses}}, _preload_content=False)
        return pod

    with ThreadPoolExecutor(threads) as pool:
        for n, pod in enumerate(pool.map(one, range(pods)), 1):
            created.append(pod)
            if progress and n % 1000 == 0:
                print(f"  {n} pods created ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return created


def metric(admin_port: int, name: str, labels: dict[str, str] | None = None) -> float | None:
    """One sample from the server's /metrics (None when absent or unreachable)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    want = ",".join(f'{k}="{v}"' for k, v in (labels or {}).items())
    for line in text.splitlines():
        if line.startswith(name) and (not want or want in line):
            return float(line.rsplit(" ", 1)[1])
    return None


def wait_metric(
    admin_port: int, name: str, predicate: Any, timeout: float, labels: dict[str, str] | None = None
) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = metric(admin_port, name, labels)
        if value is not None and predicate(value):
            return value
        time.sleep(0.2)
    last = metric(admin_port, name, labels)
    raise TimeoutError(f"{name}{labels or ''} did not get there within {timeout:.0f} s (last: {last})")


class FakeKubelet:
    """PodResources over a unix socket (a real gRPC server in a thread), allocating GPUs to pods."""

    def __init__(self, socket: Path, allocations: Iterable[tuple[str, str, str, str]]) -> None:
        import grpc

        from gputally.proto.podresources.v1 import api_pb2, api_pb2_grpc

        response = api_pb2.ListPodResourcesResponse()
        for namespace, pod, container, device in allocations:
            entry = response.pod_resources.add(name=pod, namespace=namespace)
            entry.containers.add(name=container).devices.add(resource_name="nvidia.com/gpu", device_ids=[device])

        class Servicer(api_pb2_grpc.PodResourcesListerServicer):
            def List(self, request: Any, context: Any) -> Any:  # noqa: N802
                return response

        self.server = grpc.server(ThreadPoolExecutor(2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(Servicer(), self.server)
        self.server.add_insecure_port(f"unix://{socket}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        sys.exit(__doc__)
    sys.exit(serve_main(sys.argv[2]))
