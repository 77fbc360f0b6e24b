"""Against a real kube-apiserver (tests/harness/kube): watch, owners, 410 relist, RBAC, outages.

Every test runs the processor as a least-privilege identity, on a node name of its own, so
tests sharing the session's control plane never see each other's pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from harness.kube.cluster import (
    KubeCluster,
    container_id,
    create_deployment_with_replicaset,
    create_job,
    create_node,
    create_pod,
    create_statefulset,
    delete_pod,
    set_pod_status,
)
from harness.processes import unused_port
from kubernetes import client, utils

from gputally.processors.k8s.processor import K8sProcessor

from .helpers import k8s_only, make, metrics_batch, process_resource, resource_attrs

RBAC = Path(__file__).resolve().parents[3] / "processors" / "k8s" / "rbac.yaml"
ONE_CYCLE = 2.0
"""Seconds within which an API change must show in attribution (a probe cycle is 1-10 s)."""


def cgroup(uid: str, cid: str) -> str:
    bare = cid.rpartition("://")[2]
    return (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice/"
            f"cri-containerd-{bare}.scope")


async def eventually(check: Callable[[], Any], timeout: float = ONE_CYCLE) -> Any:
    """Poll ``check`` until it returns a truthy value (returned) or ``timeout`` passes (it fails)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {check}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(config: dict[str, Any]) -> AsyncIterator[K8sProcessor]:
    proc = make(config)
    await proc.start()
    try:
        yield proc
    finally:
        await proc.shutdown()


def node_config(kubeconfig: Path, node: str, **extra: Any) -> dict[str, Any]:
    return {"mode": "node", "node_name": node, "kubeconfig": str(kubeconfig), "pod_resources": {"enabled": False},
            "watch": {"backoff_initial": "100ms", "backoff_max": "500ms"}, **extra}


async def attributed(proc: K8sProcessor, uid: str, cid: str) -> dict[str, Any]:
    batch = await proc.process(metrics_batch(process_resource(4242, cgroup=cgroup(uid, cid))))
    assert batch is not None
    return k8s_only(resource_attrs(batch)[0])


def fresh_node() -> str:
    return f"node-{uuid.uuid4().hex[:8]}"


async def test_the_watch_follows_creates_status_updates_and_deletes(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str
) -> None:
    ns, node = kube_namespace, fresh_node()
    create_pod(kube_admin, ns, "elsewhere", node_name=fresh_node())  # another node's pod: never watched here
    async with running(node_config(kube_cluster.limited_kubeconfig, node, deleted_pod_grace="1s")) as proc:
        store = proc.runtime.store
        await eventually(lambda: store.synced, timeout=10)
        assert len(store) == 0
        pod = create_pod(kube_admin, ns, "trainer-0", node_name=node, containers=["main", "sidecar"])
        uid = pod.metadata.uid
        await eventually(lambda: store.get(uid))
        cid = container_id(ns, "trainer-0", "main")
        before = await attributed(proc, uid, cid)
        assert before["k8s.pod.name"] == "trainer-0" and "k8s.container.name" not in before  # no status yet
        set_pod_status(kube_admin, ns, "trainer-0")  # the kubelet reports container ids
        await eventually(lambda: store.by_container(cid.rpartition("://")[2]))
        after = await attributed(proc, uid, cid)
        assert after["k8s.container.name"] == "main" and after["k8s.namespace.name"] == ns
        assert after["k8s.node.name"] == node and after["gputally.k8s.attribution"] == "cgroup"
        delete_pod(kube_admin, ns, "trainer-0")
        await eventually(lambda: len(store) == 0)
        late = await attributed(proc, uid, cid)  # data sent before the pod went, arriving late
        assert late["k8s.pod.name"] == "trainer-0"
        await asyncio.sleep(1.1)
        store.expire()  # what the housekeeping task does every few seconds
        gone = await attributed(proc, uid, cid)
        assert "k8s.pod.name" not in gone and gone["k8s.pod.uid"] == uid  # the cgroup's identity remains
        assert proc.degraded() is None


