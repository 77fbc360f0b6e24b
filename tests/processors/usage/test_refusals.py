"""Readings no GPU can have produced, injected into the real H200 time series: each is refused
(not booked), counted and warned once, and the rest of the period is booked as the same series
without the injection books it. Every case runs on both ways of reading a request (a cached
layout, and the general parse: ``layout_cache_mib: 0``)."""

from __future__ import annotations

import asyncio
import copy
import logging
import math
from collections.abc import Callable
from typing import Any

import pytest

from gputally.processors.usage.config import UsageConfig
from gputally.processors.usage.observe import Observer
from gputally.processors.usage.owners import OwnerRules
from tests.processors.usage.helpers import FakeClock, counters_of, emitted, feed, runtime
from tests.processors.usage.series import HOLDER_PID, NOTEBOOK_PID, TRAINER_PID, probe_requests, recording, with_attributes

BASE = 1_800_000_000 * 10**9
K = 4
"""The reading the injections change (the interval from reading 3 to 4, all three workloads running)."""
TRAINER = {"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0", "k8s.pod.uid": "uid-t"}
PROCESSES = {TRAINER_PID: TRAINER, NOTEBOOK_PID: {"k8s.namespace.name": "ml", "k8s.pod.name": "nb-0", "k8s.pod.uid": "uid-n"},
             HOLDER_PID: {"slurm.job.id": 90210}}
WAYS = [pytest.param(32, id="layout"), pytest.param(0, id="general")]

Data = dict[str, Any]


def energy_mj(data: Data, i: int) -> int:
    return int(data["snapshots"][i]["field_values"]["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"]["ullVal"])


def set_energy(data: Data, i: int, value: int) -> None:
    snapshot = data["snapshots"][i]
    for union in ("ullVal", "ulVal", "sllVal", "uiVal", "siVal"):
        snapshot["field_values"]["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"][union] = value
    snapshot["dynamic"]["energy_mj"] = value


def shift_energy(data: Data, start: int, by: Callable[[int], int]) -> Data:
    out = copy.deepcopy(data)
    for i in range(start, len(out["snapshots"])):
        set_energy(out, i, by(energy_mj(data, i)))
    return out


def energy_10x(data: Data) -> Data:
    """Reading K's counter advanced ten times what it did; the counter goes on from there."""
    delta = energy_mj(data, K) - energy_mj(data, K - 1)
    return shift_energy(data, K, lambda e: e + 9 * delta)


def restarted(data: Data) -> Data:
    """The counter restarted from 0 halfway through interval K (a driver reload)."""
    half = (energy_mj(data, K) - energy_mj(data, K - 1)) // 2
    at = energy_mj(data, K - 1) + half
    return shift_energy(data, K, lambda e: e - at)


def counter_fault(data: Data) -> Data:
    """The counter went down by 1 kJ at reading K (no restart: it stays at thousands of joules)."""
    drop = energy_mj(data, K) - energy_mj(data, K - 1) + 1_000_000
    return shift_energy(data, K, lambda e: e - drop)


def clock_back(data: Data, seconds: float = 10.0) -> Data:
    """From reading K on, the node's clock is ``seconds`` behind (an NTP step back)."""
    out = copy.deepcopy(data)
    for snapshot in out["snapshots"][K:]:
        snapshot["time"] = float(snapshot["time"]) - seconds
    return out


def utilization(data: Data, percent: int, *at: int) -> Data:
    out = copy.deepcopy(data)
    for i in at or (K,):
        out["snapshots"][i]["dynamic"]["utilization"]["gpu"] = percent
    return out


def requests(data: Data, cycles: int | None = None) -> list[Any]:
    sent = asyncio.run(probe_requests(data, base_ns=BASE, cycles=cycles))
    return [with_attributes(r, processes=PROCESSES, gpu=TRAINER) for r in sent]


def book(data: Data, way: int, cycles: int | None = None) -> tuple[dict[str, dict[str, float]], dict[str, Any], Any]:
    """The owners' counters, the GPU's refused counters (reason -> (time, energy)) and the runtime."""
    rt = runtime(FakeClock(), end_after=3600, layout_cache_mib=way,
                 prices=[{"model": "NVIDIA H200*", "per_gpu_hour": 3.2}], energy_price_per_kwh=0.12)
    sent = requests(data, cycles)
    feed(rt, sent)
    out = emitted(rt)
    refused: dict[str, list[float]] = {}
    for rm in out.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name.startswith("gputally.usage.refused."):
                    for point in metric.sum.data_points:
                        reason = point.attributes[0].value.string_value
                        index = 0 if metric.name.endswith(".time") else 1
                        refused.setdefault(reason, [0.0, 0.0])[index] = point.as_double
    return counters_of(out), {"refused": refused}, rt


