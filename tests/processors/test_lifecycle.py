"""Every registered processor starts and stops by the component contract (pipeline/component.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Processor
from gputally.pipeline.factory import ProcessorFactory
from tests.processors.builders import context, metric, metrics_batch, resource_metrics

ALL = frozenset(Signal)


@dataclass(frozen=True)
class Case:
    config: dict[str, Any] | None
    """The smallest valid config."""
    signals: frozenset[Signal]
    """The signals the factory serves."""


# Every processor registered under gputally.processors: one missing here fails the first test.
PROCESSORS = {
    "attributes": Case({"actions": [{"key": "k", "value": "v", "action": "insert"}]}, ALL),
    "filter": Case({}, ALL),
    "batch": Case({"send_batch_size": 0}, ALL),
    "memory_limiter": Case({"limit_mib": 1 << 20}, ALL),
    # An unreachable slurmrestd: the lifecycle must not depend on Slurm being there.
    "slurm": Case({"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://127.0.0.1:9", "token": "x"}}, ALL),
    # No credentials (the fixture below): the lifecycle must not depend on a cluster being there.
    "k8s": Case({"mode": "gateway"}, ALL),
    "dcgm": Case(None, frozenset({Signal.METRICS})),
    "usage": Case({}, frozenset({Signal.METRICS, Signal.LOGS})),
}


@pytest.fixture(autouse=True)
def no_kubernetes_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


def registered() -> dict[str, ProcessorFactory[Any]]:
    return {ep.name: ep.load() for ep in entry_points(group="gputally.processors")}


def test_every_registered_processor_is_listed_here_under_its_type_and_signals() -> None:
    factories = registered()
    assert sorted(factories) == sorted(PROCESSORS)
    for name, factory in factories.items():
        assert isinstance(factory, ProcessorFactory), name
        assert (factory.type_name, factory.signals) == (name, PROCESSORS[name].signals)


@pytest.mark.parametrize(
    ("name", "signal"),
    [(name, signal) for name, case in sorted(PROCESSORS.items()) for signal in sorted(case.signals)],
    ids=lambda value: str(value),
)
async def test_lifecycle(name: str, signal: Signal) -> None:
    """Safe to shut down before start and twice; start returns at once; a point passes through;
    shutdown leaves no task of the processor running and nothing held."""
    factory = registered()[name]
    proc = factory.create(factory.parse(PROCESSORS[name].config), context(name), signal)
    assert isinstance(proc, Processor)
    before = asyncio.all_tasks()
    await asyncio.wait_for(proc.shutdown(), 1)
    await asyncio.wait_for(proc.start(), 1)
    if signal is Signal.METRICS:
        out = await proc.process(metrics_batch(resource_metrics({}, [metric("gauge", "g", [{}])])))
        assert out is not None and out.items == 1
    await asyncio.wait_for(proc.shutdown(), 6)
    await asyncio.wait_for(proc.shutdown(), 1)
    await asyncio.sleep(0)
    assert [t for t in asyncio.all_tasks() - before if not t.done()] == []
    assert await proc.flush() is None
