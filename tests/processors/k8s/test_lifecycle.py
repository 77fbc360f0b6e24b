"""The shared runtime of one processor ID, and degraded without credentials (the component
contract: tests/processors/test_lifecycle.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import gputally.processors.k8s as k8s
from gputally.otlp.batch import Signal
from gputally.processors.k8s.processor import create

from .helpers import context


@pytest.fixture(autouse=True)
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


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


