"""Owners: direct ones read from the pod, ReplicaSet -> Deployment and Job -> CronJob looked up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gputally.kubelet.health import Problems
from gputally.processors.k8s.kubeapi import KubeApiError
from gputally.processors.k8s.model import OwnerRef
from gputally.processors.k8s.owners import OwnerResolver, Workload, direct_workload


@pytest.mark.parametrize(("ref", "expected"), [
    (None, Workload()),
    (OwnerRef("StatefulSet", "db", "u", "apps/v1"), Workload(statefulset="db", kind="StatefulSet", name="db")),
    (OwnerRef("DaemonSet", "agent", "u", "apps/v1"), Workload(daemonset="agent", kind="DaemonSet", name="agent")),
    (OwnerRef("ReplicaSet", "web-5f", "u", "apps/v1"),
     Workload(replicaset="web-5f", kind="ReplicaSet", name="web-5f", resolved=False)),
    (OwnerRef("Job", "train", "u", "batch/v1"), Workload(job="train", kind="Job", name="train", resolved=False)),
    (OwnerRef("RayCluster", "ray", "u", "ray.io/v1"), Workload(kind="RayCluster", name="ray")),
    (OwnerRef("StatefulSet", "kruise", "u", "apps.kruise.io/v1beta1"), Workload(kind="StatefulSet", name="kruise")),
])
def test_direct_workload(ref: OwnerRef | None, expected: Workload) -> None:
    assert direct_workload(ref) == expected


def owned(kind: str, name: str, uid: str, parent: tuple[str, str] | None) -> dict[str, Any]:
    refs = [{"apiVersion": "x", "kind": parent[0], "name": parent[1], "uid": "p", "controller": True}] if parent else []
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": refs}}


async def resolve(fetch: Any, *owners: tuple[str, OwnerRef], denied: bool = False,
                  ) -> tuple[OwnerResolver, Problems, list[str]]:
    problems = Problems(name="k8s")
    resolved: list[str] = []
    resolver = OwnerResolver(fetch=fetch, problems=problems, on_resolved=resolved.append, retry_after=0.01,
                             denied_retry=60)
    task = asyncio.create_task(resolver.run())
    try:
        for namespace, owner in owners:
            resolver.workload(namespace, owner)
        for _ in range(200):
            await asyncio.sleep(0.005)
            if len(resolved) == len(owners) or (denied and problems.get("owners")):
                break
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return resolver, problems, resolved


async def test_replicaset_to_deployment_and_job_to_cronjob() -> None:
    objects = {
        ("ReplicaSet", "web-5f"): owned("ReplicaSet", "web-5f", "rs", ("Deployment", "web")),
        ("Job", "nightly-289"): owned("Job", "nightly-289", "job", ("CronJob", "nightly")),
        ("Job", "once"): owned("Job", "once", "job2", None),
        ("ReplicaSet", "ro-7c"): owned("ReplicaSet", "ro-7c", "rs2", ("Rollout", "canary")),
    }

    async def fetch(kind: str, namespace: str, name: str) -> dict[str, Any]:
        return objects[(kind, name)]

    rs, job = OwnerRef("ReplicaSet", "web-5f", "rs", "apps/v1"), OwnerRef("Job", "nightly-289", "job", "batch/v1")
    once, rollout = OwnerRef("Job", "once", "job2", "batch/v1"), OwnerRef("ReplicaSet", "ro-7c", "rs2", "apps/v1")
    resolver, _, resolved = await resolve(fetch, ("ml", rs), ("ml", job), ("ml", once), ("ml", rollout))
    assert sorted(resolved) == ["job", "job2", "rs", "rs2"]
    assert resolver.workload("ml", rs) == Workload(replicaset="web-5f", deployment="web", kind="Deployment", name="web")
    assert resolver.workload("ml", job) == Workload(
        job="nightly-289", cronjob="nightly", kind="CronJob", name="nightly")
    assert resolver.workload("ml", once) == Workload(job="once", kind="Job", name="once")
    assert resolver.workload("ml", rollout) == Workload(replicaset="ro-7c", kind="Rollout", name="canary")


async def test_forbidden_lookups_are_reported_and_pods_keep_their_direct_owner() -> None:
    async def fetch(kind: str, namespace: str, name: str) -> dict[str, Any]:
        raise KubeApiError("get replicaset ml/web-5f: 403 forbidden", status=403, cause="forbidden")

    rs = OwnerRef("ReplicaSet", "web-5f", "rs", "apps/v1")
    resolver, problems, resolved = await resolve(fetch, ("ml", rs), denied=True)
    problem = problems.get("owners")
    assert problem is not None and problem.cause == "forbidden" and "RBAC denies get replicasets" in problem.summary
    assert resolved == [] and resolver.workload("ml", rs).replicaset == "web-5f"


async def test_a_deleted_owner_resolves_to_what_the_pod_says() -> None:
    async def fetch(kind: str, namespace: str, name: str) -> dict[str, Any]:
        raise KubeApiError("not found", status=404, cause="not_found")

    rs = OwnerRef("ReplicaSet", "web-5f", "rs", "apps/v1")
    resolver, problems, resolved = await resolve(fetch, ("ml", rs))
    assert resolved == ["rs"] and problems.get("owners") is None
    assert resolver.workload("ml", rs) == Workload(replicaset="web-5f", kind="ReplicaSet", name="web-5f")


async def test_a_transient_failure_is_retried() -> None:
    calls = []

    async def fetch(kind: str, namespace: str, name: str) -> dict[str, Any]:
        calls.append(name)
        if len(calls) == 1:
            raise KubeApiError("unreachable", cause="unreachable")
        return owned("ReplicaSet", name, "rs", ("Deployment", "web"))

    rs = OwnerRef("ReplicaSet", "web-5f", "rs", "apps/v1")
    resolver, problems, resolved = await resolve(fetch, ("ml", rs))
    assert calls == ["web-5f", "web-5f"] and resolved == ["rs"]
    assert resolver.workload("ml", rs).deployment == "web" and problems.get("owners") is None
