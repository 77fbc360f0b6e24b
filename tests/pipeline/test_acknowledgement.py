"""When a pipeline acknowledges a request: with a durable exporter, only once what the batch
processor held of it has been exported; otherwise at once, as the Collector's batch processor."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import Exporter
from gputally.pipeline.pipeline import Pipeline, Stage
from gputally.processors.batch import BatchConfig, BatchProcessor
from gputally.telemetry import SelfTelemetry


def request(points: int, resources: int = 1) -> Batch:
    message = ExportMetricsServiceRequest()
    for _ in range(resources):
        metric = message.resource_metrics.add().scope_metrics.add().metrics.add()
        metric.name = "m"
        for value in range(points):
            metric.gauge.data_points.add().as_int = value
    return Batch.decode(Signal.METRICS, message.SerializeToString())


class DiskLikeExporter(Exporter):
    """Takes batches (or refuses them) and says whether it is durable, as a queue on disk is."""

    def __init__(self, *, durable: bool) -> None:
        self._durable = durable
        self.refuse = False
        self.items = 0

    @property
    def durable(self) -> bool:
        return self._durable

    async def export(self, batch: Batch) -> None:
        if self.refuse:
            raise Refused("queue full", retry_after=1.5)
        self.items += batch.items


def pipeline(exporter: Exporter, **batch: object) -> tuple[Pipeline, BatchProcessor]:
    config = BatchConfig.model_validate({"send_batch_size": 100, "timeout": "50ms", **batch})
    processor = BatchProcessor(config, signal=Signal.METRICS)
    stage = Stage("batch", processor, SelfTelemetry().for_processor("batch"))
    return Pipeline("metrics", Signal.METRICS, [stage], [("e", exporter)]), processor


async def test_with_a_durable_exporter_a_held_request_is_acknowledged_once_exported() -> None:
    exporter = DiskLikeExporter(durable=True)
    line, processor = pipeline(exporter)
    await line.start()
    try:
        consume = asyncio.create_task(line.consume(request(10)))
        await asyncio.sleep(0.01)
        assert not consume.done(), "acknowledged while the points were only held in memory"
        assert processor.held_items == 10
        await asyncio.wait_for(consume, 1.0)
        assert exporter.items == 10, "acknowledged before the exporter had the points"
    finally:
        await line.shutdown()


async def test_without_a_durable_exporter_requests_are_acknowledged_at_once() -> None:
    exporter = DiskLikeExporter(durable=False)
    line, processor = pipeline(exporter)
    await line.start()
    try:
        await asyncio.wait_for(line.consume(request(10)), 0.02)
        assert processor.held_items == 10 and exporter.items == 0
    finally:
        await line.shutdown()
    assert exporter.items == 10


async def test_a_request_that_triggers_the_send_is_acknowledged_with_everything_held_before() -> None:
    exporter = DiskLikeExporter(durable=True)
    line, _ = pipeline(exporter, timeout="10s")
    await line.start()
    try:
        first = asyncio.create_task(line.consume(request(60)))
        await asyncio.sleep(0.01)
        assert not first.done()
        await asyncio.wait_for(line.consume(request(60)), 1.0)  # 120 >= 100: both go now
        await asyncio.wait_for(first, 1.0)
        assert exporter.items == 120
    finally:
        await line.shutdown()


async def test_a_refusal_downstream_reaches_every_sender_whose_data_was_held() -> None:
    exporter = DiskLikeExporter(durable=True)
    exporter.refuse = True
    line, _ = pipeline(exporter)
    await line.start()
    try:
        waiting = [asyncio.create_task(line.consume(request(10))) for _ in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*waiting, return_exceptions=True), 1.0)
        assert all(isinstance(r, Refused) for r in results), results
        assert all(r.retry_after == 1.5 for r in results if isinstance(r, Refused))
    finally:
        await line.shutdown()


async def test_a_request_cut_into_parts_waits_for_its_last_part() -> None:
    exporter = DiskLikeExporter(durable=True)
    line, processor = pipeline(exporter, send_batch_size=10, send_batch_max_size=10, timeout="50ms")
    await line.start()
    try:
        # Three resources of 10 points: cut into three sends, handed on one per call.
        await asyncio.wait_for(line.consume(request(10, resources=3)), 1.0)
        assert exporter.items == 30, "acknowledged before every part was exported"
        assert processor.held_items == 0
    finally:
        await line.shutdown()


@pytest.mark.parametrize("durable", [True, False])
async def test_shutdown_flushes_and_nothing_is_left_waiting(durable: bool) -> None:
    exporter = DiskLikeExporter(durable=durable)
    line, processor = pipeline(exporter, timeout="10s")
    await line.start()
    consume = asyncio.create_task(line.consume(request(10)))
    await asyncio.sleep(0.01)
    await line.shutdown()
    await asyncio.wait_for(consume, 1.0)
    assert exporter.items == 10
    assert not processor._emitted and not processor._receipts  # noqa: SLF001 - no ticket left behind


async def test_a_sender_that_goes_away_does_not_fail_the_others_in_its_batch() -> None:
    class SlowExporter(DiskLikeExporter):
        async def export(self, batch: Batch) -> None:
            await asyncio.sleep(0.05)
            await super().export(batch)

    exporter = SlowExporter(durable=True)
    line, _ = pipeline(exporter, timeout="10s")
    await line.start()
    try:
        first = asyncio.create_task(line.consume(request(60)))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(line.consume(request(60)))  # triggers the send of both
        await asyncio.sleep(0.01)
        second.cancel()  # its client went away while the batch was being exported
        await asyncio.wait_for(first, 1.0)  # the first sender is still answered: its data is kept
        assert exporter.items == 120
    finally:
        await line.shutdown()
