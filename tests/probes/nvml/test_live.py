"""The live source against the real nvidia-ml-py, with a fake libnvidia-ml underneath.

This machine has no NVIDIA driver, so the C functions pynvml resolves are replaced by fakes
that fill the ctypes structures as the library would (values from the H200 recording). The
real pynvml wrappers, structs and constants run, which catches a misnamed call or struct
field and checks that the live source returns the recording format.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gputally.probes.core.hints import ProcFs
from gputally.probes.nvml.collector import NvmlCollector
from gputally.probes.nvml.errors import NvmlCallFailed, NvmlUnavailable
from gputally.probes.nvml.live import NvmlSource

pynvml = pytest.importorskip("pynvml")

UUID = b"GPU-1e061ec2-3930-fe87-1e34-cb91101c1bd9"
SAMPLES = [(628, 1795977093486556, 69, 17), (629, 1795977093486000, 0, 0)]


def target(ref: Any) -> Any:
    """What a ``byref(x)`` argument points at."""
    return ref._obj


def scalar(value: int) -> Callable[..., int]:
    def fn(*args: Any) -> int:
        target(args[-1]).value = value
        return 0

    return fn


def string(value: bytes) -> Callable[..., int]:
    def fn(*args: Any) -> int:
        args[-2].value = value
        return 0

    return fn


def struct(**fields: Any) -> Callable[..., int]:
    def fn(*args: Any) -> int:
        out = target(args[-1])
        for key, value in fields.items():
            setattr(out, key, value)
        return 0

    return fn


class FakeLibrary:
    """The C side of NVML for one H200 with two processes."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.events: list[tuple[int, int]] = [(0x8, 79)]
        self.functions: dict[str, Callable[..., int]] = {
            "nvmlInitWithFlags": lambda flags: 0,
            "nvmlShutdown": lambda: 0,
            "nvmlSystemGetDriverVersion": string(b"580.159.04"),
            "nvmlSystemGetNVMLVersion": string(b"13.580.159.04"),
            "nvmlSystemGetCudaDriverVersion": scalar(13000),
            "nvmlSystemGetCudaDriverVersion_v2": scalar(13000),
            "nvmlDeviceGetCount_v2": scalar(1),
            "nvmlDeviceGetHandleByIndex_v2": lambda index, ref: 0,
            "nvmlDeviceGetUUID": string(UUID),
            "nvmlDeviceGetName": string(b"NVIDIA H200"),
            "nvmlDeviceGetMinorNumber": scalar(0),
            "nvmlDeviceGetMaxClockInfo": scalar(1980),
            "nvmlDeviceGetEnforcedPowerLimit": scalar(700000),
            "nvmlDeviceGetTemperatureThreshold": scalar(89),
            "nvmlDeviceGetMigMode": self.mig_mode,
            "nvmlGpmQueryDeviceSupport": struct(isSupportedDevice=1),
            "nvmlDeviceGetUtilizationRates": struct(gpu=99, memory=25),
            "nvmlDeviceGetMemoryInfo_v2": struct(total=150754820096, reserved=644939776, free=136096317440,
                                                 used=14013562880),
            "nvmlDeviceGetPowerUsage": scalar(362431),
            "nvmlDeviceGetTemperature": scalar(52),
            "nvmlDeviceGetClockInfo": scalar(1500),
            "nvmlDeviceGetEncoderUtilization": self.encoder,
            "nvmlDeviceGetComputeRunningProcesses_v3": self.compute_procs,
            "nvmlDeviceGetGraphicsRunningProcesses_v3": lambda handle, count, procs: 0,
            "nvmlDeviceGetFieldValues": self.field_values,
            "nvmlDeviceGetProcessUtilization": self.process_utilization,
            "nvmlGpmSampleAlloc": lambda ref: 0,
            "nvmlGpmSampleFree": lambda sample: 0,
            "nvmlGpmSampleGet": lambda device, sample: 0,
            "nvmlGpmMetricsGet": self.gpm_metrics,
            "nvmlEventSetCreate": lambda ref: 0,
            "nvmlDeviceGetSupportedEventTypes": scalar(0x8 | 0x2 | 0x4),
            "nvmlDeviceRegisterEvents": lambda handle, types, event_set: 0,
            "nvmlEventSetWait_v2": self.event_wait,
            "nvmlEventSetFree": lambda event_set: 0,
        }

    def resolve(self, name: str) -> Callable[..., int]:
        self.calls.append(name)
        return self.functions.get(name, lambda *args: 3)  # anything else: Not Supported

    @staticmethod
    def mig_mode(device: Any, current: Any, pending: Any) -> int:
        target(current).value, target(pending).value = 0, 0
        return 0

    @staticmethod
    def encoder(handle: Any, util: Any, period: Any) -> int:
        target(util).value, target(period).value = 7, 100000
        return 0

    @staticmethod
    def compute_procs(handle: Any, count: Any, procs: Any) -> int:
        if procs is None:
            target(count).value = 2
            return 7
        for n, (pid, used) in enumerate(((628, 9869197312), (629, 4129292288))):
            procs[n].pid, procs[n].usedGpuMemory = pid, used
        target(count).value = 2
        return 0

    @staticmethod
    def field_values(handle: Any, count: Any, values: Any) -> int:
        array = target(values)
        for n in range(count.value):
            field = array[n]
            if field.fieldId == pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                field.nvmlReturn, field.valueType, field.value.ullVal = 0, 3, 38481635
            elif field.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                field.nvmlReturn, field.valueType, field.value.uiVal = 0, 1, 43
            else:
                field.nvmlReturn = 3
        return 0

    def process_utilization(self, handle: Any, buffer: Any, count: Any, last_seen: Any) -> int:
        fresh = [s for s in SAMPLES if s[1] > last_seen.value]
        if not fresh:
            return 6
        if target(count).value < len(fresh):
            target(count).value = len(fresh)
            return 7
        for n, (pid, stamp, sm, mem) in enumerate(fresh):
            buffer[n].pid, buffer[n].timeStamp, buffer[n].smUtil, buffer[n].memUtil = pid, stamp, sm, mem
        target(count).value = len(fresh)
        return 0

    @staticmethod
    def gpm_metrics(ref: Any) -> int:
        request = target(ref)
        for n in range(request.numMetrics):
            metric = request.metrics[n]
            metric.nvmlReturn, metric.value = 0, 96.1 if metric.metricId == 2 else 0.0
            metric.metricInfo.shortName = b"smutil" if metric.metricId == 2 else b"m"
            metric.metricInfo.unit = b"%"
        return 0

    def event_wait(self, event_set: Any, ref: Any, timeout: Any) -> int:
        if not self.events:
            return 10  # timeout
        kind, data = self.events.pop(0)
        out = target(ref)
        out.eventType, out.eventData, out.gpuInstanceId, out.computeInstanceId = kind, data, 0xFFFFFFFF, 0xFFFFFFFF
        return 0


