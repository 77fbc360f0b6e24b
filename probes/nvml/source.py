"""What the NVIDIA probe needs from NVML: one small interface with a live, a replay and a recording implementation.

:class:`DeviceSource` is the NVML boundary. Its methods return plain Python values in exactly
the shape the recording format stores them (``fixtures/nvml/README.md``): memory in bytes,
power in mW, utilization in percent, dicts with NVML's field names. So the live source
(:mod:`~gputally.probes.nvml.live`), the replay source
(:mod:`~gputally.probes.nvml.replay`) and the recorder (:mod:`~gputally.probes.nvml.record`)
share one shape, and everything above this module runs the same code whichever source feeds
it. Failures come out as :class:`~gputally.probes.nvml.errors.NvmlCallFailed` /
:class:`~gputally.probes.nvml.errors.NvmlUnavailable` only.

The /proc boundary (:class:`~gputally.probes.core.procfacts.ProcessInfoSource`) is every vendor's
and lives in the core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

__all__ = [
    "EVENT_KINDS",
    "FIELDS",
    "READINGS",
    "DeviceSource",
    "DriverInfo",
    "EventWatch",
    "Gpu",
    "GpuEvent",
    "MigPlacement",
    "Reading",
]

Reading = Literal[
    "utilization",
    "memory_v2",
    "memory",
    "bar1",
    "power_mw",
    "temp_gpu",
    "clock_sm",
    "clock_mem",
    "clock_graphics",
    "clock_video",
    "pstate",
    "throttle_reasons",
    "pcie_gen",
    "pcie_width",
    "remapped_rows",
    "encoder_util",
    "decoder_util",
    "compute_procs",
    "graphics_procs",
    "energy_mj",
]
"""Single-value NVML calls, named as in the recording's ``dynamic`` block, cheapest first."""

READINGS: tuple[Reading, ...] = tuple(r for r in get_args(Reading) if r != "energy_mj")
"""What one cycle asks of every GPU, cheapest first. ``energy_mj`` (3.3 ms) is not here: energy
comes from the batched field-values call."""

FIELDS: tuple[str, ...] = (
    "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "NVML_FI_DEV_POWER_INSTANT",
    "NVML_FI_DEV_MEMORY_TEMP",
    "NVML_FI_DEV_PCIE_REPLAY_COUNTER",
    "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES",
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
)
"""Read in one ``nvmlDeviceGetFieldValues`` call per GPU per cycle; fields a GPU refuses are
dropped from later batches."""

EVENT_KINDS: dict[int, str] = {
    0x0000000000000008: "xid",
    0x0000000000000002: "ecc_uncorrected",
    0x0000000000000001: "ecc_corrected",
    0x0000000000004000: "gpu_unavailable",
    0x0000000000008000: "gpu_recovery_action",
}
"""NVML event types the probe registers for (``nvmlEventType*``), by the name it reports."""


@dataclass(frozen=True)
class DriverInfo:
    """What ``nvmlInit`` and the system queries tell once per start."""

    driver_version: str | None
    nvml_version: str | None
    cuda_driver_version: int | None


@dataclass(frozen=True)
class MigPlacement:
    """Where a MIG device sits in its parent GPU."""

    parent_uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None


@dataclass(frozen=True, eq=False)
class Gpu:
    """A handle on one GPU, or on one MIG device of a GPU (``mig`` set)."""

    index: int
    """NVML index (of the parent GPU for a MIG device)."""
    uuid: str
    handle: Any
    """Whatever the source needs to address the device; opaque above it."""
    mig: MigPlacement | None = None
    mig_index: int | None = None
    """Position of a MIG device under its parent (``nvmlDeviceGetMigDeviceHandleByIndex``)."""


@dataclass(frozen=True)
class GpuEvent:
    """One NVML event (XID, ECC, ...) as the event thread saw it."""

    gpu_uuid: str
    kind: str
    """A value of :data:`EVENT_KINDS`, or ``"type_0x..."`` for one without a name."""
    data: int
    """``eventData``: the XID number for ``xid`` events."""
    time_ns: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class EventWatch(Protocol):
    """An NVML event set with the GPUs registered on it."""

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        """Events that arrived within ``timeout_ms`` (usually none or one)."""

    def close(self) -> None:
        """Free the event set. Called from the thread that waits on it."""


class DeviceSource(Protocol):
    """The NVML calls the probe makes. Every method may raise NvmlCallFailed; ``open`` may raise
    NvmlUnavailable. Methods are called from worker threads, one thread per GPU at a time."""

    def open(self) -> DriverInfo:
        """Initialise NVML (once per start, again only after the driver went away)."""

    def close(self) -> None:
        """Release NVML."""

    def gpus(self) -> list[Gpu]:
        """Every GPU NVML sees, by index (MIG devices are asked for separately)."""

    def device_info(self, gpu: Gpu) -> dict[str, Any]:
        """Static facts (the recording's ``device`` block); keys a GPU refuses are left out."""

    def next_cycle(self) -> None:
        """A new collection cycle begins (the replay moves to its next snapshot)."""

    def read(self, gpu: Gpu, reading: Reading) -> Any:
        """One single-value call, shaped as the recording's ``dynamic[reading]``."""

    def field_values(self, gpu: Gpu, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """One batched ``nvmlDeviceGetFieldValues``: ``{name: {"ret", "type", "ts", "value"}}``."""

    def process_utilization(self, gpu: Gpu, last_seen: int) -> list[dict[str, Any]]:
        """``nvmlDeviceGetProcessUtilization`` samples newer than ``last_seen`` (microseconds)."""

    def gpm(self, gpu: Gpu, metric_ids: Sequence[int]) -> dict[str, dict[str, Any]]:
        """GPM metrics over the window since the previous call for this device (empty on the
        first): ``{str(metric_id): {"name", "ret", "value", "unit"}}``."""

    def mig_devices(self, gpu: Gpu) -> list[Gpu]:
        """The MIG devices of a GPU in MIG mode."""

    def watch_events(self, gpus: Sequence[Gpu]) -> EventWatch:
        """An event set with ``gpus`` registered for :data:`EVENT_KINDS` they support."""
