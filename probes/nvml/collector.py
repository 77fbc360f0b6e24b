"""One collection cycle: every GPU read concurrently, mapped to entities, points and log records.

Cost rules (a probe must be invisible on a node with 8 busy GPUs):

* NVML is initialised once (:meth:`NvmlCollector.open`), not per cycle or per call;
* each GPU is read in its own worker thread, and within a GPU the batched field-values call
  (~3.6 ms, it carries the energy counter) runs beside the other calls (~2.3 ms with process
  utilization), so a cycle costs about the slowest of them per GPU, not their sum;
* a call the GPU refuses (Not Supported, no permission) is not asked again; a field the GPU
  refuses leaves the batch;
* ``nvmlDeviceGetPcieThroughput`` is never called (GPM or byte-counter fields instead);
* a GPU whose reads take longer than ``budget_s`` is left out of this cycle and not asked again
  until its stuck call returns, so one hung GPU cannot stall the others or pile up threads.

Failures (GPU lost, driver gone, permission denied) are logged once per GPU and call, the GPU
is reported as failed where it cannot be read, and the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from gputally.probes.core.counters import CounterStarts
from gputally.probes.core.model import Cycle
from gputally.probes.core.procfacts import ProcessInfoSource
from gputally.probes.nvml.entities import EntityBuilder
from gputally.probes.nvml.errors import NvmlCallFailed, NvmlUnavailable
from gputally.probes.nvml.events import EventPump
from gputally.probes.nvml.gpm import METRIC_IDS, gpm_supported
from gputally.probes.nvml.process_metrics import ProcessSampler, merge_processes
from gputally.probes.nvml.readings import GpuReadings, ProcessReading
from gputally.probes.nvml.source import FIELDS, READINGS, DeviceSource, DriverInfo, Gpu, Reading
from gputally.util.once import Once

__all__ = ["NvmlCollector"]

log = logging.getLogger(__name__)

_MIG_READINGS: tuple[Reading, ...] = ("memory_v2", "memory", "compute_procs", "graphics_procs")
_PROCESS_READINGS = frozenset({"compute_procs", "graphics_procs"})
_GPM_MIN_WINDOW_S = 0.5


class _GpuGone(Exception):
    def __init__(self, error: NvmlCallFailed) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass
class _GpuState:
    """What the probe remembers about one GPU (or MIG device) between cycles."""

    gpu: Gpu
    info: dict[str, Any]
    sampler: ProcessSampler = field(default_factory=ProcessSampler)
    skip: set[str] = field(default_factory=set)
    fields: list[str] = field(default_factory=lambda: list(FIELDS))
    busy: bool = False
    lost: bool = False
    mig: dict[str, _GpuState] = field(default_factory=dict)
    parent_info: dict[str, Any] | None = None
    """For a MIG device: its GPU's static facts (GPM support is the GPU's)."""

    @property
    def mig_enabled(self) -> bool:
        mode = self.info.get("mig_mode")
        return isinstance(mode, list) and bool(mode and mode[0])


class NvmlCollector:
    """Reads every GPU once per :meth:`collect`; owns the NVML session, the worker threads and
    the event thread."""

    def __init__(
        self,
        source: DeviceSource,
        processes: ProcessInfoSource,
        *,
        node_name: str,
        budget_s: float = 5.0,
        events: bool = True,
        event_slice_ms: int = 500,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        """``events=False`` skips the event thread (a one-shot run has no time to see events)."""
        self._source = source
        self._processes = processes
        self._node_name = node_name
        self._budget_s = budget_s
        self._events = events
        self._event_slice_ms = event_slice_ms
        self._clock = clock
        self._counters = CounterStarts(probe_start_ns=clock())
        self._entities = EntityBuilder(node_name=node_name)
        self._once: Once[tuple[object, ...]] = Once()
        self._states: list[_GpuState] = []
        self._driver: DriverInfo | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pump: EventPump | None = None
        self._reopen = False
        self._unavailable = False
        self._gpm_primed_at: float | None = None

    @property
    def gpu_count(self) -> int:
        return len(self._states)

    @property
    def driver(self) -> DriverInfo | None:
        return self._driver

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Initialise NVML, read each GPU's static facts and start the event thread.

        Raises NvmlUnavailable (one line, fit for a log) when NVML cannot be used."""
        await asyncio.to_thread(self._open_blocking)
        if self._gpm_primed_at is not None:
            log.debug("GPM primed; the first window ends with the first cycle")

    def _open_blocking(self) -> None:
        self._driver = self._source.open()
        try:
            gpus = self._source.gpus()
        except NvmlCallFailed as exc:
            self._source.close()
            raise NvmlUnavailable(f"NVML lists no GPUs: {exc.name}") from exc
        self._states = [_GpuState(gpu=gpu, info=self._device_info(gpu)) for gpu in gpus]
        self._pool = ThreadPoolExecutor(max_workers=2 * len(gpus) + 1, thread_name_prefix="nvml")
        log.info(
            "NVML %s, driver %s: %d GPU(s): %s",
            self._driver.nvml_version, self._driver.driver_version, len(gpus),
            ", ".join(f"{s.gpu.index}={s.info.get('name', '?')}" for s in self._states),
        )
        self._prime_gpm()
        if not self._events:
            return
        try:
            watch = self._source.watch_events([s.gpu for s in self._states])
        except NvmlCallFailed as exc:
            log.info("NVML events unavailable (%s): XIDs will not be reported", exc.name)
        else:
            self._pump = EventPump(watch, slice_ms=self._event_slice_ms)
            self._pump.start()

    def _device_info(self, gpu: Gpu) -> dict[str, Any]:
        try:
            return self._source.device_info(gpu)
        except NvmlCallFailed as exc:
            log.warning("GPU %d: cannot read its static facts (%s)", gpu.index, exc.name)
            return {"uuid": gpu.uuid, "index": gpu.index}

    def _prime_gpm(self) -> None:
        """Take the first GPM sample now, so the first cycle already has a window."""
        needs_window = False
        for state in self._states:
            if not gpm_supported(state.info):
                continue
            try:
                needs_window |= not self._source.gpm(state.gpu, METRIC_IDS)
            except NvmlCallFailed as exc:
                log.info("GPU %d: GPM unavailable (%s): no profiling metrics", state.gpu.index, exc.name)
                state.skip.add("gpm")
        if needs_window:
            self._gpm_primed_at = time.monotonic()

    async def close(self) -> None:
        if self._pump is not None:
            await asyncio.to_thread(self._pump.stop)
            self._pump = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._states or self._driver is not None:
            await asyncio.to_thread(self._source.close)
        self._states = []
        self._driver = None

    # -- one cycle -------------------------------------------------------------------------

    async def collect(self) -> Cycle:
        """Read every GPU once. Never raises for NVML trouble: problems land in ``Cycle.problems``."""
        started = time.perf_counter()
        if self._reopen:
            await self._reinit()
        if self._pool is None:
            try:
                await self.open()
            except NvmlUnavailable as exc:
                if not self._unavailable:
                    log.error("NVML unavailable: %s", exc)
                self._unavailable = True
                return Cycle(time_ns=self._clock(), duration_s=0.0, entities=[], logs=[], problems=[str(exc)])
            if self._unavailable:
                log.info("NVML is available again")
                self._unavailable = False
        if self._gpm_primed_at is not None:
            remaining = _GPM_MIN_WINDOW_S - (time.monotonic() - self._gpm_primed_at)
            self._gpm_primed_at = None
            if remaining > 0:
                await asyncio.sleep(remaining)
        self._source.next_cycle()
        now = self._clock()
        loop = asyncio.get_running_loop()
        pool = self._pool
        assert pool is not None
        problems: list[str] = []
        running: dict[asyncio.Future[GpuReadings], _GpuState] = {}
        for state in self._states:
            if state.busy:
                problems.append(f"GPU {state.gpu.index}: an earlier read has not returned; skipped")
                continue
            state.busy = True
            running[loop.run_in_executor(pool, self._read_gpu, state)] = state
        results: list[GpuReadings] = []
        if running:
            done, pending = await asyncio.wait(running, timeout=self._budget_s)
            for future in pending:
                state = running[future]
                problems.append(f"GPU {state.gpu.index}: reads took over {self._budget_s:g} s; skipped")
                if self._once.first((state.gpu.uuid, "slow")):
                    log.warning("GPU %d: reads took over %g s; leaving it out until they return",
                                state.gpu.index, self._budget_s)
            results = [f.result() for f in running if f in done]
        results.sort(key=lambda r: r.gpu.index)
        for r in results:
            self._once.forget((r.gpu.uuid, "slow"))  # in time again: log the next slow spell
            if r.lost is not None:
                problems.append(f"GPU {r.gpu.index}: {r.lost.name}")
        events = self._pump.drain() if self._pump is not None else []
        entities, logs = self._entities.build(results, events, now, driver=self._driver)
        self._counters.stamp(entities, now)
        return Cycle(time_ns=now, duration_s=time.perf_counter() - started, entities=entities, logs=logs,
                     problems=problems)

    async def _reinit(self) -> None:
        log.warning("NVML stopped working; initialising it again")
        self._reopen = False
        await self.close()

    # -- reading (worker threads) ------------------------------------------------------------

    def _read_gpu(self, state: _GpuState) -> GpuReadings:
        started = time.perf_counter()
        r = GpuReadings(gpu=state.gpu, info=state.info)
        lane: Future[tuple[dict[str, dict[str, Any]], NvmlCallFailed | None]] | None = None
        try:
            if state.fields and self._pool is not None:
                lane = self._pool.submit(self._read_fields, state)
            self._read_readings(state, r, READINGS)
            if state.mig_enabled:
                self._read_mig(state, r)  # processes live on the MIG devices
            else:
                self._read_processes(state, r)
            self._read_gpm(state, r)
        except _GpuGone as gone:
            r.lost = gone.error
        except Exception:  # a bug must not take the probe down: report what was read
            if self._once.first((state.gpu.uuid, "bug")):
                log.exception("GPU %d: unexpected error while reading it", state.gpu.index)
        finally:
            if lane is not None:
                self._join_fields(state, r, lane)
            state.busy = False
        if r.lost is None and state.lost:
            state.lost = False
            self._once.forget_where(lambda key: key[0] == state.gpu.uuid)
            log.info("GPU %d (%s) answers again", state.gpu.index, state.gpu.uuid)
        elif r.lost is not None and not state.lost:
            state.lost = True
            log.error("GPU %d (%s): %s; reporting it as failed and retrying every cycle",
                      state.gpu.index, state.gpu.uuid, r.lost.name)
        r.duration_s = time.perf_counter() - started
        return r

    def _read_fields(self, state: _GpuState) -> tuple[dict[str, dict[str, Any]], NvmlCallFailed | None]:
        try:
            return self._source.field_values(state.gpu, list(state.fields)), None
        except NvmlCallFailed as exc:
            return {}, exc
        except Exception:  # a bug must not lose the rest of the GPU's readings
            if self._once.first((state.gpu.uuid, "bug", "fields")):
                log.exception("GPU %d: unexpected error while reading its field values", state.gpu.index)
            return {}, None

    def _join_fields(
        self,
        state: _GpuState,
        r: GpuReadings,
        lane: Future[tuple[dict[str, dict[str, Any]], NvmlCallFailed | None]],
    ) -> None:
        try:
            fields, error = lane.result(timeout=self._budget_s)
        except FutureTimeout:
            return
        r.fields = fields
        refused = [name for name, entry in fields.items() if entry.get("ret") in (2, 3, 4, 13)]
        if refused:
            state.fields = [name for name in state.fields if name not in refused]
            log.debug("GPU %d: fields not supported, no longer asked: %s", state.gpu.index, ", ".join(refused))
        if error is not None:
            self._record(state, r, "field_values", error, raise_gone=False)
            if error.not_supported:
                state.fields = []

    def _read_readings(self, state: _GpuState, r: GpuReadings, readings: Sequence[Reading]) -> None:
        for name in readings:
            if name in state.skip or (name == "memory" and "memory_v2" in r.values):
                continue
            if state.mig_enabled and name in _PROCESS_READINGS and state.gpu.mig is None:
                continue  # under MIG the processes are read per MIG device
            try:
                r.values[name] = self._source.read(state.gpu, name)
            except NvmlCallFailed as exc:
                self._record(state, r, name, exc)

    def _record(
        self, state: _GpuState, r: GpuReadings, call: str, exc: NvmlCallFailed, *, raise_gone: bool = True
    ) -> None:
        """Remember a failed call; stop reading this GPU when it is gone."""
        r.errors[call] = exc
        gpu = state.gpu
        if exc.driver_gone:
            self._reopen = True
        if (exc.gpu_gone or exc.driver_gone) and raise_gone:
            raise _GpuGone(exc)
        if exc.not_supported:
            state.skip.add(call)
            if exc.code == 4 and self._once.first((gpu.uuid, call, "permission")):
                log.warning("GPU %d: %s: permission denied; not asking again", gpu.index, call)
            else:
                log.debug("GPU %d: %s: %s; not asking again", gpu.index, call, exc.name)
        elif not exc.gpu_gone and not exc.driver_gone and self._once.first((gpu.uuid, call, exc.code)):
            log.warning("GPU %d: %s failed: %s", gpu.index, call, exc.name)

    def _read_processes(self, state: _GpuState, r: GpuReadings) -> None:
        samples: dict[int, dict[str, Any]] = {}
        if "process_utilization" not in state.skip:
            try:
                samples = state.sampler.sample(lambda last: self._source.process_utilization(state.gpu, last))
                r.samples_available = True
            except NvmlCallFailed as exc:
                self._record(state, r, "process_utilization", exc)
        memory = merge_processes(r.value("compute_procs"), r.value("graphics_procs"))
        r.processes = [
            ProcessReading(pid=pid, used_memory=used, sample=samples.get(pid), facts=self._facts(pid))
            for pid, used in sorted(memory.items())
        ]

    def _facts(self, pid: int) -> Any:
        try:
            return self._processes.facts(pid)
        except Exception:  # hints are best effort; a bug here must not lose the GPU's data
            if self._once.first(("hints", pid)):
                log.exception("pid %d: reading its /proc facts failed", pid)
            return None

    def _read_gpm(self, state: _GpuState, r: GpuReadings) -> None:
        info = state.info if state.gpu.mig is None else (state.parent_info or {})
        if "gpm" in state.skip or not gpm_supported(info):
            return
        try:
            r.gpm = self._source.gpm(state.gpu, METRIC_IDS)
        except NvmlCallFailed as exc:
            self._record(state, r, "gpm", exc)

    def _read_mig(self, state: _GpuState, r: GpuReadings) -> None:
        if "mig_devices" in state.skip:
            return
        try:
            devices = self._source.mig_devices(state.gpu)
        except NvmlCallFailed as exc:
            self._record(state, r, "mig_devices", exc)
            return
        for device in devices:
            child = state.mig.get(device.uuid)
            if child is None:
                child = _GpuState(gpu=device, info=self._device_info(device), parent_info=state.info)
                state.mig[device.uuid] = child
            child.gpu = device
            reading = GpuReadings(gpu=device, info=child.info)
            self._read_readings(child, reading, _MIG_READINGS)
            self._read_processes(child, reading)
            self._read_gpm(child, reading)
            r.mig.append(reading)
