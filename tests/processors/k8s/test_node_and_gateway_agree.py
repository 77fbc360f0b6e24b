"""Node mode and gateway mode give a GPU the same attributes: one PodResources answer, two paths.

The same pods live in the real kube-apiserver (tests/harness/kube). The same ``List`` answer
is served by the kubelet stand-in on a real unix socket. Node mode reads that socket itself;
in gateway mode the probe's own reader (:mod:`gputally.probes.core.allocations`) reads it and the
answer travels as the ``gputally.k8s.podresources.holders`` hint on the probe's OTLP. Every
form of device id is in the answer: a GPU uuid, an index, time-slicing replicas shared by two
pods, MIG devices by uuid and in the pre-R470 ``MIG-GPU-<uuid>/<gi>/<ci>`` form (and their
GPU, which lists both), a DRA claim, and a GPU nobody holds.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from harness.kube.cluster import (
    KubeCluster,
    container_id,
    create_deployment_with_replicaset,
    create_node,
    create_pod,
    create_statefulset,
    set_pod_status,
)

from gputally.otlp.batch import Batch, Signal
from gputally.probes.core.allocations import HOLDERS, PodAllocations
from gputally.probes.core.catalog import POWER
from gputally.probes.core.model import AttrValue, Entity, Point
from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.processors.k8s.processor import K8sProcessor

from .helpers import k8s_only, make, resource_attrs
from .kubelet import Kubelet, kubelet_socket


def gpu_uuid(n: int) -> str:
    return f"GPU-{n:08x}-3930-fe87-1e34-cb91101c1bd9"


MIG_A = "MIG-aaaaaaaa-1111-5111-8111-000000000001"
MIG_B = "MIG-bbbbbbbb-2222-5222-8222-000000000002"


def probe_entities(node: str) -> list[Entity]:
    """What the NVIDIA probe sends for six GPUs, the fourth in MIG mode with two GPU instances."""
    entities = []
    for n in range(6):
        attributes: dict[str, AttrValue] = {"hw.id": gpu_uuid(n), "hw.type": "gpu", "hw.vendor": "NVIDIA",
                                            "hw.name": f"nvidia{n}", "gputally.gpu.index": n, "host.name": node}
        entities.append(Entity(key=f"gpu/{n}", kind="gpu", attributes=attributes, points=[Point(POWER, 300.0)]))
    for gi, mig in ((1, MIG_A), (2, MIG_B)):
        attributes = {"hw.id": mig, "hw.type": "gpu", "hw.parent": gpu_uuid(3), "hw.name": f"nvidia3/gi{gi}",
                      "gputally.gpu.index": 3, "gputally.gpu.mig.gpu_instance_id": gi,
                      "gputally.gpu.mig.compute_instance_id": 0, "host.name": node}
        entities.append(Entity(key=f"mig/{mig}", kind="mig", attributes=attributes, points=[Point(POWER, 0.0)]))
    return entities


def batch_of(entities: list[Entity]) -> Batch:
    """The probe's OTLP encoding of ``entities``, as the receiver hands it on."""
    request = OtlpEncoder().metrics(entities, time.time_ns())
    return Batch.decode(Signal.METRICS, request.SerializeToString())


def allocate(kubelet: Kubelet, ns: str) -> None:
    kubelet.allocate(ns, "web-x", "main", "nvidia.com/gpu", gpu_uuid(0))
    kubelet.allocate(ns, "jupyter-alice-0", "notebook", "nvidia.com/gpu", "1")  # index strategy
    kubelet.allocate(ns, "share-a", "main", "nvidia.com/gpu.shared", f"{gpu_uuid(2)}::0")
    kubelet.allocate(ns, "share-b", "main", "nvidia.com/gpu.shared", f"{gpu_uuid(2)}::3")
    kubelet.allocate(ns, "mig-a", "main", "nvidia.com/mig-3g.71gb", MIG_A)
    kubelet.allocate(ns, "mig-b", "main", "nvidia.com/mig-3g.71gb", f"MIG-{gpu_uuid(3)}/2/0")
    kubelet.claim(ns, "dra", "main", "gpu.nvidia.com", "gpu-4", f"k8s.gpu.nvidia.com/gpu={gpu_uuid(4)}")
    kubelet.allocate(ns, "nic", "main", "example.com/sriov", "0000:3b:00.1")  # not a GPU


def create_pods(admin: Any, ns: str, node: str) -> dict[str, str]:
    """The pods, by name -> uid."""
    _, replicaset = create_deployment_with_replicaset(admin, ns, "web", labels={"team": "nlp"})
    statefulset = create_statefulset(admin, ns, "jupyter-alice")
    pods = {"web-x": (replicaset, ["main"]), "jupyter-alice-0": (statefulset, ["notebook"])}
    pods.update({name: (None, ["main"]) for name in ("share-a", "share-b", "mig-a", "mig-b", "dra", "nic")})
    uids = {}
    for name, (owner, containers) in pods.items():
        uids[name] = create_pod(admin, ns, name, owner=owner, node_name=node, containers=containers,
                                labels={"team": "nlp"} if name == "web-x" else None).metadata.uid
        set_pod_status(admin, ns, name)
    return uids


