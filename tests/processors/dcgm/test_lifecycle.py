"""Registration (the component contract: tests/processors/test_lifecycle.py)."""

from __future__ import annotations

import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import gputally.processors.dcgm as dcgm
from gputally.pipeline.factory import ProcessorFactory

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


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


