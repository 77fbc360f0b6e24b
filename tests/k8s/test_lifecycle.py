"""The component contract, the shared runtime of one processor ID, the public API."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import gputally.processors.k8s as k8s
from gputally.otlp.batch import Signal
from gputally.pipeline.component import Processor
from gputally.processors.k8s.processor import create

from .helpers import context, gpu_resource, metrics_batch


@pytest.fixture(autouse=True)
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


@pytest.mark.parametrize("signal", list(Signal))
async def test_lifecycle(signal: Signal) -> None:
    proc = k8s.factory.create(k8s.factory.parse({"mode": "gateway"}), context(), signal)
    assert isinstance(proc, Processor)
    await asyncio.wait_for(proc.shutdown(), 1)  # before start
    await asyncio.wait_for(proc.start(), 1)
    if signal is Signal.METRICS:
        out = await proc.process(metrics_batch(gpu_resource()))
        assert out is not None and out.items == 3
    await asyncio.wait_for(proc.shutdown(), 6)
    await asyncio.wait_for(proc.shutdown(), 1)
    assert await proc.flush() is None


async def test_pipelines_of_one_processor_id_share_one_runtime_started_once() -> None:
    ctx = context("k8s/a")
    config = k8s.factory.parse({"mode": "gateway"})
    metrics, logs = create(config, ctx, Signal.METRICS, environ={}), create(config, ctx, Signal.LOGS, environ={})
    other = create(config, context("k8s/a"), Signal.METRICS, environ={})  # another service: its own
    assert metrics.runtime is logs.runtime and other.runtime is not metrics.runtime
    await metrics.start()
    await logs.start()
    tasks = list(metrics.runtime._tasks)
    assert tasks and all(not t.done() for t in tasks)
    await metrics.shutdown()
    assert all(not t.done() for t in tasks)  # the logs pipeline still uses it
    await logs.shutdown()
    assert all(t.done() for t in tasks)


async def test_degraded_says_why_without_credentials() -> None:
    proc = k8s.factory.create(k8s.factory.parse({"mode": "gateway"}), context(), Signal.METRICS)
    assert proc.degraded() == (
        "waiting for the first pod list; attributing from cgroup and PodResources identity only"
    )
    await proc.start()
    try:
        for _ in range(200):
            if "no Kubernetes credentials" in (proc.degraded() or ""):
                break
            await asyncio.sleep(0.01)
        assert "no Kubernetes credentials" in (proc.degraded() or "")
    finally:
        await proc.shutdown()


def test_public_api_is_pinned() -> None:
    assert sorted(k8s.__all__) == [
        "ExtractConfig", "K8sConfig", "K8sProcessor", "PodResourcesConfig", "WatchConfig", "device_key", "factory",
    ]
    assert k8s.factory.type_name == "k8s" and k8s.factory.signals == frozenset(Signal)
