"""Every device metric and unit conversion, checked against the recorded H200 values."""

from __future__ import annotations

import pytest

from gputally.probes.core import catalog
from gputally.probes.core.model import Kind
from gputally.probes.nvml.readings import field_number
from gputally.probes.nvml.replay import ReplaySource
from tests.probes.nvml.helpers import GPU_UUID, TIMESERIES, gpu, recording, run_cycles, value, values


@pytest.fixture
async def busy() -> object:
    """GPU 0 in the first snapshot of the two-workload recording (busy matmul + idle holder)."""
    (cycle,) = await run_cycles(ReplaySource(recording()), 1)
    return gpu(cycle)


async def test_identity_sits_on_the_gpu_resource(busy) -> None:
    assert busy.attributes == {
        "hw.id": GPU_UUID,
        "hw.type": "gpu",
        "hw.vendor": "NVIDIA",
        "hw.name": "nvidia0",
        "hw.model": "NVIDIA H200",
        "hw.serial_number": "1653824070211",
        "hw.firmware_version": "96.00.A5.00.1A",
        "hw.driver_version": "580.159.04",
        "gputally.gpu.index": 0,
        "gputally.gpu.pci.bus_id": "00000000:00:06.0",
        "gputally.gpu.architecture": "hopper",
        "gputally.gpu.compute_capability": "9.0",
        "gputally.gpu.mig.enabled": False,
        "host.name": "node-a",
    }


async def test_utilization_is_a_ratio_per_task(busy) -> None:
    assert value(busy, "hw.gpu.utilization", {"hw.gpu.task": "general"}) == pytest.approx(0.99)
    assert value(busy, "hw.gpu.utilization", {"hw.gpu.task": "encoder"}) == 0.0
    assert value(busy, "hw.gpu.utilization", {"hw.gpu.task": "decoder"}) == 0.0
    assert value(busy, "gputally.gpu.memory.activity") == pytest.approx(0.25)


async def test_memory_in_bytes_from_memory_v2(busy) -> None:
    assert value(busy, "hw.gpu.memory.usage") == 14013562880
    assert value(busy, "hw.gpu.memory.limit") == 150754820096
    assert value(busy, "hw.gpu.memory.utilization") == pytest.approx(14013562880 / 150754820096)
    assert value(busy, "gputally.gpu.memory.reserved") == 644939776


async def test_memory_falls_back_to_v1_where_v2_is_not_recorded() -> None:
    source = ReplaySource.from_file(TIMESERIES)
    (cycle,) = await run_cycles(source, 1)
    assert value(gpu(cycle), "hw.gpu.memory.usage") == 24533598208
    assert source.calls["memory_v2"] == 1 and source.calls["memory"] == 1


async def test_power_in_watts_prefers_the_instant_field(busy) -> None:
    assert value(busy, "hw.power") == pytest.approx(683.843)
    data = recording()
    for snapshot in data["snapshots"]:
        del snapshot["field_values"]["NVML_FI_DEV_POWER_INSTANT"]
    (cycle,) = await run_cycles(ReplaySource(data), 1)
    assert value(gpu(cycle), "hw.power") == pytest.approx(362.431)  # nvmlDeviceGetPowerUsage


async def test_energy_in_joules_is_a_counter_with_a_start(busy) -> None:
    assert value(busy, "hw.energy") == pytest.approx(38481.635)
    (point,) = [p for p in busy.points if p.metric.name == "hw.energy"]
    assert point.metric.kind is Kind.COUNTER and point.start_ns is not None


async def test_energy_start_time_holds_while_it_rises_and_resets_when_it_drops() -> None:
    data = recording()
    data["snapshots"][2]["field_values"]["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"]["ullVal"] = 5
    cycles = await run_cycles(ReplaySource(data), 3)
    starts = [next(p.start_ns for p in gpu(c).points if p.metric.name == "hw.energy") for c in cycles]
    assert starts[0] == starts[1] == cycles[0].time_ns
    assert starts[2] == cycles[2].time_ns  # the counter went down: a driver reload, a new series


async def test_temperatures_and_limits_in_celsius(busy) -> None:
    assert value(busy, "hw.temperature", {"hw.sensor_location": "gpu"}) == 52
    assert value(busy, "hw.temperature", {"hw.sensor_location": "memory"}) == 43
    limit = {"hw.sensor_location": "gpu"}
    assert value(busy, "hw.temperature.limit", {**limit, "hw.limit_type": "throttled"}) == 89
    assert value(busy, "hw.temperature.limit", {**limit, "hw.limit_type": "critical"}) == 95


