"""Replay: serve recorded NVML readings through the same interface as the live source.

Reads the recording format of ``fixtures/nvml/README.md`` as it is (top-level ``device`` and
``snapshots``), plus three optional extensions that :mod:`~gputally.probes.nvml.record` writes:
``other_gpus`` (``[{"device", "snapshots"}]`` for GPUs after the first), per-snapshot ``mig``
(``{mig_uuid: {"dynamic", "gpm_1s"}}`` with ``device.mig_devices``) and per-snapshot
``events`` (``[{"kind": "xid", "data": 79}]``, fired when the snapshot comes up).

Rules, so that every path above the NVML calls runs in CI:

* each :meth:`next_cycle` moves to the next snapshot and wraps around; on each lap, sample
  timestamps and the energy counter are shifted forward by the recording's span, so the
  process sampler's last-seen timestamp and the energy counter keep moving forward as on a
  real GPU;
* a call missing from ``dynamic`` and an ``{"nvml_error": ...}`` (or ``{"error": ...}``)
  entry raise :class:`NvmlCallFailed` with that NVML error;
* ``process_utilization`` returns the recorded samples newer than the caller's last-seen
  timestamp (NVML's contract) and raises "Not Found" when none are;
* tests inject failures (:meth:`fail`, :meth:`fail_open`) and events (:meth:`inject_event`);
* ``latency=True`` sleeps each call's recorded p50 (``call_cost_us``), so timings mean
  something; sub-0.1 ms costs are summed and slept in one go, because ``time.sleep`` cannot
  sleep a microsecond.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gputally.probes.core.procfacts import ProcFacts, facts_from_record
from gputally.probes.nvml.errors import NvmlCallFailed, NvmlUnavailable, error_code
from gputally.probes.nvml.recording_check import read_recording
from gputally.probes.nvml.source import DriverInfo, Gpu, GpuEvent, MigPlacement, Reading

__all__ = ["ReplaySource", "load_recording"]

_ENERGY_FIELD = "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
_SLEEP_QUANTUM_S = 100e-6
_NOT_SUPPORTED = 3
_WIDE = ("ullVal", "ulVal", "sllVal")
"""Union members wide enough to hold the energy counter."""


def load_recording(path: Path) -> dict[str, Any]:
    """The recording at ``path``, read with a bound and checked up front
    (:mod:`~gputally.probes.nvml.recording_check`): a file that is not a recording raises
    ValueError naming the place in the file."""
    return read_recording(Path(path))


@dataclass
class _Failure:
    call: str
    code: int
    gpu: int | None
    times: int | None


@dataclass
class _Track:
    """One recorded GPU: its static block, its snapshots, and how far a lap shifts them."""

    index: int
    device: dict[str, Any]
    snapshots: list[dict[str, Any]]
    span_us: int = 0
    energy_span_mj: int = 0
    mig: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        times = [float(s.get("time", 0.0)) for s in self.snapshots]
        n = len(times)
        self.span_us = round((times[-1] - times[0]) * n / (n - 1) * 1e6) if n > 1 else 10_000_000
        energies = [_energy(s) for s in self.snapshots]
        if n > 1 and all(e is not None for e in energies):
            first, last = energies[0], energies[-1]
            assert first is not None and last is not None
            self.energy_span_mj = round((last - first) * n / (n - 1))
        self.mig = {m["uuid"]: m for m in self.device.get("mig_devices", [])}


def _energy(snapshot: Mapping[str, Any]) -> int | None:
    entry = snapshot.get("field_values", {}).get(_ENERGY_FIELD)
    if entry and entry.get("ret") == 0:
        return int(entry["value"]["ullVal"])
    value = snapshot.get("dynamic", {}).get("energy_mj")
    return int(value) if isinstance(value, int) else None


def _raise_if_error(call: str, value: Any) -> None:
    if isinstance(value, dict) and ("nvml_error" in value or "error" in value):
        text = str(value.get("nvml_error") or value.get("error"))
        raise NvmlCallFailed(call, error_code(text))


class _EventWatch:
    def __init__(self, events: queue.SimpleQueue[GpuEvent]) -> None:
        self._events = events

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        try:
            return [self._events.get(timeout=timeout_ms / 1000)]
        except queue.Empty:
            return []

    def close(self) -> None:
        pass


class ReplaySource:
    """A :class:`~gputally.probes.nvml.source.DeviceSource` and
    :class:`~gputally.probes.core.procfacts.ProcessInfoSource` over one recording."""

    def __init__(self, recording: Mapping[str, Any], *, latency: bool = False, copies: int = 1) -> None:
        """``copies`` > 1 presents the first GPU that many times (distinct UUIDs and bus ids),
        to model a node with several GPUs."""
        self._recording = recording
        self._latency = latency
        self._costs: dict[str, float] = {
            name: float(cost.get("p50_us", 0.0)) / 1e6
            for name, cost in recording.get("call_cost_us", {}).items()
            if isinstance(cost, dict)
        }
        batch = sorted(k for k in self._costs if k.startswith("field_values_batch"))
        if batch:
            self._costs.setdefault("field_values", self._costs[batch[-1]])
        tracks = [_Track(0, dict(recording["device"]), list(recording["snapshots"]))]
        for n, extra in enumerate(recording.get("other_gpus", []), start=1):
            tracks.append(_Track(n, dict(extra["device"]), list(extra["snapshots"])))
        for n in range(1, copies):
            twin = _Track(len(tracks), _renamed(tracks[0].device, n), tracks[0].snapshots)
            tracks.append(twin)
        self._tracks = tracks
        self._cycle = -1
        self._lock = threading.Lock()
        self._failures: list[_Failure] = []
        self._open_failure: str | None = None
        self._events: queue.SimpleQueue[GpuEvent] = queue.SimpleQueue()
        self._debt = threading.local()
        self.calls: Counter[str] = Counter()
        """How often each call was made, for tests (``calls["open"]``, ``calls["utilization"]``)."""
        self.last_seen_args: list[int] = []
        """Every ``last_seen`` passed to :meth:`process_utilization`, in order."""

    @classmethod
    def from_file(cls, path: Path, *, latency: bool = False, copies: int = 1) -> ReplaySource:
        return cls(load_recording(path), latency=latency, copies=copies)

    @property
    def snapshot_label(self) -> str:
        """The label of the first GPU's current snapshot (for logs and the debug dump)."""
        track = self._tracks[0]
        return str(self._snapshot(track).get("label", ""))

    # -- failure and event injection (tests) --------------------------------------------

    def fail(self, call: str, error: str | int, *, gpu: int | None = None, times: int | None = None) -> None:
        """Make ``call`` (a reading name, ``field_values``, ``process_utilization``, ``gpm``,
        ``mig_devices``, ``device_info``, ``gpus`` or ``*`` for every call) fail with ``error``
        on GPU ``gpu`` (all when None), ``times`` times (until :meth:`clear_failures` when None)."""
        code = error if isinstance(error, int) else error_code(error)
        with self._lock:
            self._failures.append(_Failure(call, code, gpu, times))

    def fail_open(self, message: str | None) -> None:
        """Make :meth:`open` raise NvmlUnavailable(message); None to stop."""
        self._open_failure = message

    def clear_failures(self) -> None:
        with self._lock:
            self._failures.clear()

    def inject_event(self, gpu: int, kind: str, data: int = 0) -> None:
        """Queue an NVML event on GPU ``gpu`` for the event watch."""
        uuid = self._tracks[gpu].device["uuid"]
        self._events.put(GpuEvent(gpu_uuid=uuid, kind=kind, data=data, time_ns=time.time_ns()))

    # -- DeviceSource ----------------------------------------------------------------------

    def open(self) -> DriverInfo:
        self._count("open")
        if self._open_failure is not None:
            raise NvmlUnavailable(self._open_failure)
        return DriverInfo(
            driver_version=self._recording.get("driver_version"),
            nvml_version=self._recording.get("nvml_version"),
            cuda_driver_version=self._recording.get("cuda_driver_version"),
        )

    def close(self) -> None:
        self._count("close")

    def next_cycle(self) -> None:
        """Move to the next snapshot; its recorded events (if any) fire now, on every lap."""
        self._cycle += 1
        for track in self._tracks:
            for recorded in self._snapshot(track).get("events", []):
                self._events.put(
                    GpuEvent(
                        gpu_uuid=track.device["uuid"],
                        kind=str(recorded.get("kind", "xid")),
                        data=int(recorded.get("data", 0)),
                        time_ns=time.time_ns(),
                    )
                )

    def gpus(self) -> list[Gpu]:
        self._check("gpus", None)
        return [Gpu(index=t.index, uuid=t.device["uuid"], handle=t) for t in self._tracks]

    def device_info(self, gpu: Gpu) -> dict[str, Any]:
        self._check("device_info", gpu)
        track = self._track(gpu)
        if gpu.mig is not None:
            return copy.deepcopy(track.mig[gpu.uuid])
        return copy.deepcopy(track.device)

    def read(self, gpu: Gpu, reading: Reading) -> Any:
        self._check(reading, gpu)
        dynamic = self._block(gpu).get("dynamic", {})
        if reading not in dynamic:
            raise NvmlCallFailed(reading, _NOT_SUPPORTED)
        value = dynamic[reading]
        _raise_if_error(reading, value)
        if reading == "energy_mj" and isinstance(value, int):
            return value + self._lap() * self._track(gpu).energy_span_mj
        return value

    def field_values(self, gpu: Gpu, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        self._check("field_values", gpu)
        recorded = self._block(gpu).get("field_values", {})
        result: dict[str, dict[str, Any]] = {}
        for name in names:
            entry = recorded.get(name)
            if entry is None:
                result[name] = {"ret": _NOT_SUPPORTED, "type": 3, "ts": 0, "value": {}}
                continue
            if name == _ENERGY_FIELD and entry.get("ret") == 0:
                shift = self._lap() * self._track(gpu).energy_span_mj
                entry = {**entry, "value": {k: v + shift if k in _WIDE else v for k, v in entry["value"].items()}}
            result[name] = entry  # recorded entries are shared, never changed by callers
        return result

    def process_utilization(self, gpu: Gpu, last_seen: int) -> list[dict[str, Any]]:
        self._check("process_utilization", gpu)
        with self._lock:
            self.last_seen_args.append(last_seen)
        recorded = self._block(gpu).get("process_utilization")
        if recorded is None:
            raise NvmlCallFailed("process_utilization", _NOT_SUPPORTED)
        _raise_if_error("process_utilization", recorded)
        shift = self._lap() * self._track(gpu).span_us
        samples = [{**s, "timeStamp": int(s["timeStamp"]) + shift} for s in recorded]
        newer = [s for s in samples if s["timeStamp"] > last_seen]
        if not newer:
            raise NvmlCallFailed("process_utilization", error_code("Not Found"))
        return newer

    def gpm(self, gpu: Gpu, metric_ids: Sequence[int]) -> dict[str, dict[str, Any]]:
        self._check("gpm", gpu)
        recorded = self._block(gpu).get("gpm_1s")
        if recorded is None:
            raise NvmlCallFailed("gpm", _NOT_SUPPORTED)
        _raise_if_error("gpm", recorded)
        wanted = {str(i) for i in metric_ids}
        return {k: dict(v) for k, v in recorded.items() if k in wanted}

    def mig_devices(self, gpu: Gpu) -> list[Gpu]:
        self._check("mig_devices", gpu)
        track = self._track(gpu)
        mode = track.device.get("mig_mode") or [0, 0]
        if not mode[0]:
            raise NvmlCallFailed("mig_devices", _NOT_SUPPORTED)
        return [
            Gpu(
                index=track.index,
                uuid=m["uuid"],
                handle=track,
                mig=MigPlacement(
                    parent_uuid=track.device["uuid"],
                    gpu_instance_id=int(m["gpu_instance_id"]),
                    compute_instance_id=m.get("compute_instance_id"),
                ),
                mig_index=n,
            )
            for n, m in enumerate(track.device.get("mig_devices", []))
        ]

    def watch_events(self, gpus: Sequence[Gpu]) -> _EventWatch:
        self._check("watch_events", None)
        return _EventWatch(self._events)

    # -- ProcessInfoSource -----------------------------------------------------------------

    def facts(self, pid: int) -> ProcFacts | None:
        for track in self._tracks:
            recorded = self._snapshot(track).get("proc_facts", {}).get(str(pid))
            if recorded is not None:
                return facts_from_record(pid, recorded)
        return None

    # -- internals -------------------------------------------------------------------------

    def _lap(self) -> int:
        return max(self._cycle, 0) // len(self._tracks[0].snapshots)

    def _snapshot(self, track: _Track) -> dict[str, Any]:
        return track.snapshots[max(self._cycle, 0) % len(track.snapshots)]

    def _track(self, gpu: Gpu) -> _Track:
        handle = gpu.handle
        assert isinstance(handle, _Track), "not a GPU of this replay source"
        return handle

    def _block(self, gpu: Gpu) -> dict[str, Any]:
        """The current snapshot of the GPU, or of the MIG device inside it."""
        snapshot = self._snapshot(self._track(gpu))
        if gpu.mig is None:
            return snapshot
        block = snapshot.get("mig", {}).get(gpu.uuid)
        if block is None:
            raise NvmlCallFailed("mig", error_code("Not Found"))
        result: dict[str, Any] = block
        return result

    def _count(self, call: str) -> None:
        with self._lock:
            self.calls[call] += 1

    def _check(self, call: str, gpu: Gpu | None) -> None:
        """Count the call, model its latency, and raise an injected failure if one matches."""
        if self._latency:
            self._spend(self._costs.get(call, 0.0))
        index = None if gpu is None else gpu.index
        with self._lock:
            self.calls[call] += 1
            for failure in self._failures:
                if failure.call not in ("*", call) or (failure.gpu is not None and failure.gpu != index):
                    continue
                if failure.times is not None:
                    if failure.times <= 0:
                        continue
                    failure.times -= 1
                raise NvmlCallFailed(call, failure.code)

    def _spend(self, seconds: float) -> None:
        """Sleep ``seconds`` as the call would block, in quanta ``time.sleep`` can honour."""
        debt = getattr(self._debt, "seconds", 0.0) + seconds
        if debt >= _SLEEP_QUANTUM_S:
            started = time.perf_counter()
            time.sleep(debt)
            debt -= time.perf_counter() - started
        self._debt.seconds = debt


def _renamed(device: Mapping[str, Any], n: int) -> dict[str, Any]:
    """A copy of ``device`` posing as GPU ``n``: its own index, UUID and PCI bus id."""
    twin = copy.deepcopy(dict(device))
    twin["index"] = n
    twin["minor_number"] = n
    twin["uuid"] = f"{device['uuid'][:-4]}{n:04x}"
    if "serial" in twin:
        twin["serial"] = f"{device['serial']}-{n}"
    pci = twin.get("pci_info")
    if isinstance(pci, dict):
        pci["bus"] = n
        pci["busId"] = f"{pci.get('domain', 0):08X}:{n:02X}:00.0"
        pci["busIdLegacy"] = f"{pci.get('domain', 0):04X}:{n:02X}:00.0"
    return twin
