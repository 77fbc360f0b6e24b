"""What happens to a batch when a processor raises: each processor kind's declared policy."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import Exporter, FailurePolicy, Processor, ProcessorFailed
from gputally.pipeline.pipeline import Pipeline, Stage
from gputally.pipeline.registry import Registry
from gputally.processors.filter import FilterProcessor
from gputally.receiver.otlp.intake import Intake
from gputally.receiver.otlp.status import Failure
from gputally.telemetry import SelfTelemetry


def request(points: int = 2) -> Batch:
    message = ExportMetricsServiceRequest()
    metric = message.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = "gpu.secret"
    for value in range(points):
        metric.gauge.data_points.add().as_int = value
    return Batch.decode(Signal.METRICS, message.SerializeToString())


class Collecting(Exporter):
    def __init__(self) -> None:
        self.batches: list[Batch] = []

    async def export(self, batch: Batch) -> None:
        self.batches.append(batch)


class Broken(Processor):
    def __init__(self, policy: FailurePolicy) -> None:
        self.on_failure = policy

    async def process(self, batch: Batch) -> Batch | None:
        raise ZeroDivisionError("a bug")


def line(processor: Processor, telemetry: SelfTelemetry) -> tuple[Pipeline, Collecting]:
    exporter = Collecting()
    stage = Stage("p", processor, telemetry.for_processor("p"))
    return Pipeline("metrics", Signal.METRICS, [stage], [("e", exporter)], registry=telemetry.registry), exporter


def failed(telemetry: SelfTelemetry, outcome: str) -> float:
    labels = {"processor": "p", "signal": "metrics", "outcome": outcome}
    return telemetry.registry.get_sample_value("gputally_processor_failed_items_total", labels) or 0.0


async def test_pass_hands_the_batch_on_unchanged_and_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    telemetry = SelfTelemetry()
    pipeline, exporter = line(Broken(FailurePolicy.PASS), telemetry)
    with caplog.at_level(logging.ERROR):
        await pipeline.consume(request())
        await pipeline.consume(request())
    assert [b.items for b in exporter.batches] == [2, 2]
    assert failed(telemetry, "passed") == 4
    assert len([r for r in caplog.records if "processor p failed" in r.getMessage()]) == 1  # logged once


async def test_drop_acknowledges_and_passes_nothing_on() -> None:
    telemetry = SelfTelemetry()
    pipeline, exporter = line(Broken(FailurePolicy.DROP), telemetry)
    await pipeline.consume(request())
    assert exporter.batches == []
    assert failed(telemetry, "dropped") == 2


async def test_refuse_answers_the_sender_and_passes_nothing_on() -> None:
    telemetry = SelfTelemetry()
    pipeline, exporter = line(Broken(FailurePolicy.REFUSE), telemetry)
    with pytest.raises(ProcessorFailed):
        await pipeline.consume(request())
    assert exporter.batches == []
    assert failed(telemetry, "refused") == 2


def filter_processor(**extra: Any) -> FilterProcessor:
    factory = Registry.discover().processors["filter"]
    config = factory.parse({"metrics": {"exclude": {"match_type": "strict", "metric_names": ["gpu.secret"]}}, **extra})
    return FilterProcessor(config, signal=Signal.METRICS)


@pytest.mark.parametrize(("extra", "outcome"), [({}, "refused"), ({"on_failure": "drop"}, "dropped")])
async def test_a_failing_filter_never_leaks_what_it_should_drop(
    monkeypatch: pytest.MonkeyPatch, extra: dict[str, Any], outcome: str
) -> None:
    processor = filter_processor(**extra)

    def bug(batch: Batch) -> bool:
        raise KeyError("a bug in the filter")

    monkeypatch.setattr(processor, "_filter", bug)
    telemetry = SelfTelemetry()
    pipeline, exporter = line(processor, telemetry)
    try:
        await pipeline.consume(request())
    except ProcessorFailed:
        assert outcome == "refused"
    else:
        assert outcome == "dropped"
    assert exporter.batches == [], "data the filter was meant to drop was passed on"
    assert failed(telemetry, outcome) == 2


def test_policies_by_processor_kind() -> None:
    from gputally.processors.batch import BatchProcessor

    assert filter_processor().on_failure is FailurePolicy.REFUSE  # removes data: never leak it
    assert filter_processor(on_failure="drop").on_failure is FailurePolicy.DROP
    assert Processor.on_failure is FailurePolicy.PASS  # attribution (k8s, slurm, dcgm), usage: pass unchanged
    assert BatchProcessor.on_failure is FailurePolicy.PASS


async def test_the_receiver_answers_a_refusing_processor_with_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Consumer:
        async def consume(self, batch: Batch) -> None:
            raise ProcessorFailed("processor filter failed")

    telemetry = SelfTelemetry()
    intake = Intake(name="otlp", consumers={Signal.METRICS: Consumer()},
                    metrics=telemetry.for_receiver("otlp", "http"), auth=None)
    with caplog.at_level(logging.ERROR):
        outcome = await intake.deliver(Signal.METRICS, request)
    assert isinstance(outcome, Failure)
    assert (outcome.http_status, outcome.grpc_code.name) == (500, "INTERNAL")
    assert not caplog.records, "the pipeline logs the cause once; the receiver adds no traceback per request"
