"""Start times for cumulative sums, so backends can turn counters into rates.

A monotonic counter's series starts when the probe first sees it, and starts again when its
value goes down (driver reload, GPU reset), as the OTLP data model asks. UpDownCounters
(memory usage and limit, status) start with the probe. Series not seen for a while (a process
that exited) are forgotten, so the table stays the size of what exists.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gputally.probes.core.model import Attributes, Entity, Kind

__all__ = ["CounterStarts"]


@dataclass
class _Series:
    start_ns: int
    value: float
    seen_cycle: int


class CounterStarts:
    def __init__(self, *, probe_start_ns: int, forget_after: int = 10) -> None:
        self._probe_start_ns = probe_start_ns
        self._forget_after = forget_after
        self._series: dict[tuple[str, str, Attributes], _Series] = {}
        self._cycle = 0

    def stamp(self, entities: list[Entity], now_ns: int) -> None:
        """Give every sum point in ``entities`` its start time (in place)."""
        self._cycle += 1
        for entity in entities:
            for n, point in enumerate(entity.points):
                kind = point.metric.kind
                if kind is Kind.GAUGE:
                    continue
                if kind is Kind.UPDOWN:
                    entity.points[n] = replace(point, start_ns=self._probe_start_ns)
                    continue
                key = (entity.key, point.metric.name, point.attributes)
                series = self._series.get(key)
                if series is None or point.value < series.value:
                    series = _Series(start_ns=now_ns, value=point.value, seen_cycle=self._cycle)
                    self._series[key] = series
                series.value, series.seen_cycle = point.value, self._cycle
                entity.points[n] = replace(point, start_ns=series.start_ns)
        stale = [key for key, s in self._series.items() if self._cycle - s.seen_cycle > self._forget_after]
        for key in stale:
            del self._series[key]
