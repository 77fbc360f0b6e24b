"""The collector of the snapshot vendors (AMD, Gaudi): one snapshot per cycle, read in a worker
thread, mapped by the vendor's :data:`~gputally.probes.snapshot.source.Mapper`, then finished exactly
as the NVIDIA probe's entities are: ``host.name``, attribution hints
(:func:`~gputally.probes.core.hints.process_attributes`), counter start times
(:class:`~gputally.probes.core.counters.CounterStarts`), ``hw.status``, the per-device snapshot log
record and ``gputally.gpu.collection.duration``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gputally.probes.core import catalog as m
from gputally.probes.core.counters import CounterStarts
from gputally.probes.core.hints import process_attributes
from gputally.probes.core.model import AttrValue, Cycle, Entity, LogEntry, Point, Severity
from gputally.probes.core.procfacts import ProcessInfoSource
from gputally.probes.core.status import status_points
from gputally.probes.snapshot.source import DeviceReading, Mapper, SnapshotSource, VendorUnavailable
from gputally.util.once import Once

__all__ = ["SnapshotCollector"]

log = logging.getLogger(__name__)


class SnapshotCollector:
    """One collection per :meth:`collect`, the interface :class:`~gputally.probes.core.runner.Runner` drives.

    The snapshot is read in a worker thread; one that takes longer than ``budget_s`` is left
    out of the cycle (and the next cycles) until it returns, so a hung tool never stalls the loop.
    """

    def __init__(
        self,
        source: SnapshotSource,
        processes: ProcessInfoSource,
        mapper: Mapper,
        *,
        node_name: str,
        vendor: str,
        budget_s: float = 5.0,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._source, self._processes, self._mapper = source, processes, mapper
        self._common: dict[str, AttrValue] = {"host.name": node_name}
        self._vendor = vendor
        self._budget_s = budget_s
        self._clock = clock
        self._counters = CounterStarts(probe_start_ns=clock())
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"gputally-{vendor}")
        self._driver: dict[str, Any] | None = None
        self._pending: asyncio.Future[Any] | None = None
        self._once: Once[str] = Once()

    def _read(self) -> dict[str, Any]:
        if self._driver is None:
            self._driver = self._source.open()
        return self._source.snapshot()

    async def collect(self) -> Cycle:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        now = self._clock()
        if self._pending is not None and not self._pending.done():
            return Cycle(now, 0.0, [], [], [f"{self._vendor}: an earlier read has not returned; skipped"])
        self._pending = loop.run_in_executor(self._pool, self._read)
        try:
            snapshot = await asyncio.wait_for(asyncio.shield(self._pending), timeout=self._budget_s)
        except TimeoutError:
            if self._once.first("slow"):
                log.warning("%s: reading took over %g s; skipping cycles until it returns", self._vendor, self._budget_s)
            return Cycle(now, time.perf_counter() - started, [], [], [f"{self._vendor}: reads took over {self._budget_s:g} s; skipped"])
        except VendorUnavailable as exc:
            self._driver = None
            if self._once.first(f"unavailable:{exc}"):
                log.error("%s unavailable: %s", self._vendor, exc)
            return Cycle(now, time.perf_counter() - started, [], [], [str(exc)])
        duration = time.perf_counter() - started
        try:
            devices = self._mapper(snapshot, self._driver or {})
        except VendorUnavailable as exc:  # a recorded tool failure (timeout, exit status) in the snapshot
            if self._once.first(f"unavailable:{exc}"):
                log.error("%s unavailable: %s", self._vendor, exc)
            return Cycle(now, duration, [], [], [str(exc)])
        self._once.forget("slow")
        self._once.forget_where(lambda key: key.startswith("unavailable:"))
        entities, logs, problems = self._build(devices, now, duration)
        self._counters.stamp(entities, now)
        return Cycle(time_ns=now, duration_s=time.perf_counter() - started, entities=entities, logs=logs,
                     problems=problems)

    def _build(self, devices: Sequence[DeviceReading], now: int, duration: float) -> tuple[list[Entity], list[LogEntry], list[str]]:
        entities: list[Entity] = []
        logs: list[LogEntry] = []
        problems: list[str] = []
        for device in devices:
            entity = Entity(key=f"gpu/{device.hw_id}", kind="gpu", attributes={**device.attributes, **self._common},
                            points=list(device.points), label=device.label or device.hw_id)
            entity.points.append(Point(m.COLLECTION_DURATION, duration))
            entity.points.extend(status_points(device.state))
            entities.append(entity)
            for problem in device.problems:
                problems.append(f"{entity.label}: {problem}")
                if self._once.first(f"{device.hw_id}:{problem}"):
                    log.warning("%s %s: %s", self._vendor, entity.label, problem)
            for process in device.processes:
                attributes: dict[str, AttrValue] = {
                    "hw.id": device.hw_id, **self._common,
                    **process_attributes(process.pid, self._processes.facts(process.pid)),
                }
                points = [Point(m.PROCESS_MEMORY, process.memory_bytes)] if process.memory_bytes is not None else []
                entities.append(Entity(
                    key=f"process/{device.hw_id}/{process.pid}/{attributes.get('process.creation.time', '')}",
                    kind="process", attributes=attributes, points=points, label=f"pid {process.pid}",
                ))
            logs.append(LogEntry(entity=entity, time_ns=now, severity=Severity.INFO,
                                 event_name="gputally.gpu.snapshot", body=device.body))
        return entities, logs, problems

    async def close(self) -> None:
        pending = self._pending
        if pending is not None and not pending.done():
            self._pool.shutdown(wait=False, cancel_futures=True)
            return
        with contextlib.suppress(Exception):
            await asyncio.get_running_loop().run_in_executor(self._pool, self._source.close)
        self._pool.shutdown(wait=False)
