"""``--record FILE``: write what the probe reads as a recording the replay source can serve.

:class:`RecordingSource` wraps the live source (any source, in fact) and keeps every answer and
every NVML error of each cycle in the recording format (``fixtures/nvml/README.md``), plus the
measured cost of each call (``call_cost_us``). Because it records exactly the calls the probe
makes, a recording replays through the same path: that is how a new GPU model or driver gets
into the tests. The file is rewritten (atomically) after each cycle, so stopping the probe at
any point leaves a valid recording.

Process facts keep what the probe uses (cgroup, comm, exe, effective uid, owner, start time);
environment variables are not recorded.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gputally.probes.core.procfacts import ProcessInfoSource, ProcFacts, record_of
from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.source import (
    DeviceSource,
    DriverInfo,
    EventWatch,
    Gpu,
    GpuEvent,
    Reading,
)

__all__ = ["RecordingSource"]

T = TypeVar("T")


def _error(exc: NvmlCallFailed) -> dict[str, str]:
    return {"nvml_error": exc.name}


class _RecordingWatch:
    def __init__(self, inner: EventWatch, sink: Callable[[GpuEvent], None]) -> None:
        self._inner = inner
        self._sink = sink

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        events = self._inner.wait(timeout_ms)
        for event in events:
            self._sink(event)
        return events

    def close(self) -> None:
        self._inner.close()


class RecordingSource:
    """A DeviceSource and ProcessInfoSource that records what flows through it."""

    def __init__(self, inner: DeviceSource, processes: ProcessInfoSource, *, path: Path) -> None:
        self._inner = inner
        self._processes = processes
        self._path = Path(path)
        self._lock = threading.Lock()
        self._driver: DriverInfo | None = None
        self._devices: dict[str, dict[str, Any]] = {}
        self._order: list[str] = []
        self._snapshots: dict[str, list[dict[str, Any]]] = {}
        self._current: dict[str, dict[str, Any]] = {}
        self._facts: dict[str, dict[str, Any]] = {}
        self._costs: dict[str, list[float]] = {}
        self._cycle = -1

    # -- recording helpers -------------------------------------------------------------------

    def _timed(self, cost_key: str, fn: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            elapsed = (time.perf_counter() - started) * 1e6
            with self._lock:
                self._costs.setdefault(cost_key, []).append(elapsed)

    def _new_snapshot(self) -> dict[str, Any]:
        return {"label": f"t{max(self._cycle, 0)}", "time": time.time(), "dynamic": {}}

    def _snapshot(self, gpu: Gpu) -> dict[str, Any]:
        uuid = gpu.mig.parent_uuid if gpu.mig is not None else gpu.uuid
        with self._lock:
            snapshot = self._current.setdefault(uuid, self._new_snapshot())
            if gpu.mig is None:
                return snapshot
            block: dict[str, Any] = snapshot.setdefault("mig", {}).setdefault(gpu.uuid, {"dynamic": {}})
            return block

    def _keep(self, gpu: Gpu, key: str, fn: Callable[[], T], *, dynamic: bool, cost_key: str | None = None) -> T:
        target = self._snapshot(gpu)
        if dynamic:
            target = target["dynamic"]
        try:
            value = self._timed(cost_key or key, fn)
        except NvmlCallFailed as exc:
            target[key] = _error(exc)
            raise
        target[key] = value
        return value

    def _flush(self) -> None:
        """Close the current cycle's snapshots and rewrite the file."""
        with self._lock:
            present = [u for u in self._order if u in self._current]
            for uuid in present:
                snapshot = self._current[uuid]
                if uuid == present[0]:  # node-wide: the replay looks in every GPU's snapshot
                    snapshot["proc_facts"] = dict(self._facts)
                self._snapshots.setdefault(uuid, []).append(snapshot)
            self._current = {}
            self._facts = {}
        if self._snapshots:
            self.write()

    def recording(self) -> dict[str, Any]:
        """The recording so far, in the format the replay source reads."""
        with self._lock:
            gpus = [u for u in self._order if self._snapshots.get(u)]
            if not gpus:
                raise ValueError("nothing recorded yet")
            driver = self._driver or DriverInfo(None, None, None)
            data: dict[str, Any] = {
                "description": "Recorded by `gputally probe nvml --record`: what each cycle read, as NVML returned it.",
                "nvml_version": driver.nvml_version,
                "driver_version": driver.driver_version,
                "cuda_driver_version": driver.cuda_driver_version,
                "device_count": len(gpus),
                "device": self._devices[gpus[0]],
                "snapshots": self._snapshots[gpus[0]],
                "call_cost_us": {
                    key: {
                        "p50_us": round(statistics.median(values), 1),
                        "p99_us": round(sorted(values)[min(len(values) - 1, int(len(values) * 0.99))], 1),
                        "min_us": round(min(values), 1),
                    }
                    for key, values in sorted(self._costs.items())
                },
            }
            if len(gpus) > 1:
                data["other_gpus"] = [{"device": self._devices[u], "snapshots": self._snapshots[u]} for u in gpus[1:]]
            return data

    def write(self) -> None:
        text = json.dumps(self.recording(), indent=1, default=str)
        tmp = self._path.with_name(self._path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, self._path)

    # -- DeviceSource --------------------------------------------------------------------------

    def open(self) -> DriverInfo:
        self._driver = self._inner.open()
        return self._driver

    def close(self) -> None:
        self._flush()
        self._inner.close()

    def next_cycle(self) -> None:
        if self._cycle >= 0:
            self._flush()
        self._cycle += 1
        self._inner.next_cycle()

    def gpus(self) -> list[Gpu]:
        gpus = self._inner.gpus()
        for gpu in gpus:
            if gpu.uuid not in self._order:
                self._order.append(gpu.uuid)
        return gpus

    def device_info(self, gpu: Gpu) -> dict[str, Any]:
        info = self._inner.device_info(gpu)
        with self._lock:
            if gpu.mig is None:
                self._devices[gpu.uuid] = dict(info)
            else:
                parent = self._devices.setdefault(gpu.mig.parent_uuid, {})
                known = {m["uuid"] for m in parent.setdefault("mig_devices", [])}
                if gpu.uuid not in known:
                    parent["mig_devices"].append({**info, "uuid": gpu.uuid, "gpu_instance_id": gpu.mig.gpu_instance_id,
                                                  "compute_instance_id": gpu.mig.compute_instance_id})
        return info

    def read(self, gpu: Gpu, reading: Reading) -> Any:
        return self._keep(gpu, reading, lambda: self._inner.read(gpu, reading), dynamic=True)

    def field_values(self, gpu: Gpu, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        return self._keep(gpu, "field_values", lambda: self._inner.field_values(gpu, names), dynamic=False,
                          cost_key=f"field_values_batch_{len(names)}")

    def process_utilization(self, gpu: Gpu, last_seen: int) -> list[dict[str, Any]]:
        self._snapshot(gpu)["process_utilization_last_seen_arg"] = last_seen
        return self._keep(gpu, "process_utilization", lambda: self._inner.process_utilization(gpu, last_seen),
                          dynamic=False)

    def gpm(self, gpu: Gpu, metric_ids: Sequence[int]) -> dict[str, dict[str, Any]]:
        if self._cycle < 0:  # priming at open: not part of any snapshot
            return self._timed("gpm", lambda: self._inner.gpm(gpu, metric_ids))
        return self._keep(gpu, "gpm_1s", lambda: self._inner.gpm(gpu, metric_ids), dynamic=False, cost_key="gpm")

    def mig_devices(self, gpu: Gpu) -> list[Gpu]:
        return self._timed("mig_devices", lambda: self._inner.mig_devices(gpu))

    def watch_events(self, gpus: Sequence[Gpu]) -> _RecordingWatch:
        return _RecordingWatch(self._inner.watch_events(gpus), self._event)

    def _event(self, event: GpuEvent) -> None:
        with self._lock:
            snapshot = self._current.setdefault(event.gpu_uuid, self._new_snapshot())
            snapshot.setdefault("events", []).append({"kind": event.kind, "data": event.data})

    # -- ProcessInfoSource ------------------------------------------------------------------

    def facts(self, pid: int) -> ProcFacts | None:
        facts = self._processes.facts(pid)
        if facts is not None:
            with self._lock:
                self._facts[str(pid)] = record_of(facts)
        return facts
