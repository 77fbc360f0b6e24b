"""Pipeline and service wiring, with recording stand-ins for our own component interfaces."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.config.types import Strict
from gputally.errors import Refused
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, CountedRuntime, Exporter, Processor, Receiver, SharedComponents
from gputally.pipeline.config import validate
from gputally.pipeline.factory import ExporterFactory, ProcessorFactory, ReceiverFactory
from gputally.pipeline.pipeline import FanOut, Pipeline, Stage
from gputally.pipeline.registry import Registry
from gputally.pipeline.service import Service
from gputally.telemetry import SelfTelemetry


def metrics_batch(points: int = 1, name: str = "m") -> Batch:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = name
    for value in range(points):
        metric.gauge.data_points.add().as_int = value
    return Batch.decode(Signal.METRICS, request.SerializeToString())


class Recorder:
    def __init__(self) -> None:
        self.events: list[str] = []


class RecordingExporter(Exporter):
    def __init__(self, name: str = "e", recorder: Recorder | None = None, refuse: bool = False) -> None:
        self.name, self.recorder, self.refuse = name, recorder or Recorder(), refuse
        self.batches: list[Batch] = []

    async def start(self) -> None:
        self.recorder.events.append(f"start {self.name}")

    async def export(self, batch: Batch) -> None:
        if self.refuse:
            raise Refused("queue full", retry_after=2)
        self.batches.append(batch)

    async def shutdown(self) -> None:
        self.recorder.events.append(f"stop {self.name}")


class Tagger(Processor):
    """Renames every metric by appending a tag, so order is visible."""

    def __init__(self, tag: str, recorder: Recorder | None = None) -> None:
        self.tag, self.recorder = tag, recorder or Recorder()

    async def start(self) -> None:
        self.recorder.events.append(f"start {self.tag}")

    async def process(self, batch: Batch) -> Batch | None:
        for rm in batch.mutable().resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    metric.name += self.tag
        return batch

    async def shutdown(self) -> None:
        self.recorder.events.append(f"stop {self.tag}")


class Holder(Processor):
    """Holds everything until flushed, like the batch processor."""

    flush_interval = 0.05

    def __init__(self) -> None:
        self.held: list[Batch] = []

    async def process(self, batch: Batch) -> Batch | None:
        self.held.append(batch)
        return None

    async def flush(self) -> Batch | None:
        if not self.held:
            return None
        out, self.held = Batch.concat(self.held), []
        return out


class Broken(Processor):
    async def process(self, batch: Batch) -> Batch | None:
        raise RuntimeError("bug")


def names(batch: Batch) -> list[str]:
    return [m.name for rm in batch.message.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]


def stage(processor: Processor, telemetry: SelfTelemetry, stage_id: str = "p") -> Stage:
    return Stage(stage_id, processor, telemetry.for_processor(stage_id))


async def test_processors_run_in_order_and_untouched_bytes_are_forwarded() -> None:
    telemetry = SelfTelemetry()
    exporter = RecordingExporter()
    pipeline = Pipeline(
        "metrics", Signal.METRICS, [stage(Tagger("-a"), telemetry, "a"), stage(Tagger("-b"), telemetry, "b")], [("e", exporter)]
    )
    await pipeline.consume(metrics_batch(3))
    assert names(exporter.batches[0]) == ["m-a-b"]
    assert telemetry.registry.get_sample_value(
        "gputally_processor_incoming_items_total", {"processor": "b", "signal": "metrics"}
    ) == 3

    untouched = metrics_batch(2)
    raw = untouched.serialize()
    plain = Pipeline("metrics", Signal.METRICS, [], [("e", exporter)])
    await plain.consume(untouched)
    assert exporter.batches[-1].serialize() is raw


async def test_held_data_is_flushed_by_timer_and_at_shutdown() -> None:
    telemetry = SelfTelemetry()
    exporter = RecordingExporter()
    holder = Holder()
    pipeline = Pipeline("metrics", Signal.METRICS, [stage(holder, telemetry, "h"), stage(Tagger("-t"), telemetry, "t")], [("e", exporter)])
    await pipeline.start()
    await pipeline.consume(metrics_batch(1))
    await pipeline.consume(metrics_batch(2))
    assert exporter.batches == []
    for _ in range(100):
        if exporter.batches:
            break
        await asyncio.sleep(0.01)
    assert [b.items for b in exporter.batches] == [3]
    assert names(exporter.batches[0]) == ["m-t", "m-t"]
    await pipeline.consume(metrics_batch(4))
    await pipeline.shutdown()
    assert [b.items for b in exporter.batches] == [3, 4]


async def test_a_failing_processor_passes_data_on() -> None:
    telemetry = SelfTelemetry()
    exporter = RecordingExporter()
    pipeline = Pipeline("metrics", Signal.METRICS, [stage(Broken(), telemetry)], [("e", exporter)])
    await pipeline.consume(metrics_batch(2))
    await pipeline.consume(metrics_batch(2))
    assert [b.items for b in exporter.batches] == [2, 2]


async def test_refusal_from_any_exporter_reaches_the_sender() -> None:
    ok, full = RecordingExporter("ok"), RecordingExporter("full", refuse=True)
    pipeline = Pipeline("metrics", Signal.METRICS, [], [("ok", ok), ("full", full)])
    with pytest.raises(Refused) as info:
        await pipeline.consume(metrics_batch())
    assert info.value.retry_after == 2
    assert len(ok.batches) == 1


class Reader(Processor):
    """Reads every batch and hands it on unchanged (as ``usage`` or ``memory_limiter`` do)."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    async def process(self, batch: Batch) -> Batch | None:
        self.seen.append(names(batch))
        return batch


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[Batch]:
    """Every batch :meth:`Batch.copy` is called on, in order (the fan-out's copies, counted)."""
    made: list[Batch] = []
    original = Batch.copy

    def counted(self: Batch) -> Batch:
        made.append(self)
        return original(self)

    monkeypatch.setattr(Batch, "copy", counted)
    return made


