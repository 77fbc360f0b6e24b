"""The ``k8s`` processor at run time: who each GPU process and each GPU belongs to.

Attribution lives on resources (one per GPU, one per GPU process), never on points, so a
resource costs one lookup and one append to its encoding whatever its number of points.

* A process resource (``process.pid``) is attributed by its cgroup: the probe's
  ``process.linux.cgroup`` hint, or ``<proc_root>/<pid>/cgroup`` read in the background.
  The cgroup names the pod uid and container id; the pod cache adds the rest. Its GPU's
  allocation is never used: a Slurm job on a GPU a pod holds is still not that pod's.
* A device resource (``hw.id`` without ``process.pid``) is attributed through PodResources:
  the pod(s) the kubelet allocated it to, including when it runs nothing (the idle GPU
  someone pays for). Several pods sharing a GPU are all listed, never one picked. In node
  mode the processor asks the kubelet itself; otherwise (gateway mode) it reads what the
  probe asked the kubelet on the node, the ``gputally.k8s.podresources.holders`` hint. Both
  give their holders to one resolution (:func:`_by_holders`), so both shapes attribute alike;
  where both exist, the processor's own socket wins (its answer is the fresher).

What a resource's own bytes imply (which hints it has, what they parse to) is decided once
and cached by those bytes (the same GPU sends the same resource every cycle), and so is the
outcome, until the caches change. The request itself is never decoded: resources are
spliced in its encoding (:mod:`gputally.otlp.splice`), so the points pass through as received.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client import CollectorRegistry

from gputally.cgroup.parse import CgroupInfo, parse_cgroup
from gputally.errors import ConfigError
from gputally.kubelet import semconv
from gputally.kubelet.devices import Holder, device_key, resource_keys
from gputally.otlp.batch import Batch, Signal
from gputally.otlp.splice import split
from gputally.pipeline.component import ComponentContext, RuntimeProcessor

from .attributes import Encoded
from .config import K8sConfig
from .metrics import K8sCollector
from .procfs import PENDING
from .runtime import K8sRuntime

__all__ = ["K8sProcessor", "create"]

_READ = frozenset({
    semconv.HW_ID, semconv.HW_NAME, semconv.HW_PARENT, *semconv.GPU_INDEX, *semconv.GPU_PCI_BUS_ID,
    semconv.MIG_GPU_INSTANCE, semconv.MIG_COMPUTE_INSTANCE,
    semconv.PROCESS_PID, semconv.PROCESS_CGROUP, semconv.PROCESS_START, semconv.PODRESOURCES_HOLDERS,
    semconv.PODRESOURCES_UIDS,
})
_DECISIONS_LIMIT = 16384

Outcome = tuple[Encoded | None, str]
"""What to merge (None: nothing) and the attribution source to count."""


class _Decision:
    """What a resource's own attributes say; :meth:`resolve` consults the caches (no I/O).

    The blob to merge is kept with the runtime generation it was computed at, so while
    nothing changes (the steady state) a resource costs one comparison.
    """

    __slots__ = ("blob", "existing", "generation", "source")
    cacheable = True

    def __init__(self, existing: frozenset[str]) -> None:
        self.existing = existing
        """Keys the processor writes that the resource already holds (kept as they are)."""
        self.generation = -1
        self.blob = b""
        self.source = ""

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        raise NotImplementedError


class _Skip(_Decision):
    """Not an entity the processor attributes, or attributed already (by a gputally upstream)."""

    __slots__ = ()

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        return None, ""


class _NoOwner(_Decision):
    """A process whose cgroup is not a pod's (Slurm, systemd, plain Docker) or cannot be known."""

    __slots__ = ()

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        return runtime.builder.none, "none"


def _by_cgroup(runtime: K8sRuntime, uid: str, cid: str | None) -> Outcome:
    store = runtime.store
    if store.synced:
        pod = store.by_container(cid) if cid else None
        if pod is None or pod.uid != uid:
            pod = store.get(uid)
        if pod is not None:
            container = pod.container_name(cid)
            return runtime.builder.pod(pod, container=container, container_id=cid, source="cgroup"), "cgroup"
    known = runtime.directory.pod(uid) if runtime.directory is not None else None
    if known is not None:  # the container runtime on the node names it: the API server is not needed
        assert runtime.directory is not None
        return runtime.builder.identity(
            source="cgroup", pod_uid=uid, container_id=cid, namespace=known.namespace, pod_name=known.name,
            container=runtime.directory.container_name(cid),
        ), "cgroup"
    return runtime.builder.identity(source="cgroup", pod_uid=uid, container_id=cid), "cgroup"


class _Cgroup(_Decision):
    """A process whose cgroup hint names a pod (uid, and the container id when it is a container's)."""

    __slots__ = ("container_id", "pod_uid")

    def __init__(self, existing: frozenset[str], pod_uid: str, container_id: str | None) -> None:
        super().__init__(existing)
        self.pod_uid = pod_uid
        self.container_id = container_id

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        return _by_cgroup(runtime, self.pod_uid, self.container_id)


