"""Scale-out with usage accounting, as shipped in collector-config/scale-out/:

    the time series of 6 nodes --> otelcol (loadbalancing by host.name) --> two gputally
        replicas (k8s + usage) --> the same otelcol --> its backend (a file exporter)

A GPU's processes must reach the replica that integrates the GPU, or its busy time and energy
cannot be split among them: routing by ``host.name`` keeps each node's resources together.
Each GPU's counters come from exactly one replica (its ``service.instance.id``), and equal the
split rules applied to what its node sent.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from harness.kube.cluster import KubeCluster
from harness.otelcol.collector import Otelcol
from harness.processes import start_on_ports

from tests.otelcol.shapes import (
    METRICS_EXPORT,
    GputallyProcess,
    file_resources,
    metrics_of,
    points_of,
    scale_out_start,
    wait_until,
)
from tests.processors.usage.series import (
    HOLDER_PID,
    NOTEBOOK_PID,
    TRAINER_PID,
    expected,
    probe_requests,
    readings,
    recorded_uid,
    recording,
)

NODES = 6


def node_recording(n: int) -> dict[str, Any]:
    data = recording()
    data["device"]["uuid"] = f"GPU-5e86e41f-8e3f-625d-d1ef-5e02519df6{n:02d}"
    return data


async def test_each_gpu_is_counted_whole_by_one_replica(
    otelcol: Callable[..., Otelcol], kube_cluster: KubeCluster, tmp_path: Path,
) -> None:
    base = 1_800_000_000 * 10**9
    per_node = {f"gpu-{n:02d}": await probe_requests(node_recording(n), base_ns=base, node=f"gpu-{n:02d}")
                for n in range(NODES)}
    out = tmp_path / "backend.json"
    replicas: list[GputallyProcess] = []

    start = scale_out_start(otelcol, replicas, tmp_path, out, replica=lambda n: {
        "processors.k8s.kubeconfig": str(kube_cluster.limited_kubeconfig),
        "extensions.file_storage.directory": str(tmp_path / f"usage-{n}"),
        "processors.usage.instance_id": f"replica-{n}",
        "processors.usage.emit_interval": "1s",
        "processors.usage.settle": "300ms",
    })

    front_port = start_on_ports(start, what="the scale-out collector and its replicas").port("otlp")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front_port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            for cycle in range(len(next(iter(per_node.values())))):  # the nodes' cycles interleaved, as they come
                for requests in per_node.values():
                    await export(requests[cycle].SerializeToString(), timeout=10)
        await wait_until(lambda: len({a.get("host.name") for a, _ in file_resources(out) if "process.pid" in a}) == NODES,
                         "every node's data back from the replicas")
        await asyncio.sleep(1.0)  # the last samples settle
    finally:
        for replica in replicas:
            assert await asyncio.to_thread(replica.stop) == 0, replica.log_tail()

    def counted() -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """hw.id -> replica -> owner id -> the newest busy time. No pods exist in the API: the
        trainer's and notebook's processes are accounted by the pod uids their cgroups name,
        the Slurm job's holder (no slurm processor here) is unattributed."""
        found: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for attributes, rm in file_resources(out):
            owner = attributes.get("gputally.usage.owner.id")
            if owner is None or owner == "unallocated":
                continue
            for metric in metrics_of(rm):
                if metric["name"] == "gputally.usage.busy.time":
                    for point in points_of(metric):
                        by = found.setdefault(attributes["hw.id"], {}).setdefault(
                            attributes["service.instance.id"], {}).setdefault(owner, {})
                        at = int(point["timeUnixNano"])
                        if at >= by.get("at", 0):
                            by.update(at=at, busy=float(point["asDouble"]))
        return found

    owner_of = {TRAINER_PID: recorded_uid(TRAINER_PID), NOTEBOOK_PID: recorded_uid(NOTEBOOK_PID),
                HOLDER_PID: "unattributed"}
    await wait_until(lambda: len(counted()) == NODES, "every GPU's counters at the backend")
    found = counted()
    replicas_used = set()
    for node, requests in per_node.items():
        want = expected(readings(requests), owner_of=owner_of.__getitem__, holders=[])
        hw_id = node_recording(int(node[-2:]))["device"]["uuid"]
        (replica, got), = found[hw_id].items()  # one replica counted this GPU, and nobody else
        replicas_used.add(replica)
        busy = {owner: counters["busy"] for owner, counters in want.items() if counters["busy"] > 0}
        assert set(busy) <= set(got), (node, got, busy)
        for owner, seconds in busy.items():
            assert math.isclose(got[owner]["busy"], seconds, rel_tol=1e-9), (node, owner, got[owner], seconds)
    assert replicas_used <= {"replica-0", "replica-1"}
    stray = [a for a, _ in file_resources(out) if a.get("gputally.usage.owner.id") == "unattributed"
             and a.get("hw.id") not in found]
    assert not stray
