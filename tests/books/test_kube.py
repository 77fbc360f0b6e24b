"""gputally's allocated GPU-time per pod against the pods' own books on a real kube-apiserver:
each pod's GPU request x its running time from its status timestamps (the container's
``startedAt`` and ``finishedAt``), within one probe interval per GPU and boundary.

No kubelet runs here, so the test plays it, as tests/processors/k8s do: at a whole second it
hands the pod its GPUs through the PodResources stand-in (a real gRPC server on a unix
socket, read by the ``k8s`` processor in node mode) and writes the pod's status with that
second as ``startedAt``, the way a kubelet starts a container; later it takes the GPUs back
and writes ``finishedAt``. The probe replays the node's two GPUs meanwhile, in real time,
through ``gputally serve`` (``k8s`` -> ``usage``) into a real Prometheus.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from harness.kube.cluster import KubeCluster, container_id, create_namespace, create_node, create_pod
from harness.prometheus.fixtures import started_prometheus
from harness.prometheus.server import Binaries, Prometheus

from gputally.proto.podresources.v1 import api_pb2
from tests.books.live import INTERVAL, allocated_seconds, probe, serve_config, start_serve, two_gpu_recording
from tests.processors.k8s.kubelet import Kubelet, kubelet_socket
from tests.processors.usage.scenario import pods_listed

PODS = (("trainer-a", 2, 5), ("trainer-b", 1, 4))
"""(name, GPUs requested, seconds running): one after the other, the second on one GPU."""
RESOURCE = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def prom(prometheus_binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    with started_prometheus(prometheus_binaries, tmp_path_factory.mktemp("books-kube") / "prometheus") as server:
        yield server


def stamp(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def write_status(admin: Any, namespace: str, name: str, *, started: float, finished: float | None = None) -> None:
    """The container's state as a kubelet writes it: running since ``started``, or terminated
    (exit 0) at ``finished``."""
    from kubernetes import client

    core = client.CoreV1Api(admin)
    pod = core.read_namespaced_pod(name, namespace)
    if finished is None:
        state = client.V1ContainerState(running=client.V1ContainerStateRunning(started_at=stamp(started)))
    else:
        state = client.V1ContainerState(terminated=client.V1ContainerStateTerminated(
            exit_code=0, reason="Completed", started_at=stamp(started), finished_at=stamp(finished),
            container_id=container_id(namespace, name, "main")))
    pod.status = client.V1PodStatus(
        phase="Running" if finished is None else "Succeeded", start_time=stamp(started),
        container_statuses=[client.V1ContainerStatus(
            name="main", image="registry.k8s.io/pause:3.10", image_id="", ready=finished is None, restart_count=0,
            state=state, container_id=container_id(namespace, name, "main"))])
    core.replace_namespaced_pod_status(name, namespace, pod)


def running_seconds(admin: Any, namespace: str, name: str) -> tuple[int, float]:
    """(GPUs requested, finishedAt - startedAt) from the pod as the API server has it."""
    from kubernetes import client

    pod = client.CoreV1Api(admin).read_namespaced_pod(name, namespace)
    gpus = sum(int((c.resources.requests or {}).get(RESOURCE, 0)) for c in pod.spec.containers)
    terminated = pod.status.container_statuses[0].state.terminated
    started, finished = terminated.started_at, terminated.finished_at
    assert isinstance(started, datetime) and isinstance(finished, datetime)
    return gpus, (finished - started).total_seconds()


async def whole_second(after: float = 0.0) -> float:
    """Sleep until the first whole second at least ``after`` seconds from now; that second."""
    target = float(int(time.time() + after) + 1)
    await asyncio.sleep(max(0.0, target - time.time()))
    return target


def hand_out(kubelet: Kubelet, namespace: str, holders: dict[str, list[str]]) -> None:
    """PodResources' answer: exactly these pods' GPUs (pod -> device ids)."""
    kubelet.response = api_pb2.ListPodResourcesResponse()
    for pod, devices in holders.items():
        kubelet.allocate(namespace, pod, "main", RESOURCE, *devices)


async def test_allocated_gpu_time_equals_request_times_running_time(kube_cluster: KubeCluster, kube_admin: Any,
                                                                    prom: Prometheus, tmp_path: Path) -> None:
    namespace = create_namespace(kube_admin).metadata.name
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node)
    uids = {name: create_pod(kube_admin, namespace, name, node_name=node, resources={"main": {RESOURCE: str(gpus)}},
                             labels={"team": "vision"}).metadata.uid for name, gpus, _ in PODS}
    recording = tmp_path / "node.json"
    gpus = two_gpu_recording(recording, minors=(0, 1))
    kubelet = Kubelet()
    async with kubelet_socket(tmp_path, kubelet) as socket:
        k8s = {"k8s": {"mode": "node", "node_name": node, "kubeconfig": str(kube_cluster.limited_kubeconfig),
                       "pod_resources": {"socket": str(socket), "refresh_interval": "200ms"}}}
        config = serve_config(k8s, prom)
        begin = time.time()
        gateway, port = await asyncio.to_thread(start_serve, config, tmp_path)
        try:
            await asyncio.to_thread(pods_listed, gateway.listening.admin[0])
            with probe(recording, port, node, tmp_path / "probe.log"):
                await asyncio.sleep(3 * INTERVAL)  # the GPUs seen free first
                at = await whole_second()
                for name, count, seconds in PODS:
                    hand_out(kubelet, namespace, {name: gpus[:count]})
                    write_status(kube_admin, namespace, name, started=at)
                    until = await whole_second(seconds - 0.5)
                    hand_out(kubelet, namespace, {})
                    write_status(kube_admin, namespace, name, started=at, finished=until)
                    at = until
                await asyncio.sleep(3 * INTERVAL)  # and free again
            assert await asyncio.to_thread(gateway.stop) == 0, gateway.log_tail()
        finally:
            await asyncio.to_thread(gateway.stop)
    end = time.time() + 1
    ours: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while not set(uids.values()) <= set(ours):
        assert time.monotonic() < deadline, f"the pods' counters never reached Prometheus: {ours}"
        await asyncio.sleep(0.3)
        ours = await asyncio.to_thread(allocated_seconds, prom.url, begin, end, "k8s.pod")
    differences = {}
    for name, count, seconds in PODS:
        requested, running = running_seconds(kube_admin, namespace, name)
        assert (requested, running) == (count, seconds)  # the pod's own books say what the test did
        differences[name] = ours[uids[name]] - requested * running
        assert abs(differences[name]) <= requested * 2 * INTERVAL, (name, ours[uids[name]], requested * running)
    print(f"gputally - pod status, GPU-s per pod: {differences}")
