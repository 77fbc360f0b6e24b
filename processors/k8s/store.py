"""The pod cache: indexed by uid, container id, namespace/name, node and owner; deleted pods linger.

Only the event loop writes it (the reflector applies list pages and watch events there), and
``process`` reads it on the same loop, so no lock is needed and a reader never sees half an
update. A deleted pod stays findable for ``grace`` seconds so data that arrives late still
attributes, but never shadows a live pod that took its name (StatefulSets reuse names).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator

from .model import PodInfo

__all__ = ["PodStore"]


class PodStore:
    """Live and recently deleted pods, with the indexes attribution looks them up by."""

    def __init__(
        self,
        *,
        grace: float,
        max_deleted: int,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_change`` is called after every change that could change an attribution."""
        self.grace = grace
        self.max_deleted = max_deleted
        self._clock = clock
        self._live: dict[str, PodInfo] = {}
        self._deleted: OrderedDict[str, tuple[PodInfo, float]] = OrderedDict()  # uid -> (pod, expiry), oldest first
        self._by_container: dict[str, str] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self._by_node: dict[str, set[str]] = {}
        self._by_owner: dict[str, set[str]] = {}
        self._on_change = on_change
        self._synced = False

    @property
    def synced(self) -> bool:
        """True once a full list has been applied: before that, nothing is attributed from the API."""
        return self._synced

    @synced.setter
    def synced(self, value: bool) -> None:
        if value != self._synced:
            self._synced = value
            self._on_change()

    # --- reads (hot path) ---------------------------------------------------------------

    def get(self, uid: str) -> PodInfo | None:
        pod = self._live.get(uid)
        if pod is None:
            gone = self._deleted.get(uid)
            pod = gone[0] if gone is not None else None
        return pod

    def by_container(self, container_id: str) -> PodInfo | None:
        uid = self._by_container.get(container_id)
        return self.get(uid) if uid is not None else None

    def by_name(self, namespace: str, name: str) -> PodInfo | None:
        uid = self._by_name.get((namespace, name))
        return self.get(uid) if uid is not None else None

    def on_node(self, node: str) -> Iterator[PodInfo]:
        for uid in tuple(self._by_node.get(node, ())):
            pod = self.get(uid)
            if pod is not None:
                yield pod

    def owned_by(self, owner_uid: str) -> Iterator[PodInfo]:
        for uid in tuple(self._by_owner.get(owner_uid, ())):
            pod = self.get(uid)
            if pod is not None:
                yield pod

    def live_uids(self) -> set[str]:
        return set(self._live)

    def __len__(self) -> int:
        return len(self._live)

    @property
    def deleted_count(self) -> int:
        return len(self._deleted)

    # --- writes (event loop only) --------------------------------------------------------

    def upsert(self, pod: PodInfo) -> PodInfo:
        """Add or replace a live pod; returns the stored object (the old one when nothing changed)."""
        old = self._live.get(pod.uid)
        if old is not None and old.same_content(pod):
            old.resource_version = pod.resource_version
            return old
        if old is None:
            gone = self._deleted.pop(pod.uid, None)  # a relist can bring back a pod thought deleted
            old = gone[0] if gone is not None else None
        if old is not None:
            self._unindex(old, keep=pod)
        self._live[pod.uid] = pod
        self._index(pod)
        self._on_change()
        return pod

    def delete(self, uid: str) -> PodInfo | None:
        """Move a pod to the deleted area, where it stays findable for ``grace`` seconds."""
        pod = self._live.pop(uid, None)
        if pod is None:
            return None
        self._on_change()
        if self.grace <= 0 or self.max_deleted == 0:
            self._unindex(pod)
            return pod
        self._deleted[uid] = (pod, self._clock() + self.grace)
        self._deleted.move_to_end(uid)
        while len(self._deleted) > self.max_deleted:
            _, (oldest, _) = self._deleted.popitem(last=False)
            self._unindex(oldest)
        return pod

    def retain(self, uids: Iterable[str]) -> list[PodInfo]:
        """After a relist: every live pod not in ``uids`` was deleted while unwatched."""
        keep = set(uids)
        return [pod for uid in list(self._live) if uid not in keep and (pod := self.delete(uid)) is not None]

    def expire(self) -> int:
        """Drop deleted pods whose grace has passed; returns how many went."""
        now = self._clock()
        dropped = 0
        while self._deleted:
            uid, (pod, expiry) = next(iter(self._deleted.items()))
            if expiry > now:
                break
            del self._deleted[uid]
            self._unindex(pod)
            dropped += 1
        if dropped:
            self._on_change()
        return dropped

    # --- indexes ---------------------------------------------------------------------------

    def _index(self, pod: PodInfo) -> None:
        for cid, _ in pod.containers:
            self._by_container[cid] = pod.uid
        self._by_name[(pod.namespace, pod.name)] = pod.uid
        if pod.node:
            self._by_node.setdefault(pod.node, set()).add(pod.uid)
        if pod.owner is not None and pod.owner.uid:
            self._by_owner.setdefault(pod.owner.uid, set()).add(pod.uid)

    def _unindex(self, pod: PodInfo, *, keep: PodInfo | None = None) -> None:
        """Remove ``pod``'s index entries that still point at it (and that ``keep`` will not re-add)."""
        uid = pod.uid
        kept_ids = {cid for cid, _ in keep.containers} if keep is not None else set()
        for cid, _ in pod.containers:
            if cid not in kept_ids and self._by_container.get(cid) == uid:
                del self._by_container[cid]
        name = (pod.namespace, pod.name)
        if self._by_name.get(name) == uid and (keep is None or (keep.namespace, keep.name) != name):
            del self._by_name[name]  # a newer pod that took the name points the index at itself
        for index, key in ((self._by_node, pod.node), (self._by_owner, pod.owner.uid if pod.owner else "")):
            members = index.get(key)
            if members is not None:
                members.discard(uid)
                if not members:
                    del index[key]