def fan_out(*kinds: str) -> tuple[FanOut, list[RecordingExporter]]:
    """A fan-out over one pipeline per kind: ``tag`` changes data (tagging it with the
    pipeline's index), ``read`` only reads it, ``none`` has no processor."""
    telemetry = SelfTelemetry()
    exporters = [RecordingExporter(str(index)) for index in range(len(kinds))]
    pipelines = []
    for index, kind in enumerate(kinds):
        stages = {
            "tag": [Stage("tag", Tagger(f"-{index}"), telemetry.for_processor("tag"), mutates_data=True)],
            "read": [Stage("read", Reader(), telemetry.for_processor("read"), mutates_data=False)],
            "none": [],
        }[kind]
        pipelines.append(Pipeline(f"metrics/{index}", Signal.METRICS, stages, [(str(index), exporters[index])]))
    return FanOut(pipelines), exporters


async def test_fan_out_keeps_each_pipelines_changes_to_itself(copies: list[Batch]) -> None:
    fan, exporters = fan_out("tag", "read", "tag", "none")
    batch = metrics_batch()
    await fan.consume(batch)
    assert [names(e.batches[0]) for e in exporters] == [["m-0"], ["m"], ["m-2"], ["m"]]
    assert names(batch) == ["m"]
    assert len(copies) == 2  # one per pipeline that changes data; the readers share the batch
    assert exporters[1].batches[0] is batch and exporters[3].batches[0] is batch


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("tag",), 0),  # one pipeline takes the batch, whatever it does with it
        (("read",), 0),
        (("read", "none", "read"), 0),  # readers share it
        (("tag", "tag"), 1),  # the first of pipelines that all change data takes the batch as it is
        (("tag", "tag", "tag"), 2),
        (("read", "tag"), 1),
    ],
)
async def test_fan_out_copies_only_for_pipelines_that_change_data(
    copies: list[Batch], kinds: tuple[str, ...], expected: int
) -> None:
    fan, exporters = fan_out(*kinds)
    await fan.consume(metrics_batch())
    assert len(copies) == expected
    assert [names(e.batches[0]) for e in exporters] == [
        [f"m-{index}"] if kind == "tag" else ["m"] for index, kind in enumerate(kinds)
    ]


class _Empty(Strict):
    pass


