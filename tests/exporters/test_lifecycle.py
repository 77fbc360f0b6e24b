"""Every registered exporter starts and stops by the component contract (pipeline/component.py):
shutdown is safe before start and twice, start returns at once, a batch exported in between
reaches the backend, and shutdown stops intake and leaves no task of the exporter running. As
in the Collector, an exporter is not started again once shut down: a new one is created."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import pytest

from gputally.errors import Refused
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.pipeline.factory import ExporterFactory
from gputally.telemetry import SelfTelemetry
from support.exporting import GrpcSink, HttpSink
from tests.processors.builders import metric, metrics_batch, resource_metrics


@dataclass(frozen=True)
class Case:
    sink: type[GrpcSink] | type[HttpSink] | None
    """The backend it sends to, started on a port of the kernel's choosing; None for none."""
    config: Callable[[int], dict[str, Any] | None]
    """The smallest config that sends to the sink on that port."""


# Every exporter registered under gputally.exporters: one missing here fails the first test.
EXPORTERS = {
    "otlp": Case(GrpcSink, lambda port: {"endpoint": f"127.0.0.1:{port}", "tls": {"insecure": True}}),
    "otlphttp": Case(HttpSink, lambda port: {"endpoint": f"http://127.0.0.1:{port}"}),
    "debug": Case(None, lambda port: None),
}


@pytest.fixture(autouse=True)
def no_otlp_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The OTLP exporters read OTEL_EXPORTER_OTLP_*: none of the machine's may steer this test."""
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)


def registered() -> dict[str, ExporterFactory[Any]]:
    return {ep.name: ep.load() for ep in entry_points(group="gputally.exporters")}


def test_every_registered_exporter_is_listed_here() -> None:
    factories = registered()
    assert sorted(factories) == sorted(EXPORTERS)
    for name, factory in factories.items():
        assert isinstance(factory, ExporterFactory) and factory.type_name == name


@pytest.mark.parametrize("name", sorted(EXPORTERS))
async def test_lifecycle(name: str) -> None:
    factory, case = registered()[name], EXPORTERS[name]
    sink = await case.sink().start() if case.sink is not None else None
    try:
        config = factory.parse(case.config(sink.port if sink is not None else 0))

        def create() -> Exporter:
            context = ComponentContext(id=name, telemetry=SelfTelemetry(), shutdown_timeout=2.0)
            exporter = factory.create(config, context)
            assert isinstance(exporter, Exporter)
            return exporter

        never_started = create()
        await asyncio.wait_for(never_started.shutdown(), 1)
        await asyncio.wait_for(never_started.shutdown(), 1)

        exporter = create()
        before = asyncio.all_tasks()
        await asyncio.wait_for(exporter.start(), 1)
        batch = metrics_batch(resource_metrics({"host.name": "n"}, [metric("gauge", "g", [{}])]))
        await asyncio.wait_for(exporter.export(batch), 1)
        if sink is not None:
            calls = await sink.wait_calls(1)
            assert calls[0].body == batch.serialize()
        await asyncio.wait_for(exporter.shutdown(), 6)
        await asyncio.wait_for(exporter.shutdown(), 1)
        if sink is not None:  # intake stopped: a later batch is pushed back, not queued
            with pytest.raises(Refused):
                await exporter.export(batch)
            await sink.stop()  # the sink's own tasks end with it: what is left is the exporter's
        await asyncio.sleep(0)
        assert [t for t in asyncio.all_tasks() - before if not t.done()] == []
    finally:
        if sink is not None:
            await sink.stop()
