"""What the AMD and Intel Gaudi probes share: a snapshot source, its replay and recording, and a
collector that turns mapped devices into the NVIDIA probe's entities, points and log records.

The NVIDIA probe's collector is shaped around NVML (field batches, GPM, event sets). The other
vendors are simpler: one *snapshot* per cycle (amdsmi's return values per device, or hl-smi's
text output), kept in plain JSON so the same dict is what the live source returns, what
``--record`` writes and what ``--replay`` serves. A vendor module maps a snapshot onto
:class:`DeviceReading` values with the shared catalog (:mod:`~gputally.probes.catalog`), and
:class:`VendorCollector` does the rest exactly as the NVIDIA probe does: ``host.name``,
attribution hints (:func:`~gputally.probes.hints.process_attributes`), counter start times
(:class:`~gputally.probes.counters.CounterStarts`), ``hw.status``, the per-device snapshot
log record and ``gputally.gpu.collection.duration``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gputally.errors import GputallyError
from gputally.probes import catalog as m
from gputally.probes.counters import CounterStarts
from gputally.probes.device_metrics import status_points
from gputally.probes.hints import process_attributes
from gputally.probes.model import AttrValue, Cycle, Entity, LogEntry, Point, Severity
from gputally.probes.source import ProcessInfoSource, ProcFacts

__all__ = [
    "DeviceReading",
    "ProcessUse",
    "SnapshotSource",
    "VendorCollector",
    "VendorRecorder",
    "VendorReplay",
    "VendorUnavailable",
    "number",
]

log = logging.getLogger(__name__)


class VendorUnavailable(GputallyError):
    """The vendor's library or tool cannot be used at all (one line, fit for a log)."""