def minus(total: dict[str, dict[str, float]], part: dict[str, dict[str, float]], names: tuple[str, ...],
          factor: float = 1.0) -> dict[str, dict[str, float]]:
    """``total`` less ``factor`` x ``part``'s counters ``names`` (peak memory is not a sum)."""
    out = copy.deepcopy(total)
    for owner, counters in part.items():
        for name in names:
            out[owner][name] -= factor * counters[name]
    return out


def interval_k(data: Data, way: int) -> dict[str, dict[str, float]]:
    """What the uninjected series books for interval K alone."""
    upto, _, _ = book(data, way, cycles=K + 1)
    before, _, _ = book(data, way, cycles=K)
    return {o: {n: v - before.get(o, {}).get(n, 0.0) for n, v in c.items() if n != "peak"} for o, c in upto.items()}


def assert_same(got: dict[str, dict[str, float]], want: dict[str, dict[str, float]]) -> None:
    assert set(got) == set(want)
    for owner, counters in want.items():
        for name, value in counters.items():
            assert math.isclose(got[owner][name], value, rel_tol=1e-9, abs_tol=1e-6), (owner, name, got[owner][name], value)


@pytest.fixture(scope="module")
def data() -> Data:
    return recording()


def refused_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "gputally_usage_refused_total" in r.getMessage()]


@pytest.mark.parametrize("way", WAYS)
def test_the_uninjected_recording_refuses_nothing(data: Data, way: int, caplog: pytest.LogCaptureFixture) -> None:
    """The H200 drew up to 717 W by its counter against its 700 W limit: inside the margin."""
    _, gpu, rt = book(data, way)
    assert gpu["refused"] == {} and not rt.ledger.checks.counts and not refused_lines(caplog)
    if way:
        assert rt.observer.layouts.hits > 0  # the layout way was taken


