"""Every registered processor of this package starts and stops by the component contract."""

from __future__ import annotations

import asyncio
import importlib
from importlib.metadata import entry_points
from typing import Any

import pytest

from gputally.otlp.batch import Signal
from gputally.pipeline.component import Processor
from gputally.pipeline.factory import ProcessorFactory
from tests.processors.builders import context, metric, metrics_batch, resource_metrics

# The smallest valid config of each processor built here.
MINIMAL: dict[str, Any] = {
    "attributes": {"actions": [{"key": "k", "value": "v", "action": "insert"}]},
    "filter": {},
    "batch": {"send_batch_size": 0},
    "memory_limiter": {"limit_mib": 1 << 20},
    # An unreachable slurmrestd: the lifecycle must not depend on Slurm being there.
    "slurm": {"backend": "slurmrestd", "slurmrestd": {"endpoint": "http://127.0.0.1:9", "token": "x"}},
}


def registered() -> dict[str, ProcessorFactory[Any]]:
    found = {ep.name: ep.load() for ep in entry_points(group="gputally.processors")}
    return {name: found[name] for name in MINIMAL if name in found}


def test_every_processor_is_registered_under_its_type() -> None:
    factories = registered()
    assert sorted(factories) == sorted(MINIMAL)
    assert all(f.type_name == name and isinstance(f, ProcessorFactory) for name, f in factories.items())
    assert all(f.signals == frozenset(Signal) for f in factories.values())


@pytest.mark.parametrize("name", sorted(MINIMAL))
@pytest.mark.parametrize("signal", list(Signal))
async def test_lifecycle(name: str, signal: Signal) -> None:
    factory = registered()[name]
    proc = factory.create(factory.parse(MINIMAL[name]), context(name), signal)
    assert isinstance(proc, Processor)
    await asyncio.wait_for(proc.shutdown(), 1)  # before start
    await asyncio.wait_for(proc.start(), 1)
    if signal is Signal.METRICS:
        out = await proc.process(metrics_batch(resource_metrics({}, [metric("gauge", "g", [{}])])))
        assert out is not None and out.items == 1
    await asyncio.wait_for(proc.shutdown(), 1)
    await asyncio.wait_for(proc.shutdown(), 1)
    assert await proc.flush() is None


PUBLIC_API = {
    "attributes": ["ActionConfig", "AttributeValue", "AttributesConfig", "AttributesProcessor", "factory"],
    "filter": [
        "AttributeMatch",
        "FilterConfig",
        "FilterProcessor",
        "LogFilter",
        "LogMatch",
        "MetricFilter",
        "MetricMatch",
        "SpanFilter",
        "SpanMatch",
        "factory",
    ],
    "batch": ["BatchConfig", "BatchProcessor", "factory"],
    "memory_limiter": ["Limits", "MemoryLimiter", "MemoryLimiterConfig", "cgroup_limit", "factory", "total_memory"],
    "slurm": sorted([
        "ATTRIBUTES", "Backend", "CacheConfig", "CliBackend", "CliConfig", "GresConfig", "JobCache", "JobInfo",
        "PyslurmBackend", "PyslurmConfig", "RestdBackend", "SlurmConfig", "SlurmError", "SlurmProcessor",
        "SlurmRuntime", "SlurmUnavailable", "SlurmrestdConfig", "factory",
    ]),
}


@pytest.mark.parametrize("name", sorted(PUBLIC_API))
def test_public_api_is_pinned(name: str) -> None:
    module = importlib.import_module(f"gputally.processors.{name}")
    assert sorted(module.__all__) == PUBLIC_API[name]
    assert all(hasattr(module, symbol) for symbol in module.__all__)