async def test_owners_are_resolved_through_the_api(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str
) -> None:
    ns, node = kube_namespace, fresh_node()
    _, replicaset = create_deployment_with_replicaset(kube_admin, ns, "web")
    statefulset = create_statefulset(kube_admin, ns, "db")
    job, _ = create_job(kube_admin, ns, "nightly-29000000", cronjob="nightly")
    plain_job, _ = create_job(kube_admin, ns, "once")
    daemonset = client.AppsV1Api(kube_admin).create_namespaced_daemon_set(ns, client.V1DaemonSet(
        metadata=client.V1ObjectMeta(name="agent"),
        spec=client.V1DaemonSetSpec(
            selector=client.V1LabelSelector(match_labels={"app": "agent"}),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels={"app": "agent"}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="pause")]))),
    ))
    ray = client.V1OwnerReference(api_version="ray.io/v1", kind="RayCluster", name="ray-gpu",
                                  uid=str(uuid.uuid4()), controller=True)
    owners = {"web-x": replicaset, "db-0": statefulset, "nightly-x": job, "once-x": plain_job, "agent-x": daemonset,
              "ray-head": [ray], "bare": None}
    uids = {name: create_pod(kube_admin, ns, name, owner=owner, node_name=node).metadata.uid
            for name, owner in owners.items()}
    expected = {
        "web-x": {"k8s.replicaset.name": replicaset.metadata.name, "k8s.deployment.name": "web",
                  "gputally.k8s.owner.kind": "Deployment", "gputally.k8s.owner.name": "web"},
        "db-0": {"k8s.statefulset.name": "db", "gputally.k8s.owner.kind": "StatefulSet",
                 "gputally.k8s.owner.name": "db"},
        "nightly-x": {"k8s.job.name": "nightly-29000000", "k8s.cronjob.name": "nightly",
                      "gputally.k8s.owner.kind": "CronJob", "gputally.k8s.owner.name": "nightly"},
        "once-x": {"k8s.job.name": "once", "gputally.k8s.owner.kind": "Job", "gputally.k8s.owner.name": "once"},
        "agent-x": {"k8s.daemonset.name": "agent", "gputally.k8s.owner.kind": "DaemonSet",
                    "gputally.k8s.owner.name": "agent"},
        "ray-head": {"gputally.k8s.owner.kind": "RayCluster", "gputally.k8s.owner.name": "ray-gpu"},
        "bare": {},
    }
    owner_keys = {"k8s.replicaset.name", "k8s.deployment.name", "k8s.statefulset.name", "k8s.daemonset.name",
                  "k8s.job.name", "k8s.cronjob.name", "gputally.k8s.owner.kind", "gputally.k8s.owner.name"}
    async with running(node_config(kube_cluster.limited_kubeconfig, node)) as proc:
        await eventually(lambda: proc.runtime.store.synced, timeout=10)
        for name, want in expected.items():
            async def owner_attributes(name: str = name) -> dict[str, Any]:
                found = await attributed(proc, uids[name], container_id(ns, name, "main"))
                return {k: v for k, v in found.items() if k in owner_keys}

            for _ in range(100):  # ReplicaSet and Job lookups answer in the background
                got = await owner_attributes()
                if got == want:
                    break
                await asyncio.sleep(0.02)
            assert got == want, name


async def test_a_compacted_resource_version_relists(kube_cluster: KubeCluster, kube_admin: Any,
                                                    kube_namespace: str) -> None:
    ns, node = kube_namespace, fresh_node()
    create_pod(kube_admin, ns, "before", node_name=node)
    config = node_config(kube_cluster.limited_kubeconfig, node, watch={"timeout": "1s", "backoff_initial": "100ms"})
    async with running(config) as proc:
        reflector = proc.runtime.reflector
        await eventually(lambda: proc.runtime.store.synced, timeout=10)
        seen = reflector.resource_version
        for i in range(3):  # history this watch never sees (another node), so its resourceVersion gets old
            create_pod(kube_admin, ns, f"other-{i}", node_name=fresh_node())
        kube_cluster.compact_etcd()
        await eventually(lambda: reflector.stats.restarts.get("gone"), timeout=10)
        await eventually(lambda: reflector.stats.lists >= 2 and reflector.resource_version != seen)
        pod = create_pod(kube_admin, ns, "after", node_name=node)
        await eventually(lambda: proc.runtime.store.get(pod.metadata.uid))
        assert {p for p in (proc.runtime.store.by_name(ns, "before"), proc.runtime.store.by_name(ns, "after")) if p}
        assert proc.degraded() is None


