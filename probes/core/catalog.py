"""Every metric the NVIDIA probe sends: OpenTelemetry semantic-convention names first, then the
one extension namespace ``gputally.gpu.*`` for what the conventions lack.

Units are UCUM as the conventions write them: bytes ``By``, watts ``W``, joules ``J``,
``Cel``, ``Hz``, seconds ``s``, ratios 0-1 as ``1``. The "NVIDIA probe" section of
docs/components/probes.md lists the same table; a test keeps the two in step.
"""

from __future__ import annotations

from gputally.probes.core.model import Kind, MetricDef

__all__ = ["ALL", "by_name"]

G, C, U = Kind.GAUGE, Kind.COUNTER, Kind.UPDOWN
DIRECTION = "network.io.direction"

# -- semantic conventions (hardware) ---------------------------------------------------------
GPU_UTILIZATION = MetricDef("hw.gpu.utilization", "1", G, "Fraction of time the engine was busy.", ("hw.gpu.task",))
GPU_MEMORY_USAGE = MetricDef("hw.gpu.memory.usage", "By", U, "GPU memory in use.")
GPU_MEMORY_LIMIT = MetricDef("hw.gpu.memory.limit", "By", U, "GPU memory size.")
GPU_MEMORY_UTILIZATION = MetricDef(
    "hw.gpu.memory.utilization", "1", G, "Fraction of GPU memory in use (usage / limit)."
)
GPU_IO = MetricDef("hw.gpu.io", "By", C, "Bytes moved over the GPU's links.", (DIRECTION, "gputally.gpu.link"))
POWER = MetricDef("hw.power", "W", G, "Instantaneous power draw.")
ENERGY = MetricDef("hw.energy", "J", C, "Energy used since the driver was loaded.")
TEMPERATURE = MetricDef("hw.temperature", "Cel", G, "Temperature by sensor.", ("hw.sensor_location",))
TEMPERATURE_LIMIT = MetricDef(
    "hw.temperature.limit", "Cel", G, "Temperature thresholds: throttled = slowdown, critical = shutdown.",
    ("hw.sensor_location", "hw.limit_type"),
)
ERRORS = MetricDef(
    "hw.errors", "{error}", C, "Errors by type: ecc_corrected, ecc_uncorrected, pcie_replay, xid (with the XID code).",
    ("error.type", "gputally.gpu.xid"),
)
STATUS = MetricDef(
    "hw.status", "1", U, "1 for the GPU's current state (ok, degraded, failed), 0 for the others.", ("hw.state",)
)

# -- gputally.gpu.* extension ----------------------------------------------------------------
CLOCK = MetricDef("gputally.gpu.clock.frequency", "Hz", G, "Current clock.", ("gputally.gpu.clock.type",))
CLOCK_LIMIT = MetricDef("gputally.gpu.clock.limit", "Hz", G, "Maximum clock.", ("gputally.gpu.clock.type",))
CLOCK_THROTTLED = MetricDef(
    "gputally.gpu.clock.throttled", "1", G, "1 while the clock-event (throttle) reason is active.",
    ("gputally.gpu.clock.event_reason",),
)
CLOCK_THROTTLE_TIME = MetricDef(
    "gputally.gpu.clock.throttle.time", "s", C, "Time spent throttled, by reason.", ("gputally.gpu.clock.event_reason",)
)
POWER_LIMIT = MetricDef(
    "gputally.gpu.power.limit", "W", G, "Power limits: enforced, and the range it may be set in (min, max).",
    ("gputally.gpu.power.limit_type",),
)
PSTATE = MetricDef("gputally.gpu.performance_state", "{pstate}", G, "Performance state, 0 (fastest) to 15.")
MEMORY_ACTIVITY = MetricDef(
    "gputally.gpu.memory.activity", "1", G, "Fraction of time device memory was being read or written."
)
MEMORY_RESERVED = MetricDef(
    "gputally.gpu.memory.reserved", "By", G, "Memory the driver reserves (not usable by processes)."
)
BAR1_USAGE = MetricDef("gputally.gpu.bar1.usage", "By", G, "BAR1 (host-mapped) memory in use.")
BAR1_LIMIT = MetricDef("gputally.gpu.bar1.limit", "By", G, "BAR1 size.")
PCIE_GENERATION = MetricDef("gputally.gpu.pcie.link.generation", "{generation}", G, "Current PCIe link generation.")
PCIE_GENERATION_LIMIT = MetricDef(
    "gputally.gpu.pcie.link.generation.limit", "{generation}", G, "Maximum PCIe generation."
)
PCIE_WIDTH = MetricDef("gputally.gpu.pcie.link.width", "{lane}", G, "Current PCIe link width.")
PCIE_WIDTH_LIMIT = MetricDef("gputally.gpu.pcie.link.width.limit", "{lane}", G, "Maximum PCIe link width.")
REMAPPED_ROWS = MetricDef(
    "gputally.gpu.memory.remapped_rows", "{row}", G, "Memory rows remapped, by cause.",
    ("gputally.gpu.memory.remap_cause",),
)
REMAP_PENDING = MetricDef("gputally.gpu.memory.remap.pending", "1", G, "1 when a row remap waits for a GPU reset.")
REMAP_FAILED = MetricDef("gputally.gpu.memory.remap.failed", "1", G, "1 when a row remap failed.")
LINK_THROUGHPUT = MetricDef(
    "gputally.gpu.link.throughput", "By/s", G, "PCIe and NVLink traffic rate over the last cycle (GPM).",
    ("gputally.gpu.link", DIRECTION),
)
GRAPHICS_ACTIVITY = MetricDef(
    "gputally.gpu.graphics.activity", "1", G, "Fraction of time any graphics/compute engine was active (GPM)."
)
SM_ACTIVITY = MetricDef("gputally.gpu.sm.activity", "1", G, "Fraction of SMs busy, averaged over the cycle (GPM).")
SM_OCCUPANCY = MetricDef("gputally.gpu.sm.occupancy", "1", G, "Resident warps / maximum warps (GPM).")
TENSOR_ACTIVITY = MetricDef(
    "gputally.gpu.tensor.activity", "1", G, "Fraction of time any tensor pipe was active (GPM)."
)
DRAM_ACTIVITY = MetricDef("gputally.gpu.dram.activity", "1", G, "DRAM bandwidth used / theoretical maximum (GPM).")
PIPE_ACTIVITY = MetricDef(
    "gputally.gpu.pipe.activity", "1", G, "Fraction of time each math pipe was active (GPM).", ("gputally.gpu.pipe",)
)
COLLECTION_DURATION = MetricDef(
    "gputally.gpu.collection.duration", "s", G, "Wall time the probe spent reading this GPU this cycle."
)

# -- per process -----------------------------------------------------------------------------
PROCESS_MEMORY = MetricDef("gputally.gpu.process.memory.usage", "By", G, "GPU memory the process holds.")
PROCESS_UTILIZATION = MetricDef(
    "gputally.gpu.process.utilization", "1", G,
    "Fraction of the GPU's SM (general), encoder and decoder time the process used since the last cycle.",
    ("hw.gpu.task",),
)
PROCESS_MEMORY_ACTIVITY = MetricDef(
    "gputally.gpu.process.memory.activity", "1", G, "Fraction of time the process was reading or writing device memory."
)

ALL: tuple[MetricDef, ...] = tuple(v for v in list(globals().values()) if isinstance(v, MetricDef))


def by_name(name: str) -> MetricDef:
    for metric in ALL:
        if metric.name == name:
            return metric
    raise KeyError(name)

