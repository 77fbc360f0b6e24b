"""The three-workload H200 time series placed on the real harnesses, run through ``gputally
serve`` with ``k8s``, ``slurm`` and ``usage``: shared by the usage end-to-end test and the
report, dashboard and alert tests that read the counters back from a real Prometheus.

The trainer (pid 448) and the notebook (pid 449) run in pods of the real kube-apiserver that
time-slice the GPU (``nvidia.com/gpu.shared`` replicas, served by the PodResources stand-in
on a real unix socket); the memory holder (pid 450) runs in a real Slurm job. The recording's
cgroups are moved into the pod uids and job id the servers chose.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from harness.kube.cluster import KubeCluster, create_node, create_pod, create_statefulset
from harness.slurm.cluster import SlurmCluster

from tests.processors.k8s.kubelet import Kubelet, kubelet_socket
from tests.otelcol.shapes import METRICS_EXPORT, GputallyProcess, retimed
from tests.processors.usage.series import (
    GPU,
    HOLDER_PID,
    NOTEBOOK_PID,
    TRAINER_PID,
    Counters,
    expected,
    probe_requests,
    readings,
    recorded_uid,
    recording,
)

__all__ = ["Placed", "feed_prometheus", "fed_prometheus", "placed", "run_through_serve"]

WARM_UP_S = 600
"""How long before the scene the warm-up copies are stamped: beyond ``max_gap``, so they are
never integrated with the scene's own samples, and inside Prometheus' out-of-order window."""


@dataclass
class Placed:
    """The workloads as the servers know them, and what the probe sends for them."""

    namespace: str
    node: str
    job: int
    requests: list[Any]
    socket: Path
    kube: KubeCluster
    slurm: SlurmCluster
    trainer_uid: str = ""
    notebook_uid: str = ""

    @property
    def owners(self) -> dict[int, str]:
        """pid -> the owner id its counters carry (a pod's: its uid)."""
        return {TRAINER_PID: self.trainer_uid, NOTEBOOK_PID: self.notebook_uid, HOLDER_PID: str(self.job)}

    @property
    def trainer(self) -> str:
        return self.trainer_uid

    @property
    def notebook(self) -> str:
        return self.notebook_uid

    @property
    def holders(self) -> list[str]:
        return sorted([self.notebook_uid, self.trainer_uid])

    def expected(self) -> Counters:
        """The counters the split rules give for what the probe sent."""
        return expected(readings(self.requests), owner_of=self.owners.__getitem__, holders=self.holders)


@contextlib.asynccontextmanager
async def placed(kube: KubeCluster, admin: Any, namespace: str, slurm: SlurmCluster, tmp_path: Path, *,
                 base_ns: int | None = None) -> AsyncIterator[Placed]:
    """Pods, allocation, job and the probe's requests (sample times from ``base_ns``, default a
    minute ago); the job is cancelled and the PodResources socket closed on leaving."""
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(admin, node, labels={"node.kubernetes.io/instance-type": "p5en.48xlarge"})
    trainer_set = create_statefulset(admin, namespace, "trainer", labels={"team": "vision"})
    trainer = create_pod(admin, namespace, "trainer-0", owner=trainer_set, node_name=node, labels={"team": "vision"},
                         containers=["train"], resources={"train": {"nvidia.com/gpu.shared": "1"}})
    notebook = create_pod(admin, namespace, "jupyter-bob-0", node_name=node, labels={"team": "nlp"},
                          containers=["notebook"], resources={"notebook": {"nvidia.com/gpu.shared": "1"}})
    kubelet = Kubelet()  # time-slicing: each pod holds a replica of the one H200
    kubelet.allocate(namespace, "trainer-0", "train", "nvidia.com/gpu.shared", f"{GPU}::0")
    kubelet.allocate(namespace, "jupyter-bob-0", "notebook", "nvidia.com/gpu.shared", f"{GPU}::1")
    job = slurm.sbatch("sleep 600\n", "--job-name=holder", "--account=physics")
    try:
        slurm.wait_job_state(job, ["RUNNING"])
        data = recording(uids={recorded_uid(TRAINER_PID): trainer.metadata.uid,
                               recorded_uid(NOTEBOOK_PID): notebook.metadata.uid}, job=job)
        base = base_ns if base_ns is not None else time.time_ns() - 60 * 10**9
        requests = await probe_requests(data, base_ns=base, node=node)
        async with kubelet_socket(tmp_path, kubelet) as socket:
            yield Placed(namespace, node, job, requests, socket, kube, slurm, trainer.metadata.uid, notebook.metadata.uid)
    finally:
        slurm.run(["scancel", str(job)], check=False)


def gputally_config(scene: Placed, token: Path, exporter: dict[str, Any], *,
                    usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """k8s (node mode) -> slurm (slurmrestd) -> usage, into ``exporter`` (an exporter section);
    listening on port 0."""
    (exporter_id,) = exporter
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {
            "k8s": {"mode": "node", "node_name": scene.node, "kubeconfig": str(scene.kube.limited_kubeconfig),
                    "pod_resources": {"socket": str(scene.socket), "refresh_interval": "200ms"},
                    "extract": {"labels": ["team"]}},
            "slurm": {"backend": "slurmrestd", "slurmrestd": {"endpoint": scene.slurm.restd_url, "user": "root",
                                                              "token_file": str(token)}},
            "usage": {"settle": "200ms", "emit_interval": "1s", "end_after": "1h", **(usage or {})},
        },
        "exporters": exporter,
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["k8s", "slurm", "usage"],
                                      "exporters": [exporter_id]}},
            "telemetry": {"metrics": {"address": "127.0.0.1:0"}},
        },
    }