async def test_node_labels_give_cloud_attributes(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str
) -> None:
    ns, node = kube_namespace, fresh_node()
    create_node(kube_admin, node, labels={"topology.kubernetes.io/region": "us-east-2",
                                          "topology.kubernetes.io/zone": "us-east-2b",
                                          "node.kubernetes.io/instance-type": "p5.48xlarge"})
    pod = create_pod(kube_admin, ns, "p", node_name=node)
    async with running(node_config(kube_cluster.limited_kubeconfig, node)) as proc:
        await eventually(lambda: proc.runtime.store.synced, timeout=10)
        cid = container_id(ns, "p", "main")

        async def cloud() -> dict[str, Any]:
            found = await attributed(proc, pod.metadata.uid, cid)
            return {k: v for k, v in found.items() if k.startswith(("cloud.", "host."))}

        for _ in range(100):
            if await cloud():
                break
            await asyncio.sleep(0.02)
        assert await cloud() == {"cloud.region": "us-east-2", "cloud.availability_zone": "us-east-2b",
                                 "host.type": "p5.48xlarge"}


async def test_gateway_mode_sees_every_node(kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str) -> None:
    ns = kube_namespace
    pods = [create_pod(kube_admin, ns, f"p{i}", node_name=fresh_node()) for i in range(3)]
    config = {"mode": "gateway", "kubeconfig": str(kube_cluster.limited_kubeconfig), "watch": {"page_size": 2}}
    async with running(config) as proc:
        await eventually(lambda: proc.runtime.store.synced, timeout=10)
        assert all(proc.runtime.store.get(p.metadata.uid) for p in pods)
        found = await attributed(proc, pods[1].metadata.uid, container_id(ns, "p1", "main"))
        assert found["k8s.pod.name"] == "p1" and found["k8s.node.name"] == pods[1].spec.node_name


# --- identities and RBAC -----------------------------------------------------------------


