"""AMD snapshot -> devices: :func:`map_amd` maps amdsmi's return values onto the shared catalog.

Percent / 100, MB x 2^20, uJ / 10^6, MHz x 10^6, uW / 10^6, MT/s to PCIe generation;
partitions (CPX/DPX/... on MI300) become their own devices with ``hw.parent``, like MIG.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gputally.probes.amd.source import CLOCKS, TEMPERATURES, UNSUPPORTED, failed
from gputally.probes.core import catalog as m
from gputally.probes.core.model import Attributes, AttrValue, Kind, MetricDef, Point
from gputally.probes.snapshot.source import DeviceReading, ProcessUse, number

__all__ = ["ECC_BLOCK_ERRORS", "map_amd"]

VENDOR = "AMD"
ECC_BLOCK_ERRORS = MetricDef(
    "gputally.gpu.ecc.errors", "{error}", Kind.COUNTER, "ECC errors by GPU block (amdsmi), corrected / uncorrected / deferred.",
    ("error.type", "gputally.gpu.ecc.block"),
)
MIB = 1024 * 1024
_PCIE_GENERATION = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6, 128000: 7}
_TEMP_LIMITS = {"critical": "throttled", "emergency": "critical"}
_VIOLATIONS = {
    "active_ppt_pwr": "sw_power_cap",
    "active_socket_thrm": "sw_thermal_slowdown",
    "active_prochot_thrm": "hw_slowdown",
    "active_vr_thrm": "vr_thermal_slowdown",
    "active_hbm_thrm": "hbm_thermal_slowdown",
}
_NO_PARTITION = (None, "", "N/A", "SPX", "UNKNOWN")
_SOCKET_POWER = ("current_socket_power", "socket_power", "average_socket_power")
"""Where amdsmi versions put the draw (W), first found wins."""
_ECC_COUNTS = (("correctable_count", "ecc_corrected"), ("uncorrectable_count", "ecc_uncorrected"),
               ("deferred_count", "ecc_deferred"))


def _ok(value: Any) -> Any:
    return None if failed(value) else value


def _get(block: Any, key: str) -> float | int | None:
    return number(block.get(key)) if isinstance(block, Mapping) else None


class _Points(list[Point]):
    def add(self, metric: MetricDef, value: Any, attributes: Attributes = ()) -> None:
        if value is not None:
            self.append(Point(metric, value, attributes))


def _ratio(percent: Any) -> float | None:
    value = number(percent)
    return None if value is None else min(max(value / 100.0, 0.0), 1.0)


def _generation(speed: Any) -> int | None:
    value = number(speed)
    return _PCIE_GENERATION.get(int(value)) if value is not None else None


def _utilization_points(points: _Points, dyn: Mapping[str, Any]) -> None:
    activity = _ok(dyn.get("activity"))
    if isinstance(activity, Mapping):
        points.add(m.GPU_UTILIZATION, _ratio(activity.get("gfx_activity")), (("hw.gpu.task", "general"),))
        points.add(m.GPU_UTILIZATION, _ratio(activity.get("mm_activity")), (("hw.gpu.task", "multimedia"),))
        points.add(m.MEMORY_ACTIVITY, _ratio(activity.get("umc_activity")))


def _memory(dyn: Mapping[str, Any]) -> tuple[int | None, int | None]:
    vram = _ok(dyn.get("vram_usage"))
    used, total = _get(vram, "vram_used"), _get(vram, "vram_total")
    return (int(used * MIB) if used is not None else None, int(total * MIB) if total is not None else None)


def _memory_points(points: _Points, used: int | None, total: int | None) -> None:
    points.add(m.GPU_MEMORY_USAGE, used)
    points.add(m.GPU_MEMORY_LIMIT, total)
    if used is not None and total:
        points.add(m.GPU_MEMORY_UTILIZATION, used / total)


def _clock_points(points: _Points, dyn: Mapping[str, Any]) -> None:
    for key, kind in CLOCKS.items():
        clock = _ok((dyn.get("clock") or {}).get(key))
        current, peak = _get(clock, "clk"), _get(clock, "max_clk")
        attrs = (("gputally.gpu.clock.type", kind),)
        points.add(m.CLOCK, current * 1_000_000 if current is not None else None, attrs)
        if kind in ("graphics", "memory"):
            points.add(m.CLOCK_LIMIT, peak * 1_000_000 if peak is not None else None, attrs)


def _socket_points(points: _Points, static: Mapping[str, Any], dyn: Mapping[str, Any]) -> bool:
    """Board-wide readings (power, energy, temperatures, PCIe, ECC, XGMI, violations); True when degraded."""
    _power_points(points, static, dyn)
    _temperature_points(points, static, dyn)
    _pcie_points(points, dyn)
    uncorrected = _ecc_points(points, dyn)
    _xgmi_points(points, dyn)
    hw_slowdown = _violation_points(points, dyn)
    return bool(uncorrected) or hw_slowdown


def _power_points(points: _Points, static: Mapping[str, Any], dyn: Mapping[str, Any]) -> None:
    """Draw (the first socket-power key this amdsmi has), the caps (uW) and the energy counter (uJ)."""
    power = _ok(dyn.get("power_info"))
    watts = next((w for w in (_get(power, key) for key in _SOCKET_POWER) if w is not None), None)
    points.add(m.POWER, float(watts) if watts is not None else None)
    cap = _ok(static.get("power_cap_info"))
    for key, kind in (("power_cap", "enforced"), ("min_power_cap", "min"), ("max_power_cap", "max")):
        microwatts = _get(cap, key)
        points.add(m.POWER_LIMIT, microwatts / 1_000_000 if microwatts is not None else None,
                   (("gputally.gpu.power.limit_type", kind),))
    energy = _ok(dyn.get("energy_count"))
    accumulator, resolution = _get(energy, "energy_accumulator"), _get(energy, "counter_resolution")
    if accumulator is not None and resolution is not None:
        points.add(m.ENERGY, accumulator * resolution / 1_000_000)


def _temperature_points(points: _Points, static: Mapping[str, Any], dyn: Mapping[str, Any]) -> None:
    for sensor, location in TEMPERATURES.items():
        points.add(m.TEMPERATURE, number(_ok((dyn.get("temperature") or {}).get(sensor))),
                   (("hw.sensor_location", location),))
    for sensor, limits in (static.get("temp_limits") or {}).items():
        limit_location = TEMPERATURES.get(sensor)
        if limit_location is None:
            continue
        for limit_name, limit_type in _TEMP_LIMITS.items():
            points.add(m.TEMPERATURE_LIMIT, number(_ok(limits.get(limit_name))),
                       (("hw.sensor_location", limit_location), ("hw.limit_type", limit_type)))


def _pcie_points(points: _Points, dyn: Mapping[str, Any]) -> None:
    pcie = _ok(dyn.get("pcie_info"))
    if not isinstance(pcie, Mapping):
        return
    link, fixed = pcie.get("pcie_metric") or {}, pcie.get("pcie_static") or {}
    points.add(m.PCIE_GENERATION, _generation(link.get("pcie_speed")))
    points.add(m.PCIE_WIDTH, _get(link, "pcie_width"))
    points.add(m.PCIE_GENERATION_LIMIT, _generation(fixed.get("max_pcie_speed")))
    points.add(m.PCIE_WIDTH_LIMIT, _get(fixed, "max_pcie_width"))
    points.add(m.ERRORS, _get(link, "pcie_replay_count"), (("error.type", "pcie_replay"),))


def _ecc_points(points: _Points, dyn: Mapping[str, Any]) -> float | int | None:
    """The board's ECC totals and the per-block counts; returns the uncorrected total."""
    ecc = _ok(dyn.get("ecc_total"))
    for key, kind in _ECC_COUNTS:
        points.add(m.ERRORS, _get(ecc, key), (("error.type", kind),))
    for block, counts in sorted((dyn.get("ecc_blocks") or {}).items()):
        for key, kind in _ECC_COUNTS:
            points.add(ECC_BLOCK_ERRORS, _get(counts, key),
                       (("error.type", kind), ("gputally.gpu.ecc.block", block.lower())))
    return _get(ecc, "uncorrectable_count")


