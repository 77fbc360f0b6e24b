"""GPU (and MIG device) readings -> points, with semantic-convention names and units.

Pure functions of one cycle's :class:`~gputally.probes.nvml.readings.GpuReadings`: NVML percent
becomes a 0-1 ratio, mW becomes W, mJ becomes J, MHz becomes Hz, KiB becomes bytes. A reading
the GPU refused simply yields no point.
"""

from __future__ import annotations

from typing import Any

from gputally.probes.core import catalog as m
from gputally.probes.core.model import Attributes, AttrValue, MetricDef, Point
from gputally.probes.nvml.readings import GpuReadings

__all__ = ["THROTTLE_REASONS", "device_points", "gpu_state"]


def _one(key: str, value: AttrValue) -> Attributes:
    return ((key, value),)


THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""``nvmlClocksEventReason*`` bits, by the name the probe reports."""
_HW_SLOWDOWN = 0x8 | 0x40 | 0x80

_THROTTLE_TIME_FIELDS = {
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP": "sw_power_cap",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST": "sync_boost",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN": "sw_thermal_slowdown",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN": "hw_thermal_slowdown",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN": "hw_power_brake_slowdown",
}
_TASK = {task: _one("hw.gpu.task", task) for task in ("general", "encoder", "decoder")}
_SENSOR = {sensor: _one("hw.sensor_location", sensor) for sensor in ("gpu", "memory")}
_LIMIT = {kind: (("hw.sensor_location", "gpu"), ("hw.limit_type", kind)) for kind in ("throttled", "critical")}
_CLOCKS = {"clock_sm": "sm", "clock_mem": "memory", "clock_graphics": "graphics", "clock_video": "video"}
_ERROR_FIELDS = {
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_corrected",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_uncorrected",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay",
}
_IO_FIELDS = {
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": ("pcie", "transmit", 1),
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": ("pcie", "receive", 1),
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": ("nvlink", "transmit", 1024),
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": ("nvlink", "receive", 1024),
}


class _Points:
    def __init__(self) -> None:
        self.points: list[Point] = []

    def add(self, metric: MetricDef, value: Any, attributes: Attributes = ()) -> None:
        """Append a point unless ``value`` is missing (the GPU refused the reading)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return
        self.points.append(Point(metric, value, attributes))


def _ratio(percent: Any) -> float | None:
    return percent / 100.0 if isinstance(percent, int | float) and not isinstance(percent, bool) else None


