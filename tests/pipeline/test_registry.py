"""Registration: every component in the tree is declared in pyproject.toml, installed, and
loaded by the registry, the same way for receivers, processors and exporters.

The expected set comes from the tree, not from a list kept here, so a new processor folder
without its entry point fails (as would an entry point left behind by a removed one)."""

from __future__ import annotations

import ast
import logging
import tomllib
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import pytest

from gputally.pipeline import registry as registry_module
from gputally.pipeline.factory import ExporterFactory, ProcessorFactory, ReceiverFactory
from gputally.pipeline.registry import EXPORTER_GROUP, PROCESSOR_GROUP, RECEIVER_GROUP, Registry

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("receivers", "processors", "exporters")
GROUPS = {"receivers": RECEIVER_GROUP, "processors": PROCESSOR_GROUP, "exporters": EXPORTER_GROUP}
FACTORY_CLASSES: dict[str, type[Any]] = {
    "receivers": ReceiverFactory, "processors": ProcessorFactory, "exporters": ExporterFactory,
}


def declared(kind: str) -> dict[str, str]:
    """Entry-point name -> ``module:factory``, as pyproject.toml declares them for ``kind``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project.get("entry-points", {}).get(GROUPS[kind], {}))


def defines_factory(module: Path) -> bool:
    """Whether ``module`` binds a top-level ``factory`` (so it is a component's registration)."""
    for node in ast.parse(module.read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(target, ast.Name) and target.id == "factory" for target in targets):
            return True
    return False


def in_tree(kind: str) -> set[str]:
    """The ``module:factory`` each component in the tree should be registered as: every
    folder under processors/, every module of exporters/ that makes a factory, the receiver."""
    if kind == "processors":
        folders = (path for path in (ROOT / "processors").iterdir() if (path / "__init__.py").is_file())
        return {f"gputally.processors.{folder.name}:factory" for folder in folders}
    if kind == "exporters":
        return {f"gputally.exporters.{m.stem}:factory" for m in (ROOT / "exporters").glob("*.py") if defines_factory(m)}
    return {"gputally.receiver:factory"} if defines_factory(ROOT / "receiver" / "__init__.py") else set()


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover()


@pytest.mark.parametrize("kind", KINDS)
def test_every_component_in_the_tree_is_declared_once(kind: str) -> None:
    values = list(declared(kind).values())
    assert sorted(values) == sorted(in_tree(kind)), f"pyproject.toml's [project.entry-points.\"{GROUPS[kind]}\"]"


@pytest.mark.parametrize("kind", KINDS)
def test_the_installed_entry_points_are_the_declared_ones(kind: str) -> None:
    installed = {entry.name: entry.value for entry in entry_points(group=GROUPS[kind])}
    assert installed == declared(kind), "entry points changed: reinstall (pip install -e . --no-deps)"


@pytest.mark.parametrize("kind", KINDS)
def test_the_registry_loads_every_declared_component_as_its_kind(kind: str, registry: Registry) -> None:
    loaded: dict[str, Any] = getattr(registry, kind)
    assert sorted(loaded) == sorted(declared(kind))
    for name, factory in loaded.items():
        assert isinstance(factory, FACTORY_CLASSES[kind]) and factory.type_name == name
        assert registry.origins[f"{kind}/{name}"].startswith(f"{declared(kind)[name]} (entry point, gputally ")


def test_a_plugin_that_fails_to_load_or_is_of_another_kind_is_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plugins = {
        PROCESSOR_GROUP: [
            EntryPoint("batch", "gputally.processors.batch:factory", PROCESSOR_GROUP),
            EntryPoint("otlp", "gputally.exporters.otlp_grpc:factory", PROCESSOR_GROUP),  # an exporter's
            EntryPoint("gone", "gputally.no_such_module:factory", PROCESSOR_GROUP),
            EntryPoint("renamed", "gputally.processors.filter:factory", PROCESSOR_GROUP),
        ],
        RECEIVER_GROUP: [EntryPoint("tag", "gputally.processors.attributes:factory", RECEIVER_GROUP)],
    }
    monkeypatch.setattr(registry_module, "entry_points", lambda *, group: plugins.get(group, []))
    with caplog.at_level(logging.WARNING, logger=registry_module.__name__):
        found = Registry.discover()
    assert sorted(found.processors) == ["batch", "filter"]  # registered under its own type name
    assert found.receivers == {} and found.exporters == {}
    logged = caplog.text
    assert "'otlp' (gputally.exporters.otlp_grpc:factory) is not a gputally ProcessorFactory" in logged
    assert "cannot load gputally.processors plugin 'gone'" in logged
    assert "'tag' (gputally.processors.attributes:factory) is not a gputally ReceiverFactory" in logged
    assert "plugin 'renamed' registers type 'filter'" in logged