def _xgmi_points(points: _Points, dyn: Mapping[str, Any]) -> None:
    """XGMI bytes (KiB accumulators summed over links) and the PCIe throughput (GB/s) from gpu_metrics."""
    metrics = _ok(dyn.get("gpu_metrics"))
    if not isinstance(metrics, Mapping):
        return
    for key, direction in (("xgmi_read_data_acc", "receive"), ("xgmi_write_data_acc", "transmit")):
        links = metrics.get(key)
        if isinstance(links, list):
            kibibytes = [v for v in (number(x) for x in links) if v is not None]
            if kibibytes:
                points.add(m.GPU_IO, int(sum(kibibytes) * 1024),
                           (("network.io.direction", direction), ("gputally.gpu.link", "xgmi")))
    inst = _get(metrics, "pcie_bandwidth_inst")
    points.add(m.LINK_THROUGHPUT, inst * 1_000_000_000 if inst is not None else None,
               (("gputally.gpu.link", "pcie"),))


def _violation_points(points: _Points, dyn: Mapping[str, Any]) -> bool:
    """Throttle reasons active now; True when PROCHOT (a hardware slowdown) is among them."""
    violation = _ok(dyn.get("violation_status"))
    hw_slowdown = False
    if not isinstance(violation, Mapping):
        return hw_slowdown
    for key, reason in _VIOLATIONS.items():
        active = violation.get(key)
        if isinstance(active, bool) or active in (0, 1):  # "N/A" where the GPU has no such limit
            points.add(m.CLOCK_THROTTLED, int(bool(active)), (("gputally.gpu.clock.event_reason", reason),))
            hw_slowdown = hw_slowdown or (key == "active_prochot_thrm" and bool(active))
    return hw_slowdown


