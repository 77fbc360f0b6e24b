"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from harness.processes import free_port
from support.otlp import OtlpSink

pytest_plugins = [
    "harness.kube.fixtures",
    "harness.otelcol.fixtures",
    "harness.prometheus.fixtures",
    "harness.slurm.fixtures",
]

@pytest.fixture
async def otlp_sink() -> AsyncIterator[OtlpSink]:
    sink = OtlpSink(free_port())
    await sink.start()
    yield sink
    await sink.stop()