class _Pid(_Decision):
    """A process sent without a cgroup hint: its cgroup is read from ``proc_root`` in the background."""

    __slots__ = ("pid", "start")
    cacheable = False  # each lookup also keeps the /proc answer alive in its cache

    def __init__(self, existing: frozenset[str], pid: int, start: str | None) -> None:
        super().__init__(existing)
        self.pid = pid
        self.start = start

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        assert runtime.proc is not None
        info = runtime.proc.lookup(self.pid, self.start)
        if info is PENDING:
            return None, "pending"
        if isinstance(info, CgroupInfo) and info.kind == "kubernetes" and info.pod_uid:
            return _by_cgroup(runtime, info.pod_uid, info.container_id)
        return runtime.builder.none, "none"


def _by_holders(runtime: K8sRuntime, holders: tuple[Holder, ...], uids: Uids = ()) -> Outcome:
    """A device's attribution from the containers holding it (sorted, no duplicates): the one
    code path of node mode (its own PodResources answer) and gateway mode (the probe's hint).

    A holder's uid comes from the API server's pod, else from the node: the probe's
    ``gputally.k8s.podresources.uids`` hint (``uids``), or this processor's own CRI answer."""
    if not holders:
        return runtime.builder.none, "none"
    store = runtime.store
    directory = runtime.directory
    hinted = dict(uids)

    def uid_of(namespace: str, name: str) -> str | None:
        found = hinted.get((namespace, name))
        if found is None and directory is not None:
            found = directory.uid_of(namespace, name)
        return found

    pods = sorted({(h.namespace, h.pod) for h in holders})
    if len(pods) == 1:
        namespace, name = pods[0]
        containers = {h.container for h in holders}
        container = next(iter(containers)) if len(containers) == 1 else None
        pod = store.by_name(namespace, name) if store.synced else None
        if pod is not None:
            encoded = runtime.builder.pod(
                pod, container=container, container_id=pod.container_id(container), source="podresources"
            )
        else:
            encoded = runtime.builder.identity(
                source="podresources", namespace=namespace, pod_name=name, container=container,
                pod_uid=uid_of(namespace, name),
            )
        return encoded, "podresources"
    entries = tuple(store.by_name(ns, n) if store.synced else None for ns, n in pods)
    known = tuple(p.uid if p is not None else uid_of(ns, n) for p, (ns, n) in zip(entries, pods, strict=True))
    return runtime.builder.shared(holders, entries, known), "podresources"


Uids = tuple[tuple[tuple[str, str], str], ...]
"""((namespace, pod), uid) for the holders the node named (the probe's uids hint)."""


class _Device(_Decision):
    """A GPU or MIG device, in node mode: the pods the kubelet's PodResources says it is allocated to."""

    __slots__ = ("keys", "own")

    def __init__(self, existing: frozenset[str], keys: tuple[str, ...]) -> None:
        super().__init__(existing)
        self.keys = keys
        self.own = keys[0] if keys else ""

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        assert runtime.podresources is not None
        devices = runtime.podresources.devices
        if devices is None:  # no List answered yet: nothing is known, not even "none"
            return None, "pending"
        keys = self.keys
        children = runtime.mig_children.get(self.own)
        if children:
            keys = (*keys, *children)
        return _by_holders(runtime, devices.holders(keys))


class _Hinted(_Decision):
    """A GPU or MIG device whose probe read PodResources on the node (gateway mode): its holders hint.

    The probe already added a MIG parent's tenants to the parent's hint."""

    __slots__ = ("holders", "uids")

    def __init__(self, existing: frozenset[str], holders: tuple[Holder, ...], uids: Uids) -> None:
        super().__init__(existing)
        self.holders = holders
        self.uids = uids

    def resolve(self, runtime: K8sRuntime) -> Outcome:
        return _by_holders(runtime, self.holders, self.uids)


def _hinted_holders(hint: tuple[str, ...]) -> tuple[Holder, ...] | None:
    """The holders a hint names, sorted; None when it has entries and none of them parse."""
    holders = {h for entry in hint if (h := Holder.from_hint(entry)) is not None}
    if hint and not holders:
        return None
    return tuple(sorted(holders))


def _hinted_uids(hint: Any) -> Uids:
    """``namespace/pod/uid`` entries of the uids hint; malformed ones are skipped."""
    if not isinstance(hint, tuple):
        return ()
    found = {}
    for entry in hint:
        parts = entry.split("/")
        if len(parts) == 3 and all(parts):
            found[(parts[0], parts[1])] = parts[2]
    return tuple(sorted(found.items()))


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":  # the holders hint: an array of strings
        values = any_value.array_value.values
        if all(v.WhichOneof("value") == "string_value" for v in values):
            return tuple(v.string_value for v in values)
        return None
    return getattr(any_value, kind) if kind in ("string_value", "int_value") else None


