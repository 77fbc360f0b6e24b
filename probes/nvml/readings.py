"""What one cycle read from one GPU (or MIG device), before any mapping to metrics.

Values stay in the recording format (see :mod:`gputally.probes.nvml.source`); accessors return None
for anything the GPU refused, so the mapping modules never see an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gputally.probes.core.procfacts import ProcFacts
from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.source import Gpu

__all__ = ["GpuReadings", "ProcessReading", "field_number"]

_VALUE_KEYS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def field_number(entry: dict[str, Any] | None) -> float | int | None:
    """The value of one ``nvmlFieldValue_t`` as recorded, read by its ``type``; None unless ``ret`` is 0."""
    if not entry or entry.get("ret") != 0:
        return None
    key = _VALUE_KEYS.get(int(entry.get("type", -1)))
    value = entry.get("value", {}).get(key) if key else None
    return value if isinstance(value, int | float) else None


@dataclass
class ProcessReading:
    """One process holding a context on the GPU, with its utilization sample and /proc facts."""

    pid: int
    used_memory: int | None
    """Bytes; None where NVML cannot tell (for example some MIG and Windows setups)."""
    sample: dict[str, Any] | None
    """The newest utilization sample for this pid since the last cycle, if it ran any kernels."""
    facts: ProcFacts | None


@dataclass
class GpuReadings:
    gpu: Gpu
    info: dict[str, Any]
    """Static facts read at start (the recording's ``device`` block)."""
    values: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, NvmlCallFailed] = field(default_factory=dict)
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpm: dict[str, dict[str, Any]] = field(default_factory=dict)
    samples_available: bool = False
    """True when the process-utilization query worked: then a process without a sample was idle."""
    processes: list[ProcessReading] = field(default_factory=list)
    mig: list[GpuReadings] = field(default_factory=list)
    lost: NvmlCallFailed | None = None
    """Set when the GPU stopped answering mid-cycle (fell off the bus, needs a reset)."""
    duration_s: float = 0.0

    def value(self, name: str) -> Any:
        return self.values.get(name)

    def field(self, name: str) -> float | int | None:
        return field_number(self.fields.get(name))

    def log_body(self) -> dict[str, Any]:
        """The readable full snapshot for the per-cycle log record."""
        body: dict[str, Any] = {
            "index": self.gpu.index,
            "uuid": self.gpu.uuid,
            "name": self.info.get("name"),
            "readings": dict(self.values),
            "fields": {
                k.removeprefix("NVML_FI_DEV_").lower(): v for k in self.fields if (v := self.field(k)) is not None
            },
            "gpm": {
                str(entry.get("name", key)): entry.get("value")
                for key, entry in self.gpm.items()
                if entry.get("ret") == 0
            },
            "processes": [
                {
                    "pid": p.pid,
                    "used_memory": p.used_memory,
                    "sample": p.sample,
                    "cgroup": p.facts.cgroup if p.facts else None,
                }
                for p in self.processes
            ],
            "errors": {name: error.name for name, error in self.errors.items()},
        }
        if self.lost is not None:
            body["lost"] = self.lost.name
        if self.mig:
            body["mig"] = [child.log_body() for child in self.mig]
        return body
