"""Who runs a pod: its controller, followed up one level where Kubernetes hides the workload.

A pod's controlling ownerReference names a ReplicaSet (made by a Deployment), a Job (maybe
made by a CronJob), a StatefulSet, a DaemonSet, or a custom controller (RayCluster,
PyTorchJob...). Only the first two need a lookup: one ``get`` of the ReplicaSet or Job,
whose own controller is the Deployment or CronJob. Lookups run in a background task and are
cached by the owner's uid (a ReplicaSet never changes hands in practice), so ``process``
only reads a dict. Until a lookup answers, a pod shows what its own ownerReference says.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gputally.kubelet.health import Problems

from .kubeapi import KubeApiError
from .model import OwnerRef, controller_of

__all__ = ["OwnerResolver", "Workload", "direct_workload"]

log = logging.getLogger(__name__)

_LOOKUP_KINDS = {"ReplicaSet": "replicasets", "Job": "jobs"}
_BUILTIN_APPS = {"apps", "batch"}


@dataclass(frozen=True, slots=True)
class Workload:
    """The owner names of one pod, each ``None`` where it does not apply."""

    replicaset: str | None = None
    deployment: str | None = None
    statefulset: str | None = None
    daemonset: str | None = None
    job: str | None = None
    cronjob: str | None = None
    kind: str | None = None
    """Kind of the top-level controller found (``Deployment``, ``CronJob``, ``RayCluster``...)."""
    name: str | None = None
    resolved: bool = True
    """False while a lookup that could name a higher owner is outstanding."""


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0] if "/" in api_version else ""


def direct_workload(owner: OwnerRef | None) -> Workload:
    """What the pod's own ownerReference says, without any lookup."""
    if owner is None:
        return Workload()
    builtin = _group(owner.api_version) in _BUILTIN_APPS or not owner.api_version
    kind, name = owner.kind, owner.name
    if builtin and kind == "StatefulSet":
        return Workload(statefulset=name, kind=kind, name=name)
    if builtin and kind == "DaemonSet":
        return Workload(daemonset=name, kind=kind, name=name)
    if builtin and kind == "ReplicaSet":
        return Workload(replicaset=name, kind=kind, name=name, resolved=False)
    if builtin and kind == "Job":
        return Workload(job=name, kind=kind, name=name, resolved=False)
    return Workload(kind=kind, name=name)  # a custom controller: reported raw


def _followed(direct: Workload, parent: OwnerRef | None) -> Workload:
    """``direct`` (a ReplicaSet or Job) completed with its own controller."""
    if parent is None:
        return Workload(replicaset=direct.replicaset, job=direct.job, kind=direct.kind, name=direct.name)
    if direct.replicaset is not None and parent.kind == "Deployment":
        return Workload(replicaset=direct.replicaset, deployment=parent.name, kind=parent.kind, name=parent.name)
    if direct.job is not None and parent.kind == "CronJob":
        return Workload(job=direct.job, cronjob=parent.name, kind=parent.kind, name=parent.name)
    # Owned by something else (an Argo Rollout owns ReplicaSets, a JobSet owns Jobs): report it raw.
    return Workload(replicaset=direct.replicaset, job=direct.job, kind=parent.kind, name=parent.name)


Fetch = Callable[[str, str, str], Awaitable[dict[str, Any]]]
"""(kind, namespace, name) -> the object's JSON; raises KubeApiError."""


class OwnerResolver:
    """Owner lookups with a bounded cache, fed by :meth:`workload` and drained by :meth:`run`."""

    def __init__(
        self,
        *,
        fetch: Fetch | None,
        problems: Problems,
        on_resolved: Callable[[str], None],
        max_entries: int = 20000,
        concurrency: int = 4,
        retry_after: float = 30.0,
        denied_retry: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fetch`` None turns lookups off (``owner_lookups: false``): pods show their direct owner."""
        self._fetch = fetch
        self._problems = problems
        self._on_resolved = on_resolved
        self._max = max_entries
        self._concurrency = concurrency
        self._retry_after = retry_after
        self._denied_retry = denied_retry
        self._clock = clock
        self._cache: OrderedDict[str, Workload] = OrderedDict()
        self._queue: asyncio.Queue[tuple[str, OwnerRef]] = asyncio.Queue()
        self._queued: set[str] = set()
        self._denied: dict[str, float] = {}  # kind -> when to ask again
        self.lookups = 0

    def workload(self, namespace: str, owner: OwnerRef | None) -> Workload:
        """The best answer now; queues a lookup when one could say more."""
        direct = direct_workload(owner)
        if direct.resolved or owner is None:
            return direct
        cached = self._cache.get(owner.uid)
        if cached is not None:
            return cached
        if self._fetch is not None and owner.uid not in self._queued and len(self._queued) < self._max:
            self._queued.add(owner.uid)
            self._queue.put_nowait((namespace, owner))
        return direct

    def __len__(self) -> int:
        return len(self._cache)

    async def run(self) -> None:
        """Answer queued lookups, a few at a time, until cancelled."""
        workers = [asyncio.create_task(self._worker(), name=f"k8s-owner-lookup-{i}") for i in range(self._concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _worker(self) -> None:
        assert self._fetch is not None
        while True:
            namespace, owner = await self._queue.get()
            try:
                await self._lookup(namespace, owner)
            finally:
                self._queue.task_done()

    def _later(self, delay: float, namespace: str, owner: OwnerRef) -> None:
        """Ask again after ``delay`` (the pod's cached attributes would otherwise never be completed)."""
        asyncio.get_running_loop().call_later(delay, self._queue.put_nowait, (namespace, owner))

    async def _lookup(self, namespace: str, owner: OwnerRef) -> None:
        assert self._fetch is not None
        direct = direct_workload(owner)
        retry_at = self._denied.get(owner.kind)
        if retry_at is not None and retry_at > self._clock():
            self._later(retry_at - self._clock(), namespace, owner)
            return
        self.lookups += 1
        try:
            obj = await self._fetch(owner.kind, namespace, owner.name)
        except KubeApiError as exc:
            if exc.forbidden:
                self._denied[owner.kind] = self._clock() + self._denied_retry
                self._problems.report(
                    "owners", "forbidden",
                    f"RBAC denies get {_LOOKUP_KINDS[owner.kind]} ({exc}); pods show their {owner.kind} only",
                )
                self._later(self._denied_retry, namespace, owner)
            elif exc.not_found:  # deleted: the direct owner is all there is to know
                self._store(owner.uid, _followed(direct, None))
            else:
                self._problems.report("owners", exc.cause, f"owner lookups failing ({exc}); retrying")
                self._later(self._retry_after, namespace, owner)
            return
        self._denied.pop(owner.kind, None)
        if not self._denied:
            self._problems.clear("owners")
        metadata = obj.get("metadata") or {}
        if metadata.get("uid") and metadata.get("uid") != owner.uid:  # same name, another object
            self._store(owner.uid, _followed(direct, None))
            return
        self._store(owner.uid, _followed(direct, controller_of(metadata)))

    def _store(self, uid: str, workload: Workload) -> None:
        self._queued.discard(uid)
        self._cache[uid] = workload
        self._cache.move_to_end(uid)
        while len(self._cache) > self._max:
            self._cache.popitem(last=False)
        self._on_resolved(uid)