@pytest.mark.parametrize("way", WAYS)
def test_ten_times_the_energy_is_refused_and_the_rest_booked(data: Data, way: int,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    base, _, _ = book(data, way)
    got, gpu, rt = book(energy_10x(data), way)
    part = interval_k(data, way)
    want = minus(base, part, ("energy",))
    for owner, counters in want.items():  # cost: energy at the price; the allocated part is unchanged
        counters["cost"] = base[owner]["cost"] - part[owner]["energy"] / 3.6e6 * 0.12
    assert_same(got, want)
    delta_j = (energy_mj(data, K) - energy_mj(data, K - 1)) / 1000
    assert gpu["refused"] == {"energy_over_power_limit": [0.0, pytest.approx(10 * delta_j)]}
    assert rt.ledger.checks.counts == {"energy_over_power_limit": 1}
    (line,) = refused_lines(caplog)
    assert "limited to 700 W" in line


@pytest.mark.parametrize("way", WAYS)
def test_a_clock_that_goes_back_loses_only_the_interval_across_the_jump(
        data: Data, way: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    base, _, _ = book(data, way)
    got, gpu, rt = book(clock_back(data), way)
    part = interval_k(data, way)
    assert_same(got, minus(base, part, ("allocated", "busy", "idle", "energy", "cost")))
    delta_j = (energy_mj(data, K) - energy_mj(data, K - 1)) / 1000
    assert gpu["refused"] == {"clock_backwards": [0.0, pytest.approx(delta_j)]}
    assert rt.ledger.checks.counts == {"clock_backwards": 1} and rt.ledger.late == 0
    (line,) = refused_lines(caplog)
    assert "clock went back" in line


@pytest.mark.parametrize("way", WAYS)
def test_a_counter_restart_books_what_it_counted_since(data: Data, way: int,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    base, _, _ = book(data, way)
    got, gpu, rt = book(restarted(data), way)
    part = interval_k(data, way)
    half = ((energy_mj(data, K) - energy_mj(data, K - 1)) - (energy_mj(data, K) - energy_mj(data, K - 1)) // 2) / 1000
    full = (energy_mj(data, K) - energy_mj(data, K - 1)) / 1000
    want = minus(base, part, ("energy",), factor=1 - half / full)
    for owner, counters in want.items():
        counters["cost"] = base[owner]["cost"] - part[owner]["energy"] * (1 - half / full) / 3.6e6 * 0.12
    assert_same(got, want)
    assert gpu["refused"] == {"energy_counter_reset": [0.0, 0.0]}  # counted and warned; nothing impossible booked
    assert rt.ledger.checks.counts == {"energy_counter_reset": 1}
    (line,) = refused_lines(caplog)
    assert "went down" in line


@pytest.mark.parametrize("way", WAYS)
def test_a_counter_that_drops_without_restarting_is_refused(data: Data, way: int) -> None:
    base, _, _ = book(data, way)
    got, gpu, _ = book(counter_fault(data), way)
    part = interval_k(data, way)
    want = minus(base, part, ("energy",))
    for owner, counters in want.items():
        counters["cost"] = base[owner]["cost"] - part[owner]["energy"] / 3.6e6 * 0.12
    assert_same(got, want)
    new_value_j = (energy_mj(data, K - 1) - 1_000_000) / 1000  # what "the new value is the delta" would book
    assert gpu["refused"] == {"energy_counter_reset": [0.0, pytest.approx(new_value_j)]}


@pytest.mark.parametrize("way", WAYS)
def test_utilization_over_100_percent_books_the_interval_busy_and_refuses_the_excess(
        data: Data, way: int, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    got, gpu, rt = book(utilization(data, 250, K, K + 2), way)
    want, _, _ = book(utilization(data, 100, K, K + 2), way)  # the most a reading can mean
    assert got == want  # exactly
    dts = [(float(data["snapshots"][i]["time"]) - float(data["snapshots"][i - 1]["time"])) for i in (K, K + 2)]
    assert gpu["refused"] == {"busy_over_wall": [pytest.approx(1.5 * sum(dts), rel=1e-6), 0.0]}
    assert rt.ledger.checks.counts == {"busy_over_wall": 2}
    assert len(refused_lines(caplog)) == 1  # once per GPU and cause


@pytest.mark.parametrize("way", WAYS)
def test_the_bound_is_the_gpus_own_limit_else_its_models_else_none(data: Data, way: int) -> None:
    """A model no table knows: the probe's power limit still refuses; without it nothing can."""
    unknown = energy_10x(data)
    unknown["device"]["name"] = "Acme X1"
    _, gpu, _ = book(unknown, way)
    assert set(gpu["refused"]) == {"energy_over_power_limit"}
    for key in ("power_limit_mw", "enforced_power_limit_mw", "power_limit_constraints"):
        unknown["device"].pop(key)
    _, gpu, _ = book(unknown, way)
    assert gpu["refused"] == {}
    known = energy_10x(data)  # an H200 that reports no limit: its model's bound (700 W)
    for key in ("power_limit_mw", "enforced_power_limit_mw", "power_limit_constraints"):
        known["device"].pop(key)
    _, gpu, _ = book(known, way)
    assert set(gpu["refused"]) == {"energy_over_power_limit"}


def test_both_ways_read_the_highest_power_limit(data: Data) -> None:
    """The probe sends the enforced limit and the range it may be set in (200-700 W): both ways
    of reading a request take the highest, the bound a GPU can be set to."""
    capped = copy.deepcopy(data)
    capped["device"]["enforced_power_limit_mw"] = capped["device"]["power_limit_mw"] = 450_000  # set below its max
    raw = requests(capped, cycles=3)[2].SerializeToString()
    observer = Observer(OwnerRules(UsageConfig().owners))
    read = [[o[2] for o in observer.observe(raw) if o[2] is not None] for _ in range(3)]
    assert observer.layouts.hits >= 1  # the second and third reads went through a layout
    assert [r[0].power_limit for r in read] == [700.0, 700.0, 700.0]


def test_what_was_refused_survives_a_restart_with_storage(data: Data, tmp_path: Any) -> None:
    """The refused counters are cumulative like the others: kept in the state file."""
    sent = requests(energy_10x(data))
    clock = FakeClock()
    first = runtime(clock, storage=tmp_path, end_after=3600)
    asyncio.run(first.acquire())
    feed(first, sent[: K + 2])
    emitted(first)
    asyncio.run(first.release())  # saves
    again = runtime(clock, storage=tmp_path, end_after=3600)
    asyncio.run(again.acquire())
    feed(again, sent[K + 2:])
    device = next(iter(again.ledger.devices.values()))
    assert set(device.refused) == {"energy_over_power_limit"} and device.refused["energy_over_power_limit"].count == 1
    assert device.power == 700.0 and device.energy_high is not None
    assert again.ledger.checks.counts == {}  # the self-metric counts since this start
