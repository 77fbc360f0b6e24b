"""GPM profiling metrics on Hopper (recorded), and their clean absence without GPM (constructed)."""

from __future__ import annotations

import pytest

from gputally.probes.nvml.gpm import IoTotals, gpm_points, link_rates
from gputally.probes.nvml.replay import ReplaySource
from tests.probes.nvml.helpers import gpu, recording, run_cycles, value, values, without_gpm

MIB = 1024 * 1024


async def test_gpm_metrics_as_ratios_and_bytes_per_second() -> None:
    (cycle,) = await run_cycles(ReplaySource(recording()), 1)
    g = gpu(cycle)
    assert value(g, "gputally.gpu.graphics.activity") == pytest.approx(0.9959747627886372)
    assert value(g, "gputally.gpu.sm.activity") == pytest.approx(0.9614865055005619)
    assert value(g, "gputally.gpu.sm.occupancy") == pytest.approx(0.14209134741742691)
    assert value(g, "gputally.gpu.tensor.activity") == pytest.approx(0.9331077389771195)
    assert value(g, "gputally.gpu.dram.activity") == pytest.approx(0.17497494847735062)
    hmma = value(g, "gputally.gpu.pipe.activity", {"gputally.gpu.pipe": "tensor_hmma"})
    assert hmma == pytest.approx(0.9331077217554758)
    assert value(g, "gputally.gpu.pipe.activity", {"gputally.gpu.pipe": "fp64"}) == 0.0
    pcie_tx = {"gputally.gpu.link": "pcie", "network.io.direction": "transmit"}
    assert value(g, "gputally.gpu.link.throughput", pcie_tx) == pytest.approx(5.849076476125697 * MIB)


async def test_gpu_io_counter_integrates_gpm_rates_over_each_window() -> None:
    cycles = await run_cycles(ReplaySource(recording()), 2)
    rx = {"network.io.direction": "receive", "gputally.gpu.link": "pcie"}
    first, second = (value(gpu(c), "hw.gpu.io", rx) for c in cycles)
    assert first == 0
    window_s = (cycles[1].time_ns - cycles[0].time_ns) / 1e9
    second_rate = recording()["snapshots"][1]["gpm_1s"]["21"]["value"] * MIB
    assert second == pytest.approx(second_rate * window_s, rel=0.01, abs=1)


def test_io_totals_accumulate() -> None:
    io = IoTotals()
    key = ("pcie", "receive")
    assert io.update({key: 1000.0}, 0) == {key: 0}
    assert io.update({key: 1000.0}, 2_000_000_000) == {key: 2000}
    assert io.update({key: 500.0}, 3_000_000_000) == {key: 2500}


def test_refused_gpm_metric_is_left_out() -> None:
    gpm = {"2": {"name": "smutil", "ret": 0, "value": 50.0}, "3": {"name": "smocc", "ret": 3, "value": 0.0}}
    assert [p.metric.name for p in gpm_points(gpm)] == ["gputally.gpu.sm.activity"]
    assert link_rates(gpm) == {}


async def test_without_gpm_support_no_profiling_points_and_no_gpm_calls() -> None:
    source = ReplaySource(without_gpm(recording()))
    cycles = await run_cycles(source, 2)
    names = {p.metric.name for p in gpu(cycles[1]).points}
    assert not {n for n in names if n.endswith((".activity", ".occupancy", ".throughput"))} - {
        "gputally.gpu.memory.activity"
    }
    assert values(gpu(cycles[1]), "hw.gpu.io") == {}
    assert source.calls["gpm"] == 0
    assert value(gpu(cycles[1]), "hw.gpu.utilization", {"hw.gpu.task": "general"}) == 0.0  # the rest is there


async def test_gpm_refused_by_the_driver_is_not_asked_again() -> None:
    data = recording()
    for snapshot in data["snapshots"]:
        snapshot["gpm_1s"] = {"nvml_error": "Not Supported"}
    source = ReplaySource(data)
    cycles = await run_cycles(source, 3)
    assert source.calls["gpm"] == 1  # the priming call at open, then never again
    assert value(gpu(cycles[2]), "gputally.gpu.sm.activity") is None
    assert value(gpu(cycles[2]), "hw.status", {"hw.state": "ok"}) == 1
