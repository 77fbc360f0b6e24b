"""A gputally processor in a package of its own: ``team`` on every resource, from its namespace.

Registered under the ``gputally.processors`` entry point ``team`` (pyproject.toml), so
``gputally serve`` finds it once the package is installed, and a Collector runs it through the
bridge like any other gputally processor.
"""

from __future__ import annotations

from gputally.config.types import Strict
from gputally.otlp.batch import Batch
from gputally.otlp.signals import SIGNALS, Signal
from gputally.pipeline.component import ComponentContext, Processor
from gputally.pipeline.factory import ProcessorFactory

__all__ = ["TeamConfig", "TeamProcessor", "factory"]


class TeamConfig(Strict):
    """``processors: team:``."""

    teams: dict[str, str] = {}
    """Namespace (``k8s.namespace.name``) -> team."""
    default: str | None = None
    """The team of a namespace not in ``teams``; unset: such resources are left alone."""


class TeamProcessor(Processor):
    """Adds ``team`` to each resource with a known namespace; a ``team`` already set is kept."""

    def __init__(self, config: TeamConfig) -> None:
        self._config = config

    async def process(self, batch: Batch) -> Batch | None:
        for entry in getattr(batch.message, SIGNALS[batch.signal].resource_field):
            attributes = {kv.key: kv.value.string_value for kv in entry.resource.attributes}
            namespace = attributes.get("k8s.namespace.name")
            team = self._config.teams.get(namespace, self._config.default) if namespace else None
            if team is not None and "team" not in attributes:
                batch.mutable()  # the request changes: its cached encoding is dropped
                entry.resource.attributes.add(key="team").value.string_value = team
        return batch


def create(config: TeamConfig, context: ComponentContext, signal: Signal) -> TeamProcessor:
    return TeamProcessor(config)


factory: ProcessorFactory[TeamConfig] = ProcessorFactory(
    type_name="team", config=TeamConfig, create=create, mutates_data=True,
    stability={Signal.METRICS: "alpha", Signal.LOGS: "alpha", Signal.TRACES: "alpha"},
)
