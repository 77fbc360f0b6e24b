"""The probe's delivery tally: told by the exporter, awaited by ``--once``."""

from __future__ import annotations

import asyncio

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.otlp.batch import Batch, Signal
from gputally.probes.delivery.exporter import DeliveryTally


def metrics_batch(points: int) -> Batch:
    message = ExportMetricsServiceRequest()
    gauge = message.resource_metrics.add().scope_metrics.add().metrics.add(name="m").gauge
    for n in range(points):
        gauge.data_points.add(as_int=n)
    return Batch(Signal.METRICS, message=message)


async def test_wait_settled_wakes_when_the_exporter_settles_the_last_item() -> None:
    tally = DeliveryTally(lambda signal, error: None)
    await asyncio.wait_for(tally.wait_settled(), 1)  # nothing handed over: settled at once
    batch = metrics_batch(3)
    tally.handed(batch)
    waiter = asyncio.create_task(tally.wait_settled())
    tally.settled(Signal.METRICS, 2, 0, None)
    await asyncio.sleep(0)
    assert not waiter.done() and not tally.is_settled()
    tally.settled(Signal.METRICS, batch.items - 2, 0, None)
    await asyncio.wait_for(waiter, 1)
    assert tally.is_settled() and not tally.failed()
    assert tally.summary() == f"sent {batch.items} points, 0 log records; failed 0"


async def test_logs_a_server_has_no_pipeline_for_are_no_failure() -> None:
    tally = DeliveryTally(lambda signal, error: None)
    tally.settled(Signal.LOGS, 0, 4, RuntimeError("UNIMPLEMENTED: no logs pipeline"))
    assert tally.logs_unimplemented and not tally.failed()
    tally.settled(Signal.METRICS, 0, 1, RuntimeError("UNAVAILABLE"))
    assert tally.failed()