@pytest.fixture
def lib(monkeypatch: pytest.MonkeyPatch) -> FakeLibrary:
    fake = FakeLibrary()
    monkeypatch.setattr(pynvml, "_LoadNvmlLibrary", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlLib", object())
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", fake.resolve)
    return fake


def test_open_reads_the_driver_and_lists_gpus(lib: FakeLibrary) -> None:
    source = NvmlSource()
    info = source.open()
    assert (info.driver_version, info.nvml_version, info.cuda_driver_version) == ("580.159.04", "13.580.159.04", 13000)
    (gpu,) = source.gpus()
    assert gpu.uuid == UUID.decode() and gpu.index == 0
    device = source.device_info(gpu)
    assert device["name"] == "NVIDIA H200" and device["mig_mode"] == [0, 0]
    assert device["gpm_support"]["isSupportedDevice"] == 1
    assert "serial" not in device  # refused by the fake: left out, no error
    source.close()
    assert "nvmlShutdown" in lib.calls


def test_readings_come_back_in_the_recording_format(lib: FakeLibrary) -> None:
    source = NvmlSource()
    source.open()
    (gpu,) = source.gpus()
    assert source.read(gpu, "utilization") == {"gpu": 99, "memory": 25}
    assert source.read(gpu, "memory_v2")["reserved"] == 644939776
    assert source.read(gpu, "power_mw") == 362431
    assert source.read(gpu, "clock_sm") == 1500
    assert source.read(gpu, "encoder_util") == [7, 100000]
    procs = source.read(gpu, "compute_procs")
    assert [(p["pid"], p["usedGpuMemory"]) for p in procs] == [(628, 9869197312), (629, 4129292288)]
    assert source.read(gpu, "graphics_procs") == []
    with pytest.raises(NvmlCallFailed) as refused:
        source.read(gpu, "bar1")
    assert refused.value.not_supported and refused.value.name == "Not Supported"
    fields = source.field_values(gpu, ["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_MEMORY_TEMP",
                                       "NVML_FI_DEV_PCIE_REPLAY_COUNTER", "NVML_FI_NOT_A_FIELD"])
    assert fields["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"]["ullVal"] == 38481635
    assert fields["NVML_FI_DEV_MEMORY_TEMP"]["type"] == 1 and fields["NVML_FI_DEV_PCIE_REPLAY_COUNTER"]["ret"] == 3
    assert fields["NVML_FI_NOT_A_FIELD"]["ret"] == 3  # unknown to this nvidia-ml-py: not supported


def test_process_utilization_is_one_native_call_into_a_kept_buffer(lib: FakeLibrary) -> None:
    source = NvmlSource()
    source.open()
    (gpu,) = source.gpus()
    lib.calls.clear()
    samples = source.process_utilization(gpu, 0)
    assert [(s["pid"], s["smUtil"]) for s in samples] == [(628, 69), (629, 0)]
    assert lib.calls == ["nvmlDeviceGetProcessUtilization"]
    with pytest.raises(NvmlCallFailed) as none:
        source.process_utilization(gpu, 1795977093486556)
    assert none.value.not_found


def test_gpm_primes_then_measures(lib: FakeLibrary) -> None:
    source = NvmlSource()
    source.open()
    (gpu,) = source.gpus()
    assert source.gpm(gpu, [2, 3]) == {}
    metrics = source.gpm(gpu, [2, 3])
    assert metrics["2"] == {"name": "smutil", "ret": 0, "value": 96.1, "unit": "%"}


def test_events_arrive_and_timeouts_are_empty(lib: FakeLibrary) -> None:
    source = NvmlSource()
    source.open()
    watch = source.watch_events(source.gpus())
    (event,) = watch.wait(10)
    assert (event.kind, event.data, event.gpu_uuid, event.gpu_instance_id) == ("xid", 79, UUID.decode(), None)
    assert watch.wait(10) == []
    watch.close()


def test_missing_library_is_one_line_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    with pytest.raises(NvmlUnavailable) as exc:
        NvmlSource().open()
    assert "libnvidia-ml.so.1" in str(exc.value) and "\n" not in str(exc.value)


def test_pid_as_timestamp_bug_is_absent_in_the_call(lib: FakeLibrary) -> None:
    """The kept buffer is passed with the caller's timestamp, never a pid."""
    seen: list[int] = []
    original = lib.process_utilization

    def spy(handle: Any, buffer: Any, count: Any, last_seen: Any) -> int:
        seen.append(last_seen.value)
        return original(handle, buffer, count, last_seen)

    lib.functions["nvmlDeviceGetProcessUtilization"] = spy
    source = NvmlSource()
    source.open()
    (gpu,) = source.gpus()
    source.process_utilization(gpu, 1234)
    assert seen == [1234]


async def test_a_live_cycle_end_to_end_over_the_fake_library(lib: FakeLibrary, tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("btime 1795970000\n")
    probe = NvmlCollector(NvmlSource(), ProcFs(tmp_path), node_name="node-a", events=False)
    try:
        first = await probe.collect()
        second = await probe.collect()
    finally:
        await probe.close()
    (gpu,) = second.gpus()
    power = next(p.value for p in gpu.points if p.metric.name == "hw.power")
    assert power == pytest.approx(362.431)  # no instant-power field on the fake: nvmlDeviceGetPowerUsage
    assert any(p.metric.name == "gputally.gpu.sm.activity" and p.value == pytest.approx(0.961) for p in gpu.points)
    assert sorted(e.attributes["process.pid"] for e in first.processes()) == [628, 629]
    assert first.processes()[0].attributes.get("process.linux.cgroup") is None  # not in this proc root
    assert lib.calls.count("nvmlInitWithFlags") == 1
    assert "nvmlDeviceGetPcieThroughput" not in lib.calls


def test_without_the_private_resolver_the_public_wrapper_is_used(
    lib: FakeLibrary, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = NvmlSource()
    source.open()
    (gpu,) = source.gpus()
    calls: list[int] = []

    def public(handle: Any, last_seen: int) -> list[Any]:
        calls.append(last_seen)
        return [pynvml.c_nvmlProcessUtilizationSample_t(628, 5, 69, 17, 0, 0)]

    monkeypatch.setattr(pynvml, "nvmlDeviceGetProcessUtilization", public)
    monkeypatch.delattr(pynvml, "_nvmlGetFunctionPointer")
    assert source.process_utilization(gpu, 4) == [
        {"pid": 628, "timeStamp": 5, "smUtil": 69, "memUtil": 17, "encUtil": 0, "decUtil": 0}
    ]
    assert calls == [4]
