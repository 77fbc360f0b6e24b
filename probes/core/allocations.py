"""Who holds each GPU, asked of the kubelet on the node and sent as a hint on the GPU's resource.

Only on the node can the kubelet's PodResources API be reached, and only it knows which pod a
device plugin (or a DRA driver) allocated a GPU to, busy or idle. The probe asks it and puts
the answer on every GPU and MIG device resource, whatever the vendor, so a gateway-mode ``k8s``
processor attributes the idle GPU someone pays for as a node-mode one does::

    gputally.k8s.podresources.holders = ["notebooks/jupyter-alice-0/notebook/nvidia.com/gpu"]

* a sorted array of ``namespace/pod/container/resource_name`` (the resource name, which may
  hold '/', comes last: split on the first three);
* empty: the kubelet was asked and nobody holds the device;
* absent: PodResources is not read (off, no socket) or has never answered;
* a GPU in MIG mode also lists the holders of its MIG devices, as node mode does.

Beside it, when the container runtime's CRI socket is read, each holding pod's uid::

    gputally.k8s.podresources.uids = ["notebooks/jupyter-alice-0/6ee8558e-..."]

PodResources names pods, a process's cgroup names their uid: the runtime joins the two on the
node, so a gateway accounts a pod's allocation and its processes as one pod while the API
server is unreachable. A pod the runtime did not list is left out (named without a uid).

The reading is the shared kubelet library's (:mod:`gputally.kubelet`: the gRPC ``List``, the
device id forms and the GPU resource names), which a node-mode ``k8s`` processor uses too, so
the probe and the processor agree on every device. Asking
happens at the start of a cycle, beside the collection, at most every ``refresh_s`` and
bounded by ``timeout_s``; a failure keeps the last answer (a kubelet restart must not
unattribute every GPU) and is logged once per cause and once when it clears.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from gputally.errors import ConfigError
from gputally.kubelet import (
    DEFAULT_CRI_SOCKETS,
    DEFAULT_RESOURCE_NAMES,
    CriClient,
    DEFAULT_SOCKET,
    DeviceMap,
    PodResourcesClient,
    Problems,
    ResourceMatcher,
    device_key,
    find_socket,
    resource_keys,
)
from gputally.kubelet.semconv import HW_PARENT, PODRESOURCES_HOLDERS, PODRESOURCES_UIDS
from gputally.probes.core.model import Entity

__all__ = ["HOLDERS", "UIDS", "PodAllocations", "from_options"]

log = logging.getLogger(__name__)

HOLDERS = PODRESOURCES_HOLDERS
"""The resource attribute: ``gputally.k8s.podresources.holders``."""
UIDS = PODRESOURCES_UIDS
"""The resource attribute: ``gputally.k8s.podresources.uids``."""
_DEVICE_KINDS = ("gpu", "mig")
_SOURCE = "podresources"


class PodAllocations:
    """The kubelet's device allocations on this node, and the hint they put on GPU entities."""

    def __init__(
        self,
        socket: Path,
        *,
        refresh_s: float = 10.0,
        timeout_s: float = 1.0,
        resource_names: Sequence[str] = DEFAULT_RESOURCE_NAMES,
        cri: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``refresh_s``: least time between two ``List`` calls; ``timeout_s``: the most one may
        take (it runs beside the collection, so a cycle is never held up longer); ``cri``: the
        container runtime's socket, asked alike, for the holders' uids (None: not asked)."""
        self.socket = socket
        self.problems = Problems(name="probe")
        self._client = PodResourcesClient(
            socket, matcher=ResourceMatcher(resource_names), refresh_interval=refresh_s, timeout=timeout_s,
            problems=self.problems,
        )
        self._cri = (CriClient(cri, refresh_interval=refresh_s, timeout=timeout_s, problems=self.problems)
                     if cri is not None else None)
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._due: float | None = None
        self._failing = False

    @property
    def devices(self) -> DeviceMap | None:
        """The last answer; None until the kubelet has answered once."""
        return self._client.devices

    @property
    def lists(self) -> int:
        """``List`` calls answered so far."""
        return self._client.lists

    async def refresh(self) -> None:
        """Ask the kubelet again when ``refresh_s`` has passed since the last asking (answered or not).

        Never raises and never takes much longer than ``timeout_s``: the call has that deadline,
        and a stalled connection is abandoned at twice it."""
        now = self._clock()
        if self._due is not None and now < self._due:
            return
        self._due = now + self._refresh_s
        try:
            calls = [self._client.refresh()] + ([self._cri.refresh()] if self._cri is not None else [])
            await asyncio.wait_for(asyncio.gather(*calls), timeout=2 * self._timeout_s)
        except TimeoutError:
            await self._client.close()
            if self._cri is not None:
                await self._cri.close()
            self.problems.report(_SOURCE, "stalled", f"pod-resources List on {self.socket} stalled; "
                                 f"{'keeping the last allocations' if self.devices else 'GPUs sent without holders'}")
        except Exception:  # a bug must not stop the probe: logged once per spell
            if not self._failing:
                log.exception("reading pod-resources from %s failed; GPUs keep the last allocations", self.socket)
            self._failing = True
            return
        if self._failing:
            log.info("reading pod-resources from %s works again", self.socket)
            self._failing = False

    def decorate(self, entities: Sequence[Entity]) -> None:
        """Put the holders hint on every GPU and MIG device of one cycle (nothing before a first answer).

        A MIG device's keys are added to its GPU's (``hw.parent``), so the GPU lists its tenants."""
        devices = self._client.devices
        if devices is None:
            return
        keyed: list[tuple[Entity, tuple[str, ...]]] = []
        children: dict[str, list[str]] = {}
        for entity in entities:
            if entity.kind not in _DEVICE_KINDS:
                continue
            keys = resource_keys(entity.attributes)
            keyed.append((entity, keys))
            parent = entity.attributes.get(HW_PARENT)
            if isinstance(parent, str) and parent:
                children.setdefault(device_key(parent), []).extend(keys)
        directory = self._cri.directory if self._cri is not None else None
        for entity, keys in keyed:
            mig = children.get(keys[0]) if keys else None
            holders = devices.holders((*keys, *mig) if mig else keys)
            entity.attributes[HOLDERS] = tuple(sorted(h.hint() for h in holders))
            if directory is not None:
                pods = {(h.namespace, h.pod) for h in holders}
                entity.attributes[UIDS] = tuple(sorted(
                    f"{ns}/{name}/{uid}" for ns, name in pods if (uid := directory.uid_of(ns, name))))

    async def close(self) -> None:
        await self._client.close()
        if self._cri is not None:
            await self._cri.close()


def from_options(socket: str | None, refresh: str, *, cri: str | None = None) -> PodAllocations | None:
    """The probe's ``--pod-resources SOCKET`` (None: the kubelet's socket if it exists; ``off``),
    ``--pod-resources-refresh`` and ``--cri SOCKET`` (None: containerd's or CRI-O's socket if one
    exists; ``off``); None when PodResources is not to be read."""
    from gputally.config.types import parse_duration

    try:
        refresh_s = parse_duration(refresh)
    except ValueError as exc:
        raise ConfigError(f"--pod-resources-refresh: {exc}") from exc
    if refresh_s <= 0:
        raise ConfigError("--pod-resources-refresh: must be above 0")
    if socket == "off":
        return None
    if socket is None:
        if not DEFAULT_SOCKET.exists():
            log.info("pod-resources: no kubelet socket at %s; GPUs are sent without holders "
                     "(--pod-resources SOCKET names another)", DEFAULT_SOCKET)
            return None
        return PodAllocations(DEFAULT_SOCKET, refresh_s=refresh_s, cri=_runtime_socket(cri))
    return PodAllocations(Path(socket), refresh_s=refresh_s, cri=_runtime_socket(cri))


def _runtime_socket(cri: str | None) -> Path | None:
    """``--cri``: a named socket, ``off``, or (None) the first runtime socket that exists."""
    if cri == "off":
        return None
    if cri is not None:
        return Path(cri)
    found = find_socket()
    if found is None:
        log.info("cri: no container runtime socket at %s; holders are sent without uids (--cri SOCKET names one)",
                 ", ".join(str(p) for p in DEFAULT_CRI_SOCKETS))
    return found