class FakeReceiver(Receiver):
    def __init__(self, recorder: Recorder, consumers: dict[Signal, Any]) -> None:
        self.recorder, self.consumers = recorder, consumers

    async def start(self) -> None:
        self.recorder.events.append("start receiver")

    async def shutdown(self) -> None:
        self.recorder.events.append("stop receiver")


def make_fake_receiver(config: Any, context: Any, consumers: Any, *, reuse_port: bool) -> FakeReceiver:
    return FakeReceiver(Recorder(), consumers)


def tagger_factory(
    make: Callable[[ComponentContext], Processor], *, type_name: str = "tag", mutates_data: bool = True
) -> ProcessorFactory[_Empty]:
    return ProcessorFactory(type_name=type_name, config=_Empty, create=lambda c, ctx, s: make(ctx),
                            mutates_data=mutates_data)


def fake_registry(processors: dict[str, ProcessorFactory[Any]]) -> Registry:
    """A ``fake`` receiver, a ``rec`` exporter and ``processors``."""
    return Registry(
        receivers={"fake": ReceiverFactory(type_name="fake", config=_Empty, create=make_fake_receiver)},
        processors=processors,
        exporters={"rec": ExporterFactory(type_name="rec", config=_Empty, create=lambda c, ctx: RecordingExporter())},
    )


async def test_service_starts_exporters_first_and_stops_in_reverse() -> None:
    recorder = Recorder()
    receivers: list[FakeReceiver] = []

    def make_receiver(config: Any, context: Any, consumers: Any, *, reuse_port: bool) -> FakeReceiver:
        receivers.append(FakeReceiver(recorder, consumers))
        return receivers[-1]

    registry = Registry(
        receivers={"fake": ReceiverFactory(type_name="fake", config=_Empty, create=make_receiver)},
        processors={"tag": tagger_factory(lambda ctx: Tagger(ctx.id, recorder))},
        exporters={"rec": ExporterFactory(type_name="rec", config=_Empty,
                                          create=lambda c, ctx: RecordingExporter(ctx.id, recorder))},
    )
    config = validate(
        {
            "receivers": {"fake": {}},
            "processors": {"tag": {}},
            "exporters": {"rec": {}, "rec/unused": {}},
            "service": {
                "pipelines": {
                    "metrics": {"receivers": ["fake"], "processors": ["tag"], "exporters": ["rec"]},
                    "logs": {"receivers": ["fake"], "exporters": ["rec"]},
                }
            },
        },
        registry,
    )
    service = Service(config)
    assert set(service.exporters) == {"rec"}
    assert set(receivers[0].consumers) == {Signal.METRICS, Signal.LOGS}
    await service.start()
    await receivers[0].consumers[Signal.METRICS].consume(metrics_batch())
    await service.shutdown()
    await service.shutdown()
    assert recorder.events == ["start rec", "start tag", "start receiver", "stop receiver", "stop tag", "stop rec"]
    exporter = service.exporters["rec"]
    assert isinstance(exporter, RecordingExporter)
    assert names(exporter.batches[0]) == ["mtag"]


class Stale(Tagger):
    def degraded(self) -> str | None:
        return "slurmctld unreachable since 12:00; attributing from cache"


async def test_service_lists_degraded_components() -> None:
    registry = fake_registry({"stale": tagger_factory(lambda ctx: Stale("x"), type_name="stale")})
    config = validate(
        {
            "receivers": {"fake": {}},
            "processors": {"stale": {}},
            "exporters": {"rec": {}},
            "service": {"pipelines": {
                "metrics": {"receivers": ["fake"], "processors": ["stale"], "exporters": ["rec"]},
                "logs": {"receivers": ["fake"], "processors": ["stale"], "exporters": ["rec"]},
            }},
        },
        registry,
    )
    service = Service(config)
    # one entry per processor ID, not one per pipeline: its instances share one runtime
    assert service.degraded() == {"stale": "slurmctld unreachable since 12:00; attributing from cache"}
    logs_stage = service.pipelines["logs"].stages[0]
    assert isinstance(logs_stage.processor, Stale)
    logs_stage.processor.degraded = lambda: "something else"  # type: ignore[method-assign]
    assert service.degraded() == {"metrics/stale": "slurmctld unreachable since 12:00; attributing from cache",
                                  "logs/stale": "something else"}
    assert service.not_ready() == ["starting"]  # degraded is not unready; not started yet is
    await service.start()
    assert service.ready and service.not_ready() == []
    await service.shutdown()
    assert service.not_ready() == ["shutting down"]


