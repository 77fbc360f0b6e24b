"""Node labels -> ``cloud.*`` and ``host.type``, read with ``get node`` and refreshed now and then.

Well-known labels (``topology.kubernetes.io/region``, ``.../zone``,
``node.kubernetes.io/instance-type``, falling back to their deprecated ``beta`` and
``failure-domain`` forms) and the provider prefix of ``spec.providerID``. Nodes are read in a
background task the first time a pod on them is seen and every ``refresh_interval`` after;
``process`` only reads the cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gputally.kubelet import semconv
from gputally.kubelet.health import Problems

from .kubeapi import KubeApiError

__all__ = ["NodeCache", "NodeInfo", "node_from_json"]

log = logging.getLogger(__name__)

_REGION = ("topology.kubernetes.io/region", "failure-domain.beta.kubernetes.io/region")
_ZONE = ("topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone")
_INSTANCE_TYPE = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
_PROVIDERS = {"aws": "aws", "gce": "gcp", "azure": "azure", "oci": "oracle_cloud", "ibm": "ibm_cloud",
              "alicloud": "alibaba_cloud", "openstack": "openstack", "digitalocean": "digitalocean"}
"""``spec.providerID`` scheme -> semconv ``cloud.provider`` (only the values semconv lists are exact)."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    attributes: tuple[tuple[str, str], ...] = ()
    """(key, value) of the ``cloud.*`` and ``host.type`` attributes the node's labels give."""


def _first(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    return next((labels[k] for k in keys if labels.get(k)), None)


def node_from_json(obj: Mapping[str, Any]) -> NodeInfo:
    metadata = obj.get("metadata") or {}
    labels = metadata.get("labels") or {}
    attributes: list[tuple[str, str]] = []
    provider_id = str((obj.get("spec") or {}).get("providerID") or "")
    scheme = provider_id.partition("://")[0] if "://" in provider_id else ""
    if scheme in _PROVIDERS:
        attributes.append((semconv.CLOUD_PROVIDER, _PROVIDERS[scheme]))
    for key, sources in ((semconv.CLOUD_REGION, _REGION), (semconv.CLOUD_AVAILABILITY_ZONE, _ZONE),
                         (semconv.HOST_TYPE, _INSTANCE_TYPE)):
        value = _first(labels, sources)
        if value:
            attributes.append((key, value))
    return NodeInfo(name=str(metadata.get("name", "")), attributes=tuple(attributes))


class NodeCache:
    """Node facts by name: :meth:`get` reads (and asks for unknown nodes), :meth:`run` fetches."""

    def __init__(
        self,
        *,
        fetch: Callable[[str], Awaitable[dict[str, Any]]] | None,
        problems: Problems,
        on_changed: Callable[[str], None],
        refresh_interval: float,
        retry_after: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fetch`` None turns node reads off (``node_labels: false``)."""
        self._fetch = fetch
        self._problems = problems
        self._on_changed = on_changed
        self._refresh = refresh_interval
        self._retry_after = retry_after
        self._clock = clock
        self._nodes: dict[str, NodeInfo] = {}
        self._due: dict[str, float] = {}  # node -> when to read it (again)
        self._wake = asyncio.Event()

    def get(self, name: str) -> NodeInfo | None:
        info = self._nodes.get(name)
        if info is None and name and self._fetch is not None and name not in self._due:
            self._due[name] = 0.0
            self._wake.set()
        return info

    def want(self, name: str) -> None:
        """Read ``name`` soon if it is not known yet (node mode: this node, at start)."""
        self.get(name)

    def __len__(self) -> int:
        return len(self._nodes)

    async def run(self) -> None:
        """Read due nodes, one at a time, until cancelled."""
        if self._fetch is None:
            return
        while True:
            now = self._clock()
            due = [name for name, when in self._due.items() if when <= now]
            for name in due:
                again = await self._read(name)
                if again is None:
                    self._due.pop(name, None)
                else:
                    self._due[name] = self._clock() + again
            soonest = min(self._due.values(), default=now + self._refresh) - self._clock()
            self._wake.clear()
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                async with asyncio.timeout(max(soonest, 0.05)):
                    await self._wake.wait()

    async def _read(self, name: str) -> float | None:
        """Read one node; returns the seconds until it should be read again (None: never, it is gone)."""
        assert self._fetch is not None
        try:
            obj = await self._fetch(name)
        except KubeApiError as exc:
            if exc.not_found:
                return None
            reason = "RBAC denies get nodes" if exc.forbidden else "cannot read nodes"
            self._problems.report("nodes", exc.cause, f"{reason} ({exc}); no cloud.* attributes for new nodes")
            return self._refresh if exc.forbidden else self._retry_after
        self._problems.clear("nodes")
        info = node_from_json(obj)
        if self._nodes.get(name) != info:
            self._nodes[name] = info
            self._on_changed(name)
        return self._refresh
