"""Everything behind one ``k8s`` processor ID: caches, metadata sources and their background tasks.

The service makes one processor per pipeline; the metrics and logs pipelines that both list
``k8s`` share one runtime (one watch, one PodResources poller, one cache), started by the
first of them and stopped by the last.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from gputally.kubelet.cri import CriClient, PodDirectory
from gputally.kubelet.devices import ResourceMatcher
from gputally.kubelet.health import Problems
from gputally.kubelet.podresources import PodResourcesClient
from gputally.pipeline.component import CountedRuntime
from gputally.util.backoff import Backoff
from gputally.util.tasks import supervised

from .attributes import AttributeBuilder
from .config import K8sConfig
from .informer import PodReflector
from .kubeapi import KubeApi, KubeApiError, in_thread
from .model import KeyFilter, PodInfo
from .nodes import NodeCache
from .owners import OwnerResolver
from .procfs import ProcCgroups
from .store import PodStore

__all__ = ["K8sRuntime"]

log = logging.getLogger(__name__)

_HOUSEKEEPING_INTERVAL = 10.0
_STOP_TIMEOUT = 5.0
_MAX_MIG_PARENTS = 1024


class K8sRuntime(CountedRuntime):
    """Caches and sources of one processor ID; the first user starts its background tasks."""

    def __init__(
        self,
        config: K8sConfig,
        *,
        name: str,
        node_name: str | None,
        connect: Callable[[], KubeApi] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        """``connect`` (blocking) builds the API client; by default from ``kubeconfig``/in-cluster."""
        self.config = config
        self.name = name
        self.node_name = node_name
        self.problems = Problems(name=name)
        self.generation = 0
        """Bumped by every change of what attribution reads (pods, devices, owners, nodes): an
        outcome computed at one generation is valid until the next."""
        self.store = PodStore(
            grace=config.deleted_pod_grace, max_deleted=config.max_deleted_pods, clock=clock, on_change=self.bump
        )
        self._connect = connect or (
            lambda: KubeApi.connect(
                kubeconfig=config.kubeconfig, context=config.context, request_timeout=config.watch.request_timeout
            )
        )
        self._api: KubeApi | None = None
        self._api_lock = asyncio.Lock()
        self.owners = OwnerResolver(
            fetch=self._fetch_owner if config.owner_lookups else None,
            problems=self.problems,
            on_resolved=self._owner_resolved,
        )
        self.nodes = NodeCache(
            fetch=self._fetch_node if config.node_labels else None,
            problems=self.problems,
            on_changed=self._node_changed,
            refresh_interval=config.node_refresh_interval,
        )
        self.builder = AttributeBuilder(
            workload=lambda pod: self.owners.workload(pod.namespace, pod.owner),
            node=self.nodes.get,
            node_name=node_name,
        )
        self.reflector = PodReflector(
            api=self.api,
            store=self.store,
            labels=KeyFilter(config.extract.labels),
            annotations=KeyFilter(config.extract.annotations),
            node_name=node_name if config.mode == "node" else None,
            page_size=config.watch.page_size,
            watch_timeout=config.watch.timeout,
            backoff=Backoff(initial=config.watch.backoff_initial, maximum=config.watch.backoff_max, reset_after=120.0),
            problems=self.problems,
            on_pod=self._pod_seen,
        )
        self.podresources = (
            PodResourcesClient(
                config.pod_resources.socket,
                matcher=ResourceMatcher(config.pod_resources.resource_names),
                refresh_interval=config.pod_resources.refresh_interval,
                timeout=config.pod_resources.timeout,
                problems=self.problems,
                on_changed=self.bump,
            )
            if config.pod_resources_enabled()
            else None
        )
        cri_socket = config.cri_socket()
        self.cri = (
            CriClient(cri_socket, refresh_interval=config.cri.refresh_interval, timeout=config.cri.timeout,
                      problems=self.problems, on_changed=self.bump)
            if cri_socket is not None
            else None
        )
        self.proc = ProcCgroups(config.proc_root, problems=self.problems) if config.proc_root is not None else None
        self.mig_children: dict[str, set[str]] = {}
        """GPU key -> keys of its MIG devices, learned from the probe's MIG resources (``hw.parent``)."""
        self.attributions: dict[tuple[str, str], int] = {}
        """(signal, source) -> resources attributed; exported as gputally_k8s_attribution_total."""
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ---------------------------------------------------------------------------

    async def _start_work(self) -> None:
        tasks = [
            (self.reflector.run(), "pods"),
            (self.owners.run(), "owners"),
            (self.nodes.run(), "nodes"),
            (self._housekeeping(), "housekeeping"),
        ]
        if self.podresources is not None:
            tasks.append((self.podresources.run(), "podresources"))
        if self.cri is not None:
            tasks.append((self.cri.run(), "cri"))
        if self.proc is not None:
            tasks.append((self.proc.run(), "proc"))
        if self.node_name:
            self.nodes.want(self.node_name)
        self._tasks = [supervised(coro, name=f"{self.name}/{what}") for coro, what in tasks]
        log.info(
            "%s: started in %s mode%s; pod-resources %s; cri %s; proc %s", self.name, self.config.mode,
            f" for node {self.node_name}" if self.node_name else "",
            self.podresources.socket if self.podresources else "off",
            self.cri.socket if self.cri else "off",
            self.proc.root if self.proc else "off",
        )

    async def _stop_work(self) -> None:
        """Bounded: nothing here waits on the network."""
        self.reflector.stop()
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            _, stuck = await asyncio.wait(self._tasks, timeout=_STOP_TIMEOUT)
            for task in stuck:
                log.warning("%s: task %s did not stop within %.0f s", self.name, task.get_name(), _STOP_TIMEOUT)
        self._tasks = []
        if self._api is not None:
            api, self._api = self._api, None
            api.close()

    @property
    def directory(self) -> PodDirectory | None:
        """The container runtime's last answer (node mode with ``cri``), else None."""
        return self.cri.directory if self.cri is not None else None

    # --- the API client, shared by the reflector and the lookups -----------------------------

    async def api(self) -> KubeApi:
        async with self._api_lock:
            if self._api is None:
                self._api = await in_thread(self._connect, name="k8s-connect")
            return self._api

    async def _fetch_owner(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        api = await self.api()
        if kind == "ReplicaSet":
            return await in_thread(lambda: api.get_replicaset(namespace, name), name="k8s-get-replicaset")
        if kind == "Job":
            return await in_thread(lambda: api.get_job(namespace, name), name="k8s-get-job")
        raise KubeApiError(f"no lookup for kind {kind}", status=404, cause="not_found")

    async def _fetch_node(self, name: str) -> dict[str, Any]:
        api = await self.api()
        return await in_thread(lambda: api.get_node(name), name="k8s-get-node")

    # --- cache upkeep --------------------------------------------------------------------------

    def bump(self) -> None:
        self.generation += 1

    def _pod_seen(self, pod: PodInfo) -> None:
        if pod.node:
            self.nodes.get(pod.node)
        if self.config.mode == "node":  # a node's few pods: resolve owners before their first data
            self.owners.workload(pod.namespace, pod.owner)

    def _owner_resolved(self, owner_uid: str) -> None:
        for pod in self.store.owned_by(owner_uid):
            pod.blobs.clear()
        self.bump()

    def _node_changed(self, node: str) -> None:
        for pod in self.store.on_node(node):
            pod.blobs.clear()
        self.builder.invalidate()  # identity and shared-device encodings carry this node's facts
        self.bump()

    def learn_mig(self, parent_key: str, child_key: str) -> None:
        children = self.mig_children.get(parent_key)
        if children is None:
            if len(self.mig_children) >= _MAX_MIG_PARENTS:
                self.mig_children.clear()
            children = self.mig_children[parent_key] = set()
        if child_key not in children:
            children.add(child_key)
            self.bump()

    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(_HOUSEKEEPING_INTERVAL)
            self.store.expire()

    # --- state for degraded() and /metrics -----------------------------------------------------

    def degraded(self) -> str | None:
        problems = self.problems.describe()
        if not self.store.synced and self.problems.get("apiserver") is None:
            waiting = "waiting for the first pod list; attributing from cgroup and PodResources identity only"
            return f"{waiting}; {problems}" if problems else waiting
        return problems
