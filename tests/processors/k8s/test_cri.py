"""Pod identity from the node while the API server says nothing: the container runtime (CRI,
node mode) or the probe's uids hint (gateway mode) names what the cgroup and PodResources give.

The runtime is a stand-in serving the real CRI calls on a real unix socket (tests/kubelet/cri.py):
no container runtime runs here."""

from __future__ import annotations

from pathlib import Path

from gputally.kubelet import Holder
from gputally.processors.k8s.processor import K8sProcessor
from tests.kubelet.cri import Runtime, runtime_socket

from .helpers import CGROUP_629, CONTAINER, GPU, POD_UID, allocate, gpu_resource, k8s_only, make, metrics_batch, \
    process_resource, resource_attrs

HOLDERS = "gputally.k8s.podresources.holders"
UIDS = "gputally.k8s.podresources.uids"
OTHER_UID = "5b1d9e2a-7777-4888-9999-aaaabbbbcccc"


def node_mode(tmp_path: Path, cri: Path) -> K8sProcessor:
    return make({"mode": "node", "node_name": "node-a", "pod_resources": {"socket": str(tmp_path / "kubelet.sock")},
                 "cri": {"socket": str(cri)}})


async def test_node_mode_names_processes_and_holders_by_uid_without_the_api_server(tmp_path: Path) -> None:
    runtime = Runtime()
    runtime.run_pod("notebooks", "jupyter-alice-0", POD_UID, containers={"notebook": CONTAINER})
    async with runtime_socket(tmp_path, runtime) as socket:
        proc = node_mode(tmp_path, socket)
        assert proc.runtime.cri is not None and await proc.runtime.cri.refresh()
        await proc.runtime.cri.close()
    assert not proc.runtime.store.synced  # the API server never answered
    allocate(proc, (GPU, Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(gpu_resource(), process_resource(629, cgroup=CGROUP_629)))
    assert batch is not None
    gpu, process = (k8s_only(a) for a in resource_attrs(batch))
    assert gpu == {
        "k8s.pod.name": "jupyter-alice-0", "k8s.pod.uid": POD_UID, "k8s.namespace.name": "notebooks",
        "k8s.container.name": "notebook", "k8s.node.name": "node-a", "gputally.k8s.pods": ["notebooks/jupyter-alice-0"],
        "gputally.k8s.pod.uids": [f"notebooks/jupyter-alice-0/{POD_UID}"], "gputally.k8s.attribution": "podresources",
    }
    assert process == {
        "k8s.pod.name": "jupyter-alice-0", "k8s.pod.uid": POD_UID, "k8s.namespace.name": "notebooks",
        "k8s.container.name": "notebook", "container.id": CONTAINER, "k8s.node.name": "node-a",
        "gputally.k8s.attribution": "cgroup",
    }


async def test_node_mode_without_a_runtime_answer_keeps_the_bare_identity(tmp_path: Path) -> None:
    proc = node_mode(tmp_path, tmp_path / "no-runtime.sock")
    allocate(proc, (GPU, Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(gpu_resource(), process_resource(629, cgroup=CGROUP_629)))
    assert batch is not None
    gpu, process = (k8s_only(a) for a in resource_attrs(batch))
    assert "k8s.pod.uid" not in gpu and gpu["k8s.pod.name"] == "jupyter-alice-0"
    assert gpu["gputally.k8s.pod.uids"] == ["notebooks/jupyter-alice-0/"]  # named, its uid unknown
    assert process["k8s.pod.uid"] == POD_UID and "k8s.pod.name" not in process


async def test_gateway_mode_takes_holder_uids_from_the_probes_hint() -> None:
    proc = make()  # gateway mode, API server silent
    batch = await proc.process(metrics_batch(
        gpu_resource(**{HOLDERS: ["notebooks/jupyter-alice-0/notebook/nvidia.com/gpu"],
                        UIDS: [f"notebooks/jupyter-alice-0/{POD_UID}", "broken-entry"]}),
        gpu_resource("GPU-shared", index=1, **{
            HOLDERS: ["ml/a/main/nvidia.com/gpu.shared", "ml/b/main/nvidia.com/gpu.shared"],
            UIDS: [f"ml/b/{OTHER_UID}"]}),  # the runtime did not list a: it is listed by name only
    ))
    assert batch is not None
    single, shared = (k8s_only(a) for a in resource_attrs(batch))
    assert single["k8s.pod.uid"] == POD_UID and single["k8s.pod.name"] == "jupyter-alice-0"
    assert single["gputally.k8s.pod.uids"] == [f"notebooks/jupyter-alice-0/{POD_UID}"]
    assert shared["gputally.k8s.pods"] == ["ml/a", "ml/b"] and shared["gputally.k8s.pod.uids"] == ["ml/a/", f"ml/b/{OTHER_UID}"]
