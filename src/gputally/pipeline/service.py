"""The running service: builds components from a validated Config and owns their lifecycle.

Start order is exporters -> processors -> pipelines -> receivers, and shutdown is the
reverse, so nothing ever drains into a stage that has already stopped.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from gputally.auth import BearerTokenAuth, BearerTokenAuthConfig
from gputally.errors import ConfigError
from gputally.otlp.batch import Signal
from gputally.pipeline.component import (
    Component,
    ComponentContext,
    Consumer,
    Exporter,
    Receiver,
    SharedComponents,
)
from gputally.pipeline.config import Config, PipelineConfig
from gputally.pipeline.pipeline import FanOut, Pipeline, Stage
from gputally.storage import FileStorageConfig
from gputally.telemetry import SelfTelemetry

__all__ = ["Service"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class Service:
    """Every component of one configuration, wired into pipelines."""

    def __init__(
        self,
        config: Config,
        *,
        telemetry: SelfTelemetry | None = None,
        reuse_port: bool = False,
    ) -> None:
        self.config = config
        self.telemetry = telemetry or SelfTelemetry()
        self.shutdown_timeout = config.service.shutdown_timeout
        self.authenticators: dict[str, BearerTokenAuth] = {
            ext_id: BearerTokenAuth(ext)
            for ext_id, ext in config.extensions.items()
            if isinstance(ext, BearerTokenAuthConfig)
        }
        """The ``bearertokenauth`` extensions by ID (the admin endpoint uses them too)."""
        self.storage: dict[str, FileStorageConfig] = {
            ext_id: ext for ext_id, ext in config.extensions.items() if isinstance(ext, FileStorageConfig)
        }
        """The ``file_storage`` extensions by ID."""
        self._shared = SharedComponents()
        self.exporters = self._build_exporters()
        self.pipelines = self._build_pipelines()
        self.receivers = self._build_receivers(reuse_port=reuse_port)
        self._started: list[Component | Pipeline] = []
        self._stopped = False
        self._running = False
        self._stopping = False

    def _context(self, component_id: str) -> ComponentContext:
        """What ``component_id`` is created with: the service's shared store, authenticators,
        deadline and readiness, and the pipelines that name it."""
        config = self.config
        return ComponentContext(
            shared=self._shared,
            pipelines={
                pid: config.pipeline_signal(pid) for pid, p in config.service.pipelines.items()
                if component_id in (*p.receivers, *p.processors, *p.exporters)
            },
            id=component_id,
            telemetry=self.telemetry,
            authenticators=self.authenticators,
            shutdown_timeout=self.shutdown_timeout,
            is_ready=lambda: self.ready,
            storage=self.storage,
        )

    def _build_exporters(self) -> dict[str, Exporter]:
        """One exporter per exporter ID that a pipeline names (an unused one is not built)."""
        used = {e for p in self.config.service.pipelines.values() for e in p.exporters}
        exporters: dict[str, Exporter] = {}
        for exporter_id in sorted(used):
            component = self.config.exporters[exporter_id]
            exporters[exporter_id] = _create(component.factory.create, component.config, self._context(exporter_id))
        return exporters

    def _build_pipelines(self) -> dict[str, Pipeline]:
        """Every pipeline, each with processor instances of its own over the shared exporters."""
        return {
            pipeline_id: self._build_pipeline(pipeline_id, pipeline_config)
            for pipeline_id, pipeline_config in self.config.service.pipelines.items()
        }

    def _build_pipeline(self, pipeline_id: str, pipeline_config: PipelineConfig) -> Pipeline:
        signal = self.config.pipeline_signal(pipeline_id)
        stages = []
        for processor_id in pipeline_config.processors:
            component = self.config.processors[processor_id]
            factory = component.factory
            processor = _create(factory.create, component.config, self._context(processor_id), signal)
            metrics = self.telemetry.for_processor(processor_id)
            stages.append(Stage(processor_id, processor, metrics, mutates_data=factory.mutates_data,
                                annotates=factory.annotates_with(component.config)))
        exporters = [(e, self.exporters[e]) for e in pipeline_config.exporters]
        return Pipeline(pipeline_id, signal, stages, exporters, registry=self.telemetry.registry)

    def _build_receivers(self, *, reuse_port: bool) -> dict[str, Receiver]:
        """One receiver per receiver ID that feeds a pipeline (the others are not started)."""
        receivers: dict[str, Receiver] = {}
        for receiver_id, component in self.config.receivers.items():
            consumers = self._consumers(receiver_id)
            if not consumers:
                log.warning("receiver %s is in no pipeline; not started", receiver_id)
                continue
            context = self._context(receiver_id)
            if component.factory.inline:
                inline = {pid: self.pipelines[pid] for pid in context.pipelines}
                context = dataclasses.replace(context, inline=inline)
            receivers[receiver_id] = _create(
                component.factory.create, component.config, context, consumers, reuse_port=reuse_port,
            )
        return receivers

    def _consumers(self, receiver_id: str) -> dict[Signal, Consumer]:
        """For each signal, a fan-out over the pipelines of that signal that list ``receiver_id``."""
        consumers: dict[Signal, Consumer] = {}
        for signal in Signal:
            feeds = [
                self.pipelines[pid]
                for pid, p in self.config.service.pipelines.items()
                if receiver_id in p.receivers and self.config.pipeline_signal(pid) is signal
            ]
            if feeds:
                consumers[signal] = FanOut(feeds)
        return consumers

    @property
    def ready(self) -> bool:
        """The one answer to "is this service ready?", for ``/readyz`` and gRPC health alike:
        started, not shutting down, and every exporter has reached its backend."""
        return not self.not_ready()

    def not_ready(self) -> list[str]:
        """What readiness waits for: exporter IDs, or ``starting`` / ``shutting down``."""
        if self._stopping:
            return ["shutting down"]
        waiting = [exporter_id for exporter_id, exporter in self.exporters.items() if not exporter.ready]
        return waiting if self._running else ["starting", *waiting]

    def degraded(self) -> dict[str, str]:
        """Components working below par, with why (see :meth:`Component.degraded`): one entry
        per processor ID, since its instances in several pipelines share one runtime and say
        the same; under ``pipeline/ID`` only where they differ."""
        found: dict[str, str] = {}
        by_processor: dict[str, dict[str, str]] = {}
        for pipeline in self.pipelines.values():
            for stage in pipeline.stages:
                reason = stage.processor.degraded()
                if reason:
                    by_processor.setdefault(stage.id, {})[pipeline.id] = reason
        for processor_id, reasons in by_processor.items():
            if len(set(reasons.values())) == 1:
                found[processor_id] = next(iter(reasons.values()))
            else:
                found.update((f"{pipeline_id}/{processor_id}", reason) for pipeline_id, reason in reasons.items())
        for component_id, component in (*self.exporters.items(), *self.receivers.items()):
            reason = component.degraded()
            if reason:
                found[component_id] = reason
        return found

    async def start(self) -> None:
        """Start everything, exporters first; on a failure, stop what started and re-raise."""
        order: list[Component | Pipeline] = [
            *self.exporters.values(),
            *(stage.processor for pipeline in self.pipelines.values() for stage in pipeline.stages),
            *self.pipelines.values(),
            *self.receivers.values(),
        ]
        try:
            for component in order:
                await component.start()
                self._started.append(component)
        except BaseException:
            await self.shutdown()
            raise
        self._running = True
        log.info(
            "started %d pipeline(s): %s", len(self.pipelines), ", ".join(sorted(self.pipelines))
        )

    async def shutdown(self) -> None:
        """Stop in reverse order: receivers, pipelines (flushing held data), processors, exporters."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True  # not ready from here on: /readyz and gRPC health say so at once
        for component in reversed(self._started):
            try:
                await component.shutdown()
            except Exception:
                log.exception("error while stopping %s", type(component).__name__)
        self._started.clear()
        log.info("stopped")


def _create(create: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Call a factory, turning a late config problem into ConfigError (fail fast at startup)."""
    try:
        return create(*args, **kwargs)
    except ConfigError:
        raise
    except (ValueError, OSError) as exc:
        raise ConfigError(str(exc)) from exc
