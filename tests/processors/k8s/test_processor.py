"""The hot path: process and device resources get their pod, from caches filled by hand here."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest

from gputally.kubelet.devices import Holder
from gputally.otlp.batch import Signal
from gputally.processors.k8s.model import KeyFilter, pod_from_json
from gputally.processors.k8s.owners import OwnerResolver
from gputally.processors.k8s.processor import K8sProcessor

from .helpers import (
    allocate,
    CGROUP_628,
    CGROUP_629,
    CONTAINER,
    GPU,
    POD_UID,
    cid,
    uid_of,
    context,
    gpu_resource,
    k8s_only,
    logs_batch,
    make,
    metrics_batch,
    pod_json,
    process_resource,
    resource_attrs,
)

NO_FILTER = KeyFilter([])


def add_pod(proc: K8sProcessor, obj: dict[str, object], *, labels: KeyFilter = NO_FILTER) -> None:
    runtime = proc.runtime
    runtime.store.upsert(pod_from_json(obj, labels=labels, annotations=NO_FILTER))
    runtime.store.synced = True


def jupyter(**extra: object) -> dict[str, object]:
    return pod_json("jupyter-alice-0", namespace="notebooks", uid=POD_UID,
                    owner=("StatefulSet", "jupyter-alice", "sts-uid"), containers={"notebook": CONTAINER}, **extra)


async def test_idle_holder_lands_on_its_pod_and_slurm_process_does_not() -> None:
    proc = make()
    add_pod(proc, jupyter())
    batch = await proc.process(metrics_batch(
        process_resource(628, cgroup=CGROUP_628), process_resource(629, cgroup=CGROUP_629)
    ))
    assert batch is not None
    slurm, holder = resource_attrs(batch)
    assert k8s_only(slurm) == {"gputally.k8s.attribution": "none"}
    assert k8s_only(holder) == {
        "k8s.pod.name": "jupyter-alice-0",
        "k8s.pod.uid": POD_UID,
        "k8s.namespace.name": "notebooks",
        "k8s.container.name": "notebook",
        "container.id": CONTAINER,
        "k8s.statefulset.name": "jupyter-alice",
        "gputally.k8s.owner.kind": "StatefulSet",
        "gputally.k8s.owner.name": "jupyter-alice",
        "k8s.node.name": "node-a",
        "gputally.k8s.attribution": "cgroup",
    }
    assert holder["process.pid"] == 629 and holder["hw.id"] == GPU  # the probe's own attributes stay


async def test_before_the_first_list_only_cgroup_identity_is_attached() -> None:
    proc = make()
    proc.runtime.store.upsert(pod_from_json(jupyter(), labels=NO_FILTER, annotations=NO_FILTER))  # not synced
    batch = await proc.process(metrics_batch(process_resource(629, cgroup=CGROUP_629)))
    assert batch is not None
    (holder,) = resource_attrs(batch)
    assert k8s_only(holder) == {"k8s.pod.uid": POD_UID, "container.id": CONTAINER, "gputally.k8s.attribution": "cgroup"}


async def test_a_container_restarted_into_a_new_id_still_finds_its_pod_by_uid() -> None:
    proc = make()
    add_pod(proc, jupyter())
    fresh = cid("restarted")
    text = CGROUP_629.replace(CONTAINER, fresh)
    batch = await proc.process(metrics_batch(process_resource(629, cgroup=text)))
    assert batch is not None
    (holder,) = resource_attrs(batch)
    assert holder["k8s.pod.name"] == "jupyter-alice-0" and holder["container.id"] == fresh
    assert "k8s.container.name" not in holder  # no status names that container yet: not guessed


async def test_labels_and_annotations_come_from_the_allow_lists_only() -> None:
    proc = make({"extract": {"labels": ["team", "app.kubernetes.io/*"], "annotations": ["cost-center"]}})
    obj = jupyter(labels={"team": "ml", "app.kubernetes.io/name": "jupyter", "secret": "x"},
                  annotations={"cost-center": "r&d", "other": "y"})
    proc.runtime.store.upsert(pod_from_json(obj, labels=KeyFilter(["team", "app.kubernetes.io/*"]),
                                            annotations=KeyFilter(["cost-center"])))
    proc.runtime.store.synced = True
    batch = await proc.process(metrics_batch(process_resource(629, cgroup=CGROUP_629)))
    assert batch is not None
    (holder,) = resource_attrs(batch)
    assert {k: v for k, v in holder.items() if ".label." in k or ".annotation." in k} == {
        "k8s.pod.label.app.kubernetes.io/name": "jupyter",
        "k8s.pod.label.team": "ml",
        "k8s.pod.annotation.cost-center": "r&d",
    }


async def test_keys_the_resource_already_has_are_kept_not_duplicated() -> None:
    proc = make()
    add_pod(proc, jupyter())
    batch = await proc.process(metrics_batch(
        process_resource(629, cgroup=CGROUP_629, **{"k8s.node.name": "set-upstream", "k8s.cluster.name": "prod"})
    ))
    assert batch is not None
    (holder,) = resource_attrs(batch)  # attrs() fails on a duplicated key
    assert holder["k8s.node.name"] == "set-upstream" and holder["k8s.cluster.name"] == "prod"
    assert holder["k8s.pod.name"] == "jupyter-alice-0"


async def test_a_resource_attributed_upstream_is_left_alone_and_forwarded_as_received() -> None:
    proc = make()
    add_pod(proc, jupyter())
    incoming = metrics_batch(process_resource(629, cgroup=CGROUP_629, **{"gputally.k8s.attribution": "cgroup"}),
                             {"service.name": "not-a-gpu"})
    raw = incoming.serialize()
    batch = await proc.process(incoming)
    assert batch is not None and batch.serialize() is raw  # untouched: not even re-encoded


async def test_logs_are_attributed_like_metrics() -> None:
    proc = make(signal=Signal.LOGS)
    add_pod(proc, jupyter())
    batch = await proc.process(logs_batch(process_resource(629, cgroup=CGROUP_629)))
    assert batch is not None
    (holder,) = resource_attrs(batch)
    assert holder["k8s.pod.name"] == "jupyter-alice-0"


async def test_an_owner_lookup_that_completes_changes_the_next_batch() -> None:
    proc = make()
    runtime = proc.runtime
    asked: list[tuple[str, str, str]] = []

    async def fetch(kind: str, namespace: str, name: str) -> dict[str, object]:
        asked.append((kind, namespace, name))
        return {"metadata": {"name": name, "uid": "rs-uid", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d-uid", "controller": True}]}}

    runtime.owners = OwnerResolver(fetch=fetch, problems=runtime.problems, on_resolved=runtime._owner_resolved)
    uid = "0f0f0f0f-0000-4000-8000-000000000001"
    add_pod(proc, pod_json("web-1", uid=uid, owner=("ReplicaSet", "web-6d4f", "rs-uid"), containers={"main": cid("w")}))
    cgroup = f"0::/kubepods/besteffort/pod{uid}/{cid('w')}"
    first = await proc.process(metrics_batch(process_resource(7, cgroup=cgroup)))
    assert first is not None
    (before,) = resource_attrs(first)
    assert before["k8s.replicaset.name"] == "web-6d4f" and "k8s.deployment.name" not in before
    task = asyncio.create_task(runtime.owners.run())
    try:
        for _ in range(100):
            await asyncio.sleep(0.01)
            if len(runtime.owners):
                break
    finally:
        task.cancel()
    second = await proc.process(metrics_batch(process_resource(7, cgroup=cgroup)))
    assert second is not None
    (after,) = resource_attrs(second)
    assert asked == [("ReplicaSet", "ml", "web-6d4f")]
    assert after["k8s.deployment.name"] == "web" and after["gputally.k8s.owner.kind"] == "Deployment"
    assert after["k8s.replicaset.name"] == "web-6d4f" and after["k8s.pod.name"] == "web-1"


# --- devices ------------------------------------------------------------------------------


def node_mode(tmp_path: Path, **config: object) -> K8sProcessor:
    return make({"mode": "node", "node_name": "node-a",
                 "pod_resources": {"socket": str(tmp_path / "kubelet.sock")}, **config})


async def test_an_allocated_idle_gpu_carries_its_pod(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    add_pod(proc, jupyter())
    allocate(proc, (GPU, Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(gpu_resource(), gpu_resource("GPU-other", index=1)))
    assert batch is not None
    allocated, free = resource_attrs(batch)
    assert k8s_only(allocated) == {
        "k8s.pod.name": "jupyter-alice-0",
        "k8s.pod.uid": POD_UID,
        "k8s.namespace.name": "notebooks",
        "k8s.container.name": "notebook",
        "container.id": CONTAINER,
        "k8s.statefulset.name": "jupyter-alice",
        "gputally.k8s.owner.kind": "StatefulSet",
        "gputally.k8s.owner.name": "jupyter-alice",
        "k8s.node.name": "node-a",
        "gputally.k8s.pods": ["notebooks/jupyter-alice-0"],
        "gputally.k8s.pod.uids": [f"notebooks/jupyter-alice-0/{POD_UID}"],
        "gputally.k8s.attribution": "podresources",
    }
    assert k8s_only(free) == {"gputally.k8s.attribution": "none"}


async def test_a_gpu_shared_by_time_slicing_lists_every_pod_and_names_none(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    add_pod(proc, pod_json("a", namespace="team-a", containers={"main": cid("a")}))
    add_pod(proc, pod_json("b", namespace="team-b", containers={"main": cid("b")}))
    allocate(proc,
             (f"{GPU}::0", Holder("team-a", "a", "main", "nvidia.com/gpu")),
             (f"{GPU}::3", Holder("team-b", "b", "main", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(gpu_resource()))
    assert batch is not None
    (shared,) = resource_attrs(batch)
    assert k8s_only(shared) == {
        "gputally.k8s.pods": ["team-a/a", "team-b/b"],
        "gputally.k8s.pod.uids": [f"team-a/a/{uid_of('team-a', 'a')}", f"team-b/b/{uid_of('team-b', 'b')}"],
        "k8s.node.name": "node-a",
        "gputally.k8s.attribution": "podresources",
    }


async def test_one_pod_holding_two_replicas_of_a_gpu_is_its_single_owner(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    add_pod(proc, pod_json("a", containers={"main": cid("a")}))
    allocate(proc, (f"{GPU}::0", Holder("ml", "a", "main", "nvidia.com/gpu")),
             (f"{GPU}::1", Holder("ml", "a", "main", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(gpu_resource()))
    assert batch is not None
    (gpu,) = resource_attrs(batch)
    assert gpu["k8s.pod.name"] == "a" and gpu["k8s.container.name"] == "main" and gpu["container.id"] == cid("a")


async def test_device_ids_by_index_and_minor_number_find_the_same_gpu(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    allocate(proc, ("1", Holder("ml", "by-index", "main", "nvidia.com/gpu")),
             ("nvidia5", Holder("ml", "by-minor", "main", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(
        gpu_resource("GPU-aaa", index=1), gpu_resource("GPU-bbb", index=2, **{"hw.name": "nvidia5"})
    ))
    assert batch is not None
    first, second = resource_attrs(batch)
    # Not in the pod cache (not listed yet): PodResources' own identity is attached at once.
    assert k8s_only(first) == {"k8s.pod.name": "by-index", "k8s.namespace.name": "ml", "k8s.container.name": "main",
                               "k8s.node.name": "node-a", "gputally.k8s.pods": ["ml/by-index"],
                               "gputally.k8s.pod.uids": ["ml/by-index/"], "gputally.k8s.attribution": "podresources"}
    assert second["k8s.pod.name"] == "by-minor"


async def test_mig_devices_carry_their_pod_and_the_gpu_lists_every_mig_tenant(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    mig_a, mig_b = "MIG-aaaaaaaa-1111-5111-8111-000000000001", "MIG-bbbbbbbb-2222-5222-8222-000000000002"
    allocate(proc, (mig_a, Holder("ml", "a", "main", "nvidia.com/mig-1g.18gb")),
             (mig_b, Holder("ml", "b", "main", "nvidia.com/mig-3g.71gb")))
    mig = {"hw.parent": GPU, "gputally.gpu.mig.gpu_instance_id": 1}
    migs = [gpu_resource(mig_a, **mig), gpu_resource(mig_b, **{**mig, "gputally.gpu.mig.gpu_instance_id": 2})]
    await proc.process(metrics_batch(*migs))  # the probe's MIG resources say which GPU they are on
    batch = await proc.process(metrics_batch(gpu_resource(), *migs))
    assert batch is not None
    parent, a, b = resource_attrs(batch)
    assert (a["k8s.pod.name"], b["k8s.pod.name"]) == ("a", "b")
    assert parent["gputally.k8s.pods"] == ["ml/a", "ml/b"] and "k8s.pod.name" not in parent


async def test_nothing_is_said_of_devices_until_pod_resources_answered(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    incoming = metrics_batch(gpu_resource())
    raw = incoming.serialize()
    batch = await proc.process(incoming)
    assert batch is not None and batch.serialize() is raw


async def test_gateway_mode_leaves_devices_without_a_holders_hint_alone() -> None:
    proc = make()
    assert proc.runtime.podresources is None
    incoming = metrics_batch(gpu_resource())
    raw = incoming.serialize()
    batch = await proc.process(incoming)
    assert batch is not None and batch.serialize() is raw


# --- devices in gateway mode: the probe's holders hint ------------------------------------------

HOLDERS = "gputally.k8s.podresources.holders"


def hinted(*entries: str, uuid_: str = GPU, **extra: object) -> dict[str, object]:
    return gpu_resource(uuid_, **{HOLDERS: list(entries)}, **extra)


def without_hint(attributes: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in k8s_only(attributes).items() if k != HOLDERS}


async def test_gateway_mode_attributes_a_gpu_from_the_probes_hint_as_node_mode_does(tmp_path: Path) -> None:
    gateway, node = make(), node_mode(tmp_path)
    for proc in (gateway, node):
        add_pod(proc, jupyter())
    allocate(node, (GPU, Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu")))
    held = await gateway.process(metrics_batch(
        hinted("notebooks/jupyter-alice-0/notebook/nvidia.com/gpu"), hinted(uuid_="GPU-free", index=1)))
    reference = await node.process(metrics_batch(gpu_resource(), gpu_resource("GPU-free", index=1)))
    assert held is not None and reference is not None
    assert [without_hint(a) for a in resource_attrs(held)] == [k8s_only(a) for a in resource_attrs(reference)]
    allocated, free = resource_attrs(held)
    assert allocated["k8s.pod.name"] == "jupyter-alice-0" and allocated["gputally.k8s.attribution"] == "podresources"
    assert allocated["k8s.node.name"] == "node-a"  # the pod's spec.nodeName
    assert without_hint(free) == {"gputally.k8s.attribution": "none"}  # the kubelet said: nobody
    assert free[HOLDERS] == []  # the hint stays as the probe sent it


async def test_a_hinted_shared_gpu_lists_every_pod_and_its_node() -> None:
    proc = make()
    add_pod(proc, pod_json("a", namespace="team-a", node="gpu-7", containers={"main": cid("a")}))
    add_pod(proc, pod_json("b", namespace="team-b", node="gpu-7", containers={"main": cid("b")}))
    batch = await proc.process(metrics_batch(hinted(
        "team-b/b/main/nvidia.com/gpu.shared", "team-a/a/main/nvidia.com/gpu.shared")))
    assert batch is not None
    (shared,) = resource_attrs(batch)
    assert without_hint(shared) == {
        "gputally.k8s.pods": ["team-a/a", "team-b/b"],
        "gputally.k8s.pod.uids": [f"team-a/a/{uid_of('team-a', 'a')}", f"team-b/b/{uid_of('team-b', 'b')}"],
        "k8s.node.name": "gpu-7",
        "gputally.k8s.attribution": "podresources",
    }


async def test_a_hint_is_split_on_its_first_three_slashes_and_nonsense_is_not_believed() -> None:
    proc = make()
    batch = await proc.process(metrics_batch(
        hinted("ml/a/main/example.com/vendor/gpu"), hinted("nonsense", "ml//main/nvidia.com/gpu", uuid_="GPU-x")))
    assert batch is not None
    parsed, ignored = resource_attrs(batch)
    # Not listed by the API (yet): the hint's own identity, as PodResources' in node mode.
    assert without_hint(parsed) == {"k8s.pod.name": "a", "k8s.namespace.name": "ml", "k8s.container.name": "main",
                                    "gputally.k8s.pods": ["ml/a"], "gputally.k8s.pod.uids": ["ml/a/"],
                                    "gputally.k8s.attribution": "podresources"}
    assert without_hint(ignored) == {}


async def test_node_mode_prefers_its_own_socket_to_a_hint(tmp_path: Path) -> None:
    proc = node_mode(tmp_path)
    allocate(proc, (GPU, Holder("ml", "fresh", "main", "nvidia.com/gpu")))
    batch = await proc.process(metrics_batch(hinted("ml/stale/main/nvidia.com/gpu")))
    assert batch is not None and resource_attrs(batch)[0]["k8s.pod.name"] == "fresh"
    # Without a socket of its own (pod_resources off), node mode takes the hint.
    off = make({"mode": "node", "node_name": "node-a", "pod_resources": {"enabled": False}})
    batch = await off.process(metrics_batch(hinted("ml/stale/main/nvidia.com/gpu")))
    assert batch is not None and resource_attrs(batch)[0]["k8s.pod.name"] == "stale"


async def test_a_new_hint_is_a_new_decision() -> None:
    proc = make()
    first = await proc.process(metrics_batch(hinted("ml/a/main/nvidia.com/gpu")))
    second = await proc.process(metrics_batch(hinted("ml/b/main/nvidia.com/gpu")))
    again = await proc.process(metrics_batch(hinted()))
    assert first is not None and second is not None and again is not None
    assert [resource_attrs(b)[0].get("k8s.pod.name") for b in (first, second, again)] == ["a", "b", None]
    assert len(proc._decisions) == 3


# --- pid-only processes (proc_root) --------------------------------------------------------


def fake_proc(root: Path, pid: int, cgroup: str, start_ticks: int) -> None:
    (root / "self").mkdir(parents=True, exist_ok=True)
    base = root / str(pid)
    base.mkdir(parents=True, exist_ok=True)
    (base / "cgroup").write_text(cgroup + "\n")
    fields = ["S"] + ["0"] * 18 + [str(start_ticks)] + ["0"] * 10
    (base / "stat").write_text(f"{pid} (python3) " + " ".join(fields) + "\n")


async def test_a_pid_without_hint_is_read_from_proc_root_in_the_background(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    fake_proc(root, 629, CGROUP_629, 1000)
    proc = make({"proc_root": str(root)})
    add_pod(proc, jupyter())
    runtime = proc.runtime
    assert runtime.proc is not None
    first = await proc.process(metrics_batch(process_resource(629, start="2026-11-29T10:00:00.000Z")))
    assert first is not None
    assert "gputally.k8s.attribution" not in resource_attrs(first)[0]  # pending: nothing read on the hot path
    await runtime.proc.read_once()
    second = await proc.process(metrics_batch(process_resource(629, start="2026-11-29T10:00:00.000Z")))
    assert second is not None
    assert resource_attrs(second)[0]["k8s.pod.name"] == "jupyter-alice-0"


async def test_a_reused_pid_never_inherits_the_previous_owner(tmp_path: Path) -> None:
    root = tmp_path / "proc"
    fake_proc(root, 629, CGROUP_629, 1000)
    proc = make({"proc_root": str(root)})
    add_pod(proc, jupyter())
    runtime = proc.runtime
    assert runtime.proc is not None
    await proc.process(metrics_batch(process_resource(629)))  # no start time from the probe either
    await runtime.proc.read_once()
    batch = await proc.process(metrics_batch(process_resource(629)))
    assert batch is not None and resource_attrs(batch)[0]["k8s.pod.name"] == "jupyter-alice-0"
    fake_proc(root, 629, CGROUP_628, 5000)  # the pod's process exited; a Slurm task got pid 629
    await runtime.proc.read_once()  # the refresh sees another start time and drops the answer
    await proc.process(metrics_batch(process_resource(629)))
    await runtime.proc.read_once()
    batch = await proc.process(metrics_batch(process_resource(629)))
    assert batch is not None and k8s_only(resource_attrs(batch)[0]) == {"gputally.k8s.attribution": "none"}


async def test_without_proc_root_a_pid_alone_is_not_guessed() -> None:
    proc = make()
    add_pod(proc, jupyter())
    batch = await proc.process(metrics_batch(process_resource(629)))
    assert batch is not None and k8s_only(resource_attrs(batch)[0]) == {"gputally.k8s.attribution": "none"}


# --- self-metrics ---------------------------------------------------------------------------


async def test_attribution_is_counted_by_source_and_signal(tmp_path: Path) -> None:
    ctx = context("k8s/node")
    proc = make({"mode": "node", "node_name": "node-a", "pod_resources": {"socket": str(tmp_path / "s")}}, ctx=ctx)
    add_pod(proc, jupyter())
    allocate(proc, (GPU, Holder("notebooks", "jupyter-alice-0", "notebook", "nvidia.com/gpu")))
    for _ in range(2):
        await proc.process(metrics_batch(
            gpu_resource(), process_resource(628, cgroup=CGROUP_628), process_resource(629, cgroup=CGROUP_629)
        ))
    text = generate_latest(ctx.telemetry.registry).decode()
    for source in ("podresources", "none", "cgroup"):
        line = f'gputally_k8s_attribution_total{{processor="k8s/node",signal="metrics",source="{source}"}} 2.0'
        assert line in text
    assert 'gputally_k8s_pods_cached{processor="k8s/node",state="live"} 1.0' in text
    assert 'gputally_k8s_device_allocations{processor="k8s/node"} 1.0' in text