async def attributed(proc: K8sProcessor, batch: Batch) -> list[dict[str, Any]]:
    out = await proc.process(batch)
    assert out is not None
    return [{k: v for k, v in k8s_only(a).items() if k != HOLDERS} for a in resource_attrs(out)]


async def settled(proc: K8sProcessor, batch: Batch, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The processor's answer once background lookups (owners, node labels, MIG parents) are in."""
    deadline = time.monotonic() + timeout
    while True:
        found = await attributed(proc, batch)
        done = found[0].get("k8s.deployment.name") == "web" and found[0].get("cloud.region") == "us-east-2"
        if done and found[3].get("gputally.k8s.pods") == [f"{found[6]['k8s.namespace.name']}/mig-a",
                                                         f"{found[6]['k8s.namespace.name']}/mig-b"]:
            return found
        assert time.monotonic() < deadline, f"{proc.runtime.config.mode} mode never settled: {found}"
        await asyncio.sleep(0.05)


async def test_node_mode_and_gateway_mode_attribute_every_gpu_alike(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, tmp_path: Path
) -> None:
    ns, node = kube_namespace, f"gpu-{uuid.uuid4().hex[:8]}"
    create_node(kube_admin, node, labels={"topology.kubernetes.io/region": "us-east-2",
                                          "node.kubernetes.io/instance-type": "p5en.48xlarge"})
    uids = create_pods(kube_admin, ns, node)
    kubelet = Kubelet()
    allocate(kubelet, ns)
    common = {"kubeconfig": str(kube_cluster.limited_kubeconfig), "extract": {"labels": ["team"]},
              "watch": {"backoff_initial": "100ms", "backoff_max": "500ms"}}
    async with kubelet_socket(tmp_path, kubelet) as socket:
        node_mode = make({"mode": "node", "node_name": node, **common,
                          "pod_resources": {"socket": str(socket), "refresh_interval": "100ms"}})
        gateway = make({"mode": "gateway", **common})
        probe = PodAllocations(socket)
        await node_mode.start()
        await gateway.start()
        try:
            plain = probe_entities(node)  # what the sidecar's probe sends: no hint, gputally reads the socket
            hinted = probe_entities(node)  # what a probe sends to a gateway
            await probe.refresh()
            probe.decorate(hinted)
            assert all(HOLDERS in e.attributes for e in hinted)
            by_node = await settled(node_mode, batch_of(plain))
            by_gateway = await settled(gateway, batch_of(hinted))
        finally:
            await probe.close()
            await node_mode.shutdown()
            await gateway.shutdown()

    assert by_gateway == by_node
    web, jupyter, shared, mig_parent, dra, free, mig_a, mig_b = by_node
    assert web == {
        "k8s.pod.name": "web-x", "k8s.pod.uid": web["k8s.pod.uid"], "k8s.namespace.name": ns,
        "k8s.container.name": "main", "container.id": container_id(ns, "web-x", "main").rpartition("://")[2],
        "k8s.replicaset.name": web["k8s.replicaset.name"], "k8s.deployment.name": "web",
        "gputally.k8s.owner.kind": "Deployment", "gputally.k8s.owner.name": "web", "k8s.pod.label.team": "nlp",
        "k8s.node.name": node, "cloud.region": "us-east-2", "host.type": "p5en.48xlarge",
        "gputally.k8s.pods": [f"{ns}/web-x"], "gputally.k8s.pod.uids": [f"{ns}/web-x/{uids['web-x']}"],
        "gputally.k8s.attribution": "podresources",
    }
    assert jupyter["k8s.statefulset.name"] == "jupyter-alice" and jupyter["k8s.container.name"] == "notebook"
    assert shared == {"gputally.k8s.pods": [f"{ns}/share-a", f"{ns}/share-b"], "k8s.namespace.name": ns,
                      "gputally.k8s.pod.uids": [f"{ns}/{name}/{uids[name]}" for name in ("share-a", "share-b")],
                      "k8s.node.name": node, "cloud.region": "us-east-2", "host.type": "p5en.48xlarge",
                      "gputally.k8s.attribution": "podresources"}
    assert mig_parent["gputally.k8s.pods"] == [f"{ns}/mig-a", f"{ns}/mig-b"] and "k8s.pod.name" not in mig_parent
    assert mig_parent["gputally.k8s.pod.uids"] == [f"{ns}/{name}/{uids[name]}" for name in ("mig-a", "mig-b")]
    assert (mig_a["k8s.pod.name"], mig_b["k8s.pod.name"], dra["k8s.pod.name"]) == ("mig-a", "mig-b", "dra")
    assert free == {"gputally.k8s.attribution": "none"}
