"""The processor in a service: lifecycle, pass-through, counters on the timer and at shutdown,
events only where a logs pipeline lists it, restarts with ``storage``, self-metrics."""

from __future__ import annotations

import asyncio
import json
import math
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import gputally.processors.usage as usage
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Exporter, Processor
from gputally.pipeline.factory import ProcessorFactory
from gputally.pipeline.pipeline import Pipeline, Stage
from gputally.telemetry import SelfTelemetry
from tests.processors.usage.helpers import FakeClock, counters_of, emitted, feed, runtime
from tests.processors.usage.series import HOLDER_PID, NOTEBOOK_PID, TRAINER_PID, probe_requests, recording, with_attributes

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"
PROCESSES = {TRAINER_PID: {"k8s.namespace.name": "ml", "k8s.pod.name": "trainer-0"},
             NOTEBOOK_PID: {"k8s.namespace.name": "ml", "k8s.pod.name": "jupyter-bob-0"},
             HOLDER_PID: {"slurm.job.id": 90210}}


@pytest.fixture(scope="module")
def requests() -> list[Any]:
    raw = asyncio.run(probe_requests(recording(), base_ns=1_800_000_000 * 10**9))
    return [with_attributes(r, processes=PROCESSES, gpu={"gputally.k8s.pods": ["ml/trainer-0"],
                                                                 "gputally.k8s.pod.uids": ["ml/trainer-0/"]}) for r in raw]


def test_registered_and_declared() -> None:
    found = {ep.name: ep for ep in entry_points(group="gputally.processors")}
    assert "usage" in found, "add the usage entry point to pyproject.toml and reinstall"
    assert found["usage"].load() is usage.factory and isinstance(usage.factory, ProcessorFactory)
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["entry-points"]["gputally.processors"]["usage"] == "gputally.processors.usage:factory"
    assert "gputally.processors.usage" in project["tool"]["setuptools"]["packages"]


class Sink(Exporter):
    def __init__(self) -> None:
        self.batches: list[Batch] = []

    async def export(self, batch: Batch) -> None:
        self.batches.append(batch)


def pipeline(signal: Signal, processor: Processor, sink: Sink) -> Pipeline:
    telemetry = SelfTelemetry()
    return Pipeline(f"{signal}", signal, [Stage("usage", processor, telemetry.for_processor("usage"))],
                    [("sink", sink)])


async def test_data_passes_untouched_and_counters_follow_on_the_timer_and_at_shutdown(requests: list[Any]) -> None:
    context = ComponentContext(id="usage", telemetry=SelfTelemetry())
    config = usage.factory.parse({"emit_interval": "100ms", "settle": 0})
    metrics = usage.factory.create(config, context, Signal.METRICS)
    logs = usage.factory.create(config, context, Signal.LOGS)
    assert metrics.runtime is logs.runtime  # one ledger per processor ID
    assert metrics.flush_interval and metrics.flush_interval <= 0.2
    sink, log_sink = Sink(), Sink()
    lines = [pipeline(Signal.METRICS, metrics, sink), pipeline(Signal.LOGS, logs, log_sink)]
    for component in (metrics, logs, *lines):
        await component.start()
    sent = [r.SerializeToString() for r in requests[:5]]
    for raw in sent:
        await lines[0].consume(Batch.decode(Signal.METRICS, raw))
    assert [b.serialize() for b in sink.batches[:5]] == sent  # the probe's data goes on as it came
    await asyncio.sleep(0.5)
    timed = [b for b in sink.batches[5:] if b"gputally.usage.busy.time" in b.serialize()]
    assert timed, "no counters were sent on the timer"
    for raw in (r.SerializeToString() for r in requests[5:]):
        await lines[0].consume(Batch.decode(Signal.METRICS, raw))
    for component in (*lines, metrics, logs):
        await component.shutdown()
    await metrics.shutdown()  # twice is fine
    last = counters_of(sink.batches[-1].message)
    assert math.isclose(last["ml/trainer-0"]["allocated"], 18.331705093, rel_tol=1e-6)  # every interval, at shutdown