async def run_through_serve(scene: Placed, tmp_path: Path, exporter: dict[str, Any], *,
                            warm: Callable[[], bool], usage: dict[str, Any] | None = None) -> None:
    """Start gputally, warm its caches, send the probe's requests, and stop it (its last emit
    goes out on the way down). ``warm`` says when the backend shows attributed data: until then
    a copy of the first request from ten minutes before (far outside ``max_gap``, inside
    Prometheus' out-of-order window) is sent again."""
    token = tmp_path / "slurm-token"
    token.write_text(scene.slurm.token("root"))
    gateway = GputallyProcess(gputally_config(scene, token, exporter, usage=usage), tmp_path / "gputally").start()
    port = gateway.port("grpc")
    try:
        # The pods listed before the first sample: an account made before would emit counters
        # carrying the pod's uid without its name, a series of its own in Prometheus.
        await asyncio.to_thread(pods_listed, gateway.listening.admin[0])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            deadline = time.monotonic() + 60
            early = retimed(scene.requests[0], -WARM_UP_S * 10**9).SerializeToString()
            while not await asyncio.to_thread(warm):
                if time.monotonic() > deadline:
                    raise AssertionError(f"the backend never showed attributed data:\n{gateway.log_tail()}")
                await export(early, timeout=5)
                await asyncio.sleep(0.5)
            for request in scene.requests:
                await export(request.SerializeToString(), timeout=5)
        await asyncio.sleep(1.5)  # the last samples settle and one emit goes out
    finally:
        assert await asyncio.to_thread(gateway.stop) == 0, gateway.log_tail()


def pods_listed(admin: str, timeout: float = 30.0) -> None:
    """Until gputally's /readyz no longer says the k8s processor waits for its first pod list."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://{admin}/readyz", timeout=2) as response:
                body = response.read().decode()
            if "waiting for the first pod list" not in body:
                return
        if time.monotonic() > deadline:
            raise AssertionError("the k8s processor never listed its pods")
        time.sleep(0.1)


async def feed_prometheus(scene: Placed, prometheus: Any, tmp_path: Path, *,
                          usage: dict[str, Any] | None = None) -> None:
    """Run the scene through ``gputally serve`` into ``prometheus`` (the harness's, OTLP receiver
    on): the probe's ``hw.*`` metrics and the usage counters, written by the ``otlphttp``
    exporter. Returns once the final counters are queryable."""
    base = prometheus.otlp_url.removesuffix("/v1/metrics")
    exporter = {"otlphttp": {"endpoint": base, "compression": "none"}}

    at = readings(scene.requests[:1])[0].time_ns / 1e9 - WARM_UP_S  # when the warm-up copies are stamped

    def warm() -> bool:  # pods synced, the GPU's allocation listed, the job's metadata fetched
        gpu = prometheus.query('hw_gpu_utilization_ratio{k8s_namespace_name!=""}', time=at)  # shared: its namespace
        job = prometheus.query('gputally_gpu_process_memory_usage_bytes{slurm_job_user!=""}', time=at)
        pods = prometheus.query('gputally_gpu_process_memory_usage_bytes{k8s_pod_name!=""}', time=at)
        return bool(gpu and job and pods)

    await run_through_serve(scene, tmp_path, exporter, warm=warm, usage=usage)
    want = scene.expected()
    owner = str(scene.job)
    deadline = time.monotonic() + 30
    while True:  # the last emit, at shutdown, carries the whole series' counters
        found = prometheus.query(f'gputally_usage_allocated_time_seconds_total{{gputally_usage_owner_id="{owner}"}}')
        trainer = prometheus.query('gputally_usage_busy_time_seconds_total{gputally_usage_owner_id="'
                                   f'{scene.trainer}"}}')
        if found and trainer and abs(float(trainer[0]["value"][1]) - want[scene.trainer]["busy"]) < 1e-6:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus never showed the final counters: {trainer}")
        await asyncio.sleep(0.3)


@contextlib.contextmanager
def fed_prometheus(binaries: Any, kube: KubeCluster, admin: Any, slurm: SlurmCluster, workdir: Path, *,
                   usage: dict[str, Any] | None = None) -> Iterator[tuple[Any, Placed]]:
    """A Prometheus of its own, fed once with the scene in a new namespace (about 25 s), for
    the module- or package-scoped fixtures that read it; stopped on leaving. The feed runs on
    a thread with its own event loop, so no test's loop (pytest-asyncio) is touched."""
    import concurrent.futures

    import pytest
    from harness.kube.cluster import create_namespace
    from harness.prometheus.server import HarnessError, Prometheus

    server = Prometheus(binaries.prometheus, workdir / "prometheus")
    try:
        server.start()
    except HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    namespace = create_namespace(admin).metadata.name

    async def feed() -> Placed:
        async with placed(kube, admin, namespace, slurm, workdir) as scene:
            await feed_prometheus(scene, server, workdir, usage=usage)
        return scene

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            scene = pool.submit(asyncio.run, feed()).result()
        yield server, scene
    finally:
        server.stop()
