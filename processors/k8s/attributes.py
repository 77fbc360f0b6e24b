"""Attribution as pre-encoded bytes, so enriching a resource costs one ``MergeFromString``.

Each attribute is encoded once as a piece of a ``Resource`` message (field 1, a KeyValue);
concatenated pieces are the encoding of a Resource holding all of them, which merges into a
resource by appending. Encodings are cached on the :class:`PodInfo` they describe (and
dropped with it, or when an owner or node lookup completes), so the hot path builds nothing.
A resource that already holds one of the keys keeps its own value: its pieces are filtered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from gputally.kubelet import semconv
from gputally.kubelet.devices import Holder

from .model import PodInfo
from .nodes import NodeInfo
from .owners import Workload

__all__ = ["AttributeBuilder", "Encoded", "piece"]

Value = str | Sequence[str]


def piece(key: str, value: Value) -> bytes:
    """One attribute encoded as a Resource fragment (a string, or an array of strings)."""
    if isinstance(value, str):
        any_value = AnyValue(string_value=value)
    else:
        any_value = AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
    return bytes(Resource(attributes=[KeyValue(key=key, value=any_value)]).SerializeToString())


@dataclass(frozen=True, slots=True)
class Encoded:
    """Attributes ready to merge into a resource: the encoding of a Resource holding them.

    Only the joined bytes are kept (10,000 pods' worth is a few megabytes); the rare resource
    that already holds one of the keys gets a filtered copy, built by decoding these bytes.
    """

    blob: bytes

    @classmethod
    def of(cls, attributes: Iterable[tuple[str, Value]]) -> Encoded:
        return cls(b"".join(piece(key, value) for key, value in attributes))

    def without(self, keys: frozenset[str]) -> bytes:
        """The blob minus the attributes in ``keys`` (which the resource already holds)."""
        resource = Resource.FromString(self.blob)
        kept = [kv for kv in resource.attributes if kv.key not in keys]
        return bytes(Resource(attributes=kept).SerializeToString())


_WORKLOAD_KEYS = (
    ("replicaset", semconv.REPLICASET_NAME),
    ("deployment", semconv.DEPLOYMENT_NAME),
    ("statefulset", semconv.STATEFULSET_NAME),
    ("daemonset", semconv.DAEMONSET_NAME),
    ("job", semconv.JOB_NAME),
    ("cronjob", semconv.CRONJOB_NAME),
    ("kind", semconv.OWNER_KIND),
    ("name", semconv.OWNER_NAME),
)


class AttributeBuilder:
    """Builds (and caches) the encoded attributes of pods, containers and shared devices."""

    def __init__(
        self,
        *,
        workload: Callable[[PodInfo], Workload],
        node: Callable[[str], NodeInfo | None],
        node_name: str | None,
        max_cached: int = 4096,
    ) -> None:
        """``workload`` and ``node`` read the owner and node caches; ``node_name`` is this node (node mode)."""
        self._workload = workload
        self._node = node
        self.node_name = node_name
        self._max = max_cached
        self._identity: dict[tuple[str, ...], Encoded] = {}
        self._shared: dict[tuple[tuple[Holder, ...], tuple[str | None, ...]],
                           tuple[tuple[PodInfo | None, ...], Encoded]] = {}
        self.none = Encoded.of([(semconv.ATTRIBUTION, "none")])

    def invalidate(self) -> None:
        """Forget encodings that read node facts (a node's labels changed)."""
        self._identity.clear()
        self._shared.clear()

    def _node_attributes(self, node: str) -> list[tuple[str, Value]]:
        if not node:
            return []
        out: list[tuple[str, Value]] = [(semconv.NODE_NAME, node)]
        info = self._node(node)
        if info is not None:
            out.extend(info.attributes)
        return out

    def pod(self, pod: PodInfo, *, container: str | None, container_id: str | None, source: str) -> Encoded:
        """Everything known of ``pod`` (and one of its containers), with how it was found."""
        key = (container, container_id, source)
        cached = pod.blobs.get(key)
        if cached is not None:
            return cached
        attributes: list[tuple[str, Value]] = [
            (semconv.POD_NAME, pod.name),
            (semconv.POD_UID, pod.uid),
            (semconv.NAMESPACE_NAME, pod.namespace),
        ]
        if container:
            attributes.append((semconv.CONTAINER_NAME, container))
        if container_id:
            attributes.append((semconv.CONTAINER_ID, container_id))
        workload = self._workload(pod)
        attributes.extend((name, value) for field, name in _WORKLOAD_KEYS if (value := getattr(workload, field)))
        attributes.extend((semconv.POD_LABEL_PREFIX + k, v) for k, v in pod.labels)
        attributes.extend((semconv.POD_ANNOTATION_PREFIX + k, v) for k, v in pod.annotations)
        attributes.extend(self._node_attributes(pod.node or self.node_name or ""))
        if source == "podresources":
            attributes.append((semconv.PODS, [f"{pod.namespace}/{pod.name}"]))
            attributes.append((semconv.POD_UIDS, [f"{pod.namespace}/{pod.name}/{pod.uid}"]))
        attributes.append((semconv.ATTRIBUTION, source))
        encoded = Encoded.of(attributes)
        pod.blobs[key] = encoded  # dropped when an owner lookup or a node read completes
        return encoded

    def identity(
        self,
        *,
        source: str,
        pod_uid: str | None = None,
        container_id: str | None = None,
        namespace: str | None = None,
        pod_name: str | None = None,
        container: str | None = None,
    ) -> Encoded:
        """What the cgroup path or PodResources says by itself, for a pod the API has not (yet) shown."""
        key = (source, pod_uid or "", container_id or "", namespace or "", pod_name or "", container or "")
        cached = self._identity.get(key)
        if cached is not None:
            return cached
        attributes: list[tuple[str, Value]] = []
        if pod_name:
            attributes.append((semconv.POD_NAME, pod_name))
        if pod_uid:
            attributes.append((semconv.POD_UID, pod_uid))
        if namespace:
            attributes.append((semconv.NAMESPACE_NAME, namespace))
        if container:
            attributes.append((semconv.CONTAINER_NAME, container))
        if container_id:
            attributes.append((semconv.CONTAINER_ID, container_id))
        attributes.extend(self._node_attributes(self.node_name or ""))
        if namespace and pod_name and source == "podresources":
            attributes.append((semconv.PODS, [f"{namespace}/{pod_name}"]))
            attributes.append((semconv.POD_UIDS, [f"{namespace}/{pod_name}/{pod_uid or ''}"]))
        attributes.append((semconv.ATTRIBUTION, source))
        encoded = Encoded.of(attributes)
        if len(self._identity) >= self._max:
            self._identity.clear()
        self._identity[key] = encoded
        return encoded

    def shared(self, holders: tuple[Holder, ...], pods: tuple[PodInfo | None, ...],
               uids: tuple[str | None, ...] = ()) -> Encoded:
        """A device several pods hold: the list of them, never one picked from it.

        ``pods`` are the store's entries for the distinct (namespace, pod) of ``holders``, in
        sorted order (None where unknown), ``uids`` their uids where known; the cache entry is
        valid while those entries are the same objects.
        """
        key = (holders, uids)
        cached = self._shared.get(key)
        if cached is not None and all(a is b for a, b in zip(cached[0], pods, strict=True)):
            return cached[1]
        names = sorted({f"{h.namespace}/{h.pod}" for h in holders})
        namespaces = {h.namespace for h in holders}
        attributes: list[tuple[str, Value]] = [(semconv.PODS, names)]
        if len(uids) == len(names):
            attributes.append((semconv.POD_UIDS, [f"{name}/{uid or ''}" for name, uid in zip(names, uids, strict=True)]))
        if len(namespaces) == 1:
            attributes.append((semconv.NAMESPACE_NAME, next(iter(namespaces))))
        # Node mode: this node. Gateway mode: the node of the pods (a device's pods share its node).
        node = self.node_name or next((p.node for p in pods if p is not None and p.node), "")
        attributes.extend(self._node_attributes(node))
        attributes.append((semconv.ATTRIBUTION, "podresources"))
        encoded = Encoded.of(attributes)
        if len(self._shared) >= self._max:
            self._shared.clear()
        self._shared[key] = (pods, encoded)
        return encoded
