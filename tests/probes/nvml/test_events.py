"""NVML events: XIDs become log records and hw.errors counts, without blocking the cycle."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from gputally.probes.core.model import Severity
from gputally.probes.nvml.errors import NvmlCallFailed
from gputally.probes.nvml.events import EventPump
from gputally.probes.nvml.replay import ReplaySource
from gputally.probes.nvml.source import GpuEvent
from tests.probes.nvml.helpers import GPU_UUID, collector, gpu, recording, value

XID = {"error.type": "xid", "gputally.gpu.xid": 79}


async def wait_for_events(probe, source, count: int):  # type: ignore[no-untyped-def]
    """Collect until ``count`` event logs arrived (the event thread hands them over asynchronously)."""
    deadline = time.monotonic() + 5
    seen = []
    while time.monotonic() < deadline:
        cycle = await probe.collect()
        seen.append(cycle)
        if sum(1 for c in seen for e in c.logs if e.event_name != "gputally.gpu.snapshot") >= count:
            return seen
        await asyncio.sleep(0.02)
    raise AssertionError("events did not arrive")


async def test_xid_becomes_a_log_record_and_a_counter() -> None:
    source = ReplaySource(recording())
    probe = collector(source, events=True, event_slice_ms=20)
    try:
        await probe.collect()
        source.inject_event(0, "xid", 79)
        cycles = await wait_for_events(probe, source, 1)
        (entry,) = [e for e in cycles[-1].logs if e.event_name == "gputally.gpu.xid"]
        assert entry.severity is Severity.ERROR
        assert "XID 79" in entry.body and "fallen off the bus" in entry.body
        assert entry.attributes["gputally.gpu.xid"] == 79
        assert entry.entity.attributes["hw.id"] == GPU_UUID
        assert value(gpu(cycles[-1]), "hw.errors", XID) == 1
        source.inject_event(0, "xid", 79)
        source.inject_event(0, "ecc_uncorrected", 0)
        cycles = await wait_for_events(probe, source, 2)
        last = gpu(cycles[-1])
        assert value(last, "hw.errors", XID) == 2  # cumulative since the probe started
        start = next(p.start_ns for p in last.points if p.metric.name == "hw.errors" and dict(p.attributes) == XID)
        assert start is not None
    finally:
        await probe.close()


async def test_recorded_events_fire_with_their_snapshot() -> None:
    data = recording()
    data["snapshots"][1]["events"] = [{"kind": "xid", "data": 48}]
    source = ReplaySource(data)
    probe = collector(source, events=True, event_slice_ms=20)
    try:
        await probe.collect()
        await probe.collect()
        cycles = await wait_for_events(probe, source, 1)
        logs = [e for c in cycles for e in c.logs if e.event_name == "gputally.gpu.xid"]
        assert logs[0].attributes["gputally.gpu.xid"] == 48 and "double-bit ECC" in logs[0].body
    finally:
        await probe.close()


async def test_events_never_block_the_cycle() -> None:
    source = ReplaySource(recording())
    probe = collector(source, events=True, event_slice_ms=700)  # the event thread sits in 0.7 s waits
    try:
        started = time.perf_counter()
        for _ in range(3):
            await probe.collect()
        assert time.perf_counter() - started < 0.3
    finally:
        await probe.close()


async def test_no_event_support_is_one_line_and_collection_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    source = ReplaySource(recording())
    source.fail("watch_events", "Not Supported")
    probe = collector(source, events=True)
    caplog.set_level(logging.INFO, logger="gputally.probes")
    try:
        cycles = [await probe.collect() for _ in range(3)]
    finally:
        await probe.close()
    assert len([r for r in caplog.records if "events unavailable" in r.getMessage()]) == 1
    assert all(value(gpu(c), "hw.power") is not None for c in cycles)


class _Watch:
    def __init__(self) -> None:
        self.calls = 0
        self.closed = threading.Event()

    def wait(self, timeout_ms: int) -> list[GpuEvent]:
        self.calls += 1
        if self.calls == 1:
            raise NvmlCallFailed("event_wait", 999)
        time.sleep(timeout_ms / 1000)
        return [GpuEvent(gpu_uuid="GPU-x", kind="xid", data=13, time_ns=1)]

    def close(self) -> None:
        self.closed.set()


def test_pump_survives_a_failed_wait_and_closes_its_set_on_stop() -> None:
    watch = _Watch()
    pump = EventPump(watch, slice_ms=10)
    pump.start()
    deadline = time.monotonic() + 5
    events: list[GpuEvent] = []
    while not events and time.monotonic() < deadline:
        events = pump.drain()
        time.sleep(0.01)
    pump.stop()
    assert events and events[0].data == 13
    assert watch.closed.wait(2)
