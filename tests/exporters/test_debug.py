"""The ``debug`` exporter's output at each verbosity, and that it never stalls the event loop."""

from __future__ import annotations

import asyncio
import io
import time
from dataclasses import replace

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.errors import Refused
from gputally.exporters.debug.config import DebugConfig
from gputally.exporters.debug.exporter import create_exporter, render
from gputally.exporters.debug.render import render_chunks
from gputally.otlp.batch import Batch, Signal

M, L, T = Signal.METRICS, Signal.LOGS, Signal.TRACES


NOW = 1_764_557_248_123_000_000  # 2025-12-01T02:47:28.123Z


def test_basic_is_one_line_per_batch_with_time_exporter_and_pipeline(make_batch) -> None:
    assert render(make_batch(M, items=3), "basic", exporter="debug/x", pipeline="metrics/gpu", now_ns=NOW) == (
        "2025-12-01T02:47:28.123Z debug/x pipeline=metrics/gpu metrics: 1 resource, 3 data points\n")
    assert render(make_batch(L, items=1), "basic", now_ns=NOW) == "2025-12-01T02:47:28.123Z debug logs: 1 resource, 1 log record\n"
    assert render(make_batch(T, items=2), "basic", now_ns=NOW).endswith(" traces: 1 resource, 2 spans\n")


def test_normal_is_one_compact_line_per_point_and_record(make_batch) -> None:
    metrics = render(make_batch(M, items=2, tag="gpu0"), "normal", now_ns=NOW).splitlines()
    assert metrics[1:] == [
        "resource {tag=gpu0}",
        "  gpu.utilization.gpu0 0 2023-11-14T22:13:20.000Z",
        "  gpu.utilization.gpu0 1 2023-11-14T22:13:20.000Z",
    ]
    logs = render(make_batch(L, items=2, tag="x"), "normal", now_ns=NOW).splitlines()
    assert logs[2:] == ["  - INFO x line 0", "  - INFO x line 1"]
    spans = render(make_batch(T, items=1, tag="s"), "normal", now_ns=NOW).splitlines()
    assert spans[2] == ("  s-0 trace_id=000102030405060708090a0b0c0d0e0f span_id=0000000000000001 duration=2.000ms"
                        " 1970-01-01T00:00:00.000Z")


def test_normal_shows_values_units_attributes_and_keeps_a_record_on_one_line() -> None:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add(name="hw.power", unit="W")
    point = metric.gauge.data_points.add(as_double=683.843, time_unix_nano=NOW)
    point.attributes.add(key="hw.id", value={"string_value": "GPU-1"})
    counter = request.resource_metrics[0].scope_metrics[0].metrics.add(name="hw.errors", unit="{error}")
    counter.sum.data_points.add(as_int=3, time_unix_nano=NOW)
    lines = render(Batch(M, message=request), "normal", now_ns=NOW).splitlines()
    assert lines[2:] == ["  hw.power{hw.id=GPU-1} 683.843 W 2025-12-01T02:47:28.123Z",
                         "  hw.errors 3 {error} 2025-12-01T02:47:28.123Z"]
    logs = ExportLogsServiceRequest()
    record = logs.resource_logs.add().scope_logs.add().log_records.add(
        severity_text="WARN", time_unix_nano=NOW, body={"string_value": "first\nsecond " + "x" * 300})
    record.attributes.add(key="pid", value={"int_value": 42})
    (line,) = render(Batch(L, message=logs), "normal", now_ns=NOW).splitlines()[2:]
    assert line.startswith("  2025-12-01T02:47:28.123Z WARN first\\nsecond xxx")
    assert line.endswith("... (154 more characters) {pid=42}")


def test_detailed_is_readable_one_block_per_resource(make_batch) -> None:
    chunks = list(render_chunks(make_batch(T, items=1, tag="d"), "detailed", now_ns=NOW))
    text = "".join(chunks)
    assert len(chunks) == 2 and chunks[1].startswith("ResourceSpans #0\n")
    assert "     -> tag: Str(d)" in text
    assert "    Trace ID       : 000102030405060708090a0b0c0d0e0f" in text
    assert "    Parent ID      : abababababababab" in text
    assert "    End time       : 1970-01-01T00:00:00.002Z" in text
    assert "\\" not in text  # no octal-escaped bytes
    metrics = render(make_batch(M, items=2, tag="d"), "detailed", now_ns=NOW)
    assert "     -> Name: gpu.utilization.d" in metrics and "Timestamp: 2023-11-14T22:13:20.000Z" in metrics
    assert metrics.count("DataPoint #") == 2


async def test_each_batch_names_the_pipelines_of_its_signal(make_batch, context) -> None:
    stream = io.StringIO()
    ctx = replace(context("debug"), pipelines={"metrics/gpu": M, "logs": L})
    exporter = create_exporter(DebugConfig(verbosity="basic"), ctx, stream=stream)
    await exporter.start()
    await exporter.export(make_batch(M, items=1))
    await exporter.shutdown()
    assert " debug pipeline=metrics/gpu metrics: 1 resource, 1 data point\n" in stream.getvalue()


async def test_export_writes_counts_and_refuses_after_shutdown(make_batch, context, counted) -> None:
    stream = io.StringIO()
    exporter = create_exporter(DebugConfig(verbosity="basic"), context("debug"), stream=stream)
    assert exporter.ready
    await exporter.start()
    await exporter.export(make_batch(L, items=4))
    await exporter.export(make_batch(M, items=1))
    lines = stream.getvalue().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == ["logs: 1 resource, 4 log records", "metrics: 1 resource, 1 data point"]
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
    assert stream.getvalue().count("metrics: 1 resource, 3 data points") == 2  # written one after the other, whole
