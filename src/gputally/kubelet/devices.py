"""Device ids as device plugins write them, and as the probe describes a device, meeting in one key.

The PodResources API reports what each plugin called a device; the probe reports the device
as the driver sees it. Both sides are reduced to the same keys:

======================================  ============================  ==========================
plugin writes                           key                           probe side
======================================  ============================  ==========================
``GPU-1e06...`` (uuid strategy)          ``gpu-1e06...``               ``hw.id``
``GPU-1e06...::3`` (time-slicing, MPS)   ``gpu-1e06...``               ``hw.id``
``MIG-9b2c...``                          ``mig-9b2c...``               ``hw.id`` of the MIG device
``MIG-GPU-1e06.../1/0`` (pre-R470)       ``mig:gpu-1e06.../1/0``       ``hw.parent`` + instance ids
``0`` (index strategy)                   ``index:0``                   ``gputally.gpu.index``
``nvidia0`` (``/dev/nvidia0``)           ``minor:0``                   ``hw.name`` ``nvidia0``
``0000:c1:00.0`` (AMD: PCI address)      ``pci:0000:c1:00.0``          ``gputally.gpu.pci.bus_id``
anything else                            the id, lower-cased           ``hw.id``, lower-cased
======================================  ============================  ==========================

Replica suffixes are dropped because every replica of a shared GPU is the same GPU: pods
holding replicas of one GPU all hold it, and the device's points list all of them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import semconv

__all__ = ["DeviceMap", "Holder", "ResourceMatcher", "device_key", "resource_keys"]

_REPLICA = re.compile(r"::\d+$")
_INDEX = re.compile(r"\d+")
_MINOR = re.compile(r"nvidia(\d+)")
_PCI = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])")
_LEGACY_MIG = re.compile(r"mig-(gpu-[0-9a-f-]+)/(\d+)/(\d+)")


def _pci(text: str) -> str | None:
    match = _PCI.fullmatch(text)
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"pci:{int(domain or '0', 16):04x}:{bus}:{device}.{function}"


def device_key(device_id: str) -> str:
    """The key a device id from the PodResources API is known by (see the module table)."""
    text = _REPLICA.sub("", device_id.strip().lower())
    if _INDEX.fullmatch(text):
        return f"index:{int(text)}"
    if match := _MINOR.fullmatch(text):
        return f"minor:{int(match.group(1))}"
    if match := _LEGACY_MIG.fullmatch(text):
        return f"mig:{match.group(1)}/{int(match.group(2))}/{int(match.group(3))}"
    pci = _pci(text)
    return pci if pci is not None else text


def resource_keys(attributes: Mapping[str, Any]) -> tuple[str, ...]:
    """Every key a device resource (by its attributes) may be allocated under."""
    keys: list[str] = []
    hw_id = attributes.get(semconv.HW_ID)
    if isinstance(hw_id, str) and hw_id:
        keys.append(device_key(hw_id))
    parent = attributes.get(semconv.HW_PARENT)
    if isinstance(parent, str) and parent:
        gi = attributes.get(semconv.MIG_GPU_INSTANCE)
        ci = attributes.get(semconv.MIG_COMPUTE_INSTANCE)
        if isinstance(gi, int) and isinstance(ci, int):
            keys.append(f"mig:{parent.strip().lower()}/{gi}/{ci}")
    else:  # a MIG device shares its GPU's index, minor and PCI address: those name the GPU only
        index = next((attributes[k] for k in semconv.GPU_INDEX if k in attributes), None)
        if isinstance(index, int) and not isinstance(index, bool):
            keys.append(f"index:{index}")
        name = attributes.get(semconv.HW_NAME)
        if isinstance(name, str) and (match := _MINOR.fullmatch(name.strip().lower())):
            keys.append(f"minor:{int(match.group(1))}")
        bus_id = next((attributes[k] for k in semconv.GPU_PCI_BUS_ID if k in attributes), None)
        if isinstance(bus_id, str) and (pci := _pci(bus_id.strip().lower())):
            keys.append(pci)
    return tuple(dict.fromkeys(keys))


class ResourceMatcher:
    """Which resource names (or DRA driver names) count as GPUs: glob patterns, decided once per name."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self._regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in patterns)) if patterns else None
        self._seen: dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        verdict = self._seen.get(name)
        if verdict is None:
            verdict = bool(self._regex and self._regex.match(name))
            if len(self._seen) < 4096:
                self._seen[name] = verdict
        return verdict


@dataclass(frozen=True, slots=True, order=True)
class Holder:
    """One container that holds a device."""

    namespace: str
    pod: str
    container: str
    resource: str

    def hint(self) -> str:
        """``namespace/pod/container/resource``: one entry of the probe's holders hint
        (``gputally.k8s.podresources.holders``). The resource name may hold '/' and comes last."""
        return f"{self.namespace}/{self.pod}/{self.container}/{self.resource}"

    @classmethod
    def from_hint(cls, text: str) -> Holder | None:
        """The holder an entry of the hint names; None for an entry that is not four non-empty parts."""
        parts = text.split("/", 3)
        if len(parts) != 4 or not all(parts):
            return None
        return cls(*parts)


class DeviceMap:
    """Device key -> the containers holding it, from one PodResources ``List`` answer."""

    __slots__ = ("_by_key", "allocations")

    def __init__(self, by_key: Mapping[str, Iterable[Holder]]) -> None:
        self._by_key = {key: tuple(sorted(set(holders))) for key, holders in by_key.items()}
        self.allocations = sum(len(h) for h in self._by_key.values())

    @classmethod
    def from_response(cls, response: Any, matcher: ResourceMatcher) -> DeviceMap:
        """Build from a ``v1.ListPodResourcesResponse``: device-plugin devices and DRA claims."""
        by_key: dict[str, list[Holder]] = {}
        for pod in response.pod_resources:
            for container in pod.containers:
                for devices in container.devices:
                    if not matcher(devices.resource_name):
                        continue
                    holder = Holder(pod.namespace, pod.name, container.name, devices.resource_name)
                    for device_id in devices.device_ids:
                        by_key.setdefault(device_key(device_id), []).append(holder)
                for claim in container.dynamic_resources:
                    for resource in claim.claim_resources:
                        if not matcher(resource.driver_name):
                            continue
                        holder = Holder(pod.namespace, pod.name, container.name, resource.driver_name)
                        ids = [resource.device_name] if resource.device_name else []
                        ids += [cdi.name.rpartition("=")[2] for cdi in resource.cdi_devices if "=" in cdi.name]
                        for device_id in ids:
                            by_key.setdefault(device_key(device_id), []).append(holder)
        return cls(by_key)

    def holders(self, keys: Iterable[str]) -> tuple[Holder, ...]:
        """Every container holding a device known by any of ``keys``, sorted, no duplicates."""
        found: tuple[Holder, ...] = ()
        for key in keys:
            holders = self._by_key.get(key)
            if holders:
                found = holders if not found else tuple(sorted(set(found) | set(holders)))
        return found

    def __len__(self) -> int:
        return len(self._by_key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMap) and self._by_key == other._by_key

    __hash__ = None  # type: ignore[assignment]
