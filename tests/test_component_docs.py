"""Every component's README agrees with its code: the machine-readable ``Stability:`` line
says what the factory declares, and every key its key tables name is a key of its config model.

A README is the front door for a component's users (house style 12), so a key renamed in the
model, or a stability level raised in the factory, must not leave the README behind.
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from gputally.pipeline.factory import AnyFactory
from gputally.pipeline.registry import EXPORTER_GROUP, PROCESSOR_GROUP, RECEIVER_GROUP, Registry

SIGNAL_ORDER = ("metrics", "logs", "traces")
"""The order the ``Stability:`` line lists signals in."""

NOT_MODEL_KEYS: dict[tuple[str, str], str] = {
    # (component, key as written in its README) -> why the model has no such field.
    # Empty: every key in every key table is a model field. An entry is for a key that
    # legitimately is not one (a placeholder such as `<name>`); a stale entry fails the test.
}

_STABILITY = re.compile(r"^Stability: (?P<levels>.*)$", re.M)
_LEVEL = re.compile(r"^(?P<signal>[a-z]+): (?P<level>[a-z]+)$")
_SEPARATOR_CELL = re.compile(r"^:?-+:?$")
_BRACES = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class Component:
    kind: str
    """``receivers``, ``processors`` or ``exporters``."""
    name: str
    factory: AnyFactory
    readme: Path

    @property
    def id(self) -> str:
        return f"{self.kind}/{self.name}"


def _readme_of(kind: str, module_file: Path) -> Path:
    """The README beside the factory's module: every component folder has one."""
    return module_file.parent / "README.md"


def _components() -> list[Component]:
    """gputally's own registered components, each with its factory as the registry loads it.

    Third-party plugins installed beside gputally are skipped: their READMEs are theirs."""
    registry = Registry.discover()
    kinds = {
        RECEIVER_GROUP: ("receivers", registry.receivers),
        PROCESSOR_GROUP: ("processors", registry.processors),
        EXPORTER_GROUP: ("exporters", registry.exporters),
    }
    found = []
    for group, (kind, factories) in kinds.items():
        for entry in entry_points(group=group):
            if not entry.module.startswith("gputally."):
                continue
            module = importlib.import_module(entry.module)
            factory = getattr(module, entry.attr)
            assert factories.get(factory.type_name) is factory, f"{group} {entry.name}: not what the registry loaded"
            assert module.__file__ is not None
            found.append(Component(kind, factory.type_name, factory, _readme_of(kind, Path(module.__file__))))
    return sorted(found, key=lambda c: c.id)


COMPONENTS = _components()


def test_every_kind_is_covered() -> None:
    assert {c.kind for c in COMPONENTS} == {"receivers", "processors", "exporters"}


# --- the stability line ----------------------------------------------------------------------


def parse_stability(text: str, where: str) -> dict[str, str]:
    """``{signal: level}`` from the README's one ``Stability: metrics: beta, logs: beta.`` line."""
    lines = _STABILITY.findall(text)
    assert len(lines) == 1, f"{where}: expected exactly one 'Stability: ...' line, found {len(lines)}"
    levels = lines[0].strip()
    assert levels.endswith("."), f"{where}: the Stability line must end with '.': {levels!r}"
    parsed: dict[str, str] = {}
    for part in levels[:-1].split(", "):
        match = _LEVEL.match(part.strip())
        assert match is not None, f"{where}: {part!r} in the Stability line is not 'signal: level'"
        assert match["signal"] not in parsed, f"{where}: {match['signal']} listed twice in the Stability line"
        parsed[match["signal"]] = match["level"]
    unknown = set(parsed) - set(SIGNAL_ORDER)
    assert not unknown, f"{where}: unknown signals {sorted(unknown)} in the Stability line"
    order = [s for s in SIGNAL_ORDER if s in parsed]
    assert list(parsed) == order, f"{where}: signals must be listed as {', '.join(order)}"
    return parsed


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.id)
def test_stability_line_matches_the_factory(component: Component) -> None:
    assert component.readme.exists(), f"{component.id}: no README at {component.readme}"
    factory = component.factory
    expected = {signal.value: factory.stability_of(signal) for signal in factory.signals}
    stated = parse_stability(component.readme.read_text(), str(component.readme))
    assert stated == expected, f"{component.readme}: Stability line says {stated}, the factory declares {expected}"


# --- key tables ------------------------------------------------------------------------------


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def key_tables(text: str) -> list[list[str]]:
    """The first cell of every body row of every table whose header's first cell is ``key``."""
    lines = text.splitlines()
    tables = []
    index = 0
    while index + 1 < len(lines):
        header, separator = lines[index], lines[index + 1]
        if (header.lstrip().startswith("|") and separator.lstrip().startswith("|")
                and all(_SEPARATOR_CELL.match(cell) for cell in _cells(separator))):
            rows = []
            index += 2
            while index < len(lines) and lines[index].lstrip().startswith("|"):
                rows.append(_cells(lines[index])[0])
                index += 1
            if _cells(header)[0].lower() == "key":
                tables.append(rows)
            continue
        index += 1
    return tables


