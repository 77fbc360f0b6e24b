"""The replay loader (``probe nvml --replay FILE``): the real H200 recordings bent, and their
bytes damaged. A file is either refused with one RecordingError naming where, or it replays:
every call of the replay source answers or fails as NVML does (NvmlCallFailed), nothing else."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.recording_check import RecordingError, read_recording
from gputally.probes.nvml.replay import ReplaySource
from tests.fuzz.budget import bounded_memory, case, fuzz_settings
from tests.fuzz.strategies import bent, damaged
from tests.probes.nvml.helpers import TIMESERIES, TWO_WORKLOADS

BASES = [json.loads(TWO_WORKLOADS.read_text()), json.loads(TIMESERIES.read_text())]
RECORDING_KEYS = st.sampled_from([
    "device", "snapshots", "other_gpus", "uuid", "mig_mode", "mig_devices", "gpu_instance_id", "dynamic",
    "field_values", "process_utilization", "timeStamp", "proc_facts", "status_uid", "events", "data", "kind",
    "mig", "gpm_1s", "time", "energy_mj", "call_cost_us", "p50_us", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "ullVal", "ret", "value", "pci_info", "domain", "start_time",
])
READINGS = ["utilization", "memory", "power_mw", "energy_mj", "temp_gpu", "clock_sm", "throttle_reasons",
            "compute_procs", "graphics_procs"]


def replay(data: dict) -> None:  # type: ignore[type-arg]
    source = ReplaySource(data, copies=2)

    def calm(call: object, *args: object) -> None:
        try:
            call(*args)  # type: ignore[operator]
        except NvmlCallFailed:
            pass

    source.open()
    for _ in range(3):
        source.next_cycle()
        for gpu in source.gpus():
            calm(source.device_info, gpu)
            for reading in READINGS:
                calm(source.read, gpu, reading)
            calm(source.field_values, gpu, ["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "NVML_FI_DEV_MEMORY_TEMP"])
            calm(source.process_utilization, gpu, 0)
            calm(source.gpm, gpu, [1, 2, 3])
            calm(source.mig_devices, gpu)
        for pid in (448, 449, 450, 1):
            source.facts(pid)


@fuzz_settings("replay")
@given(st.data())
def check(data: st.DataObject) -> None:
    with case("replay"):
        tree = data.draw(bent(data.draw(st.sampled_from(BASES)), keys=RECORDING_KEYS, edits=3))
        raw = json.dumps(tree).encode()
        if data.draw(st.integers(0, 5)) == 0:
            raw = data.draw(damaged(raw))
        with tempfile.NamedTemporaryFile(suffix=".json") as file:
            file.write(raw)
            file.flush()
            try:
                recording = read_recording(Path(file.name))
            except RecordingError as exc:
                assert str(exc).startswith(file.name) and "\n" not in str(exc), str(exc)
                return
        replay(recording)


def test_replay_loader() -> None:
    with bounded_memory("replay"):
        check()
