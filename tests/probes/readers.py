"""Small readers of a probe's cycle, for every vendor's tests: find a device or process, read its points."""

from __future__ import annotations

from typing import Any

from gputally.probes.core.model import Cycle, Entity

__all__ = ["device", "gpu", "pids", "process", "value", "values"]


def gpu(cycle: Cycle, index: int = 0) -> Entity:
    (entity,) = [e for e in cycle.entities if e.kind == "gpu" and e.attributes["gputally.gpu.index"] == index]
    return entity


def device(cycle: Cycle, hw_id: str) -> Entity:
    """The GPU (or accelerator) ``hw_id`` of a cycle."""
    (entity,) = [e for e in cycle.gpus() if e.attributes["hw.id"] == hw_id]
    return entity


def process(cycle: Cycle, pid: int) -> Entity:
    (entity,) = [e for e in cycle.processes() if e.attributes["process.pid"] == pid]
    return entity


def pids(cycle: Cycle) -> list[int]:
    return sorted(int(e.attributes["process.pid"]) for e in cycle.processes())


def values(entity: Entity, name: str) -> dict[tuple[tuple[str, Any], ...], float | int]:
    return {p.attributes: p.value for p in entity.points if p.metric.name == name}


def value(entity: Entity, name: str, attributes: dict[str, Any] | None = None) -> float | int | None:
    """The value of the point of ``name`` whose attributes are exactly ``attributes``; None if absent."""
    wanted = tuple(sorted((attributes or {}).items()))
    for point in entity.points:
        if point.metric.name == name and tuple(sorted(point.attributes)) == wanted:
            return point.value
    return None