class K8sProcessor(RuntimeProcessor[K8sRuntime]):
    """Adds pod, container, workload and node attributes to GPU and GPU-process resources."""

    def __init__(self, runtime: K8sRuntime, *, signal: Signal) -> None:
        super().__init__(runtime)
        self.signal = signal
        self._decisions: dict[bytes, _Decision] = {}

    async def process(self, batch: Batch) -> Batch | None:
        runtime = self.runtime
        decisions = self._decisions
        generation = runtime.generation
        counts: dict[str, int] = {}
        request = split(batch.serialize())  # the received bytes, unless an earlier stage changed them
        changed = False
        for entry in request.entries:
            resource = entry.resource
            decision = decisions.get(resource)
            if decision is None:
                decision = self._decide(Resource.FromString(resource))
                if len(decisions) >= _DECISIONS_LIMIT:
                    decisions.clear()
                decisions[resource] = decision
            if decision.generation == generation:
                blob, source = decision.blob, decision.source
            else:
                encoded, source = decision.resolve(runtime)
                if encoded is None:
                    blob = b""
                else:
                    blob = encoded.without(decision.existing) if decision.existing else encoded.blob
                if decision.cacheable:
                    decision.generation, decision.blob, decision.source = generation, blob, source
            if source:
                counts[source] = counts.get(source, 0) + 1
            if blob:
                entry.resource = resource + blob  # appending KeyValues to a Resource's encoding adds attributes
                changed = True
        if counts:
            tally = runtime.attributions
            signal = self.signal.value
            for source, count in counts.items():
                tally[(signal, source)] = tally.get((signal, source), 0) + count
        if not changed:
            return batch
        out = Batch(batch.signal, raw=request.SerializeToString(), items=batch.items)
        out.rejected, out.rejection = batch.rejected, batch.rejection
        return out

    def _decide(self, resource: Any) -> _Decision:
        """Read the hints once per distinct resource (the result is cached by its bytes)."""
        hints: dict[str, Any] = {}
        existing: set[str] = set()
        for kv in resource.attributes:
            key = kv.key
            if key in _READ:
                hints[key] = _value(kv.value)
            elif key.startswith(semconv.WRITTEN_PREFIXES):
                existing.add(key)
        held = frozenset(existing)
        if semconv.ATTRIBUTION in held:
            return _Skip(held)
        runtime = self.runtime
        pid = hints.get(semconv.PROCESS_PID)
        cgroup = hints.get(semconv.PROCESS_CGROUP)
        # A process, or what runs in a cgroup without a pid of its own (an inference engine read
        # as `--engine URL,cgroup=PATH`): named by its cgroup.
        if isinstance(pid, int) or (isinstance(cgroup, str) and cgroup and not isinstance(hints.get(semconv.HW_ID), str)):
            if isinstance(cgroup, str) and cgroup:
                info = parse_cgroup(cgroup)
                if info.kind == "kubernetes" and info.pod_uid:
                    return _Cgroup(held, info.pod_uid, info.container_id)
                return _NoOwner(held)
            if isinstance(pid, int) and runtime.proc is not None:
                start = hints.get(semconv.PROCESS_START)
                return _Pid(held, pid, start if isinstance(start, str) and start else None)
            return _NoOwner(held)
        if not isinstance(hints.get(semconv.HW_ID), str):
            return _Skip(held)
        if runtime.podresources is not None:  # node mode's own socket, preferred to the probe's hint
            keys = resource_keys(hints)
            parent = hints.get(semconv.HW_PARENT)
            if isinstance(parent, str) and parent:
                parent_key = device_key(parent)
                for key in keys:  # the MIG device's uuid, and its legacy MIG-GPU-<uuid>/<gi>/<ci> form
                    runtime.learn_mig(parent_key, key)
            return _Device(held, keys)
        hint = hints.get(semconv.PODRESOURCES_HOLDERS)
        if isinstance(hint, tuple):
            holders = _hinted_holders(hint)
            if holders is not None:
                return _Hinted(held, holders, _hinted_uids(hints.get(semconv.PODRESOURCES_UIDS)))
        return _Skip(held)


class _Share:
    """The ``k8s`` runtimes of one service (keyed by its metrics registry), and their collector."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runtimes: dict[str, K8sRuntime] = {}
        registry.register(K8sCollector(self.runtimes))




def create(
    config: K8sConfig, context: ComponentContext, signal: Signal, *, environ: Mapping[str, str] | None = None
) -> K8sProcessor:
    """Factory hook: one processor per pipeline, one runtime per processor ID and service."""
    environ = os.environ if environ is None else environ
    try:
        node_name = config.node_name_in(environ)
    except ValueError as exc:
        raise ConfigError(f"{context.id}: node_name: {exc}") from None
    if config.kubeconfig is not None and not config.kubeconfig.is_file():
        raise ConfigError(f"{context.id}: kubeconfig: {config.kubeconfig} is not a file")
    if config.proc_root is not None and not config.proc_root.is_dir():
        raise ConfigError(f"{context.id}: proc_root: {config.proc_root} is not a directory")
    share = context.shared.get(__name__, "", lambda: _Share(context.telemetry.registry))
    runtime = context.shared.get(__name__, context.id, lambda: K8sRuntime(config, name=context.id, node_name=node_name),
                                 reuse=lambda held: held.config == config)
    share.runtimes[context.id] = runtime
    return K8sProcessor(runtime, signal=signal)
