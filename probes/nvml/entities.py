"""One cycle's readings -> entities (GPU, MIG device, GPU process) with their points, and log entries.

Runs on the event loop after the worker threads have read the GPUs. It keeps the little that
spans cycles: XIDs counted since the probe started, and the ``hw.gpu.io`` totals integrated
from GPM rates for GPUs without byte-counter fields.
"""

from __future__ import annotations

from collections.abc import Sequence

from gputally.probes.core import catalog as m
from gputally.probes.core.model import AttrValue, Entity, LogEntry, Point, Severity
from gputally.probes.core.status import status_points
from gputally.probes.nvml.device_metrics import device_points, gpu_state
from gputally.probes.nvml.events import XidCounts, event_log
from gputally.probes.nvml.gpm import IoTotals, gpm_points, link_rates
from gputally.probes.nvml.process_metrics import process_entities
from gputally.probes.nvml.readings import GpuReadings
from gputally.probes.nvml.source import DriverInfo, GpuEvent

__all__ = ["EntityBuilder"]

_ARCHITECTURES = dict(enumerate(
    ("", "", "kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell")
))
_COUNTER_FIELDS = (("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "pcie"), ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "nvlink"))


class EntityBuilder:
    def __init__(self, *, node_name: str) -> None:
        self._common: dict[str, AttrValue] = {"host.name": node_name}
        self._xids = XidCounts()
        self._io: dict[str, IoTotals] = {}

    def build(
        self, results: Sequence[GpuReadings], events: Sequence[GpuEvent], now: int, *, driver: DriverInfo | None
    ) -> tuple[list[Entity], list[LogEntry]]:
        """Entities and log entries for one cycle; ``events`` are those drained this cycle."""
        for event in events:
            self._xids.add(event)
        entities: list[Entity] = []
        logs: list[LogEntry] = []
        by_uuid: dict[str, Entity] = {}
        for r in results:
            gpu = Entity(key=f"gpu/{r.gpu.uuid}", kind="gpu", attributes=self._gpu_attributes(r, driver),
                         label=f"{r.gpu.index} ({r.info.get('name', r.gpu.uuid)})")
            by_uuid[r.gpu.uuid] = gpu
            entities.append(gpu)
            if r.lost is None:
                gpu.points.extend(device_points(r))
                gpu.points.extend(gpm_points(r.gpm))
                gpu.points.extend(self._io_points(r, now))
            else:
                gpu.points.append(Point(m.COLLECTION_DURATION, r.duration_s))
            for code, count in sorted(self._xids.of(r.gpu.uuid).items()):
                gpu.points.append(Point(m.ERRORS, count, (("error.type", "xid"), ("gputally.gpu.xid", code))))
            gpu.points.extend(status_points(gpu_state(r)))
            entities.extend(process_entities(r, common=self._common))
            for child in r.mig:
                mig = Entity(key=f"mig/{child.gpu.uuid}", kind="mig", attributes=self._mig_attributes(gpu, child),
                             label=f"{gpu.label} MIG gi{child.gpu.mig.gpu_instance_id if child.gpu.mig else '?'}")
                by_uuid[child.gpu.uuid] = mig
                mig.points.extend(device_points(child))
                mig.points.extend(gpm_points(child.gpm))
                entities.append(mig)
                entities.extend(process_entities(child, common=self._common))
            logs.append(LogEntry(entity=gpu, time_ns=now, severity=Severity.INFO,
                                 event_name="gputally.gpu.snapshot", body=r.log_body()))
        for event in events:
            entity = by_uuid.get(event.gpu_uuid) or Entity(
                key=f"gpu/{event.gpu_uuid}", kind="gpu",
                attributes={"hw.id": event.gpu_uuid, "hw.type": "gpu", **self._common}, label=event.gpu_uuid,
            )
            logs.append(event_log(event, entity))
        return entities, logs

    def _gpu_attributes(self, r: GpuReadings, driver: DriverInfo | None) -> dict[str, AttrValue]:
        info = r.info
        minor = info.get("minor_number")
        attributes: dict[str, AttrValue] = {
            "hw.id": r.gpu.uuid,
            "hw.type": "gpu",
            "hw.vendor": "NVIDIA",
            "hw.name": f"nvidia{minor}" if isinstance(minor, int) else f"gpu{r.gpu.index}",
            "gputally.gpu.index": r.gpu.index,
            **self._common,
        }
        optional = {
            "hw.model": info.get("name"),
            "hw.serial_number": info.get("serial"),
            "hw.firmware_version": info.get("vbios"),
            "hw.driver_version": driver.driver_version if driver else None,
            "gputally.gpu.pci.bus_id": (info.get("pci_info") or {}).get("busId"),
            "gputally.gpu.architecture": _ARCHITECTURES.get(info.get("architecture", -1)) or None,
        }
        cc = info.get("cuda_cc")
        if isinstance(cc, list) and len(cc) == 2:
            optional["gputally.gpu.compute_capability"] = f"{cc[0]}.{cc[1]}"
        attributes.update({k: v for k, v in optional.items() if v is not None})
        if isinstance(info.get("mig_mode"), list):
            attributes["gputally.gpu.mig.enabled"] = bool(info["mig_mode"][0])
        return attributes

    def _mig_attributes(self, parent: Entity, r: GpuReadings) -> dict[str, AttrValue]:
        placement = r.gpu.mig
        assert placement is not None
        attributes: dict[str, AttrValue] = {
            "hw.id": r.gpu.uuid,
            "hw.type": "gpu",
            "hw.vendor": "NVIDIA",
            "hw.parent": placement.parent_uuid,
            "hw.name": f"{parent.attributes.get('hw.name')}/gi{placement.gpu_instance_id}",
            "gputally.gpu.index": r.gpu.index,
            "gputally.gpu.mig.gpu_instance_id": placement.gpu_instance_id,
            **self._common,
        }
        if placement.compute_instance_id is not None:
            attributes["gputally.gpu.mig.compute_instance_id"] = placement.compute_instance_id
        for key in ("hw.driver_version", "gputally.gpu.pci.bus_id", "hw.serial_number"):
            if key in parent.attributes:
                attributes[key] = parent.attributes[key]
        if r.info.get("name"):
            attributes["hw.model"] = r.info["name"]
        return attributes

    def _io_points(self, r: GpuReadings, now: int) -> list[Point]:
        """``hw.gpu.io`` from GPM rates, for links the GPU has no byte-counter fields for."""
        counted = {link for name, link in _COUNTER_FIELDS if r.field(name) is not None}
        io = self._io.setdefault(r.gpu.uuid, IoTotals())
        totals = io.update(link_rates(r.gpm), now)
        return io.points(totals, skip_links=counted)
