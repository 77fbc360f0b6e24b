"""The ``debug`` exporter: prints what would be exported, for trying a pipeline out.

Rendering and writing run in a thread, one batch at a time, so a ``detailed`` dump of a huge
batch or a stalled terminal never holds up the event loop.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from typing import Any, Literal, TextIO

from google.protobuf import text_format

from gputally.errors import Refused
from gputally.exporters.config import DebugConfig
from gputally.otlp.batch import Batch, Signal
from gputally.pipeline.component import ComponentContext, Exporter, Factory
from gputally.telemetry import ExporterMetrics

__all__ = ["DebugExporter", "create_exporter", "factory", "render"]

Verbosity = Literal["basic", "normal", "detailed"]

_NOUN = {Signal.METRICS: "data points", Signal.LOGS: "log records", Signal.TRACES: "spans"}
_RESOURCES = {Signal.METRICS: "resource_metrics", Signal.LOGS: "resource_logs", Signal.TRACES: "resource_spans"}
_SCOPES = {Signal.METRICS: "scope_metrics", Signal.LOGS: "scope_logs", Signal.TRACES: "scope_spans"}
_ITEMS = {Signal.METRICS: "metrics", Signal.LOGS: "log_records", Signal.TRACES: "spans"}


def _value(any_value: Any) -> str:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return ""
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return str(text_format.MessageToString(any_value, as_one_line=True))
    return str(getattr(any_value, kind))


def _attributes(attributes: Any) -> str:
    return " ".join(f"{kv.key}={_value(kv.value)}" for kv in attributes)


def _metric_line(metric: Any) -> str:
    kind = metric.WhichOneof("data") or "empty"
    points = len(getattr(metric, kind).data_points) if kind != "empty" else 0
    return f"{metric.name} {kind} points={points}"


def _log_line(record: Any) -> str:
    severity = record.severity_text or str(record.severity_number)
    return f"{severity} {_value(record.body)}"


def _span_line(span: Any) -> str:
    millis = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e6
    return f"{span.name} trace_id={span.trace_id.hex()} span_id={span.span_id.hex()} duration={millis:.3f}ms"


_ITEM_LINE = {Signal.METRICS: _metric_line, Signal.LOGS: _log_line, Signal.TRACES: _span_line}


def _normal(batch: Batch) -> Iterator[str]:
    signal = batch.signal
    for n, resource in enumerate(getattr(batch.message, _RESOURCES[signal])):
        yield f"  resource #{n} {_attributes(resource.resource.attributes)}".rstrip()
        for scope_holder in getattr(resource, _SCOPES[signal]):
            scope = scope_holder.scope
            if scope.name:
                yield f"    scope {scope.name} {scope.version}".rstrip()
            for item in getattr(scope_holder, _ITEMS[signal]):
                yield f"      {_ITEM_LINE[signal](item)}"


def render(batch: Batch, verbosity: Verbosity) -> str:
    """The text printed for ``batch``: a summary line, then more per ``verbosity``."""
    resources = len(getattr(batch.message, _RESOURCES[batch.signal]))
    lines = [f"{batch.signal}: {resources} resources, {batch.items} {_NOUN[batch.signal]}"]
    if verbosity == "normal":
        lines.extend(_normal(batch))
    elif verbosity == "detailed":
        lines.append(text_format.MessageToString(batch.message))
    return "\n".join(lines) + "\n"


class DebugExporter(Exporter):
    """Writes each batch to ``stream``; always ready."""

    def __init__(self, *, verbosity: Verbosity, stream: TextIO, metrics: ExporterMetrics) -> None:
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
        self._stream.write(render(batch, self._verbosity))
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
    )


factory: Factory[DebugConfig] = Factory(
    type="debug",
    config=DebugConfig,
    create=lambda config, context: create_exporter(config, context),
)
