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


def _discover(group: str) -> dict[str, Factory[Any]]:
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
    return found


@dataclass(frozen=True)
class Registry:
    """Factories by type name, one mapping per component kind."""

    receivers: dict[str, Factory[Any]] = field(default_factory=dict)
    processors: dict[str, Factory[Any]] = field(default_factory=dict)
    exporters: dict[str, Factory[Any]] = field(default_factory=dict)
    extensions: dict[str, type[Strict]] = field(default_factory=dict)

    @classmethod
    def discover(cls) -> Registry:
        from gputally.receiver import factory as otlp_receiver

        return cls(
            receivers={otlp_receiver.type: otlp_receiver},
            processors=_discover(PROCESSOR_GROUP),
            exporters=_discover(EXPORTER_GROUP),
            extensions={"bearertokenauth": BearerTokenAuthConfig},
        )
