"""Which component types exist: built-ins plus whatever installed packages register.

Processors and exporters are discovered through the entry-point groups
``gputally.processors`` and ``gputally.exporters`` (gputally registers its own built-ins the
same way, so a third-party package is a first-class citizen). Receivers and extensions are
built in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from gputally.auth import BearerTokenAuthConfig
from gputally.config.types import Strict
from gputally.pipeline.component import Factory

__all__ = ["Registry"]

log = logging.getLogger(__name__)

PROCESSOR_GROUP = "gputally.processors"
EXPORTER_GROUP = "gputally.exporters"


def _discover(group: str, origins: dict[str, str] | None = None) -> dict[str, Factory[Any]]:
    """The group's factories by type; ``origins`` gets where each came from (distribution, module)."""
    found: dict[str, Factory[Any]] = {}
    for entry in entry_points(group=group):
        try:
            factory = entry.load()
        except Exception:  # a broken plugin must not take the service down
            log.exception("cannot load %s plugin %r from %s", group, entry.name, entry.value)
            continue
        if not isinstance(factory, Factory):
            log.error("%s plugin %r (%s) is not a gputally Factory; ignored", group, entry.name, entry.value)
            continue
        if factory.type != entry.name:
            log.warning("%s plugin %r registers type %r; using %r", group, entry.name, factory.type, factory.type)
        found[factory.type] = factory
        if origins is not None:
            dist = getattr(entry, "dist", None)
            package = f"{dist.name} {dist.version}" if dist is not None else "unknown distribution"
            origins[f"{group.rsplit('.', 1)[1]}/{factory.type}"] = f"{entry.value} (entry point, {package})"
    return found


@dataclass(frozen=True)
class Registry:
    """Factories by type name, one mapping per component kind."""

    receivers: dict[str, Factory[Any]] = field(default_factory=dict)
    processors: dict[str, Factory[Any]] = field(default_factory=dict)
    exporters: dict[str, Factory[Any]] = field(default_factory=dict)
    extensions: dict[str, type[Strict]] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    """``kind/type`` -> where it comes from (built in, or an entry point and its distribution)."""

    @classmethod
    def discover(cls) -> Registry:
        from gputally.receiver import factory as otlp_receiver

        origins = {
            f"receivers/{otlp_receiver.type}": "gputally.receiver (built in)",
            "extensions/bearertokenauth": "gputally.auth (built in)",
        }
        return cls(
            receivers={otlp_receiver.type: otlp_receiver},
            processors=_discover(PROCESSOR_GROUP, origins),
            exporters=_discover(EXPORTER_GROUP, origins),
            extensions={"bearertokenauth": BearerTokenAuthConfig},
            origins=origins,
        )

    def describe(self, *, version: str) -> str:
        """``gputally components``: every kind, each type with where it comes from and, for
        pipeline components, the signals it takes (as ``otelcol components`` lists them)."""
        lines = ["buildinfo:", "  command: gputally", f"  version: {version}"]
        for kind, types in (("receivers", self.receivers), ("processors", self.processors),
                            ("exporters", self.exporters), ("extensions", self.extensions)):
            lines.append(f"{kind}:")
            for name in sorted(types):
                lines.append(f"  - name: {name}")
                lines.append(f"    module: {self.origins.get(f'{kind}/{name}', 'unknown')}")
                factory = types[name]
                if isinstance(factory, Factory):
                    lines.append(f"    signals: [{', '.join(sorted(s.value for s in factory.signals))}]")
        return "\n".join(lines) + "\n"
