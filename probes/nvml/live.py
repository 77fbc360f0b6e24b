"""The live source: NVML through nvidia-ml-py (``pynvml``), imported only when the probe opens it.

A node without the package, the library or the driver gets one :class:`NvmlUnavailable` whose
message says what is missing, never an ImportError traceback. Every ``pynvml.NVMLError`` is
translated into :class:`NvmlCallFailed` with NVML's return code here, at the boundary.

Values come back in the recording format (see :mod:`gputally.probes.nvml.source`), so a recording
made through this class replays through the same code.

Cost notes (H200, ``call_cost_us`` in the fixture): most calls take 1-10 us; BAR1 ~120 us;
the running-process lists 20-60 us; the field-values batch ~3.6 ms because it carries the
energy counter; process utilization ~2 ms. pynvml's ``nvmlDeviceGetProcessUtilization``
makes two native calls (size, then data); :meth:`NvmlSource.process_utilization` makes one
into a buffer kept per GPU. ``nvmlDeviceGetPcieThroughput`` (20 ms, blocking) is never called:
PCIe traffic comes from GPM or the PCIe byte-counter fields.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from gputally.probes.nvml.errors import NvmlCallFailed, NvmlUnavailable
from gputally.probes.nvml.source import EVENT_KINDS, DriverInfo, Gpu, GpuEvent, MigPlacement, Reading

__all__ = ["NvmlSource"]

log = logging.getLogger(__name__)

_INSUFFICIENT_SIZE = 7
_TIMEOUT = 10
_NO_ID = 0xFFFFFFFF
_SAMPLE_FIELDS = ("pid", "timeStamp", "smUtil", "memUtil", "encUtil", "decUtil")
_UNION_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_UNAVAILABLE_HINTS = {
    12: "the NVIDIA driver library libnvidia-ml.so.1 is not on this node (or not mounted into the container)",
    9: "the NVIDIA kernel driver is not loaded",
    4: "no permission to open /dev/nvidia* (run privileged or with the NVIDIA container runtime)",
    18: "the NVML library and the kernel driver are different versions (reboot or reload the driver)",
}


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _fields(struct: Any, names: Sequence[str]) -> dict[str, Any]:
    return {name: _text(getattr(struct, name)) for name in names}


@dataclass
class _GpmWindow:
    """Two GPM samples per device, swapped each cycle: metrics cover the time between cycles."""

    previous: Any
    current: Any
    primed: bool = False


class _EventWatch:
    def __init__(self, nvml: ModuleType, source: NvmlSource, gpus: Sequence[Gpu]) -> None:
        self._nvml = nvml
        self._source = source
        self._set = source._call("watch_events", nvml.nvmlEventSetCreate)
        wanted = 0
        for mask in EVENT_KINDS:
            wanted |= mask
        registered = 0
        for gpu in gpus:
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle)
                if supported & wanted:
                    nvml.nvmlDeviceRegisterEvents(gpu.handle, supported & wanted, self._set)
                    registered += 1
            except nvml.NVMLError as exc:
                log.info("GPU %d: no NVML events (%s)", gpu.index, exc)
        if not registered:
            self.close()
            raise NvmlCallFailed("watch_events", 3)

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        nvml = self._nvml
        try:
            data = nvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except nvml.NVMLError as exc:
            if exc.value == _TIMEOUT:
                return []
            raise NvmlCallFailed("event_wait", int(exc.value), str(exc)) from exc
        try:
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
        except nvml.NVMLError:
            uuid = "unknown"
        kind = EVENT_KINDS.get(int(data.eventType), f"type_0x{int(data.eventType):x}")
        gi, ci = int(data.gpuInstanceId), int(data.computeInstanceId)
        return [
            GpuEvent(
                gpu_uuid=uuid,
                kind=kind,
                data=int(data.eventData),
                time_ns=time.time_ns(),
                gpu_instance_id=None if gi == _NO_ID else gi,
                compute_instance_id=None if ci == _NO_ID else ci,
            )
        ]

    def close(self) -> None:
        try:
            self._nvml.nvmlEventSetFree(self._set)
        except self._nvml.NVMLError as exc:
            log.debug("freeing the NVML event set: %s", exc)


class NvmlSource:
    """:class:`~gputally.probes.nvml.source.DeviceSource` over the real NVML."""

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None
        self._gpm: dict[str, _GpmWindow] = {}
        self._pu_buffers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._readers: dict[str, Callable[[Any], Any]] = {}

    @property
    def nvml(self) -> ModuleType:
        if self._nvml is None:
            raise NvmlUnavailable("NVML is not initialised")
        return self._nvml

    def _call(self, call: str, fn: Callable[..., Any], *args: Any) -> Any:
        nvml = self.nvml
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            raise NvmlCallFailed(call, int(exc.value), str(exc)) from exc

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> DriverInfo:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            hint = _UNAVAILABLE_HINTS.get(int(exc.value), "")
            raise NvmlUnavailable(f"nvmlInit failed: {exc}" + (f": {hint}" if hint else "")) from exc
        except OSError as exc:  # a broken library file
            raise NvmlUnavailable(f"cannot load libnvidia-ml.so.1: {exc}") from exc
        self._nvml = pynvml
        self._readers = self._make_readers(pynvml)

        def optional(fn: Callable[[], Any]) -> Any:
            try:
                return _text(fn())
            except pynvml.NVMLError:
                return None

        return DriverInfo(
            driver_version=optional(pynvml.nvmlSystemGetDriverVersion),
            nvml_version=optional(pynvml.nvmlSystemGetNVMLVersion),
            cuda_driver_version=optional(pynvml.nvmlSystemGetCudaDriverVersion),
        )

    def close(self) -> None:
        nvml = self._nvml
        if nvml is None:
            return
        with self._lock:
            for window in self._gpm.values():
                for sample in (window.previous, window.current):
                    with contextlib.suppress(nvml.NVMLError):
                        nvml.nvmlGpmSampleFree(sample)
            self._gpm.clear()
            self._pu_buffers.clear()
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)
        self._nvml = None

    def next_cycle(self) -> None:
        """Nothing to do live: every call reads the GPU as it is now."""

    # -- devices ---------------------------------------------------------------------------

    def gpus(self) -> list[Gpu]:
        nvml = self.nvml
        count = self._call("gpus", nvml.nvmlDeviceGetCount)
        result = []
        for index in range(count):
            handle = self._call("gpus", nvml.nvmlDeviceGetHandleByIndex, index)
            uuid = _text(self._call("gpus", nvml.nvmlDeviceGetUUID, handle))
            result.append(Gpu(index=index, uuid=uuid, handle=handle))
        return result

    def device_info(self, gpu: Gpu) -> dict[str, Any]:
        nvml = self.nvml
        h = gpu.handle
        if gpu.mig is not None:
            info: dict[str, Any] = {
                "uuid": gpu.uuid,
                "gpu_instance_id": gpu.mig.gpu_instance_id,
                "compute_instance_id": gpu.mig.compute_instance_id,
            }
            self._put(info, "name", lambda: nvml.nvmlDeviceGetName(h))
            return info
        info = {}
        put = self._put
        put(info, "name", lambda: nvml.nvmlDeviceGetName(h))
        put(info, "uuid", lambda: nvml.nvmlDeviceGetUUID(h))
        put(info, "serial", lambda: nvml.nvmlDeviceGetSerial(h))
        put(info, "index", lambda: nvml.nvmlDeviceGetIndex(h))
        put(info, "minor_number", lambda: nvml.nvmlDeviceGetMinorNumber(h))
        put(info, "pci_info", lambda: _fields(
            nvml.nvmlDeviceGetPciInfo(h),
            ("busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId"),
        ))
        put(info, "board_part_number", lambda: nvml.nvmlDeviceGetBoardPartNumber(h))
        put(info, "vbios", lambda: nvml.nvmlDeviceGetVbiosVersion(h))
        put(info, "architecture", lambda: nvml.nvmlDeviceGetArchitecture(h))
        put(info, "cuda_cc", lambda: list(nvml.nvmlDeviceGetCudaComputeCapability(h)))
        put(info, "brand", lambda: nvml.nvmlDeviceGetBrand(h))
        put(info, "mig_mode", lambda: list(nvml.nvmlDeviceGetMigMode(h)))
        put(info, "max_sm_clock", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
        put(info, "max_mem_clock", lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_MEM))
        put(info, "power_limit_mw", lambda: nvml.nvmlDeviceGetPowerManagementLimit(h))
        put(info, "enforced_power_limit_mw", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
        put(info, "power_limit_constraints", lambda: list(nvml.nvmlDeviceGetPowerManagementLimitConstraints(h)))
        put(info, "temp_threshold_slowdown", lambda: nvml.nvmlDeviceGetTemperatureThreshold(
            h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
        put(info, "temp_threshold_shutdown", lambda: nvml.nvmlDeviceGetTemperatureThreshold(
            h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))
        put(info, "max_pcie_gen", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(h))
        put(info, "max_pcie_width", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(h))
        put(info, "ecc_mode", lambda: list(nvml.nvmlDeviceGetEccMode(h)))
        put(info, "gpm_support", lambda: _fields(nvml.nvmlGpmQueryDeviceSupport(h), ("version", "isSupportedDevice")))
        put(info, "num_gpu_cores", lambda: nvml.nvmlDeviceGetNumGpuCores(h))
        return info

    def _put(self, info: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
        nvml = self.nvml
        try:
            info[key] = _text(fn())
        except nvml.NVMLError as exc:
            log.debug("%s: %s", key, exc)
        except AttributeError:  # an older nvidia-ml-py without this call
            log.debug("%s: not in this nvidia-ml-py", key)

    def mig_devices(self, gpu: Gpu) -> list[Gpu]:
        nvml = self.nvml
        count = self._call("mig_devices", nvml.nvmlDeviceGetMaxMigDeviceCount, gpu.handle)
        result = []
        for n in range(count):
            try:
                handle = nvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu.handle, n)
            except nvml.NVMLError as exc:
                if exc.value == 6:  # no MIG device at this position
                    continue
                raise NvmlCallFailed("mig_devices", int(exc.value), str(exc)) from exc
            uuid = _text(self._call("mig_devices", nvml.nvmlDeviceGetUUID, handle))
            gi = self._call("mig_devices", nvml.nvmlDeviceGetGpuInstanceId, handle)
            try:
                ci: int | None = nvml.nvmlDeviceGetComputeInstanceId(handle)
            except nvml.NVMLError:
                ci = None
            placement = MigPlacement(parent_uuid=gpu.uuid, gpu_instance_id=gi, compute_instance_id=ci)
            result.append(Gpu(index=gpu.index, uuid=uuid, handle=handle, mig=placement, mig_index=n))
        return result

    # -- readings --------------------------------------------------------------------------

    @staticmethod
    def _make_readers(nvml: ModuleType) -> dict[str, Callable[[Any], Any]]:
        def procs(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return lambda h: [
                {
                    "pid": p.pid,
                    "usedGpuMemory": p.usedGpuMemory,
                    "gpuInstanceId": p.gpuInstanceId,
                    "computeInstanceId": p.computeInstanceId,
                }
                for p in fn(h)
            ]

        def clock(kind: int) -> Callable[[Any], Any]:
            return lambda h: nvml.nvmlDeviceGetClockInfo(h, kind)

        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nvml.nvmlDeviceGetCurrentClocksThrottleReasons  # nvidia-ml-py before 12.535
        return {
            "utilization": lambda h: _fields(nvml.nvmlDeviceGetUtilizationRates(h), ("gpu", "memory")),
            "memory": lambda h: _fields(nvml.nvmlDeviceGetMemoryInfo(h), ("total", "free", "used")),
            "memory_v2": lambda h: _fields(
                nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2),
                ("version", "total", "reserved", "free", "used"),
            ),
            "bar1": lambda h: _fields(nvml.nvmlDeviceGetBAR1MemoryInfo(h), ("bar1Total", "bar1Free", "bar1Used")),
            "power_mw": nvml.nvmlDeviceGetPowerUsage,
            "energy_mj": nvml.nvmlDeviceGetTotalEnergyConsumption,
            "temp_gpu": lambda h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "clock_sm": clock(nvml.NVML_CLOCK_SM),
            "clock_mem": clock(nvml.NVML_CLOCK_MEM),
            "clock_graphics": clock(nvml.NVML_CLOCK_GRAPHICS),
            "clock_video": clock(nvml.NVML_CLOCK_VIDEO),
            "pstate": nvml.nvmlDeviceGetPerformanceState,
            "throttle_reasons": reasons,
            "pcie_gen": nvml.nvmlDeviceGetCurrPcieLinkGeneration,
            "pcie_width": nvml.nvmlDeviceGetCurrPcieLinkWidth,
            "remapped_rows": lambda h: list(nvml.nvmlDeviceGetRemappedRows(h)),
            "encoder_util": lambda h: list(nvml.nvmlDeviceGetEncoderUtilization(h)),
            "decoder_util": lambda h: list(nvml.nvmlDeviceGetDecoderUtilization(h)),
            "compute_procs": procs(nvml.nvmlDeviceGetComputeRunningProcesses),
            "graphics_procs": procs(nvml.nvmlDeviceGetGraphicsRunningProcesses),
        }

    def read(self, gpu: Gpu, reading: Reading) -> Any:
        reader = self._readers.get(reading)
        if reader is None:
            raise NvmlCallFailed(reading, 3)
        return self._call(reading, reader, gpu.handle)

    def field_values(self, gpu: Gpu, names: Sequence[str]) -> dict[str, dict[str, Any]]:
        nvml = self.nvml
        known = [(name, getattr(nvml, name)) for name in names if hasattr(nvml, name)]
        result: dict[str, dict[str, Any]] = {
            name: {"ret": 3, "type": 3, "ts": 0, "value": {}} for name in names if not hasattr(nvml, name)
        }
        if not known:
            return result
        values = self._call("field_values", nvml.nvmlDeviceGetFieldValues, gpu.handle, [fid for _, fid in known])
        for (name, _), value in zip(known, values, strict=True):
            result[name] = {
                "ret": int(value.nvmlReturn),
                "type": int(value.valueType),
                "ts": int(value.timestamp),
                "value": {k: getattr(value.value, k) for k in _UNION_MEMBERS},
            }
        return result

    def process_utilization(self, gpu: Gpu, last_seen: int) -> list[dict[str, Any]]:
        """One native call into a buffer kept per GPU (pynvml's wrapper makes two)."""
        nvml = self.nvml
        resolve = getattr(nvml, "_nvmlGetFunctionPointer", None)
        if resolve is None:  # a future nvidia-ml-py without the resolver: its own (two-call) wrapper
            samples = self._call("process_utilization", nvml.nvmlDeviceGetProcessUtilization, gpu.handle, last_seen)
            return [{key: getattr(s, key) for key in _SAMPLE_FIELDS} for s in samples]
        fn = self._call("process_utilization", resolve, "nvmlDeviceGetProcessUtilization")
        buffer = self._pu_buffers.get(gpu.uuid)
        if buffer is None:
            buffer = (nvml.c_nvmlProcessUtilizationSample_t * 64)()
        for _ in range(3):
            count = ctypes.c_uint(len(buffer))
            ret = fn(gpu.handle, buffer, ctypes.byref(count), ctypes.c_ulonglong(last_seen))
            if ret == _INSUFFICIENT_SIZE:
                buffer = (nvml.c_nvmlProcessUtilizationSample_t * (count.value * 2 + 8))()
                continue
            if ret != 0:
                raise NvmlCallFailed("process_utilization", int(ret), str(nvml.NVMLError(ret)))
            self._pu_buffers[gpu.uuid] = buffer
            return [{key: getattr(s, key) for key in _SAMPLE_FIELDS} for s in buffer[: count.value]]
        raise NvmlCallFailed("process_utilization", _INSUFFICIENT_SIZE)

    def gpm(self, gpu: Gpu, metric_ids: Sequence[int]) -> dict[str, dict[str, Any]]:
        nvml = self.nvml
        window = self._gpm.get(gpu.uuid)
        if window is None:
            window = _GpmWindow(
                previous=self._call("gpm", nvml.nvmlGpmSampleAlloc),
                current=self._call("gpm", nvml.nvmlGpmSampleAlloc),
            )
            with self._lock:
                self._gpm[gpu.uuid] = window
        if gpu.mig is not None:
            parent = self._call("gpm", nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, gpu.handle)
            self._call("gpm", nvml.nvmlGpmMigSampleGet, parent, gpu.mig.gpu_instance_id, window.current)
        else:
            self._call("gpm", nvml.nvmlGpmSampleGet, gpu.handle, window.current)
        if not window.primed:
            window.primed = True
            window.previous, window.current = window.current, window.previous
            return {}
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metric_ids)
        request.sample1 = window.previous
        request.sample2 = window.current
        for n, metric_id in enumerate(metric_ids):
            request.metrics[n].metricId = metric_id
        self._call("gpm", nvml.nvmlGpmMetricsGet, request)
        window.previous, window.current = window.current, window.previous
        result = {}
        for n in range(len(metric_ids)):
            metric = request.metrics[n]
            info = metric.metricInfo
            result[str(metric.metricId)] = {
                "name": _text(info.shortName) if info.shortName else str(metric.metricId),
                "ret": int(metric.nvmlReturn),
                "value": float(metric.value),
                "unit": _text(info.unit) if info.unit else "",
            }
        return result

    def watch_events(self, gpus: Sequence[Gpu]) -> _EventWatch:
        return _EventWatch(self.nvml, self, gpus)