def service_account_kubeconfig(cluster: KubeCluster, admin: Any, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig for a service account, with a token from the TokenRequest API."""
    core = client.CoreV1Api(admin)
    with contextlib.suppress(client.ApiException):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
    token = core.create_namespaced_service_account_token(name, namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc.cluster.local"],
                                       expiration_seconds=3600))).status.token
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": cluster.api_url,
                                               "certificate-authority": str(cluster.ca_file)}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
    }))
    return path


async def test_the_documented_minimal_rbac_is_enough(kube_cluster: KubeCluster, kube_admin: Any,
                                                     kube_namespace: str, tmp_path: Path) -> None:
    documents = list(yaml.safe_load_all(RBAC.read_text()))
    sa_namespace = f"gputally-{uuid.uuid4().hex[:6]}"
    suffix = uuid.uuid4().hex[:6]
    for doc in documents:  # the manifest as shipped, made unique for this session
        if doc["kind"] == "ServiceAccount":
            continue
        doc["metadata"]["name"] += f"-{suffix}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{suffix}"
            doc["subjects"][0]["namespace"] = sa_namespace
        utils.create_from_dict(kube_admin, doc)
    (role,) = [d for d in documents if d["kind"] == "ClusterRole"]
    assert {tuple(r["verbs"]) for r in role["rules"]} == {("list", "watch"), ("get",)}  # nothing more than that
    kubeconfig = service_account_kubeconfig(kube_cluster, kube_admin, sa_namespace, "gputally", tmp_path / "sa.yaml")
    ns, node = kube_namespace, fresh_node()
    create_node(kube_admin, node, labels={"topology.kubernetes.io/zone": "z1"})
    _, replicaset = create_deployment_with_replicaset(kube_admin, ns, "web")
    job, _ = create_job(kube_admin, ns, "nightly-1", cronjob="nightly")
    web = create_pod(kube_admin, ns, "web-1", owner=replicaset, node_name=node)
    cron = create_pod(kube_admin, ns, "nightly-1-x", owner=job, node_name=node)
    async with running(node_config(kubeconfig, node)) as proc:
        await eventually(lambda: proc.runtime.store.synced, timeout=20)  # RBAC bindings take a moment to apply

        async def complete() -> bool:
            a = await attributed(proc, web.metadata.uid, container_id(ns, "web-1", "main"))
            b = await attributed(proc, cron.metadata.uid, container_id(ns, "nightly-1-x", "main"))
            return (a.get("k8s.deployment.name"), b.get("k8s.cronjob.name"), a.get("cloud.availability_zone")) == (
                "web", "nightly", "z1")

        for _ in range(200):
            if await complete():
                break
            await asyncio.sleep(0.05)
        assert await complete()
        assert proc.degraded() is None


async def test_rbac_denied_is_degraded_and_data_still_flows(kube_cluster: KubeCluster, kube_admin: Any,
                                                            tmp_path: Path) -> None:
    kubeconfig = service_account_kubeconfig(kube_cluster, kube_admin, f"nobody-{uuid.uuid4().hex[:6]}", "nobody",
                                            tmp_path / "nobody.yaml")
    async with running(node_config(kubeconfig, fresh_node())) as proc:
        await eventually(lambda: "RBAC denies list/watch pods" in (proc.degraded() or ""))
        reason = proc.degraded()
        assert reason is not None and "403" in reason and "attributing from cache" in reason
        uid = str(uuid.uuid4())
        found = await attributed(proc, uid, "containerd://" + "ab" * 32)
        assert found == {"k8s.pod.uid": uid, "container.id": "ab" * 32, "k8s.node.name": proc.runtime.node_name,
                         "gputally.k8s.attribution": "cgroup"}
        await asyncio.sleep(0.5)  # several retries
        assert proc.runtime.problems.counts[("apiserver", "forbidden")] >= 2


class Proxy:
    """A TCP relay in front of the API server that a test can cut and restore, on the same
    port: one held while it is cut (`unused_port`), which it listens on beside the hold."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = unused_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._relays: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port, reuse_port=True)

    async def cut(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await asyncio.gather(*self._relays, return_exceptions=True)
        await self._server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}


async def test_an_unreachable_api_server_keeps_cached_attribution_and_recovers(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str, tmp_path: Path
) -> None:
    proxy = Proxy(kube_cluster.apiserver_port)
    await proxy.open()
    doc = yaml.safe_load(kube_cluster.limited_kubeconfig.read_text())
    doc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{proxy.port}"
    kubeconfig = tmp_path / "proxied.yaml"
    kubeconfig.write_text(yaml.safe_dump(doc))
    ns, node = kube_namespace, fresh_node()
    pod = create_pod(kube_admin, ns, "p", node_name=node)
    cid = container_id(ns, "p", "main")
    async with running(node_config(kubeconfig, node)) as proc:
        await eventually(lambda: proc.runtime.store.synced, timeout=10)
        await proxy.cut()
        await eventually(lambda: "unreachable" in (proc.degraded() or ""), timeout=5)
        assert (await attributed(proc, pod.metadata.uid, cid))["k8s.pod.name"] == "p"  # from the cache
        await proxy.open()  # same port: the API server is back
        late = create_pod(kube_admin, ns, "q", node_name=node)
        await eventually(lambda: proc.runtime.store.get(late.metadata.uid), timeout=10)
        await eventually(lambda: proc.runtime.problems.get("apiserver") is None)
        await proxy.cut()
