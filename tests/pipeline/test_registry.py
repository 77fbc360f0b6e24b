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
    """The ``module:factory`` each component in the tree should be registered as: every folder
    under receiver/, processors/ and exporters/ with a ``factory.py`` that makes a factory (the
    one shape every component has)."""
    folder = {"receivers": "receiver", "processors": "processors", "exporters": "exporters"}[kind]
    package = {"receivers": "receiver", "processors": "processors", "exporters": "exporters"}[kind]
    return {
        f"gputally.{package}.{path.name}:factory"
        for path in (ROOT / folder).iterdir()
        if (path / "factory.py").is_file() and defines_factory(path / "factory.py")
    }


def test_every_component_folder_has_the_same_parts() -> None:
    """factory.py, config.py, the runtime module and a README, in every component folder."""
    runtime = {"receiver": "receiver.py", "processors": "processor.py", "exporters": "exporter.py"}
    for folder, module in runtime.items():
        for path in (ROOT / folder).iterdir():
            if (path / "__init__.py").is_file():
                parts = {"factory.py", "config.py", module, "README.md"}
                assert parts <= {p.name for p in path.iterdir()}, f"{path.relative_to(ROOT)} lacks {sorted(parts - {p.name for p in path.iterdir()})}"


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
            EntryPoint("otlp", "gputally.exporters.otlp:factory", PROCESSOR_GROUP),  # an exporter's
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
    assert "'otlp' (gputally.exporters.otlp:factory) is not a gputally ProcessorFactory" in logged
    assert "cannot load gputally.processors plugin 'gone'" in logged
    assert "'tag' (gputally.processors.attributes:factory) is not a gputally ReceiverFactory" in logged
    assert "plugin 'renamed' registers type 'filter'" in logged