def _expand_braces(key: str) -> list[str]:
    """``metrics.{include,exclude}.match_type`` -> one key per alternative."""
    match = _BRACES.search(key)
    if match is None:
        return [key]
    return [expanded for choice in match[1].split(",")
            for expanded in _expand_braces(key[: match.start()] + choice.strip() + key[match.end():])]


def keys_of_cell(cell: str) -> list[str]:
    """The keys one first cell names: backticked, separated by commas or `` / ``; a key that
    starts with ``.`` is a sibling of the one before it (```summary.a`, `.b``` -> summary.b)."""
    keys: list[str] = []
    previous = ""
    for written in re.findall(r"`([^`]+)`", cell):
        key = written.strip()
        if key.startswith(".") and previous:
            key = previous.rsplit(".", 1)[0] + key if "." in previous else key[1:]
        previous = key
        keys.extend(_expand_braces(key))
    return keys


def _alternatives(annotation: Any) -> list[Any]:
    """The types a field may hold: ``X | None``, ``Optional[X]``, ``Annotated[X, ...]`` unwrapped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _alternatives(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [alt for arg in get_args(annotation) for alt in _alternatives(arg)]
    return [annotation]


def _accepts(annotation: Any, path: list[str]) -> bool:
    """Whether a value of ``annotation`` has the (dotted) sub-key ``path``."""
    if not path:
        return True
    for candidate in _alternatives(annotation):
        origin = get_origin(candidate)
        if isinstance(origin, type) and issubclass(origin, Mapping):
            return True  # a mapping takes any key below it (headers.<name>)
        if isinstance(origin, type) and issubclass(origin, (Sequence, AbstractSet)):
            # a list of models: the key is one of each item's (actions[].key)
            if any(_accepts(item, path) for item in get_args(candidate) if item is not Ellipsis):
                return True
        elif isinstance(candidate, type) and issubclass(candidate, BaseModel) and _has_key(candidate, path):
            return True
    return False


def _has_key(model: type[BaseModel], path: list[str]) -> bool:
    name = path[0].removesuffix("[]")  # actions[].key: a key of each item of the list
    for field_name, field in model.model_fields.items():
        if name in (field_name, field.alias):
            return _accepts(field.annotation, path[1:])
    return False


def missing_keys(model: type[BaseModel], keys: list[str]) -> list[str]:
    """The keys (dotted, as a README writes them) that ``model`` does not have."""
    return [key for key in keys if not _has_key(model, key.split("."))]


def documented_keys(text: str) -> list[str]:
    return [key for table in key_tables(text) for cell in table for key in keys_of_cell(cell)]


@pytest.mark.parametrize("component", COMPONENTS, ids=lambda c: c.id)
def test_documented_keys_exist(component: Component) -> None:
    assert component.readme.exists(), f"{component.id}: no README at {component.readme}"
    keys = documented_keys(component.readme.read_text())
    assert keys, f"{component.readme}: no key table (a table whose first column is headed 'key')"
    allowed = {key for (owner, key) in NOT_MODEL_KEYS if owner == component.id}
    missing = [key for key in missing_keys(component.factory.config, keys) if key not in allowed]
    assert not missing, (f"{component.readme} documents keys that {component.factory.config.__name__} "
                         f"lacks: {missing}")
    stale = allowed - set(keys)
    assert not stale, f"NOT_MODEL_KEYS lists keys {sorted(stale)} that {component.readme} no longer names"


# --- the parsing itself ----------------------------------------------------------------------


class _Leaf(BaseModel):
    enabled: bool = True


class _Model(BaseModel):
    plain: int = 0
    nested: _Leaf = _Leaf()
    maybe: _Leaf | None = None
    items: list[_Leaf] = []
    headers: dict[str, str] = {}


def test_the_walk_follows_nesting_optionals_lists_and_mappings() -> None:
    good = ["plain", "nested", "nested.enabled", "maybe.enabled", "items[].enabled", "items", "headers.x-token"]
    assert missing_keys(_Model, good) == []
    assert missing_keys(_Model, ["plian", "nested.enable", "plain.x", "items[].nope"]) == [
        "plian", "nested.enable", "plain.x", "items[].nope"]


def test_cells_name_keys_as_readmes_write_them() -> None:
    assert keys_of_cell("`a.b` / `a.c`") == ["a.b", "a.c"]
    assert keys_of_cell("`summary.x`, `.y`, `.z`") == ["summary.x", "summary.y", "summary.z"]
    assert keys_of_cell("`m.{include,exclude}.t`") == ["m.include.t", "m.exclude.t"]
    text = "| Key | Default |\n| --- | --- |\n| `one` | 1 |\n\n| attribute | x |\n|---|---|\n| `not.a.key` | y |\n"
    assert documented_keys(text) == ["one"]


def test_a_misstated_stability_line_is_caught() -> None:
    stated = parse_stability("x\nStability: metrics: beta, traces: alpha.\n", "t")
    assert stated == {"metrics": "beta", "traces": "alpha"}
    for bad in ("Stability: traces: beta, metrics: beta.", "Stability: metrics: beta",
                "Stability: alpha. Signals: metrics.", "Stability: metrics: beta.\nStability: logs: beta."):
        with pytest.raises(AssertionError):
            parse_stability(bad, "t")
