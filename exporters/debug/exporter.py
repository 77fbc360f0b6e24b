"""The ``debug`` exporter: prints what would be exported, for trying a pipeline out.

Rendering and writing run in a thread, one batch at a time, so a ``detailed`` dump of a huge
batch or a stalled terminal never holds up the event loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from typing import TextIO

from gputally.errors import Refused
from gputally.exporters.debug.config import DebugConfig
from gputally.exporters.debug.render import Verbosity, render_chunks
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Exporter
from gputally.telemetry import ExporterMetrics

__all__ = ["DebugExporter", "Verbosity", "create_exporter", "render"]

def render(batch: Batch, verbosity: Verbosity, *, exporter: str = "debug", pipeline: str = "",
           now_ns: int | None = None) -> str:
    """The whole text printed for ``batch`` (see :mod:`gputally.exporters.debug.render`)."""
    return "".join(render_chunks(batch, verbosity, exporter=exporter, pipeline=pipeline, now_ns=now_ns))


class DebugExporter(Exporter):
    """Writes each batch to ``stream``; always ready."""

    def __init__(
        self,
        *,
        verbosity: Verbosity,
        stream: TextIO,
        metrics: ExporterMetrics,
        name: str = "debug",
        pipelines: Mapping[str, Signal] | None = None,
    ) -> None:
        """``name``: the exporter's ID; ``pipelines``: those that send to it, with their signal
        (a batch's line names the pipeline(s) of its signal)."""
        self._name = name
        self._pipelines = {
            signal: "|".join(sorted(pid for pid, s in (pipelines or {}).items() if s is signal)) for signal in Signal
        }
        self._verbosity = verbosity
        self._stream = stream
        self._metrics = metrics
        self._lock = asyncio.Lock()
        self._closed = False

    async def export(self, batch: Batch) -> None:
        if self._closed:
            raise Refused("debug exporter is shut down")
        # A private copy: the thread must not race the pipeline over the batch's lazy decode.
        twin = batch.copy()
        async with self._lock:
            await asyncio.to_thread(self._write, twin)
        self._metrics.sent[batch.signal].inc(batch.items)

    def _write(self, batch: Batch) -> None:
        for chunk in render_chunks(batch, self._verbosity, exporter=self._name, pipeline=self._pipelines[batch.signal]):
            self._stream.write(chunk)  # one resource at a time: a huge batch is never one string
        self._stream.flush()

    async def shutdown(self) -> None:
        self._closed = True
        async with self._lock:  # let a write in progress finish
            pass


def create_exporter(config: DebugConfig, context: ComponentContext, *, stream: TextIO | None = None) -> DebugExporter:
    """Build the exporter; ``stream`` (stdout by default) is where it writes."""
    return DebugExporter(
        verbosity=config.verbosity,
        stream=stream if stream is not None else sys.stdout,
        metrics=context.telemetry.for_exporter(context.id),
        name=context.id,
        pipelines=context.pipelines,
    )
