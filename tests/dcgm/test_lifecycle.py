"""Registration, the component contract and the public API."""

from __future__ import annotations

import asyncio
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import gputally.processors.dcgm as dcgm
from gputally.otlp.batch import Signal
from gputally.pipeline.component import ComponentContext, Processor
from gputally.pipeline.factory import ProcessorFactory
from gputally.telemetry import SelfTelemetry

from .scrape import TWO_GPUS, batch

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_registered_as_an_entry_point() -> None:
    """Needs ``dcgm = "gputally.processors.dcgm:factory"`` in pyproject and a reinstall."""
    found = {ep.name: ep for ep in entry_points(group="gputally.processors")}
    assert "dcgm" in found, "add the dcgm entry point to pyproject.toml and reinstall"
    assert found["dcgm"].load() is dcgm.factory
    assert isinstance(dcgm.factory, ProcessorFactory) and dcgm.factory.type_name == "dcgm"


def test_declared_in_pyproject() -> None:
    project = tomllib.loads(PYPROJECT.read_text())
    assert project["project"]["entry-points"]["gputally.processors"]["dcgm"] == "gputally.processors.dcgm:factory"
    assert "gputally.processors.dcgm" in project["tool"]["setuptools"]["packages"]


async def test_lifecycle() -> None:
    proc = dcgm.factory.create(dcgm.factory.parse(None), ComponentContext(id="dcgm", telemetry=SelfTelemetry()),
                               Signal.METRICS)
    assert isinstance(proc, Processor)
    await asyncio.wait_for(proc.shutdown(), 1)  # before start
    await asyncio.wait_for(proc.start(), 1)
    out = await proc.process(batch(TWO_GPUS))
    assert out is not None and out.items == 17
    await asyncio.wait_for(proc.shutdown(), 1)
    await asyncio.wait_for(proc.shutdown(), 1)
    assert await proc.flush() is None
    assert proc.degraded() is None


def test_public_api_is_pinned() -> None:
    assert sorted(dcgm.__all__) == ["DcgmConfig", "DcgmProcessor", "LabelsConfig", "factory"]
    assert all(hasattr(dcgm, name) for name in dcgm.__all__)
