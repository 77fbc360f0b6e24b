"""The usage counters end to end, through ``gputally serve`` with the real parts:

    H200 time series (the probe's OTLP) --> gputally serve: k8s (node mode, real kube-apiserver,
        PodResources on a real unix socket) -> slurm (real slurmctld, slurmrestd) -> usage
        --> otelcol (its backend a file exporter)

The GPU is time-sliced between the trainer's and the notebook's pods (``nvidia.com/gpu.shared``
replicas), and the recording's memory holder runs in a real Slurm job. The counters that come
out equal the split rules applied to the readings that went in (`series.expected`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.kube.cluster import KubeCluster
from harness.otelcol.collector import Otelcol
from harness.slurm.cluster import SlurmCluster

from tests.otelcol.shapes import USAGE_COUNTERS as COUNTERS
from tests.otelcol.shapes import file_backend, file_resources, override, shipped, usage_at_backend, wait_until
from tests.processors.usage.scenario import placed, run_through_serve
from tests.processors.usage.series import GPU


async def test_usage_counters_through_serve_with_k8s_and_slurm(
    otelcol: Callable[..., Otelcol], kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str,
    slurm_cluster: SlurmCluster, tmp_path: Path,
) -> None:
    out = tmp_path / "backend.json"
    backend = otelcol(file_backend(override(shipped("gateway", "otelcol.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "receivers.otlp.protocols.http.endpoint": "127.0.0.1:0",
    }), out, ["metrics", "logs"]), name="backend")
    exporter = {"otlp": {"endpoint": f"127.0.0.1:{backend.port('otlp')}", "tls": {"insecure": True}}}

    def warm() -> bool:  # pods synced, the GPU's allocation listed, the job's metadata fetched
        seen = [a for a, _ in file_resources(out)]
        return all(any(k in a for a in seen) for k in ("k8s.statefulset.name", "gputally.k8s.pods", "slurm.job.user"))

    async with placed(kube_cluster, kube_admin, kube_namespace, slurm_cluster, tmp_path) as scene:
        await run_through_serve(scene, tmp_path, exporter, warm=warm)
    await wait_until(lambda: len(usage_at_backend(out)) >= 3, "the usage counters at the backend")

    ns, job = scene.namespace, scene.job
    want = scene.expected()
    got = usage_at_backend(out)
    unattributed = got.pop("unattributed", None)  # warm-up copies sent before the pods were named: nothing counted
    assert unattributed is None or all(unattributed[k] == 0 for k in COUNTERS.values())
    assert set(got) == set(want), got.keys()
    for owner, counters in want.items():
        for name in COUNTERS.values():
            assert math.isclose(got[owner][name], counters[name], rel_tol=1e-9, abs_tol=1e-6), (owner, name)

    trainer_attributes = got[scene.trainer]["attributes"]
    assert trainer_attributes["gputally.usage.owner.kind"] == "k8s.pod"
    assert trainer_attributes["k8s.namespace.name"] == ns and trainer_attributes["k8s.pod.name"] == "trainer-0"
    assert trainer_attributes["gputally.k8s.owner.kind"] == "StatefulSet"
    assert trainer_attributes["k8s.pod.label.team"] == "vision" and trainer_attributes["hw.id"] == GPU
    holder = got[str(job)]["attributes"]
    assert holder["gputally.usage.owner.kind"] == "slurm.job" and holder["slurm.job.account"] == "physics"
    assert holder["slurm.job.name"] == "holder" and holder["slurm.job.user"] == "root"
    assert got[str(job)]["busy"] == 0 and got[str(job)]["allocated"] == 0  # holds memory, computes nothing
    # Both pods hold the GPU: each has half its observed time, the notebook idle once it stopped.
    assert math.isclose(got[scene.trainer]["allocated"], got[scene.notebook]["allocated"])
    assert got[scene.notebook]["idle"] > 0 and got[scene.trainer]["idle"] == 0