def number(value: Any) -> float | int | None:
    """A numeric reading, or None for what the vendor tools print for "no value".

    amdsmi returns ``"N/A"`` strings (and sometimes ``0xFFFF``-style sentinels) for values a
    device does not report; hl-smi prints ``N/A``, ``[N/A]`` or a number with its unit.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        if isinstance(value, int) and value in (0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):
            return None
        return value
    if isinstance(value, str):
        text = value.strip().strip("[]").strip()
        if not text or text.upper() in ("N/A", "NA", "NOT SUPPORTED", "UNKNOWN", "-"):
            return None
        head = text.split()[0].rstrip("%")
        try:
            return int(head)
        except ValueError:
            try:
                return float(head)
            except ValueError:
                return None
    return None


@dataclass(frozen=True)
class ProcessUse:
    pid: int
    memory_bytes: int | None
    """Device memory the process holds; None where the vendor does not say."""


@dataclass
class DeviceReading:
    """One device (GPU, accelerator or partition) of one snapshot, mapped."""

    hw_id: str
    attributes: dict[str, AttrValue]
    """Resource attributes without ``host.name``."""
    points: list[Point] = field(default_factory=list)
    processes: list[ProcessUse] = field(default_factory=list)
    state: str = "ok"
    label: str = ""
    body: dict[str, Any] = field(default_factory=dict)
    """The raw readings of this device, for the snapshot log record."""
    problems: list[str] = field(default_factory=list)


class SnapshotSource(Protocol):
    """A vendor boundary: ``open`` may raise VendorUnavailable; ``snapshot`` reads every device once
    (blocking) and returns plain JSON values."""

    def open(self) -> dict[str, Any]: ...

    def snapshot(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _facts(pid: int, recorded: Mapping[str, Any]) -> ProcFacts:
    from gputally.probes.replay_source import _facts as nvml_facts

    return nvml_facts(pid, recorded)


class VendorReplay:
    """Serves a recording (``{"driver", "snapshots", "proc_facts"}``) as the live source would.

    Snapshots are served in turn and the recording starts over after the last; an entry
    ``"unavailable": "message"`` makes ``open`` fail as a node without the vendor stack does.
    Also the :class:`~gputally.probes.source.ProcessInfoSource` (from ``proc_facts``).
    """

    def __init__(self, recording: Mapping[str, Any]) -> None:
        snapshots = recording.get("snapshots")
        if not isinstance(snapshots, list) or not snapshots:
            raise ValueError("the recording has no snapshots")
        self.recording = recording
        self._next = 0

    @classmethod
    def from_file(cls, path: Path) -> VendorReplay:
        return cls(json.loads(Path(path).read_text()))

    def open(self) -> dict[str, Any]:
        if self.recording.get("unavailable"):
            raise VendorUnavailable(str(self.recording["unavailable"]))
        return dict(self.recording.get("driver") or {})

    def snapshot(self) -> dict[str, Any]:
        snapshots = self.recording["snapshots"]
        snap = snapshots[self._next % len(snapshots)]
        self._next += 1
        if isinstance(snap, Mapping) and snap.get("unavailable"):
            raise VendorUnavailable(str(snap["unavailable"]))
        return json.loads(json.dumps(snap))  # a fresh copy: mappers may not share state with the file

    def close(self) -> None:
        pass

    def facts(self, pid: int) -> ProcFacts | None:
        recorded = (self.recording.get("proc_facts") or {}).get(str(pid))
        return _facts(pid, recorded) if recorded is not None else None


def _facts_record(facts: ProcFacts) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("cgroup", "comm", "exe", "owner", "start_time"):
        if getattr(facts, key) is not None:
            out[key] = getattr(facts, key)
    if facts.uid is not None:
        out["status_uid"] = [f"Uid:\t{facts.uid}\t{facts.uid}\t{facts.uid}\t{facts.uid}"]
    return out


class VendorRecorder:
    """Wraps a live source (and its ProcessInfoSource) and writes what each cycle read to ``path``
    in the replay format, rewritten after every cycle."""

    def __init__(self, inner: SnapshotSource, processes: ProcessInfoSource, *, path: Path, fmt: str) -> None:
        self._inner, self._processes, self._path = inner, processes, Path(path)
        self._recording: dict[str, Any] = {
            "format": fmt, "constructed": False, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "driver": {}, "snapshots": [], "proc_facts": {},
        }

    def open(self) -> dict[str, Any]:
        driver = self._inner.open()
        self._recording["driver"] = driver
        return driver

    def snapshot(self) -> dict[str, Any]:
        snap = self._inner.snapshot()
        self._recording["snapshots"].append(snap)
        self._write()
        return snap

    def close(self) -> None:
        self._inner.close()

    def facts(self, pid: int) -> ProcFacts | None:
        facts = self._processes.facts(pid)
        if facts is not None:
            self._recording["proc_facts"][str(pid)] = _facts_record(facts)
            self._write()
        return facts

    def _write(self) -> None:
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_text(json.dumps(self._recording, indent=1, default=str))
        os.replace(tmp, self._path)


Mapper = Callable[[dict[str, Any], dict[str, Any]], list[DeviceReading]]
"""``(snapshot, driver) -> devices``: a vendor's pure mapping."""


class VendorCollector:
    """One collection per :meth:`collect`, the interface :class:`~gputally.probes.runner.Runner` drives.

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
        self._logged: set[str] = set()

    def _once(self, key: str) -> bool:
        if key in self._logged:
            return False
        self._logged.add(key)
        return True

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
            if self._once("slow"):
                log.warning("%s: reading took over %g s; skipping cycles until it returns", self._vendor, self._budget_s)
            return Cycle(now, time.perf_counter() - started, [], [], [f"{self._vendor}: reads took over {self._budget_s:g} s; skipped"])
        except VendorUnavailable as exc:
            self._driver = None
            if self._once(f"unavailable:{exc}"):
                log.error("%s unavailable: %s", self._vendor, exc)
            return Cycle(now, time.perf_counter() - started, [], [], [str(exc)])
        duration = time.perf_counter() - started
        try:
            devices = self._mapper(snapshot, self._driver or {})
        except VendorUnavailable as exc:  # a recorded tool failure (timeout, exit status) in the snapshot
            if self._once(f"unavailable:{exc}"):
                log.error("%s unavailable: %s", self._vendor, exc)
            return Cycle(now, duration, [], [], [str(exc)])
        self._logged.discard("slow")
        self._logged = {k for k in self._logged if not k.startswith("unavailable:")}
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
                if self._once(f"{device.hw_id}:{problem}"):
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
