"""``gputally probe amd`` on constructed amdsmi recordings: every mapping, unit and error path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gputally.cli.main import main
from gputally.probes.amd.fdinfo import scan_fdinfo
from gputally.probes.amd.mapping import map_amd
from gputally.probes.amd.source import AmdsmiSource, load_amdsmi
from gputally.probes.core.otlp_shape import OtlpEncoder
from gputally.probes.snapshot.replay import SnapshotRecorder, SnapshotReplay
from gputally.probes.snapshot.source import VendorUnavailable
from tests.probes.amd.helpers import DPX, GPU0, GPU1, TWO_GPUS, cycles, device, one, recording, values

MIB = 1024 * 1024
GENERAL = (("hw.gpu.task", "general"),)


async def test_device_readings_map_onto_the_nvidia_names_and_units() -> None:
    (cycle,) = await cycles(recording())
    gpu = device(cycle, GPU0)
    a = gpu.attributes
    assert (a["hw.vendor"], a["hw.type"], a["hw.model"], a["hw.name"]) == ("AMD", "gpu", "AMD Instinct MI300X", "amdgpu0")
    assert (a["gputally.gpu.pci.bus_id"], a["hw.firmware_version"], a["hw.driver_version"]) == (
        "0000:05:00.0", "022.040.003.041.000001", "6.10.5")
    assert a["gputally.gpu.architecture"] == "gfx942" and a["host.name"] == "node-a"
    assert one(gpu, "hw.gpu.utilization", GENERAL) == pytest.approx(0.97)  # percent -> 0-1
    assert one(gpu, "gputally.gpu.memory.activity") == pytest.approx(0.38)
    assert one(gpu, "hw.gpu.memory.usage") == 143521 * MIB  # MB -> bytes
    assert one(gpu, "hw.gpu.memory.limit") == 196592 * MIB
    assert one(gpu, "hw.gpu.memory.utilization") == pytest.approx(143521 / 196592)
    assert one(gpu, "hw.power") == 611.0
    assert one(gpu, "hw.energy") == pytest.approx(2521565000 * 15.259 / 1e6)  # uJ resolution -> J
    assert values(gpu, "hw.temperature") == {
        (("hw.sensor_location", "gpu"),): 52, (("hw.sensor_location", "memory"),): 44}  # edge refused: absent
    assert values(gpu, "hw.temperature.limit")[(("hw.sensor_location", "gpu"), ("hw.limit_type", "critical"))] == 110
    assert one(gpu, "gputally.gpu.power.limit", (("gputally.gpu.power.limit_type", "enforced"),)) == 750.0  # uW -> W
    assert one(gpu, "gputally.gpu.clock.frequency", (("gputally.gpu.clock.type", "graphics"),)) == 2_100_000_000
    assert one(gpu, "gputally.gpu.clock.limit", (("gputally.gpu.clock.type", "memory"),)) == 1_300_000_000
    assert (("gputally.gpu.clock.type", "video"),) not in values(gpu, "gputally.gpu.clock.frequency")
    assert one(gpu, "gputally.gpu.pcie.link.generation") == 5  # 32000 MT/s
    assert one(gpu, "gputally.gpu.pcie.link.width.limit") == 16
    assert one(gpu, "hw.errors", (("error.type", "pcie_replay"),)) == 0
    assert values(gpu, "hw.gpu.io") == {
        (("network.io.direction", "receive"), ("gputally.gpu.link", "xgmi")): 2 * 1000 * 1024,
        (("network.io.direction", "transmit"), ("gputally.gpu.link", "xgmi")): 2 * 2000 * 1024,
    }
    assert one(gpu, "gputally.gpu.link.throughput", (("gputally.gpu.link", "pcie"),)) == 3e9
    assert values(gpu, "hw.status") == {(("hw.state", "ok"),): 1, (("hw.state", "degraded"),): 0,
                                        (("hw.state", "failed"),): 0}
    assert one(gpu, "gputally.gpu.collection.duration") >= 0


async def test_na_values_and_refused_calls_are_left_out() -> None:
    (cycle,) = await cycles(recording())
    gpu = device(cycle, GPU0)
    assert (("hw.gpu.task", "multimedia"),) not in values(gpu, "hw.gpu.utilization")  # mm_activity "N/A"
    throttled = values(gpu, "gputally.gpu.clock.throttled")
    assert (("gputally.gpu.clock.event_reason", "hbm_thermal_slowdown"),) not in throttled  # "N/A"
    body = next(entry.body for entry in cycle.logs if entry.entity is gpu)
    assert body["errors"]["temperature.edge"].startswith("AMDSMI_STATUS_NOT_SUPPORTED")


async def test_ecc_throttle_and_degraded_state() -> None:
    (cycle,) = await cycles(recording())
    gpu = device(cycle, GPU1)
    assert one(gpu, "hw.errors", (("error.type", "ecc_corrected"),)) == 3
    assert one(gpu, "hw.errors", (("error.type", "ecc_uncorrected"),)) == 1
    assert one(gpu, "gputally.gpu.ecc.errors", (("error.type", "ecc_uncorrected"), ("gputally.gpu.ecc.block", "umc"))) == 1
    assert one(gpu, "hw.errors", (("error.type", "pcie_replay"),)) == 2
    assert one(gpu, "gputally.gpu.clock.throttled", (("gputally.gpu.clock.event_reason", "sw_power_cap"),)) == 1
    assert one(gpu, "hw.status", (("hw.state", "degraded"),)) == 1


async def test_processes_carry_the_nvidia_attribution_hints() -> None:
    (cycle,) = await cycles(recording())
    procs = {e.attributes["process.pid"]: e for e in cycle.processes()}
    assert set(procs) == {4242, 4243, 5150}
    p = procs[4242].attributes
    assert p["hw.id"] == GPU0 and p["host.name"] == "node-a"
    assert "kubepods-burstable-pod0c1f5e3a" in p["process.linux.cgroup"]
    assert (p["process.executable.name"], p["process.owner"], p["process.user.id"]) == ("python3.11", "root", 0)
    assert p["process.creation.time"] == "2026-11-29T16:33:20.250Z"
    assert values(procs[4242], "gputally.gpu.process.memory.usage") == {(): 150323855360}  # vram_mem bytes


async def test_a_refused_process_list_falls_back_to_drm_fdinfo() -> None:
    (cycle,) = await cycles(recording())
    (fallback,) = [e for e in cycle.processes() if e.attributes["hw.id"] == GPU1]
    assert fallback.attributes["process.pid"] == 5150
    assert fallback.attributes["process.linux.cgroup"].endswith("job_5150/step_0/user/task_0")
    assert values(fallback, "gputally.gpu.process.memory.usage") == {(): 1073741824}


def _fdinfo(root: Path, pid: int, fd: int, text: str) -> None:
    directory = root / str(pid) / "fdinfo"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / str(fd)).write_text(text)


def test_scan_fdinfo_reads_a_fake_proc_root(tmp_path: Path) -> None:
    amd = "pos:\t0\nflags:\t02100002\ndrm-driver:\tamdgpu\ndrm-pdev:\t0000:05:00.0\ndrm-client-id:\t{c}\ndrm-memory-vram:\t{v}\n"
    _fdinfo(tmp_path, 100, 3, amd.format(c=7, v="1048576 KiB"))
    _fdinfo(tmp_path, 100, 4, amd.format(c=7, v="1048576 KiB"))  # same client: counted once
    _fdinfo(tmp_path, 100, 5, amd.format(c=8, v="2 MiB"))
    _fdinfo(tmp_path, 200, 3, "drm-driver:\tamdgpu\ndrm-pdev:\t0000:26:00.0\ndrm-client-id:\t1\ndrm-resident-vram:\t4096\n")
    _fdinfo(tmp_path, 300, 3, "drm-driver:\ti915\ndrm-pdev:\t0000:00:02.0\ndrm-memory-vram:\t10 KiB\n")
    _fdinfo(tmp_path, 400, 0, "pos:\t0\nflags:\t0100002\n")  # not a DRM fd
    (tmp_path / "self").mkdir()
    assert scan_fdinfo(tmp_path) == {"0000:05:00.0": {"100": 1024**3 + 2 * MIB}, "0000:26:00.0": {"200": 4096}}
    assert scan_fdinfo(tmp_path / "missing") == {}


class _Refused(Exception):
    def get_error_info(self) -> str:
        return "AMDSMI_STATUS_NO_PERM - Permission Denied"


def fake_amdsmi(rec: dict[str, Any], calls: list[str]) -> Any:
    """A stand-in amdsmi module answering from a recording's first snapshot; process lists refused."""
    devices = rec["snapshots"][0]["devices"]

    def answer(key: str, section: str = "dynamic") -> Any:
        def fn(handle: int, *args: Any) -> Any:
            calls.append(key)
            value = devices[handle][section][key]
            if isinstance(value, dict) and "amdsmi_error" in value:
                raise _Refused()
            return value
        return fn

    def temp(handle: int, sensor: str, metric: str) -> Any:
        calls.append(f"temp_{sensor}_{metric}")
        if metric == "CURRENT":
            value = devices[handle]["dynamic"]["temperature"][sensor.lower()]
        else:
            value = devices[handle]["static"]["temp_limits"][sensor.lower()][metric.lower()]
        if isinstance(value, dict):
            raise _Refused()
        return value

    def process_list(handle: int) -> Any:
        calls.append("process_list")
        raise _Refused()

    names = lambda *n: SimpleNamespace(**{x: x for x in n})  # noqa: E731
    return SimpleNamespace(
        AmdSmiInitFlags=SimpleNamespace(INIT_AMD_GPUS=2), amdsmi_init=lambda flags: calls.append("init"),
        amdsmi_shut_down=lambda: calls.append("shutdown"), amdsmi_get_processor_handles=lambda: [0, 1],
        AmdSmiTemperatureType=names("EDGE", "HOTSPOT", "VRAM"),
        AmdSmiTemperatureMetric=names("CURRENT", "CRITICAL", "EMERGENCY"),
        AmdSmiClkType=names("GFX", "MEM", "SOC", "VCLK0"),
        AmdSmiGpuBlock=names("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL"),
        amdsmi_get_gpu_device_uuid=answer("uuid", "static"), amdsmi_get_gpu_device_bdf=answer("bdf", "static"),
        amdsmi_get_gpu_asic_info=answer("asic_info", "static"), amdsmi_get_gpu_board_info=answer("board_info", "static"),
        amdsmi_get_gpu_vbios_info=answer("vbios_info", "static"),
        amdsmi_get_gpu_driver_info=answer("driver_info", "static"),
        amdsmi_get_gpu_compute_partition=answer("compute_partition", "static"),
        amdsmi_get_gpu_memory_partition=answer("memory_partition", "static"),
        amdsmi_get_gpu_kfd_info=answer("kfd_info", "static"),
        amdsmi_get_power_cap_info=answer("power_cap_info", "static"),
        amdsmi_get_temp_metric=temp,
        amdsmi_get_gpu_activity=answer("activity"), amdsmi_get_gpu_vram_usage=answer("vram_usage"),
        amdsmi_get_power_info=answer("power_info"), amdsmi_get_energy_count=answer("energy_count"),
        amdsmi_get_pcie_info=answer("pcie_info"), amdsmi_get_gpu_total_ecc_count=answer("ecc_total"),
        amdsmi_get_gpu_metrics_info=answer("gpu_metrics"), amdsmi_get_violation_status=answer("violation_status"),
        amdsmi_get_gpu_process_list=process_list,
        amdsmi_get_clock_info=lambda h, c: calls.append(f"clock_{c}") or (
            _raise() if "amdsmi_error" in devices[h]["dynamic"]["clock"][c.lower()] else devices[h]["dynamic"]["clock"][c.lower()]),
        amdsmi_get_gpu_ecc_count=lambda h, b: devices[h]["dynamic"]["ecc_blocks"].get(b) or _raise(),
    )


