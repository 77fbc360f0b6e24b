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

from collections.abc import Callable, Mapping
from typing import Any

from gputally.probes.core import catalog as m
from gputally.probes.core.model import Attributes, AttrValue, MetricDef, Point
from gputally.probes.gaudi import nic as gaudi_nic
from gputally.probes.gaudi.parse import (
    Row,
    cell_bytes,
    cell_hz,
    cell_number,
    cell_text,
    parse_csv,
    parse_processes,
    parse_rows,
)
from gputally.probes.snapshot.source import DeviceReading, ProcessUse, VendorUnavailable

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
    rows = _query_rows(snapshot)
    replaced = parse_rows(_stdout(snapshot, "rows") or "")
    processes = parse_processes(_stdout(snapshot, "processes") or "")
    ports = gaudi_nic.assign(snapshot.get("nic"), [b for b in (cell_text(row, "bus_id") for row in rows) if b])
    out = [_device(position, row, replaced, processes, ports) for position, row in enumerate(rows)]
    if out:
        out[0].problems.extend(_side_problems(snapshot))
    return out


def _query_rows(snapshot: Mapping[str, Any]) -> list[Row]:
    query = snapshot.get("query")
    problem = _failure(query, "hl-smi -Q")
    if problem is not None:
        raise VendorUnavailable(problem)
    assert isinstance(query, Mapping)
    rows = parse_csv(query.get("stdout", ""))
    if not rows:
        raise VendorUnavailable("hl-smi lists no Gaudi devices")
    return list(rows)


def _stdout(snapshot: Mapping[str, Any], what: str) -> str | None:
    """The output of a side command (``rows``, ``processes``), None where it failed or is absent."""
    result = snapshot.get(what)
    if _failure(result, what) is not None:
        return None
    assert isinstance(result, Mapping)  # _failure says so
    return str(result.get("stdout", ""))


def _side_problems(snapshot: Mapping[str, Any]) -> list[str]:
    """What the side commands and the NIC read could not tell, said on the first device."""
    problems = [issue for what in ("rows", "processes") if what in snapshot
                for issue in [_failure(snapshot.get(what), f"hl-smi {what}")] if issue]
    nic = snapshot.get("nic")
    if isinstance(nic, Mapping) and nic.get("error"):
        problems.append(f"NIC ports: {nic['error']}")
    return problems


def _device(position: int, row: Row, replaced: Mapping[str, Mapping[str, int]],
            processes: list[tuple[int, int, int | None]], ports: Mapping[str, list[Mapping[str, Any]]]) -> DeviceReading:
    index, hw_id, attributes = _identity(position, row)
    bus = cell_text(row, "bus_id")
    remap = replaced.get(bus.lower()) if bus else None
    points = _row_points(row)
    pending = _remap_points(points, remap or {})
    port_points, port_body = gaudi_nic.port_points(ports.get(bus, []) if bus else [])
    points.extend(port_points)
    mine = [(pid, memory) for aip, pid, memory in processes if aip == index]
    device = DeviceReading(
        hw_id=hw_id, attributes=attributes, points=points,
        label=f"{index} ({attributes.get('hw.model', hw_id)})",
        processes=[ProcessUse(pid, memory) for pid, memory in mine],
        body={"index": index, "uuid": hw_id, "query": {k: v for k, (v, _) in row.items()},
              "rows": remap or {}, "processes": [{"pid": pid, "memory": memory} for pid, memory in mine]},
    )
    if port_body:
        device.body["nic"] = port_body
    if (cell_number(row, "ecc.errors.uncorrected.volatile.total") or 0) > 0 or pending:
        device.state = "degraded"
    return device


