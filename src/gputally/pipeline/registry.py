"""Which component types exist: built-ins plus whatever installed packages register.

Receivers, processors and exporters are all discovered through the entry-point groups
``gputally.receivers``, ``gputally.processors`` and ``gputally.exporters`` (gputally registers
its own built-ins the same way, so a third-party package is a first-class citizen). The
``bearertokenauth`` extension is built in.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, TypeVar

from gputally.auth import BearerTokenAuthConfig
from gputally.config.types import Strict
from gputally.errors import ConfigError
from gputally.pipeline.factory import AnyFactory, ExporterFactory, ProcessorFactory, ReceiverFactory
from gputally.storage import FileStorageConfig

__all__ = ["EXPORTER_GROUP", "PROCESSOR_GROUP", "RECEIVER_GROUP", "Registry", "load_factory"]

log = logging.getLogger(__name__)

RECEIVER_GROUP = "gputally.receivers"
PROCESSOR_GROUP = "gputally.processors"
EXPORTER_GROUP = "gputally.exporters"

FactoryT = TypeVar("FactoryT", ReceiverFactory[Any], ProcessorFactory[Any], ExporterFactory[Any])


def _discover(group: str, kind: type[FactoryT], origins: dict[str, str]) -> dict[str, FactoryT]:
    """The group's factories of ``kind`` by type; ``origins`` gets where each came from
    (distribution, module)."""
    found: dict[str, FactoryT] = {}
    for entry in entry_points(group=group):
        try:
            factory = entry.load()
        except Exception:  # a broken plugin must not take the service down
            log.exception("cannot load %s plugin %r from %s", group, entry.name, entry.value)
            continue
        if not isinstance(factory, kind):
            log.error("%s plugin %r (%s) is not a gputally %s; ignored", group, entry.name, entry.value, kind.__name__)
            continue
        if factory.type_name != entry.name:
            log.warning("%s plugin %r registers type %r; using %r", group, entry.name, factory.type_name,
                        factory.type_name)
        found[factory.type_name] = factory
        dist = getattr(entry, "dist", None)
        package = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
        origins[f"{group.rsplit('.', 1)[1]}/{factory.type_name}"] = f"{entry.value} (entry point, {package})"
    return found


def load_factory(group: str, type_name: str, kind: type[FactoryT]) -> FactoryT:
    """The one factory registered as ``type_name`` in ``group``, loading no other plugin.

    For a caller that needs one component type without the cost of importing every plugin
    (the node probe builds its exporter this way); a missing or broken registration raises
    ConfigError."""
    for entry in entry_points(group=group, name=type_name):
        try:
            factory = entry.load()
        except Exception as exc:
            raise ConfigError(f"{group} {type_name!r} ({entry.value}) cannot be loaded: {exc}") from exc
        if isinstance(factory, kind):
            return factory
        raise ConfigError(f"{group} {type_name!r} ({entry.value}) is not a gputally {kind.__name__}")
    raise ConfigError(f"no {group} plugin named {type_name!r} is installed")


@dataclass(frozen=True)
class Registry:
    """Factories by type name, one mapping per component kind."""

    receivers: dict[str, ReceiverFactory[Any]] = field(default_factory=dict)
    processors: dict[str, ProcessorFactory[Any]] = field(default_factory=dict)
    exporters: dict[str, ExporterFactory[Any]] = field(default_factory=dict)
    extensions: dict[str, type[Strict]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    """``kind/type`` -> where it comes from (built in, or an entry point and its distribution)."""

    @classmethod
    def discover(cls) -> Registry:
        origins = {"extensions/bearertokenauth": "gputally.auth (built in)",
                   "extensions/file_storage": "gputally.storage (built in)"}
        return cls(
            receivers=_discover(RECEIVER_GROUP, ReceiverFactory, origins),
            processors=_discover(PROCESSOR_GROUP, ProcessorFactory, origins),
            exporters=_discover(EXPORTER_GROUP, ExporterFactory, origins),
            extensions={"bearertokenauth": BearerTokenAuthConfig, "file_storage": FileStorageConfig},
            origins=origins,
        )

    def describe(self, *, version: str) -> str:
        """``gputally components``: every kind, each type with where it comes from and, for
        pipeline components, the signals it takes (as ``otelcol components`` lists them)."""
        lines = ["buildinfo:", "  command: gputally", f"  version: {version}"]
        kinds: tuple[tuple[str, Mapping[str, AnyFactory | type[Strict]]], ...] = (
            ("receivers", self.receivers), ("processors", self.processors),
            ("exporters", self.exporters), ("extensions", self.extensions))
        for kind, types in kinds:
            lines.append(f"{kind}:")
            for name, made in sorted(types.items()):
                lines.append(f"  - name: {name}")
                lines.append(f"    module: {self.origins.get(f'{kind}/{name}', 'unknown')}")
                if not isinstance(made, type):  # a factory, not an extension's config model
                    signals = sorted(made.signals, key=lambda s: s.value)
                    lines.append(f"    signals: [{', '.join(s.value for s in signals)}]")
                    lines.append("    stability:")
                    lines.extend(f"      {s.value}: {made.stability_of(s)}" for s in signals)
        return "\n".join(lines) + "\n"
