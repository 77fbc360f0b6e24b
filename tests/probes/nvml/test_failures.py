"""NVML missing, GPUs lost, permission denied, slow calls: one log line, partial data, the loop goes on."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from gputally.probes.nvml.replay import ReplaySource
from gputally.probes.nvml.source import Gpu
from tests.probes.nvml.helpers import collector, gpu, recording, run_cycles, value

POWER = "hw.power"


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.fixture(autouse=True)
def _capture(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="gputally.probes")


async def test_nvml_initialised_once_across_cycles() -> None:
    source = ReplaySource(recording())
    await run_cycles(source, 5)
    assert source.calls["open"] == 1 and source.calls["close"] == 1


async def test_nvml_missing_is_one_line_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    source = ReplaySource(recording())
    source.fail_open("nvmlInit failed: NVML Shared Library Not Found")
    probe = collector(source)
    try:
        empty = [await probe.collect() for _ in range(3)]
        assert all(not c.entities and "Shared Library Not Found" in c.problems[0] for c in empty)
        assert len(lines(caplog, "NVML unavailable")) == 1
        source.fail_open(None)
        back = await probe.collect()
    finally:
        await probe.close()
    assert value(gpu(back), POWER) is not None
    assert len(lines(caplog, "NVML is available again")) == 1


async def test_lost_gpu_is_failed_the_others_unaffected(caplog: pytest.LogCaptureFixture) -> None:
    source = ReplaySource(recording(), copies=2)
    probe = collector(source)
    try:
        await probe.collect()
        source.fail("*", "GPU is lost", gpu=1)
        lost = [await probe.collect() for _ in range(3)]
        source.clear_failures()
        back = await probe.collect()
    finally:
        await probe.close()
    for cycle in lost:
        assert value(gpu(cycle, 1), "hw.status", {"hw.state": "failed"}) == 1
        assert value(gpu(cycle, 1), POWER) is None
        assert value(gpu(cycle, 0), POWER) is not None
        assert value(gpu(cycle, 0), "hw.status", {"hw.state": "ok"}) == 1
        assert "GPU 1: GPU is lost" in cycle.problems
        assert all(p.attributes["hw.id"] != gpu(cycle, 1).attributes["hw.id"] for p in cycle.processes())
    assert len(lines(caplog, "reporting it as failed")) == 1
    assert value(gpu(back, 1), "hw.status", {"hw.state": "ok"}) == 1
    assert len(lines(caplog, "answers again")) == 1


async def test_permission_denied_is_logged_once_and_not_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    source = ReplaySource(recording())
    source.fail("bar1", "Insufficient Permissions")
    cycles = await run_cycles(source, 3)
    assert len(lines(caplog, "bar1: permission denied")) == 1
    assert source.calls["bar1"] == 1
    assert all(value(gpu(c), "gputally.gpu.bar1.usage") is None for c in cycles)
    assert all(value(gpu(c), "hw.gpu.memory.usage") is not None for c in cycles)


async def test_unsupported_calls_are_asked_once() -> None:
    source = ReplaySource(recording())
    data_fields = recording()["snapshots"][0]["field_values"]
    await run_cycles(source, 3)
    assert source.calls["fan"] == 0  # never part of a cycle
    assert source.calls["pcie_tx_kbs"] == 0 and source.calls["pcie_rx_kbs"] == 0  # the 20 ms blocking call
    assert source.calls["energy_mj"] == 0  # the 3.3 ms call: energy comes with the field batch
    assert source.calls["field_values"] == 3
    assert "NVML_FI_DEV_PCIE_COUNT_TX_BYTES" not in data_fields


async def test_transient_error_is_logged_once_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    source = ReplaySource(recording())
    source.fail("temp_gpu", "Unknown Error", times=2)
    cycles = await run_cycles(source, 3)
    assert [value(gpu(c), "hw.temperature", {"hw.sensor_location": "gpu"}) for c in cycles] == [None, None, 36]
    assert len(lines(caplog, "temp_gpu failed: Unknown Error")) == 1
    assert source.calls["temp_gpu"] == 3


async def test_driver_gone_means_nvml_is_initialised_again() -> None:
    source = ReplaySource(recording())
    source.fail("utilization", "Driver Not Loaded", times=1)
    cycles = await run_cycles(source, 3)
    assert source.calls["open"] == 2
    assert value(gpu(cycles[0]), "hw.status", {"hw.state": "failed"}) == 1
    assert value(gpu(cycles[2]), "hw.status", {"hw.state": "ok"}) == 1


async def test_failed_field_batch_keeps_the_other_readings() -> None:
    source = ReplaySource(recording())
    source.fail("field_values", "Unknown Error")
    (cycle,) = await run_cycles(source, 1)
    assert value(gpu(cycle), "hw.energy") is None
    assert value(gpu(cycle), POWER) == pytest.approx(362.431)  # the direct call stands in


class _Stuck(ReplaySource):
    """GPU 1 hangs in its first call until released, as a GPU falling off the bus can."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data, copies=2)
        self.release = threading.Event()
        self.entered = 0

    def read(self, gpu: Gpu, reading: Any) -> Any:
        if gpu.index == 1:
            self.entered += 1
            self.release.wait(10)
        return super().read(gpu, reading)


async def test_a_hung_gpu_is_skipped_without_piling_up_threads(caplog: pytest.LogCaptureFixture) -> None:
    source = _Stuck(recording())
    probe = collector(source, budget_s=0.2)
    try:
        first = await probe.collect()
        second = await probe.collect()
        assert value(gpu(first, 0), POWER) is not None and value(gpu(second, 0), POWER) is not None
        assert [e.attributes["gputally.gpu.index"] for e in first.gpus()] == [0]
        assert "GPU 1: reads took over 0.2 s; skipped" in first.problems
        assert "GPU 1: an earlier read has not returned; skipped" in second.problems
        assert source.entered == 1  # the second cycle did not start another read on GPU 1
        assert len(lines(caplog, "took over")) == 1
    finally:
        source.release.set()
        await probe.close()