async def test_error_counters(busy) -> None:
    errors = values(busy, "hw.errors")
    assert errors == {
        (("error.type", "ecc_corrected"),): 0,
        (("error.type", "ecc_uncorrected"),): 0,
        (("error.type", "pcie_replay"),): 0,
    }


async def test_clocks_in_hertz(busy) -> None:
    clock = "gputally.gpu.clock.frequency"
    assert value(busy, clock, {"gputally.gpu.clock.type": "sm"}) == 1_500_000_000
    assert value(busy, clock, {"gputally.gpu.clock.type": "memory"}) == 3_201_000_000
    assert value(busy, clock, {"gputally.gpu.clock.type": "graphics"}) == 1_500_000_000
    assert value(busy, clock, {"gputally.gpu.clock.type": "video"}) == 1_515_000_000
    assert value(busy, "gputally.gpu.clock.limit", {"gputally.gpu.clock.type": "sm"}) == 1_980_000_000


async def test_throttle_reasons_and_time(busy) -> None:
    points = values(busy, "gputally.gpu.clock.throttled")
    throttled = {dict(k)["gputally.gpu.clock.event_reason"]: v for k, v in points.items()}
    assert throttled["sw_power_cap"] == 1  # throttle_reasons = 4
    assert sum(throttled.values()) == 1 and len(throttled) == 9
    reason = {"gputally.gpu.clock.event_reason": "sw_power_cap"}
    assert value(busy, "gputally.gpu.clock.throttle.time", reason) == pytest.approx(45.608598208)


async def test_power_limits_pstate_bar1_pcie_and_row_remapping(busy) -> None:
    limit = "gputally.gpu.power.limit"
    assert value(busy, limit, {"gputally.gpu.power.limit_type": "enforced"}) == 700.0
    assert value(busy, limit, {"gputally.gpu.power.limit_type": "min"}) == 200.0
    assert value(busy, limit, {"gputally.gpu.power.limit_type": "max"}) == 700.0
    assert value(busy, "gputally.gpu.performance_state") == 0
    assert value(busy, "gputally.gpu.bar1.usage") == 14015332352
    assert value(busy, "gputally.gpu.bar1.limit") == 274877906944
    assert value(busy, "gputally.gpu.pcie.link.generation") == 5
    assert value(busy, "gputally.gpu.pcie.link.width") == 16
    assert value(busy, "gputally.gpu.pcie.link.generation.limit") == 5
    assert value(busy, "gputally.gpu.pcie.link.width.limit") == 16
    assert value(busy, "gputally.gpu.memory.remapped_rows", {"gputally.gpu.memory.remap_cause": "uncorrectable"}) == 0
    assert value(busy, "gputally.gpu.memory.remap.pending") == 0


async def test_status_ok_then_degraded_on_uncorrectable_ecc() -> None:
    data = recording()
    data["snapshots"][1]["field_values"]["NVML_FI_DEV_ECC_DBE_VOL_TOTAL"]["value"]["ullVal"] = 2
    first, second = await run_cycles(ReplaySource(data), 2)
    assert value(gpu(first), "hw.status", {"hw.state": "ok"}) == 1
    assert value(gpu(second), "hw.status", {"hw.state": "degraded"}) == 1
    assert value(gpu(second), "hw.status", {"hw.state": "ok"}) == 0
    assert value(gpu(second), "hw.errors", {"error.type": "ecc_uncorrected"}) == 2


async def test_refused_readings_yield_no_points(busy) -> None:
    names = {p.metric.name for p in busy.points}
    assert "hw.fan.speed" not in names
    links = {dict(k)["gputally.gpu.link"] for k in values(busy, "hw.gpu.io")}
    assert links == {"pcie", "nvlink"}  # from GPM rates: the H200 has no byte-counter fields


async def test_every_point_uses_a_catalog_metric(busy) -> None:
    assert {p.metric for p in busy.points} <= set(catalog.ALL)


def test_field_values_are_read_by_their_type() -> None:
    # a recorded SW power cap time: type 3 (unsigned long long), whose siVal is negative
    entry = recording()["snapshots"][0]["field_values"]["NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP"]
    assert field_number(entry) == 45608598208
    assert field_number({**entry, "ret": 3}) is None
    assert field_number({"ret": 0, "type": 0, "value": {"dVal": 1.5}}) == 1.5
