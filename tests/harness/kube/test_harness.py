"""The Kubernetes test harness is a real API server: watches, 410 Gone after etcd
compaction, RBAC, owner chains, the pod status subresource and field selectors behave
as in a cluster, because they are kube-apiserver + etcd, not a fake (issue #8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.kube.cluster import (
    LIMITED_USER,
    HarnessError,
    KubeCluster,
    compact_etcd,
    container_id,
    create_deployment_with_replicaset,
    create_job,
    create_node,
    create_pod,
    create_statefulset,
    delete_pod,
    locate_binaries,
    set_pod_status,
)
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

WATCH_TIMEOUT = 15  # seconds the API server keeps one watch open


def _watch_until(
    stream: Iterator[dict[str, Any]], w: watch.Watch, done: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """Collect events until `done(event)`; fail if the watch times out first."""
    seen = []
    for event in stream:
        seen.append(event)
        if done(event):
            w.stop()
            return seen
    raise AssertionError(f"watch ended without the expected event; saw {_summary(seen)}")


def _summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"].metadata.name) for e in events]


def _later(delay: float, fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), fn()), daemon=True)
    thread.start()
    return thread


# -- prove it: watch, 410 + relist, least privilege -------------------------------------------


def test_watch_sees_a_pod_created_after_it_started(kube_admin: Any, kube_namespace: str) -> None:
    core = client.CoreV1Api(kube_admin)
    listed = core.list_namespaced_pod(kube_namespace)
    assert listed.items == []
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        kube_namespace,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=WATCH_TIMEOUT,
    )
    # Create the pod only once the watch request is in flight.
    creator = _later(0.5, lambda: create_pod(kube_admin, kube_namespace, "late"))
    events = _watch_until(stream, w, lambda e: e["object"].metadata.name == "late")
    creator.join()
    assert _summary(events) == [("ADDED", "late")]
    added = events[0]["object"]
    assert int(added.metadata.resource_version) > int(listed.metadata.resource_version)
    assert added.metadata.uid


def test_watch_from_a_compacted_resource_version_gets_410_and_the_client_relists(
    kube_cluster: KubeCluster, kube_admin: Any, kube_namespace: str
) -> None:
    core = client.CoreV1Api(kube_admin)
    ns = kube_namespace
    create_pod(kube_admin, ns, "before")
    old_rv = core.list_namespaced_pod(ns).metadata.resource_version
    # History after old_rv that a resumed watch would have to replay...
    create_pod(kube_admin, ns, "during")
    delete_pod(kube_admin, ns, "before")
    # ...and then etcd forgets it.
    compacted = compact_etcd(kube_cluster)
    assert compacted > int(old_rv)

    # A raw resumed watch: the server answers with an ERROR event, Status 410 Expired.
    resp = core.list_namespaced_pod(
        ns, watch=True, resource_version=old_rv, timeout_seconds=WATCH_TIMEOUT,
        _preload_content=False,
    )
    try:
        first = json.loads(resp.readline())
    finally:
        resp.close()
        resp.release_conn()
    assert first["type"] == "ERROR", first
    assert first["object"]["code"] == 410, first
    assert first["object"]["reason"] == "Expired", first

    # A consistent list at the old resourceVersion is gone too.
    with pytest.raises(ApiException) as gone:
        core.list_namespaced_pod(ns, resource_version=old_rv, resource_version_match="Exact")
    assert gone.value.status == 410

    # What a reflector does: the client's watch raises 410, so it relists and resumes from
    # the fresh resourceVersion, and the relisted state is the current one.
    w = watch.Watch()
    with pytest.raises(ApiException) as expired:
        for _ in w.stream(
            core.list_namespaced_pod, ns, resource_version=old_rv, timeout_seconds=WATCH_TIMEOUT
        ):
            pass
    assert expired.value.status == 410
    relisted = core.list_namespaced_pod(ns)
    assert [p.metadata.name for p in relisted.items] == ["during"]
    assert int(relisted.metadata.resource_version) >= compacted

    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_pod,
        ns,
        resource_version=relisted.metadata.resource_version,
        timeout_seconds=WATCH_TIMEOUT,
    )
    creator = _later(0.3, lambda: create_pod(kube_admin, ns, "after"))
    events = _watch_until(stream, w, lambda e: e["object"].metadata.name == "after")
    creator.join()
    assert _summary(events) == [("ADDED", "after")]


def test_least_privilege_user_is_denied_secrets_and_allowed_what_gputally_needs(
    kube_admin: Any, kube_limited: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    deployment, rs = create_deployment_with_replicaset(kube_admin, ns, "web")
    job, _ = create_job(kube_admin, ns, "train")
    create_node(kube_admin, f"gpu-{ns}", labels={"nvidia.com/gpu.present": "true"})
    create_pod(kube_admin, ns, "web-1", owner=rs, node_name=f"gpu-{ns}")
    client.CoreV1Api(kube_admin).create_namespaced_secret(
        ns, client.V1Secret(metadata=client.V1ObjectMeta(name="token"), string_data={"k": "v"})
    )

    # It is who the binding names.
    me = client.AuthenticationV1Api(kube_limited).create_self_subject_review(
        client.V1SelfSubjectReview()
    )
    assert me.status.user_info.username == LIMITED_USER
    assert "system:masters" not in (me.status.user_info.groups or [])

    core, apps, batch = (
        client.CoreV1Api(kube_limited),
        client.AppsV1Api(kube_limited),
        client.BatchV1Api(kube_limited),
    )
    # Denied: secrets (cluster-wide, namespaced, by name) and anything it was not granted.
    denied: list[Callable[[], object]] = [
        lambda: core.list_secret_for_all_namespaces(),
        lambda: core.list_namespaced_secret(ns),
        lambda: core.read_namespaced_secret("token", ns),
        lambda: apps.read_namespaced_deployment("web", ns),
        lambda: core.list_namespace(),
        lambda: core.create_namespaced_pod(
            ns, client.V1Pod(metadata=client.V1ObjectMeta(name="x"), spec=client.V1PodSpec(
                containers=[client.V1Container(name="c", image="i")]))
        ),
        lambda: core.delete_namespaced_pod("web-1", ns),
        lambda: core.patch_namespaced_pod_status("web-1", ns, {"status": {"phase": "Failed"}}),
    ]
    for call in denied:
        with pytest.raises(ApiException) as forbidden:
            call()
        assert forbidden.value.status == 403, forbidden.value
        assert LIMITED_USER in json.loads(forbidden.value.body)["message"]

    # Allowed: everything the processor does.
    assert [p.metadata.name for p in core.list_namespaced_pod(ns).items] == ["web-1"]
    assert any(p.metadata.name == "web-1" for p in core.list_pod_for_all_namespaces().items)
    assert core.read_namespaced_pod("web-1", ns).spec.node_name == f"gpu-{ns}"
    assert apps.read_namespaced_replica_set(rs.metadata.name, ns).metadata.uid == rs.metadata.uid
    assert apps.list_replica_set_for_all_namespaces().items
    assert batch.read_namespaced_job("train", ns).metadata.uid == job.metadata.uid
    assert batch.list_job_for_all_namespaces().items
    assert core.read_node(f"gpu-{ns}").metadata.labels["nvidia.com/gpu.present"] == "true"
    assert core.list_node().items
    w = watch.Watch()
    for _ in w.stream(core.list_pod_for_all_namespaces, timeout_seconds=1):
        w.stop()  # the watch was admitted and streamed (ADDED for existing pods)

    # The same answers from the authorizer, as SelfSubjectAccessReviews.
    authz = client.AuthorizationV1Api(kube_limited)

    def allowed(verb: str, resource: str, group: str = "") -> bool:
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, group=group
                )
            )
        )
        return bool(authz.create_self_subject_access_review(review).status.allowed)

    assert allowed("watch", "pods") and allowed("watch", "nodes")
    assert allowed("watch", "replicasets", "apps") and allowed("watch", "jobs", "batch")
    assert not allowed("list", "secrets") and not allowed("get", "secrets")
    assert not allowed("update", "pods") and not allowed("get", "cronjobs", "batch")


# -- helper coverage -------------------------------------------------------------------------


def test_owner_chains_are_stored_and_walkable_with_least_privilege(
    kube_admin: Any, kube_limited: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    deployment, rs = create_deployment_with_replicaset(kube_admin, ns, "serve")
    sts = create_statefulset(kube_admin, ns, "db")
    job, cron = create_job(kube_admin, ns, "nightly-29000000", cronjob="nightly")
    plain_job, no_cron = create_job(kube_admin, ns, "oneoff")
    assert no_cron is None and not plain_job.metadata.owner_references
    create_pod(kube_admin, ns, "serve-abc", owner=rs)
    create_pod(kube_admin, ns, "db-0", owner=sts)
    create_pod(kube_admin, ns, "nightly-29000000-x", owner=job)
    create_pod(kube_admin, ns, "bare")

    core, apps, batch = (
        client.CoreV1Api(kube_limited),
        client.AppsV1Api(kube_limited),
        client.BatchV1Api(kube_limited),
    )

    def controller(obj: Any) -> Any:
        refs = [r for r in obj.metadata.owner_references or [] if r.controller]
        return refs[0] if refs else None

    def workload(pod_name: str) -> tuple[str, str] | None:
        """What the processor does: pod -> controller -> (ReplicaSet|Job ->) its owner."""
        ref = controller(core.read_namespaced_pod(pod_name, ns))
        if ref is None:
            return None
        if ref.kind == "ReplicaSet":
            parent = controller(apps.read_namespaced_replica_set(ref.name, ns))
            return (parent.kind, parent.name) if parent else (ref.kind, ref.name)
        if ref.kind == "Job":
            parent = controller(batch.read_namespaced_job(ref.name, ns))
            return (parent.kind, parent.name) if parent else (ref.kind, ref.name)
        return ref.kind, ref.name

    assert workload("serve-abc") == ("Deployment", "serve")
    assert workload("db-0") == ("StatefulSet", "db")
    assert workload("nightly-29000000-x") == ("CronJob", "nightly")
    assert workload("bare") is None

    # The references carry the owners' real uids and API versions.
    assert controller(rs).uid == deployment.metadata.uid
    assert (controller(rs).api_version, controller(rs).kind) == ("apps/v1", "Deployment")
    assert controller(job).uid == cron.metadata.uid
    assert (controller(job).api_version, controller(job).kind) == ("batch/v1", "CronJob")
    stored = core.read_namespaced_pod("db-0", ns)
    assert controller(stored).uid == sts.metadata.uid


def test_pod_status_is_written_through_the_status_subresource(
    kube_admin: Any, kube_limited: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    admin_core = client.CoreV1Api(kube_admin)
    pod = create_pod(
        kube_admin, ns, "trainer", node_name="gpu-1",
        containers={"main": "pytorch:2", "sidecar": "busybox"},
        resources={"main": {"nvidia.com/gpu": "2"}},
    )
    assert pod.status.phase == "Pending" and not pod.status.container_statuses

    # Status in a write to the main resource is ignored, as in any real cluster.
    pod.status.phase = "Running"
    assert admin_core.replace_namespaced_pod("trainer", ns, pod).status.phase == "Pending"

    main_id = "containerd://" + "ab" * 32
    running = set_pod_status(kube_admin, ns, "trainer", phase="Running", container_ids={"main": main_id})
    assert running.status.phase == "Running"

    seen = client.CoreV1Api(kube_limited).read_namespaced_pod("trainer", ns)
    ids = {c.name: c.container_id for c in seen.status.container_statuses}
    assert ids == {"main": main_id, "sidecar": container_id(ns, "trainer", "sidecar")}
    assert all(c.state.running and c.ready for c in seen.status.container_statuses)
    assert seen.status.pod_ip and seen.status.start_time
    assert seen.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
    assert int(seen.metadata.resource_version) > int(pod.metadata.resource_version)

    done = set_pod_status(kube_admin, ns, "trainer", phase="Succeeded", container_ids={"main": main_id})
    states = {c.name: c.state.terminated for c in done.status.container_statuses}
    assert done.status.phase == "Succeeded"
    assert states["main"].exit_code == 0 and states["main"].container_id == main_id

    # And the converse: spec in a write to the status subresource is ignored.
    current = admin_core.read_namespaced_pod("trainer", ns)
    current.spec.containers[0].image = "other:1"
    current.status.message = "via status"
    back = admin_core.replace_namespaced_pod_status("trainer", ns, current)
    assert back.spec.containers[0].image == "pytorch:2" and back.status.message == "via status"


def test_field_selector_on_node_name_filters_list_and_watch(
    kube_admin: Any, kube_limited: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    node_a, node_b = f"{ns}-a", f"{ns}-b"
    create_pod(kube_admin, ns, "a-1", node_name=node_a)
    create_pod(kube_admin, ns, "b-1", node_name=node_b)
    create_pod(kube_admin, ns, "unscheduled")
    core = client.CoreV1Api(kube_limited)
    selector = f"spec.nodeName={node_a}"

    listed = core.list_pod_for_all_namespaces(field_selector=selector)
    assert [p.metadata.name for p in listed.items] == ["a-1"]
    assert [p.metadata.name for p in core.list_namespaced_pod(ns, field_selector="spec.nodeName=").items] == [
        "unscheduled"
    ]

    # A watch with the selector (the processor's per-node watch) sees only its node's
    # pods, including status changes and deletes, and nothing about the other node.
    w = watch.Watch()
    stream = w.stream(
        core.list_pod_for_all_namespaces,
        field_selector=selector,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=WATCH_TIMEOUT,
    )

    def churn() -> None:
        create_pod(kube_admin, ns, "b-2", node_name=node_b)
        create_pod(kube_admin, ns, "a-2", node_name=node_a)
        set_pod_status(kube_admin, ns, "b-1", phase="Running")
        set_pod_status(kube_admin, ns, "a-2", phase="Running")
        delete_pod(kube_admin, ns, "b-2")
        delete_pod(kube_admin, ns, "a-1")

    writer = _later(0.3, churn)
    events = _watch_until(stream, w, lambda e: e["type"] == "DELETED")
    writer.join()
    # Deleting a scheduled pod, even with grace period 0, first marks it (MODIFIED with a
    # deletionTimestamp), then removes it: the real server's sequence, not a fake's.
    assert _summary(events) == [
        ("ADDED", "a-2"), ("MODIFIED", "a-2"), ("MODIFIED", "a-1"), ("DELETED", "a-1")
    ]
    assert events[2]["object"].metadata.deletion_timestamp is not None
    assert events[1]["object"].status.container_statuses[0].container_id == container_id(
        ns, "a-2", "main"
    )

    # An invalid field is rejected by the server, not silently ignored.
    with pytest.raises(ApiException) as bad:
        core.list_pod_for_all_namespaces(field_selector="spec.gpu=1")
    assert bad.value.status == 400


def test_graceful_delete_of_a_scheduled_pod_leaves_it_terminating(
    kube_admin: Any, kube_namespace: str
) -> None:
    ns = kube_namespace
    create_pod(kube_admin, ns, "stuck", node_name="gpu-9")
    delete_pod(kube_admin, ns, "stuck", grace_period_seconds=30)
    pod = client.CoreV1Api(kube_admin).read_namespaced_pod("stuck", ns)
    assert pod.metadata.deletion_timestamp is not None  # no kubelet to finish it
    delete_pod(kube_admin, ns, "stuck")
    with pytest.raises(ApiException) as gone:
        client.CoreV1Api(kube_admin).read_namespaced_pod("stuck", ns)
    assert gone.value.status == 404


# -- the harness itself ----------------------------------------------------------------------


def test_session_cluster_runs_real_binaries_with_kubeconfigs(kube_cluster: KubeCluster) -> None:
    assert set(kube_cluster.pids) == {"etcd", "kube-apiserver"}
    for pid in kube_cluster.pids.values():
        os.kill(pid, 0)  # alive
        exe = Path(f"/proc/{pid}/exe").resolve()
        assert exe in (kube_cluster.binaries.kube_apiserver, kube_cluster.binaries.etcd)
    from kubernetes import config

    for kubeconfig in (kube_cluster.admin_kubeconfig, kube_cluster.limited_kubeconfig):
        api = config.new_client_from_config(config_file=str(kubeconfig))
        try:
            version = client.VersionApi(api).get_code()
        finally:
            api.close()
        assert version.major == "1" and version.git_version.startswith("v1.")
    assert kube_cluster.api_url.startswith("https://127.0.0.1:")


def test_a_second_cluster_with_the_watch_cache_starts_and_stops_cleanly() -> None:
    with KubeCluster(watch_cache=True) as cluster:
        pids, workdir = dict(cluster.pids), cluster.workdir
        api = cluster.admin_client()
        ns = "cached"
        client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=ns))
        )
        create_pod(api, ns, "p")
        # Served from the watch cache now: a list at resourceVersion "0" still sees it.
        deadline = time.monotonic() + 5
        while not client.CoreV1Api(api).list_namespaced_pod(ns, resource_version="0").items:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not workdir.exists()


def test_missing_binaries_name_the_build_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("GPUTALLY_KUBE_APISERVER", raising=False)
    monkeypatch.delenv("GPUTALLY_ETCD", raising=False)
    monkeypatch.setenv("GPUTALLY_CACHE", str(tmp_path / "empty"))
    with pytest.raises(HarnessError, match=r"tests/harness/kube/build\.sh"):
        locate_binaries()


def test_the_fixture_fails_rather_than_skips_without_binaries(tmp_path: Path) -> None:
    tests_dir = Path(__file__).resolve().parents[2]
    (tmp_path / "conftest.py").write_text("from harness.kube.fixtures import kube_cluster  # noqa\n")
    (tmp_path / "test_needs_cluster.py").write_text(
        textwrap.dedent(
            """
            def test_uses_it(kube_cluster):
                pass
            """
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(tests_dir),
        "GPUTALLY_CACHE": str(tmp_path / "empty-cache"),
    }
    env.pop("GPUTALLY_KUBE_APISERVER", None)
    env.pop("GPUTALLY_ETCD", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "tests/harness/kube/build.sh" in out, out