async def test_every_component_of_a_service_gets_the_same_shared_store() -> None:
    stores: list[SharedComponents] = []

    def make_processor(ctx: ComponentContext) -> Tagger:
        stores.append(ctx.shared)
        return Tagger(ctx.id)

    registry = fake_registry({"tag": tagger_factory(make_processor)})
    document = {
        "receivers": {"fake": {}},
        "processors": {"tag": {}},
        "exporters": {"rec": {}},
        "service": {"pipelines": {
            "metrics": {"receivers": ["fake"], "processors": ["tag"], "exporters": ["rec"]},
            "logs": {"receivers": ["fake"], "processors": ["tag"], "exporters": ["rec"]},
        }},
    }
    Service(validate(document, registry))
    Service(validate(document, registry))
    assert len(stores) == 4
    assert stores[0] is stores[1] and stores[2] is stores[3]
    assert stores[0] is not stores[2]  # one store per service, not per process


async def test_service_copies_a_received_batch_only_for_pipelines_whose_processors_change_it(
    copies: list[Batch],
) -> None:
    registry = fake_registry({
        "tag": tagger_factory(lambda ctx: Tagger("-t")),
        "read": tagger_factory(lambda ctx: Reader(), type_name="read", mutates_data=False),
    })
    document = {
        "receivers": {"fake": {}},
        "processors": {"tag": {}, "read": {}},
        "exporters": {"rec": {}},
        "service": {"pipelines": {
            "metrics/read": {"receivers": ["fake"], "processors": ["read"], "exporters": ["rec"]},
            "metrics/plain": {"receivers": ["fake"], "exporters": ["rec"]},
            "metrics/changed": {"receivers": ["fake"], "processors": ["read", "tag"], "exporters": ["rec"]},
            "logs": {"receivers": ["fake"], "processors": ["tag"], "exporters": ["rec"]},
        }},
    }
    service = Service(validate(document, registry))
    assert {pid: p.mutates_data for pid, p in service.pipelines.items()} == {
        "metrics/read": False, "metrics/plain": False, "metrics/changed": True, "logs": True,
    }
    receiver = service.receivers["fake"]
    assert isinstance(receiver, FakeReceiver)
    batch = metrics_batch()
    await receiver.consumers[Signal.METRICS].consume(batch)
    assert copies == [batch]  # for metrics/changed, the one pipeline that changes data
    exporter = service.exporters["rec"]
    assert isinstance(exporter, RecordingExporter)
    assert sorted(names(b)[0] for b in exporter.batches) == ["m", "m", "m-t"]
    logs = Batch.decode(Signal.LOGS, b"")
    await receiver.consumers[Signal.LOGS].consume(logs)
    assert copies == [batch]  # the logs pipeline is the only one: it takes the batch as it is


class _Counted(CountedRuntime):
    def __init__(self, *, fail_first: bool = False) -> None:
        super().__init__()
        self.events: list[str] = []
        self.fail_first = fail_first

    async def _start_work(self) -> None:
        if self.fail_first:
            self.fail_first = False
            raise OSError("disk not there yet")
        self.events.append("start")

    async def _stop_work(self) -> None:
        self.events.append("stop")


async def test_a_counted_runtime_starts_with_its_first_user_and_stops_with_its_last() -> None:
    runtime = _Counted()
    await runtime.release()  # before any acquire: nothing
    await runtime.acquire()
    await runtime.acquire()
    await runtime.release()
    assert runtime.events == ["start"] and runtime.users == 1
    await runtime.release()
    await runtime.release()  # one release too many: nothing
    assert runtime.events == ["start", "stop"] and runtime.users == 0


async def test_a_counted_runtime_whose_start_failed_starts_at_the_next_acquire() -> None:
    runtime = _Counted(fail_first=True)
    with pytest.raises(OSError):
        await runtime.acquire()
    assert runtime.users == 0
    await runtime.acquire()
    assert runtime.events == ["start"] and runtime.users == 1