def _identity(position: int, row: Row) -> tuple[int, str, dict[str, AttrValue]]:
    """``(index, hw.id, resource attributes)``: the UUID, else the serial, else the PCI address names it."""
    reported = cell_number(row, "index")
    index = int(reported) if reported is not None else position
    uuid, bus, serial = cell_text(row, "uuid"), cell_text(row, "bus_id"), cell_text(row, "serial")
    hw_id = uuid or (f"gaudi-{serial}" if serial else f"gaudi-{bus or index}")
    module = cell_number(row, "module_id")
    optional = {
        "hw.model": cell_text(row, "name"),
        "hw.serial_number": serial,
        "hw.driver_version": cell_text(row, "driver_version"),
        "gputally.gpu.pci.bus_id": bus.lower() if bus else None,
        "gputally.gpu.module_id": int(module) if module is not None else None,
    }
    attributes: dict[str, AttrValue] = {
        "hw.id": hw_id, "hw.type": "gpu", "hw.vendor": VENDOR, "hw.name": f"accel{index}",
        "gputally.gpu.index": index, **{k: v for k, v in optional.items() if v is not None},
    }
    return index, hw_id, attributes


class _Points(list[Point]):
    def add(self, metric: MetricDef, value: Any, attributes: Attributes = ()) -> None:
        if value is not None:
            self.append(Point(metric, value, attributes))


def _watts(row: Row, column: str) -> float | None:
    value = cell_number(row, column)
    return float(value) if value is not None else None


_ROW_POINTS: tuple[tuple[MetricDef, str, Callable[[Row, str], Any], Attributes], ...] = (
    (m.POWER, "power.draw", _watts, ()),
    (m.POWER_LIMIT, "power.max", _watts, (("gputally.gpu.power.limit_type", "enforced"),)),
    (m.TEMPERATURE, "temperature.aip", cell_number, (("hw.sensor_location", "gpu"),)),
    (m.CLOCK, "clocks.current.soc", cell_hz, (("gputally.gpu.clock.type", "soc"),)),
    (m.CLOCK_LIMIT, "clocks.max.soc", cell_hz, (("gputally.gpu.clock.type", "soc"),)),
    (m.ERRORS, "ecc.errors.corrected.volatile.total", cell_number, (("error.type", "ecc_corrected"),)),
    (m.ERRORS, "ecc.errors.uncorrected.volatile.total", cell_number, (("error.type", "ecc_uncorrected"),)),
    (m.PCIE_GENERATION, "pcie.link.gen.current", cell_number, ()),
    (m.PCIE_GENERATION_LIMIT, "pcie.link.gen.max", cell_number, ()),
    (m.PCIE_WIDTH, "pcie.link.width.current", cell_number, ()),
    (m.PCIE_WIDTH_LIMIT, "pcie.link.width.max", cell_number, ()),
)
"""Columns read one point each, in order: metric, column, reader (unit applied), point attributes."""


def _row_points(row: Row) -> _Points:
    """The query row's readings: busy ratio, memory, then :data:`_ROW_POINTS`."""
    points = _Points()
    utilization = cell_number(row, "utilization.aip")
    points.add(m.GPU_UTILIZATION, min(max(utilization / 100.0, 0.0), 1.0) if utilization is not None else None,
               (("hw.gpu.task", "general"),))
    used, total = cell_bytes(row, "memory.used"), cell_bytes(row, "memory.total")
    points.add(m.GPU_MEMORY_USAGE, used)
    points.add(m.GPU_MEMORY_LIMIT, total)
    if used is not None and total:
        points.add(m.GPU_MEMORY_UTILIZATION, used / total)
    for metric, column, read, attributes in _ROW_POINTS:
        points.add(metric, read(row, column), attributes)
    return points


def _remap_points(points: _Points, remap: Mapping[str, int]) -> bool:
    """Rows replaced and pending (``hl-smi -q -d ROW_REPLACEMENT``); True while a replacement is pending."""
    if not remap:
        return False
    points.add(m.REMAPPED_ROWS, remap.get("replaced"), (("gputally.gpu.memory.remap_cause", "any"),))
    if "pending" not in remap:
        return False
    pending = remap["pending"] > 0
    points.add(m.REMAP_PENDING, int(pending))
    return pending
