"""The probe's own small model of one collection: entities with points, and log entries.

The mapping modules produce these; :mod:`~gputally.probes.core.otlp_shape` turns them into OTLP
and :mod:`~gputally.probes.core.debug` into text. Keeping protobuf out of the mapping keeps it
cheap to test and lets ``--once --debug`` run without building any message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gputally.probes.engines.model import HistogramPoint

__all__ = ["Cycle", "Entity", "Kind", "LogEntry", "MetricDef", "Point", "Severity"]

AttrValue = str | int | float | bool | tuple[str, ...] | tuple[int, ...]
"""A tuple is an array (the PodResources holders hint, an engine's GPUs and their pids); OTLP
encodes it as an array."""
Attributes = tuple[tuple[str, AttrValue], ...]


class Kind(enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    """Cumulative monotonic Sum with a start time."""
    UPDOWN = "updowncounter"
    """Cumulative non-monotonic Sum (semconv UpDownCounter: memory usage and limit, status)."""
    HISTOGRAM = "histogram"
    """Cumulative explicit-bucket histogram (inference engines' latencies); its points are
    :class:`~gputally.probes.engines.model.HistogramPoint` s, never :class:`Point` s."""


@dataclass(frozen=True)
class MetricDef:
    """One metric name with its unit, type and description (see :mod:`~gputally.probes.core.catalog`)."""

    name: str
    unit: str
    kind: Kind
    description: str
    attributes: tuple[str, ...] = ()
    """Point attribute keys the metric carries (for the README and tests)."""


@dataclass(frozen=True, slots=True)
class Point:
    metric: MetricDef
    value: float | int
    attributes: Attributes = ()
    start_ns: int | None = None
    """For counters: when the count began (set by :class:`~gputally.probes.core.counters.CounterStarts`)."""


@dataclass
class Entity:
    """One thing the points describe: a GPU, a MIG device or a GPU process (one OTLP Resource)."""

    key: str
    """Stable identity within the probe: ``gpu/<uuid>``, ``mig/<uuid>``, ``process/<uuid>/<pid>``,
    ``engine/<container>/<host>:<port><path>/<pid>/<start>``."""
    kind: str
    """``gpu``, ``mig``, ``process`` or ``engine`` (an inference engine's endpoint)."""
    attributes: dict[str, AttrValue]
    points: list[Point] = field(default_factory=list)
    label: str = ""
    """Short human name for the debug dump."""
    histograms: list[HistogramPoint] = field(default_factory=list)
    """Explicit-bucket histograms (an inference engine's latencies); other entities have none."""


class Severity(enum.IntEnum):
    """OTLP SeverityNumber values used by the probe."""

    INFO = 9
    WARN = 13
    ERROR = 17


@dataclass
class LogEntry:
    """One OTLP log record, attached to an entity's resource."""

    entity: Entity
    time_ns: int
    severity: Severity
    event_name: str
    body: Any
    """A string, or a JSON-like dict that becomes a kvlist body."""
    attributes: dict[str, AttrValue] = field(default_factory=dict)


@dataclass
class Cycle:
    """What one collection produced."""

    time_ns: int
    duration_s: float
    entities: list[Entity]
    logs: list[LogEntry]
    problems: list[str] = field(default_factory=list)
    """One line per GPU that could not be read fully this cycle (for the debug dump)."""

    def gpus(self) -> list[Entity]:
        return [e for e in self.entities if e.kind in ("gpu", "mig")]

    def processes(self) -> list[Entity]:
        return [e for e in self.entities if e.kind == "process"]

    def engines(self) -> list[Entity]:
        return [e for e in self.entities if e.kind == "engine"]