def _bdf(static: Mapping[str, Any]) -> str | None:
    bdf = _ok(static.get("bdf"))
    return bdf.lower() if isinstance(bdf, str) and bdf else None


def _processes(dyn: Mapping[str, Any], bdf: str | None, fdinfo: Mapping[str, Any]) -> list[ProcessUse]:
    listed = dyn.get("process_list")
    if isinstance(listed, list):
        out = []
        for entry in listed:
            if not isinstance(entry, Mapping) or number(entry.get("pid")) is None:
                continue
            vram = _get(entry.get("memory_usage"), "vram_mem")
            if vram is None:
                vram = _get(entry, "mem")
            out.append(ProcessUse(int(entry["pid"]), int(vram) if vram is not None else None))
        return sorted(out, key=lambda p: p.pid)
    usage = fdinfo.get(bdf or "", {}) if bdf else {}
    return sorted((ProcessUse(int(pid), int(amount)) for pid, amount in usage.items()), key=lambda p: p.pid)


def _identity(static: Mapping[str, Any], driver: Mapping[str, Any]) -> dict[str, AttrValue]:
    asic = _ok(static.get("asic_info")) or {}
    board = _ok(static.get("board_info")) or {}
    vbios = _ok(static.get("vbios_info")) or {}
    drv = _ok(static.get("driver_info")) or {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) and value and value != "N/A" else None

    optional = {
        "hw.model": text(asic.get("market_name")) or text(board.get("product_name")),
        "hw.serial_number": text(board.get("product_serial")) or text(asic.get("asic_serial")),
        "hw.firmware_version": text(vbios.get("version")),
        "hw.driver_version": text(drv.get("driver_version")) or text(driver.get("driver_version")),
        "gputally.gpu.pci.bus_id": _bdf(static),
        "gputally.gpu.architecture": text(asic.get("target_graphics_version")),
    }
    return {k: v for k, v in optional.items() if v is not None}