async def test_without_a_logs_pipeline_events_are_counted_not_kept(
    requests: list[Any], caplog: pytest.LogCaptureFixture,
) -> None:
    telemetry = SelfTelemetry()
    context = ComponentContext(id="usage/x", telemetry=telemetry)
    metrics = usage.factory.create(usage.factory.parse({"idle_after": "2s", "settle": 0}), context, Signal.METRICS)
    with caplog.at_level("INFO"):
        await metrics.start()
    assert "usage/x: in no logs pipeline" in caplog.text
    for request in requests:
        await metrics.process(Batch.decode(Signal.METRICS, request.SerializeToString()))
    await metrics.shutdown()
    registry = telemetry.registry
    raised = registry.get_sample_value("gputally_usage_events_total",
                                       {"processor": "usage/x", "event": "gputally.usage.idle"})
    assert raised and raised >= 1  # the Slurm job holding memory, at least
    every = sum(s.value for family in registry.collect() if family.name == "gputally_usage_events"
                for s in family.samples if s.name.endswith("_total"))
    assert registry.get_sample_value("gputally_usage_events_dropped_total", {"processor": "usage/x"}) == every
    assert registry.get_sample_value("gputally_usage_owners", {"processor": "usage/x"}) == 3
    assert metrics.runtime.events == []
    # The recording's requests have two shapes (before and after the notebook stops): after each
    # one's first two sightings, its requests are read through its layout.
    read = {way: registry.get_sample_value("gputally_usage_requests_read_total", {"processor": "usage/x", "way": way})
            for way in ("layout", "general")}
    assert read["layout"] and read["general"] and read["layout"] + read["general"] == len(requests)
    assert registry.get_sample_value("gputally_usage_layout_bytes", {"processor": "usage/x"}) > 0


def test_a_restart_with_storage_continues_the_counters(requests: list[Any], tmp_path: Path) -> None:
    clock = FakeClock()
    whole = runtime(clock)
    feed(whole, requests)
    want = counters_of(emitted(whole))

    first = runtime(clock, storage=tmp_path)
    asyncio.run(first.acquire())
    feed(first, requests[:4])
    before = emitted(first)
    asyncio.run(first.release())  # saves
    saved = json.loads((tmp_path / "usage-usage.json").read_text())
    assert saved["version"] == 1 and set(saved["devices"])

    again = runtime(clock, storage=tmp_path)
    asyncio.run(again.acquire())
    feed(again, requests[2:])  # the sender retries what was already counted: nothing twice
    after = emitted(again)
    got = counters_of(after)
    assert set(got) == set(want)
    for owner, counters in want.items():
        for name, value in counters.items():
            assert math.isclose(got[owner][name], value, rel_tol=1e-9, abs_tol=1e-9), (owner, name)
    starts = {tuple(sorted((kv.key, kv.value.string_value) for kv in rm.resource.attributes)):
              rm.scope_metrics[0].metrics[0].sum.data_points[0].start_time_unix_nano
              for rm in before.resource_metrics}
    for rm in after.resource_metrics:
        key = tuple(sorted((kv.key, kv.value.string_value) for kv in rm.resource.attributes))
        if key in starts:
            assert rm.scope_metrics[0].metrics[0].sum.data_points[0].start_time_unix_nano == starts[key]


def test_requests_accounted_in_batches_count_as_one_by_one(requests: list[Any]) -> None:
    """Queued requests are accounted together (64 at most, and before anything reads the
    ledger): the counters are those of accounting each request as it comes."""
    one_by_one, batched = runtime(), runtime()
    for request in requests:
        one_by_one.observe(request.SerializeToString())
        one_by_one.account()
    feed(batched, requests)
    assert batched.observer.layouts.requests == 0, "accounted before 64 requests were queued"
    assert counters_of(emitted(batched)) == counters_of(emitted(one_by_one))
    assert batched.observer.layouts.requests == len(requests)


