"""The ``debug`` exporter's output at each verbosity, and that it never stalls the event loop."""

from __future__ import annotations

import asyncio
import io
import time

import pytest

from gputally.errors import Refused
from gputally.exporters.config import DebugConfig
from gputally.exporters.debug import create_exporter, render
from gputally.otlp.batch import Signal

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES


def test_basic_is_one_line_per_batch(make_batch) -> None:
    assert render(make_batch(M, items=3), "basic") == "metrics: 1 resources, 3 data points\n"
    assert render(make_batch(L, items=2), "basic") == "logs: 1 resources, 2 log records\n"
    assert render(make_batch(T, items=1), "basic") == "traces: 1 resources, 1 spans\n"


def test_normal_has_a_line_per_resource_and_item(make_batch) -> None:
    metrics = render(make_batch(M, items=3, tag="gpu0"), "normal").splitlines()
    assert metrics == [
        "metrics: 1 resources, 3 data points",
        "  resource #0 tag=gpu0",
        "      gpu.utilization.gpu0 gauge points=3",
    ]
    logs = render(make_batch(L, items=2, tag="x"), "normal").splitlines()
    assert logs[2:] == ["      INFO x line 0", "      INFO x line 1"]
    spans = render(make_batch(T, items=1, tag="s"), "normal").splitlines()
    assert spans[2] == ("      s-0 trace_id=000102030405060708090a0b0c0d0e0f span_id=0000000000000001"
                        " duration=2.000ms")


def test_detailed_prints_the_whole_message(make_batch) -> None:
    text = render(make_batch(M, items=2, tag="d"), "detailed")
    assert text.startswith("metrics: 1 resources, 2 data points\n")
    assert 'name: "gpu.utilization.d"' in text
    assert text.count("data_points {") == 2 and "as_double: 1" in text


async def test_export_writes_counts_and_refuses_after_shutdown(make_batch, context, counted) -> None:
    stream = io.StringIO()
    exporter = create_exporter(DebugConfig(verbosity="basic"), context("debug"), stream=stream)
    assert exporter.ready
    await exporter.start()
    await exporter.export(make_batch(L, items=4))
    await exporter.export(make_batch(M, items=1))
    assert stream.getvalue() == "logs: 1 resources, 4 log records\nmetrics: 1 resources, 1 data points\n"
    assert counted("sent", "debug", L) == 4
    await exporter.shutdown()
    await exporter.shutdown()
    with pytest.raises(Refused):
        await exporter.export(make_batch())


class StalledTerminal(io.StringIO):
    """A stream whose writes block, like stdout piped into a full buffer."""

    def write(self, text: str) -> int:
        time.sleep(0.3)
        return super().write(text)


async def test_a_blocking_stream_does_not_stall_the_event_loop(make_batch, context) -> None:
    stream = StalledTerminal()
    exporter = create_exporter(DebugConfig(verbosity="detailed"), context("debug"), stream=stream)
    await exporter.start()
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.gather(exporter.export(make_batch(tag="1")), exporter.export(make_batch(tag="2")))
    tick.cancel()
    await exporter.shutdown()
    assert max(gaps) < 0.15
    assert stream.getvalue().count("metrics: 1 resources") == 2  # written one after the other, whole
