"""The little of a Pod that attribution needs, cut from the API's JSON at the boundary.

A full Pod object is several kilobytes of Python dicts; a :class:`PodInfo` keeps only
identity, the controlling owner, container ids and the allow-listed labels and annotations,
so 10,000 pods fit in a few megabytes. Objects are read as the API's JSON (camelCase keys),
never through the ``kubernetes`` client's model classes, which cost ~1 ms per pod to build.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["KeyFilter", "OwnerRef", "PodInfo", "bare_container_id", "controller_of", "pod_from_json"]

_intern = sys.intern


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """A controlling ownerReference: the object that created this one."""

    kind: str
    name: str
    uid: str
    api_version: str = ""


class KeyFilter:
    """Which label or annotation keys to keep: glob patterns, decided once per key."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self._regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None
        self._seen: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return self._regex is not None

    def select(self, mapping: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
        if not mapping or self._regex is None:
            return ()
        kept = []
        for key, value in mapping.items():
            verdict = self._seen.get(key)
            if verdict is None:
                verdict = bool(self._regex.match(key))
                if len(self._seen) < 8192:
                    self._seen[key] = verdict
            if verdict:
                kept.append((_intern(key), value))
        return tuple(sorted(kept))


class PodInfo:
    """One pod as attribution sees it. Immutable except for ``blobs``, the encoded-attribute cache."""

    __slots__ = (
        "annotations",
        "blobs",
        "containers",
        "labels",
        "name",
        "namespace",
        "node",
        "owner",
        "resource_version",
        "uid",
    )

    def __init__(
        self,
        *,
        uid: str,
        name: str,
        namespace: str,
        node: str = "",
        owner: OwnerRef | None = None,
        containers: tuple[tuple[str, str], ...] = (),
        labels: tuple[tuple[str, str], ...] = (),
        annotations: tuple[tuple[str, str], ...] = (),
        resource_version: str = "",
    ) -> None:
        self.uid = uid
        self.name = name
        self.namespace = namespace
        self.node = node
        self.owner = owner
        self.containers = containers
        """(container id, container name) for every container with a status, init and ephemeral included."""
        self.labels = labels
        self.annotations = annotations
        self.resource_version = resource_version
        self.blobs: dict[Any, Any] = {}

    def container_name(self, container_id: str | None) -> str | None:
        if container_id:
            for cid, name in self.containers:
                if cid == container_id:
                    return name
        return None

    def container_id(self, container_name: str | None) -> str | None:
        if container_name:
            for cid, name in self.containers:
                if name == container_name:
                    return cid
        return None

    def same_content(self, other: PodInfo) -> bool:
        """Whether attribution would read the same from both (so cached encodings stay valid)."""
        return (
            self.uid == other.uid
            and self.name == other.name
            and self.namespace == other.namespace
            and self.node == other.node
            and self.owner == other.owner
            and self.containers == other.containers
            and self.labels == other.labels
            and self.annotations == other.annotations
        )

    def __repr__(self) -> str:
        return f"PodInfo({self.namespace}/{self.name} uid={self.uid})"


def bare_container_id(container_id: str | None) -> str | None:
    """``containerd://<hex>`` -> ``<hex>`` (the form the cgroup path holds)."""
    if not container_id:
        return None
    return container_id.rpartition("://")[2] or None


def controller_of(metadata: Mapping[str, Any]) -> OwnerRef | None:
    """The ownerReference marked ``controller: true`` (or the only one), if any."""
    refs: list[Mapping[str, Any]] = metadata.get("ownerReferences") or []
    chosen = next((r for r in refs if r.get("controller")), None)
    if chosen is None and len(refs) == 1:
        chosen = refs[0]
    if chosen is None:
        return None
    return OwnerRef(
        kind=_intern(str(chosen.get("kind", ""))),
        name=str(chosen.get("name", "")),
        uid=str(chosen.get("uid", "")),
        api_version=_intern(str(chosen.get("apiVersion", ""))),
    )


def pod_from_json(obj: Mapping[str, Any], *, labels: KeyFilter, annotations: KeyFilter) -> PodInfo:
    """Cut a Pod (API JSON) down to a :class:`PodInfo`."""
    metadata = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    containers: list[tuple[str, str]] = []
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for entry in status.get(key) or ():
            cid = bare_container_id(entry.get("containerID"))
            if cid:
                containers.append((cid, _intern(str(entry.get("name", "")))))
            # A restarted container's previous id still names its cgroup until the old one is gone.
            last = bare_container_id(((entry.get("lastState") or {}).get("terminated") or {}).get("containerID"))
            if last and last != cid:
                containers.append((last, _intern(str(entry.get("name", "")))))
    return PodInfo(
        uid=str(metadata.get("uid", "")),
        name=str(metadata.get("name", "")),
        namespace=_intern(str(metadata.get("namespace", ""))),
        node=_intern(str(spec.get("nodeName") or "")),
        owner=controller_of(metadata),
        containers=tuple(containers),
        labels=labels.select(metadata.get("labels")),
        annotations=annotations.select(metadata.get("annotations")),
        resource_version=str(metadata.get("resourceVersion", "")),
    )