def _lost(dyn: Mapping[str, Any]) -> str | None:
    keys = ("activity", "vram_usage")
    texts = [e["amdsmi_error"] for k in keys if failed(e := dyn.get(k))]
    if len(texts) == len(keys):
        if not any(word in t.upper() for t in texts for word in UNSUPPORTED):
            return texts[0]
    return None


def _chips(devices: list[Mapping[str, Any]]) -> list[list[int]]:
    """Indices of amdsmi handles grouped by physical GPU (ASIC serial, else the PCI device)."""
    groups: dict[str, list[int]] = {}
    for n, device in enumerate(devices):
        static = device.get("static") or {}
        serial = (_ok(static.get("asic_info")) or {}).get("asic_serial")
        bdf = _bdf(static) or f"handle{n}"
        key = serial if isinstance(serial, str) and serial not in ("", "N/A") else bdf.rsplit(".", 1)[0]
        groups.setdefault(key, []).append(n)
    return list(groups.values())


def _partition_id(device: Mapping[str, Any], fallback: int) -> int:
    value = _get(_ok((device.get("static") or {}).get("kfd_info")), "current_partition_id")
    return int(value) if value is not None else fallback


def _errors(device: Mapping[str, Any]) -> dict[str, str]:
    out = {}
    for section in ("static", "dynamic"):
        for key, value in (device.get(section) or {}).items():
            if failed(value):
                out[key] = value["amdsmi_error"]
            elif isinstance(value, Mapping):
                out.update({f"{key}.{k}": v["amdsmi_error"] for k, v in value.items() if failed(v)})
    return out


def map_amd(snapshot: Mapping[str, Any], driver: Mapping[str, Any]) -> list[DeviceReading]:
    """One snapshot -> devices: one per GPU, and in a partition mode one per partition with ``hw.parent``."""
    devices = list(snapshot.get("devices") or [])
    fdinfo = snapshot.get("drm_fdinfo") or {}
    out: list[DeviceReading] = []
    for index, members in enumerate(_chips(devices)):
        chip = [devices[n] for n in sorted(members, key=lambda n: _partition_id(devices[n], n))]
        gpu = _gpu_reading(index, chip[0], driver)
        out.append(gpu)
        if _partitioned(chip):
            out.extend(_partitions(gpu, index, chip, fdinfo))
        else:
            _whole_gpu_points(gpu, chip[0], fdinfo)
    return out


def _partitioned(chip: list[Mapping[str, Any]]) -> bool:
    """Several handles for one GPU, or a compute partition mode other than single (SPX)."""
    compute = _ok((chip[0].get("static") or {}).get("compute_partition"))
    return len(chip) > 1 or compute not in _NO_PARTITION


def _gpu_reading(index: int, first: Mapping[str, Any], driver: Mapping[str, Any]) -> DeviceReading:
    """The physical GPU: identity, partition modes and the board-wide points, from its first handle."""
    static, dyn = first.get("static") or {}, first.get("dynamic") or {}
    uuid = _ok(static.get("uuid"))
    hw_id = str(uuid) if isinstance(uuid, str) and uuid else f"amdgpu-{_bdf(static) or index}"
    attributes: dict[str, AttrValue] = {
        "hw.id": hw_id, "hw.type": "gpu", "hw.vendor": VENDOR, "hw.name": f"amdgpu{index}",
        "gputally.gpu.index": index, **_identity(static, driver), **_partition_modes(static),
    }
    points = _Points()
    lost = _lost(dyn)
    degraded = _socket_points(points, static, dyn) if lost is None else False
    gpu = DeviceReading(hw_id=hw_id, attributes=attributes, points=points,
                        label=f"{index} ({attributes.get('hw.model', hw_id)})",
                        body={"index": index, "uuid": hw_id, "static": dict(static), "dynamic": dict(dyn),
                              "errors": _errors(first)})
    if lost is not None:
        gpu.state, gpu.problems = "failed", [f"amdsmi cannot read the GPU: {lost}"]
    elif degraded:
        gpu.state = "degraded"
    return gpu


