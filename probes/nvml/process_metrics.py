"""Per-process GPU metrics: which process holds how much memory and uses how much of the GPU.

``nvmlDeviceGetProcessUtilization(handle, lastSeen)`` returns the samples newer than
``lastSeen`` (a timestamp in microseconds), one per process that ran work since then, each
carrying its own ``pid``. :class:`ProcessSampler` keeps the newest timestamp it has seen per
GPU and passes it on the next call, and keys every sample by the pid inside it. (A public
agent passes the pid as the timestamp and gives every process the GPU's numbers: that is the
bug this avoids.)

The process list comes from the running-process calls, not from the samples: a process that
holds memory but ran no kernels (an idle notebook, a memory holder) never appears in the
samples, yet is reported with its memory and a utilization of 0. Where the utilization query
itself is unsupported (MIG devices), processes get their memory and no utilization at all,
rather than a made-up 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gputally.probes.core import catalog as m
from gputally.probes.core.hints import process_attributes
from gputally.probes.core.model import AttrValue, Entity, Point
from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.readings import GpuReadings, ProcessReading

__all__ = ["ProcessSampler", "merge_processes", "process_entities"]


class ProcessSampler:
    """One GPU's process-utilization sampling, across cycles."""

    def __init__(self) -> None:
        self.last_seen = 0
        """Newest sample timestamp seen (microseconds); 0 before the first call."""

    def sample(self, fetch: Callable[[int], list[dict[str, Any]]]) -> dict[int, dict[str, Any]]:
        """Samples since the last call, newest per pid. NVML's "Not Found" means none: an empty
        dict. Other failures propagate (the caller records them)."""
        try:
            samples = fetch(self.last_seen)
        except NvmlCallFailed as exc:
            if exc.not_found:
                return {}
            raise
        newest: dict[int, dict[str, Any]] = {}
        for sample in samples:
            pid = int(sample["pid"])
            stamp = int(sample["timeStamp"])
            if pid not in newest or stamp > int(newest[pid]["timeStamp"]):
                newest[pid] = sample
            self.last_seen = max(self.last_seen, stamp)
        return newest


def merge_processes(*lists: Any) -> dict[int, int | None]:
    """Used memory by pid over the compute and graphics process lists (a process in both counts once)."""
    memory: dict[int, int | None] = {}
    for processes in lists:
        if not isinstance(processes, list):
            continue
        for process in processes:
            pid = int(process["pid"])
            used = process.get("usedGpuMemory")
            used = used if isinstance(used, int) else None
            previous = memory.get(pid)
            memory[pid] = used if previous is None else max(previous, used or 0)
    return memory


def _ratio(sample: dict[str, Any] | None, key: str) -> float:
    if sample is None:
        return 0.0
    value = sample.get(key)
    return min(max(float(value) / 100.0, 0.0), 1.0) if isinstance(value, int | float) else 0.0


def process_points(process: ProcessReading, *, with_utilization: bool) -> list[Point]:
    points = []
    if process.used_memory is not None:
        points.append(Point(m.PROCESS_MEMORY, process.used_memory))
    if with_utilization:
        sample = process.sample
        points.extend([
            Point(m.PROCESS_UTILIZATION, _ratio(sample, "smUtil"), (("hw.gpu.task", "general"),)),
            Point(m.PROCESS_UTILIZATION, _ratio(sample, "encUtil"), (("hw.gpu.task", "encoder"),)),
            Point(m.PROCESS_UTILIZATION, _ratio(sample, "decUtil"), (("hw.gpu.task", "decoder"),)),
            Point(m.PROCESS_MEMORY_ACTIVITY, _ratio(sample, "memUtil")),
        ])
    return points


def process_entities(r: GpuReadings, *, common: dict[str, AttrValue]) -> list[Entity]:
    """One entity per process on this GPU or MIG device: ``hw.id`` of the device plus the hints."""
    entities = []
    for process in r.processes:
        attributes: dict[str, AttrValue] = {
            "hw.id": r.gpu.uuid, **common, **process_attributes(process.pid, process.facts)
        }
        start = attributes.get("process.creation.time", "")
        entities.append(
            Entity(
                key=f"process/{r.gpu.uuid}/{process.pid}/{start}",
                kind="process",
                attributes=attributes,
                points=process_points(process, with_utilization=r.samples_available),
                label=f"pid {process.pid}",
            )
        )
    return entities