def _raise() -> Any:
    raise _Refused()


def test_the_live_adapter_reads_amdsmi_and_falls_back_to_fdinfo(tmp_path: Path) -> None:
    _fdinfo(tmp_path, 5150, 3, "drm-driver:\tamdgpu\ndrm-pdev:\t0000:26:00.0\ndrm-client-id:\t1\ndrm-memory-vram:\t1048576 KiB\n")
    calls: list[str] = []
    source = AmdsmiSource(proc_root=tmp_path, module=fake_amdsmi(recording(), calls))
    assert source.open()["driver_version"] == "6.10.5"
    first = source.snapshot()
    assert first["drm_fdinfo"] == {"0000:26:00.0": {"5150": 1024**3}}
    assert first["devices"][0]["dynamic"]["process_list"] == {"amdsmi_error": "AMDSMI_STATUS_NO_PERM - Permission Denied"}
    assert calls.count("process_list") == 2
    source.snapshot()
    assert calls.count("process_list") == 2, "a refused call is not asked again"
    mapped = map_amd(first, {})
    assert [p.pid for d in mapped for p in d.processes] == [5150]
    assert mapped[0].attributes["hw.id"] == GPU0
    source.close()
    assert calls[-1] == "shutdown"


def test_an_amdsmi_import_failure_is_one_line_and_keeps_stdout_clean(capfd: pytest.CaptureFixture[str]) -> None:
    def broken() -> Any:
        print("ERROR: libamd_smi.so not found")
        print("Please install ROCm")
        raise KeyError("libamd_smi.so")

    with pytest.raises(VendorUnavailable) as caught:
        load_amdsmi(broken)
    out, _ = capfd.readouterr()
    assert out == ""
    assert "\n" not in str(caught.value) and "KeyError" in str(caught.value) and "libamd_smi.so" in str(caught.value)