def device_points(r: GpuReadings) -> list[Point]:
    """Every device-level point one cycle's readings support (MIG devices get the memory subset)."""
    out = _Points()
    add = out.add
    util = r.value("utilization")
    if isinstance(util, dict):
        add(m.GPU_UTILIZATION, _ratio(util.get("gpu")), _TASK["general"])
        add(m.MEMORY_ACTIVITY, _ratio(util.get("memory")))
    for reading, task in (("encoder_util", "encoder"), ("decoder_util", "decoder")):
        value = r.value(reading)
        if isinstance(value, list) and value:
            add(m.GPU_UTILIZATION, _ratio(value[0]), _TASK[task])
    _memory(r, add)
    power_mw = r.field("NVML_FI_DEV_POWER_INSTANT")
    if power_mw is None:
        power_mw = r.value("power_mw")
    if isinstance(power_mw, int | float):
        add(m.POWER, power_mw / 1000.0)
    energy_mj = r.field("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    if energy_mj is not None:
        add(m.ENERGY, energy_mj / 1000.0)
    add(m.TEMPERATURE, r.value("temp_gpu"), _SENSOR["gpu"])
    add(m.TEMPERATURE, r.field("NVML_FI_DEV_MEMORY_TEMP"), _SENSOR["memory"])
    add(m.TEMPERATURE_LIMIT, r.info.get("temp_threshold_slowdown"), _LIMIT["throttled"])
    add(m.TEMPERATURE_LIMIT, r.info.get("temp_threshold_shutdown"), _LIMIT["critical"])
    for name, error_type in _ERROR_FIELDS.items():
        add(m.ERRORS, r.field(name), _one("error.type", error_type))
    for name, (link, direction, scale) in _IO_FIELDS.items():
        value = r.field(name)
        if value is not None:
            add(m.GPU_IO, int(value) * scale, (("network.io.direction", direction), ("gputally.gpu.link", link)))
    for reading, clock_type in _CLOCKS.items():
        mhz = r.value(reading)
        if isinstance(mhz, int | float):
            add(m.CLOCK, mhz * 1_000_000, _one("gputally.gpu.clock.type", clock_type))
    for key, clock_type in (("max_sm_clock", "sm"), ("max_mem_clock", "memory")):
        mhz = r.info.get(key)
        if isinstance(mhz, int | float):
            add(m.CLOCK_LIMIT, mhz * 1_000_000, _one("gputally.gpu.clock.type", clock_type))
    reasons = r.value("throttle_reasons")
    if isinstance(reasons, int):
        for bit, reason in THROTTLE_REASONS.items():
            add(m.CLOCK_THROTTLED, 1 if reasons & bit else 0, _one("gputally.gpu.clock.event_reason", reason))
    for name, reason in _THROTTLE_TIME_FIELDS.items():
        ns = r.field(name)
        if ns is not None:
            add(m.CLOCK_THROTTLE_TIME, ns / 1e9, _one("gputally.gpu.clock.event_reason", reason))
    _power_limits(r, add)
    add(m.PSTATE, r.value("pstate"))
    bar1 = r.value("bar1")
    if isinstance(bar1, dict):
        add(m.BAR1_USAGE, bar1.get("bar1Used"))
        add(m.BAR1_LIMIT, bar1.get("bar1Total"))
    add(m.PCIE_GENERATION, r.value("pcie_gen"))
    add(m.PCIE_WIDTH, r.value("pcie_width"))
    add(m.PCIE_GENERATION_LIMIT, r.info.get("max_pcie_gen"))
    add(m.PCIE_WIDTH_LIMIT, r.info.get("max_pcie_width"))
    remapped = r.value("remapped_rows")
    if isinstance(remapped, list) and len(remapped) >= 4:
        add(m.REMAPPED_ROWS, remapped[0], _one("gputally.gpu.memory.remap_cause", "correctable"))
        add(m.REMAPPED_ROWS, remapped[1], _one("gputally.gpu.memory.remap_cause", "uncorrectable"))
        add(m.REMAP_PENDING, 1 if remapped[2] else 0)
        add(m.REMAP_FAILED, 1 if remapped[3] else 0)
    if r.gpu.mig is None:  # a MIG device is read inside its GPU's time
        add(m.COLLECTION_DURATION, r.duration_s)
    return out.points


def _memory(r: GpuReadings, add: Any) -> None:
    memory = r.value("memory_v2")
    if not isinstance(memory, dict):
        memory = r.value("memory")
    if not isinstance(memory, dict):
        return
    used, total = memory.get("used"), memory.get("total")
    add(m.GPU_MEMORY_USAGE, used)
    add(m.GPU_MEMORY_LIMIT, total)
    if isinstance(used, int) and isinstance(total, int) and total > 0:
        add(m.GPU_MEMORY_UTILIZATION, used / total)
    add(m.MEMORY_RESERVED, memory.get("reserved"))


def _power_limits(r: GpuReadings, add: Any) -> None:
    enforced = r.info.get("enforced_power_limit_mw", r.info.get("power_limit_mw"))
    if isinstance(enforced, int | float):
        add(m.POWER_LIMIT, enforced / 1000.0, _one("gputally.gpu.power.limit_type", "enforced"))
    constraints = r.info.get("power_limit_constraints")
    if isinstance(constraints, list) and len(constraints) == 2:
        add(m.POWER_LIMIT, constraints[0] / 1000.0, _one("gputally.gpu.power.limit_type", "min"))
        add(m.POWER_LIMIT, constraints[1] / 1000.0, _one("gputally.gpu.power.limit_type", "max"))


def gpu_state(r: GpuReadings) -> str:
    """``failed`` when the GPU stopped answering; ``degraded`` on uncorrectable ECC errors since
    the driver loaded, a pending or failed row remap, or hardware clock slowdown; else ``ok``."""
    if r.lost is not None:
        return "failed"
    dbe = r.field("NVML_FI_DEV_ECC_DBE_VOL_TOTAL")
    remapped = r.value("remapped_rows")
    reasons = r.value("throttle_reasons")
    if (
        (dbe is not None and dbe > 0)
        or (isinstance(remapped, list) and len(remapped) >= 4 and (remapped[2] or remapped[3]))
        or (isinstance(reasons, int) and reasons & _HW_SLOWDOWN)
    ):
        return "degraded"
    return "ok"
