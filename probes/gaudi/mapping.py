"""Gaudi snapshot -> devices: :func:`map_gaudi` maps hl-smi's parsed output and the NIC ports
onto the shared catalog, one device per accelerator.

Per-port network counters of the integrated RoCE NIC ports do not come from hl-smi (its NET view
has no documented machine-readable form) but from the kernel's netdev sysfs, a documented ABI
(:mod:`~gputally.probes.gaudi.nic`): each port under a Gaudi's PCI device sends ``hw.gpu.io``
(bytes, receive/transmit), ``gputally.gpu.link.packets``, ``hw.errors`` (error.type receive,
transmit, receive_dropped, transmit_dropped), ``gputally.gpu.link.up`` (1 while operstate is up)
and ``gputally.gpu.link.speed`` (bit/s; absent while unreadable), each with
``gputally.gpu.link`` = ``port<dev_port>`` and ``network.interface.name``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gputally.probes import catalog as m
from gputally.probes.gaudi import nic as gaudi_nic
from gputally.probes.gaudi.parse import (
    cell_bytes,
    cell_hz,
    cell_number,
    cell_text,
    parse_csv,
    parse_processes,
    parse_rows,
)
from gputally.probes.model import AttrValue, Point
from gputally.probes.snapshot import DeviceReading, ProcessUse, VendorUnavailable

__all__ = ["map_gaudi"]

VENDOR = "Intel"


def _failure(result: Any, what: str) -> str | None:
    if not isinstance(result, Mapping):
        return f"{what}: no output recorded"
    if "error" in result:
        return str(result["error"])
    if result.get("returncode") not in (0, None):
        detail = (result.get("stderr") or result.get("stdout") or "").strip().splitlines()
        return f"{what} exited with status {result['returncode']}" + (f": {detail[0]}" if detail else "")
    return None


def map_gaudi(snapshot: Mapping[str, Any], driver: Mapping[str, Any]) -> list[DeviceReading]:
    """One snapshot -> one device per Gaudi. Raises VendorUnavailable when the query itself failed."""
    query = snapshot.get("query")
    problem = _failure(query, "hl-smi -Q")
    if problem is not None:
        raise VendorUnavailable(problem)
    assert isinstance(query, Mapping)
    rows = parse_csv(query.get("stdout", ""))
    if not rows:
        raise VendorUnavailable("hl-smi lists no Gaudi devices")
    replaced = parse_rows(snapshot["rows"].get("stdout", "")) if _failure(snapshot.get("rows"), "") is None else {}
    processes = parse_processes(snapshot["processes"].get("stdout", "")) if _failure(snapshot.get("processes"), "") is None else []
    ports = gaudi_nic.assign(snapshot.get("nic"), [b for b in (cell_text(row, "bus_id") for row in rows) if b])
    out = []
    for position, row in enumerate(rows):
        index = cell_number(row, "index")
        index = int(index) if index is not None else position
        uuid = cell_text(row, "uuid")
        bus = cell_text(row, "bus_id")
        serial = cell_text(row, "serial")
        hw_id = uuid or (f"gaudi-{serial}" if serial else f"gaudi-{bus or index}")
        attributes: dict[str, AttrValue] = {
            "hw.id": hw_id, "hw.type": "gpu", "hw.vendor": VENDOR, "hw.name": f"accel{index}",
            "gputally.gpu.index": index,
        }
        optional = {
            "hw.model": cell_text(row, "name"),
            "hw.serial_number": serial,
            "hw.driver_version": cell_text(row, "driver_version"),
            "gputally.gpu.pci.bus_id": bus.lower() if bus else None,
            "gputally.gpu.module_id": int(cell_number(row, "module_id")) if cell_number(row, "module_id") is not None else None,  # type: ignore[arg-type]
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        points: list[Point] = []

        def add(metric: Any, value: Any, attrs: tuple[tuple[str, AttrValue], ...] = ()) -> None:
            if value is not None:
                points.append(Point(metric, value, attrs))  # noqa: B023 - used in this iteration only

        utilization = cell_number(row, "utilization.aip")
        add(m.GPU_UTILIZATION, min(max(utilization / 100.0, 0.0), 1.0) if utilization is not None else None,
            (("hw.gpu.task", "general"),))
        used, total = cell_bytes(row, "memory.used"), cell_bytes(row, "memory.total")
        add(m.GPU_MEMORY_USAGE, used)
        add(m.GPU_MEMORY_LIMIT, total)
        if used is not None and total:
            add(m.GPU_MEMORY_UTILIZATION, used / total)
        power = cell_number(row, "power.draw")
        add(m.POWER, float(power) if power is not None else None)
        cap = cell_number(row, "power.max")
        add(m.POWER_LIMIT, float(cap) if cap is not None else None, (("gputally.gpu.power.limit_type", "enforced"),))
        add(m.TEMPERATURE, cell_number(row, "temperature.aip"), (("hw.sensor_location", "gpu"),))
        add(m.CLOCK, cell_hz(row, "clocks.current.soc"), (("gputally.gpu.clock.type", "soc"),))
        add(m.CLOCK_LIMIT, cell_hz(row, "clocks.max.soc"), (("gputally.gpu.clock.type", "soc"),))
        corrected = cell_number(row, "ecc.errors.corrected.volatile.total")
        uncorrected = cell_number(row, "ecc.errors.uncorrected.volatile.total")
        add(m.ERRORS, corrected, (("error.type", "ecc_corrected"),))
        add(m.ERRORS, uncorrected, (("error.type", "ecc_uncorrected"),))
        add(m.PCIE_GENERATION, cell_number(row, "pcie.link.gen.current"))
        add(m.PCIE_GENERATION_LIMIT, cell_number(row, "pcie.link.gen.max"))
        add(m.PCIE_WIDTH, cell_number(row, "pcie.link.width.current"))
        add(m.PCIE_WIDTH_LIMIT, cell_number(row, "pcie.link.width.max"))
        remap = replaced.get(bus.lower()) if bus else None
        pending = False
        if remap:
            add(m.REMAPPED_ROWS, remap.get("replaced"), (("gputally.gpu.memory.remap_cause", "any"),))
            if "pending" in remap:
                pending = remap["pending"] > 0
                add(m.REMAP_PENDING, int(pending))
        port_points, port_body = gaudi_nic.port_points(ports.get(bus, []) if bus else [])
        points.extend(port_points)
        device = DeviceReading(
            hw_id=hw_id, attributes=attributes, points=points,
            label=f"{index} ({attributes.get('hw.model', hw_id)})",
            processes=[ProcessUse(pid, mem) for aip, pid, mem in processes if aip == index],
            body={"index": index, "uuid": hw_id, "query": {k: v for k, (v, _) in row.items()},
                  "rows": remap or {}, "processes": [{"pid": p, "memory": mb} for a, p, mb in processes if a == index]},
        )
        if port_body:
            device.body["nic"] = port_body
        if (uncorrected or 0) > 0 or pending:
            device.state = "degraded"
        out.append(device)
    for what in ("rows", "processes"):
        issue = _failure(snapshot.get(what), f"hl-smi {what}") if what in snapshot else None
        if issue and out:
            out[0].problems.append(issue)
    nic = snapshot.get("nic")
    if isinstance(nic, Mapping) and nic.get("error") and out:
        out[0].problems.append(f"NIC ports: {nic['error']}")
    return out
