"""Start times for cumulative sums, so backends can turn counters into rates.

A monotonic counter's series starts when the probe first sees it, and starts again when its
value goes down (driver reload, GPU reset, an engine restart), as the OTLP data model asks; a
histogram's likewise by its count. A point whose source gives its start (an engine's
``_created`` sample) keeps that start: the engine knows its restarts better. UpDownCounters
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
        """Give every sum point and histogram in ``entities`` its start time (in place). One
        that comes with a start of its own (an engine's ``_created``) keeps it."""
        self._cycle += 1
        for entity in entities:
            for n, point in enumerate(entity.points):
                kind = point.metric.kind
                if kind is Kind.GAUGE or point.start_ns is not None:
                    continue
                if kind is Kind.UPDOWN:
                    entity.points[n] = replace(point, start_ns=self._probe_start_ns)
                    continue
                start = self._start((entity.key, point.metric.name, point.attributes), point.value, now_ns)
                entity.points[n] = replace(point, start_ns=start)
            for n, histogram in enumerate(entity.histograms):
                if histogram.start_ns is None:  # its count, like a counter's value, only grows
                    start = self._start((entity.key, histogram.metric.name, histogram.attributes), histogram.count,
                                        now_ns)
                    entity.histograms[n] = replace(histogram, start_ns=start)
        self._forget()

    def _start(self, key: tuple[str, str, Attributes], value: float, now_ns: int) -> int:
        series = self._series.get(key)
        if series is None or value < series.value:
            series = _Series(start_ns=now_ns, value=value, seen_cycle=self._cycle)
            self._series[key] = series
        series.value, series.seen_cycle = value, self._cycle
        return series.start_ns

    def _forget(self) -> None:
        stale = [key for key, s in self._series.items() if self._cycle - s.seen_cycle > self._forget_after]
        for key in stale:
            del self._series[key]