def test_a_full_queue_is_accounted_without_waiting_for_a_read(requests: list[Any]) -> None:
    rt = runtime()
    raw = [r.SerializeToString() for r in requests]
    for n in range(65):
        rt.observe(raw[n % len(raw)])
    assert rt.observer.layouts.requests == 64  # the 65th waits for the next batch or a read
    assert rt.ledger.devices and rt.observer.layouts.requests == 65


def test_without_storage_a_restart_starts_anew_with_a_new_start_time(requests: list[Any]) -> None:
    first = runtime()
    feed(first, requests[:4])
    again = runtime()
    feed(again, requests[4:])
    assert counters_of(emitted(again))["ml/trainer-0"]["allocated"] < counters_of(emitted(first))["ml/trainer-0"][
        "allocated"] + 18.4


def test_a_state_file_that_cannot_be_read_is_set_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "usage-usage.json").write_text("{not json")
    rt = runtime(storage=tmp_path)
    asyncio.run(rt.acquire())
    assert (tmp_path / "usage-usage.json.corrupt").exists()
    assert "cannot be read" in caplog.text and not rt.ledger.devices


async def test_a_request_without_gpus_passes_unread() -> None:
    from tests.processors.builders import all_kinds, metrics_batch, resource_metrics

    metrics = usage.factory.create(usage.factory.parse({}), ComponentContext(id="usage", telemetry=SelfTelemetry()),
                                   Signal.METRICS)
    batch = metrics_batch(resource_metrics({"service.name": "api"}, all_kinds([{"route": "/"}])))
    raw = batch.serialize()
    assert await metrics.process(batch) is batch and batch.serialize() == raw
    assert not metrics.runtime.ledger.devices


def test_a_counters_first_emit_starts_at_zero_and_a_changed_owner_ends_its_old_series() -> None:
    """What keeps per-series deltas whole in a backend: a 0 at the start time on the first emit,
    and the old label set's last value when an owner's attributes grew."""
    from gputally.processors.usage.emit import MetricsEmitter
    from gputally.processors.usage.ledger import Ledger
    from gputally.processors.usage.observe import DeviceReading
    from gputally.processors.usage.owners import Owner

    book = Ledger(usage.UsageConfig(settle=0), start_ns=0)
    pod = Owner("k8s.pod", "ml/a")

    def sample(t: int, attributes: tuple[tuple[str, Any], ...]) -> None:
        book.add("GPU-0", t * 10**9, DeviceReading(utilization=1.0, allocation=((pod, attributes),),
                                                     attributes=(("hw.id", "GPU-0"),)), "", None, arrived=0.0)
        book.settle(0.0)

    def busy_points(request: Any) -> list[tuple[tuple[tuple[str, str], ...], list[tuple[int, float]]]]:
        out = []
        for rm in request.resource_metrics:
            attributes = tuple((kv.key, kv.value.string_value) for kv in rm.resource.attributes
                               if kv.key.startswith("k8s."))
            for metric in rm.scope_metrics[0].metrics:
                if metric.name == "gputally.usage.busy.time":
                    out.append((attributes, [(p.time_unix_nano, p.as_double) for p in metric.sum.data_points]))
        return out

    emitter = MetricsEmitter()
    sample(10, ())
    sample(20, ())
    (first,) = emitter.requests(book, 100 * 10**9)
    assert busy_points(first) == [((), [(10 * 10**9, 0.0), (100 * 10**9, 10.0)])]
    sample(30, (("k8s.deployment.name", "trainer"),))  # the pod's metadata arrived
    (second,) = emitter.requests(book, 200 * 10**9)
    assert busy_points(second) == [((), [(200 * 10**9, 20.0)]),
                                   ((("k8s.deployment.name", "trainer"),), [(200 * 10**9, 20.0)])]
    (third,) = emitter.requests(book, 300 * 10**9)
    assert busy_points(third) == [((("k8s.deployment.name", "trainer"),), [(300 * 10**9, 20.0)])]