FAKE_AMDSMI = '''print("ERROR:root:ROCm library libamd_smi.so not found")
print("Set ROCM_PATH")
raise KeyError("libamd_smi.so")
'''


def test_the_cli_without_rocm_prints_one_line_and_exits_non_zero(tmp_path: Path) -> None:
    (tmp_path / "amdsmi.py").write_text(FAKE_AMDSMI)
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from gputally.cli.main import main; sys.exit(main(sys.argv[1:]))",
         "probe", "amd", "--once", "--debug"],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputally probe amd: cannot load amdsmi (KeyError"), result.stderr
    assert "Traceback" not in result.stderr


async def test_partitions_are_entities_with_their_parent_gpu() -> None:
    (cycle,) = await cycles(recording(DPX))
    parent_id = "b8ff74a1-0000-1000-80ea-8c2b5f7d0a11"
    gpus = cycle.gpus()
    assert [e.attributes["hw.id"] for e in gpus] == [parent_id, f"{parent_id}/p0", f"{parent_id}/p1"]
    parent, p0, p1 = gpus
    assert "hw.parent" not in parent.attributes
    assert parent.attributes["gputally.gpu.partition.compute_mode"] == "DPX"
    for part, n in ((p0, 0), (p1, 1)):
        assert part.attributes["hw.parent"] == parent_id
        assert part.attributes["gputally.gpu.partition.id"] == n
        assert part.attributes["hw.name"] == f"amdgpu0/p{n}"
        assert "hw.power" not in {p.metric.name for p in part.points}  # board-wide readings stay on the GPU
    assert p1.attributes["gputally.gpu.partition.uuid"] == "d1ff74a1-0000-1000-80ea-8c2b5f7d0a11"
    assert one(p0, "hw.gpu.utilization", GENERAL) == pytest.approx(0.9)
    assert one(parent, "hw.gpu.utilization", GENERAL) == pytest.approx(0.6)  # mean of the partitions
    assert one(parent, "hw.gpu.memory.usage") == (80000 + 1024) * MIB  # sum of the partitions
    assert one(parent, "hw.power") == 598.0
    procs = {e.attributes["process.pid"]: e.attributes["hw.id"] for e in cycle.processes()}
    assert procs == {4242: f"{parent_id}/p0", 7001: f"{parent_id}/p1"}


async def test_a_gpu_that_stops_answering_is_failed_and_the_other_goes_on() -> None:
    rec = recording()
    for snap in rec["snapshots"]:
        dyn = snap["devices"][1]["dynamic"]
        dyn["activity"] = dyn["vram_usage"] = {"amdsmi_error": "AMDSMI_STATUS_DRM_ERROR - Error when calling libdrm"}
    (cycle,) = await cycles(rec)
    lost = device(cycle, GPU1)
    assert one(lost, "hw.status", (("hw.state", "failed"),)) == 1
    assert "hw.power" not in {p.metric.name for p in lost.points}
    assert any("AMDSMI_STATUS_DRM_ERROR" in line for line in cycle.problems)
    assert one(device(cycle, GPU0), "hw.status", (("hw.state", "ok"),)) == 1


async def test_amdsmi_unavailable_is_a_problem_not_a_crash() -> None:
    rec = recording()
    rec["unavailable"] = "amdsmi cannot start: AMDSMI_STATUS_DRIVER_NOT_LOADED"
    (cycle,) = await cycles(rec)
    assert cycle.entities == [] and cycle.problems == ["amdsmi cannot start: AMDSMI_STATUS_DRIVER_NOT_LOADED"]


async def test_counters_get_start_times_and_energy_grows_across_snapshots() -> None:
    first, second = await cycles(recording(), 2)
    e1 = next(p for p in device(first, GPU0).points if p.metric.name == "hw.energy")
    e2 = next(p for p in device(second, GPU0).points if p.metric.name == "hw.energy")
    assert e2.value > e1.value and e1.start_ns == e2.start_ns is not None


def test_replay_once_debug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "amd", "--replay", str(TWO_GPUS), "--once", "--debug", "--node-name", "n1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gputally probe amd (replay of mi300x-two-gpus.json): 2 device(s), 3 process(es)")
    assert "process 5150  train  owner ana" in out
    assert "nvml" not in out
    assert "amdsmi" not in sys.modules, "the replay path imported amdsmi"