def _partition_modes(static: Mapping[str, Any]) -> dict[str, AttrValue]:
    modes = {"gputally.gpu.partition.compute_mode": _ok(static.get("compute_partition")),
             "gputally.gpu.partition.memory_mode": _ok(static.get("memory_partition"))}
    return {key: mode for key, mode in modes.items() if isinstance(mode, str) and mode}


def _whole_gpu_points(gpu: DeviceReading, device: Mapping[str, Any], fdinfo: Mapping[str, Any]) -> None:
    """An unpartitioned GPU's own engine, memory and clock points, and its processes."""
    static, dyn = device.get("static") or {}, device.get("dynamic") or {}
    points = _Points()
    _engine_points(points, dyn)
    gpu.points.extend(points)
    gpu.processes = _processes(dyn, _bdf(static), fdinfo)


def _engine_points(points: _Points, dyn: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """Utilization, memory and clocks of one GPU or partition; returns its memory (used, total)."""
    _utilization_points(points, dyn)
    used, total = _memory(dyn)
    _memory_points(points, used, total)
    _clock_points(points, dyn)
    return used, total


_INHERITED = ("hw.model", "hw.driver_version", "hw.serial_number", "gputally.gpu.pci.bus_id",
              "gputally.gpu.partition.compute_mode", "gputally.gpu.partition.memory_mode")
"""What a partition takes from its GPU's attributes (its own PCI address wins where it has one)."""


def _partitions(gpu: DeviceReading, index: int, chip: list[Mapping[str, Any]],
                fdinfo: Mapping[str, Any]) -> list[DeviceReading]:
    """One device per partition with ``hw.parent``; the GPU gets their mean busy time and summed memory."""
    gpu.body["partitions"] = []
    parts = [_partition_reading(gpu, index, position, device, fdinfo) for position, device in enumerate(chip)]
    used_sum = total_sum = 0
    busy: list[float] = []
    for part, device in zip(parts, chip, strict=True):
        gpu.body["partitions"].append(part.hw_id)
        dyn = device.get("dynamic") or {}
        used, total = _memory(dyn)
        used_sum += used or 0
        total_sum += total or 0
        gfx = _ratio((_ok(dyn.get("activity")) or {}).get("gfx_activity"))
        if gfx is not None:
            busy.append(gfx)
    points = _Points()
    if busy:
        points.add(m.GPU_UTILIZATION, sum(busy) / len(busy), (("hw.gpu.task", "general"),))
    if total_sum:
        _memory_points(points, used_sum, total_sum)
    gpu.points.extend(points)
    return parts


def _partition_reading(gpu: DeviceReading, index: int, position: int, device: Mapping[str, Any],
                       fdinfo: Mapping[str, Any]) -> DeviceReading:
    partition_id = _partition_id(device, position)
    static, dyn = device.get("static") or {}, device.get("dynamic") or {}
    hw_id = f"{gpu.hw_id}/p{partition_id}"
    attributes: dict[str, AttrValue] = {
        "hw.id": hw_id, "hw.parent": gpu.hw_id, "hw.type": "gpu", "hw.vendor": VENDOR,
        "hw.name": f"amdgpu{index}/p{partition_id}", "gputally.gpu.index": index,
        "gputally.gpu.partition.id": partition_id,
    }
    uuid = _ok(static.get("uuid"))
    if isinstance(uuid, str) and uuid:
        attributes["gputally.gpu.partition.uuid"] = uuid
    attributes.update({key: gpu.attributes[key] for key in _INHERITED if key in gpu.attributes})
    bdf = _bdf(static)
    if bdf:
        attributes["gputally.gpu.pci.bus_id"] = bdf
    points = _Points()
    _engine_points(points, dyn)
    part = DeviceReading(
        hw_id=hw_id, attributes=attributes, points=points, label=f"{index} partition {partition_id}",
        processes=_processes(dyn, bdf, fdinfo),
        body={"index": index, "partition": partition_id, "uuid": hw_id, "static": dict(static),
              "dynamic": dict(dyn), "errors": _errors(device)},
    )
    if _lost(dyn) is not None:
        part.state = "failed"
    return part