def test_replay_of_a_missing_file_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", "amd", "--replay", str(tmp_path / "none.json"), "--once", "--debug"]) == 2


def test_replay_of_an_unavailable_node_once_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "no-rocm.json"
    path.write_text(json.dumps({"unavailable": "amdsmi lists no AMD GPUs", "snapshots": [{}]}))
    assert main(["probe", "amd", "--replay", str(path), "--once", "--debug"]) == 1
    assert "! amdsmi lists no AMD GPUs" in capsys.readouterr().out


async def test_record_writes_what_replays_the_same(tmp_path: Path) -> None:
    inner = SnapshotReplay(recording())
    path = tmp_path / "rec.json"
    recorder = SnapshotRecorder(inner, inner, path=path, fmt="gputally-amdsmi-recording/1")
    driver = recorder.open()
    snap = recorder.snapshot()
    assert recorder.facts(4242) is not None
    written = json.loads(path.read_text())
    assert written["constructed"] is False and written["snapshots"] == [snap]
    replayed = SnapshotReplay(written)
    assert map_amd(replayed.snapshot(), driver)[0].points == map_amd(snap, driver)[0].points
    assert replayed.facts(4242) == inner.facts(4242)


async def test_otlp_scope_names_the_amd_probe() -> None:
    (cycle,) = await cycles(recording())
    request = OtlpEncoder(scope_name="gputally.probes.amd").metrics(cycle.entities, cycle.time_ns)
    assert {sm.scope.name for rm in request.resource_metrics for sm in rm.scope_metrics} == {"gputally.probes.amd"}
    logs = OtlpEncoder(scope_name="gputally.probes.amd").logs(cycle.logs, cycle.time_ns)
    assert {r.event_name for rl in logs.resource_logs for sl in rl.scope_logs for r in sl.log_records} == {
        "gputally.gpu.snapshot"}
