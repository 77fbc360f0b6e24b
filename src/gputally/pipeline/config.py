"""The top-level config: the OpenTelemetry Collector's shape, validated in one pass.

Every fault is collected with its YAML path, and all of them are raised together as one
:class:`~gputally.errors.ConfigError`, so a user fixes a config in one round. Each
component's own section is validated by the config model of its factory.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from gputally.auth import BearerTokenAuthConfig
from gputally.config.files import check_input_file, input_paths, values_of
from gputally.config.loader import format_path, load_yaml
from gputally.config.sources import ConfigSources, resolve
from gputally.config.types import AuthSettings, Duration, ServerTLSSettings, Strict
from gputally.errors import ConfigError
from gputally.otlp.batch import Signal
from gputally.pipeline.factory import ExporterFactory, ProcessorFactory, ReceiverFactory
from gputally.pipeline.registry import Registry
from gputally.storage import FileStorageConfig, StorageID, directory_problem

__all__ = ["Config", "check_input_files", "PipelineConfig", "ServiceConfig", "TelemetryConfig", "load_config", "load_sources"]

_NOT_SUPPORTED = {
    ("connectors",): "not supported: gputally has no connectors; give each signal its own pipeline "
                     "(receivers may feed several), or route in an otelcol in front",
    ("service", "connectors"): "not supported: gputally has no connectors",
    ("service", "telemetry", "metrics", "readers"): "not supported: gputally serves its own metrics in Prometheus "
        "format at /metrics; set service.telemetry.metrics.address (host:port, null to turn it off)",
    ("service", "telemetry", "metrics", "level"): "not supported: every self-metric is always on; "
        "service.telemetry.metrics.address says where they are served",
}
"""otelcol keys a Collector user will type, answered with what gputally does instead."""


class PipelineConfig(Strict):
    receivers: list[str] = Field(min_length=1)
    processors: list[str] = []
    """Run in order; each instance serves this pipeline only."""
    exporters: list[str] = Field(min_length=1)


class MetricsTelemetry(Strict):
    address: str | None = "localhost:8888"
    """Where ``/metrics``, ``/healthz`` and ``/readyz`` are served; null turns them off. Keep it
    on loopback unless something else must scrape it, and then set ``auth`` and ``tls``."""
    tls: ServerTLSSettings | None = None
    """Serve the admin endpoint over HTTPS (client certificates required with ``client_ca_file``)."""
    auth: AuthSettings | None = None
    """A ``bearertokenauth`` extension whose token ``/metrics`` and ``/readyz`` require
    (``/healthz`` stays open: it says only that the process runs)."""


class LogsTelemetry(Strict):
    level: Literal["debug", "info", "warn", "warning", "error"] = "info"
    encoding: Literal["console", "json"] = "console"
    """``json`` writes one JSON object per line, for log pipelines."""


class TelemetryConfig(Strict):
    metrics: MetricsTelemetry = MetricsTelemetry()
    logs: LogsTelemetry = LogsTelemetry()


class ServiceConfig(Strict):
    extensions: list[str] = []
    pipelines: dict[str, PipelineConfig] = Field(min_length=1)
    """Keyed ``metrics``, ``logs`` or ``traces``, optionally ``/name``."""
    telemetry: TelemetryConfig = TelemetryConfig()
    shutdown_timeout: Duration = 30.0
    """On SIGTERM, how long exporters may take to drain their queues."""
    scheduling: Literal["batch", "normal"] = "batch"
    """gputally's own key: the Linux CPU scheduling policy of ``serve``'s threads. ``batch``
    (``SCHED_BATCH``): a thread that gRPC wakes does not preempt the one running, so its many
    hand-offs between threads cost fewer context switches (see ``gputally.util.scheduling``);
    ``normal``: the default policy."""


class _Document(Strict):
    receivers: dict[str, Any] = Field(min_length=1)
    processors: dict[str, Any] = {}
    exporters: dict[str, Any] = Field(min_length=1)
    extensions: dict[str, Any] = {}
    service: ServiceConfig


FactoryT = TypeVar("FactoryT", ReceiverFactory[Any], ProcessorFactory[Any], ExporterFactory[Any])


@dataclass(frozen=True)
class Component(Generic[FactoryT]):
    """One configured component: its ID, factory and validated settings."""

    id: str
    type_name: str
    factory: FactoryT
    config: BaseModel


@dataclass(frozen=True)
class Config:
    """A validated configuration, ready for the service to build."""

    receivers: dict[str, Component[ReceiverFactory[Any]]]
    processors: dict[str, Component[ProcessorFactory[Any]]]
    exporters: dict[str, Component[ExporterFactory[Any]]]
    extensions: dict[str, BaseModel]
    service: ServiceConfig
    warnings: tuple[str, ...] = ()
    """Valid but risky combinations, one line each naming the key (``validate`` prints them,
    ``serve`` logs them at start)."""

    def pipeline_signal(self, pipeline_id: str) -> Signal:
        return Signal(pipeline_id.split("/", 1)[0])


def _errors(exc: ValidationError, prefix: tuple[Any, ...]) -> list[str]:
    lines = []
    for error in exc.errors(include_url=False):
        path = (*prefix, *error["loc"])
        message = " ".join(str(error["msg"]).split())  # one line, whatever a value held
        if error["type"] == "extra_forbidden":
            message = _NOT_SUPPORTED.get(tuple(path), "unknown key")
        lines.append(f"{format_path(path)}: {message}")
    return lines


def _component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _build(
    kind: str, sections: dict[str, Any], factories: Mapping[str, FactoryT], problems: list[str]
) -> dict[str, Component[FactoryT]]:
    """The sections of one kind, each validated by its type's factory; faults go to ``problems``."""
    built: dict[str, Component[FactoryT]] = {}
    for component_id, section in sections.items():
        type_ = _component_type(component_id)
        factory = factories.get(type_)
        if factory is None:
            problems.append(_unknown_type(kind, component_id, factories))
            continue
        try:
            built[component_id] = Component(component_id, type_, factory, factory.parse(section))
        except ValidationError as exc:
            problems.extend(_errors(exc, (kind, component_id)))
        except ConfigError as exc:
            problems.extend(f"{format_path((kind, component_id))}: {p}" for p in exc.problems)
    return built


def _unknown_type(kind: str, component_id: str, known: Mapping[str, Any]) -> str:
    """One line: the unknown type, the nearest known name, and every known one."""
    type_ = _component_type(component_id)
    near = difflib.get_close_matches(type_, list(known), n=1, cutoff=0.6)
    hint = f"did you mean {near[0]}? " if near else ""
    listed = ", ".join(sorted(known)) or "none"
    return f"{format_path((kind, component_id))}: unknown {kind[:-1]} type {type_!r} ({hint}known: {listed})"


def _types_of(document: dict[str, Any], registry: Registry) -> list[str]:
    """Unknown component types, from the raw document: said in the same pass as a fault of
    the document's shape, which stops validation before the components are built."""
    problems: list[str] = []
    for kind, known in (("receivers", registry.receivers), ("processors", registry.processors),
                        ("exporters", registry.exporters), ("extensions", registry.extensions)):
        section = document.get(kind)
        if isinstance(section, dict):
            problems.extend(_unknown_type(kind, str(cid), known) for cid in section
                            if _component_type(str(cid)) not in known)
    return problems


def validate(document: dict[str, Any], registry: Registry) -> Config:
    """Check a parsed document against the registry's component types; raise ConfigError."""
    try:
        top = _Document.model_validate(document)
    except ValidationError as exc:
        raise ConfigError(_errors(exc, ()) + _types_of(document, registry)) from None

    problems: list[str] = []
    receivers = _build("receivers", top.receivers, registry.receivers, problems)
    processors = _build("processors", top.processors, registry.processors, problems)
    exporters = _build("exporters", top.exporters, registry.exporters, problems)
    extensions = _build_extensions(top.extensions, registry.extensions, problems)
    built: dict[str, Mapping[str, Component[Any]]] = {
        "receivers": receivers, "processors": processors, "exporters": exporters,
    }
    problems.extend(_service_extension_problems(top))
    for pipeline_id, pipeline in top.service.pipelines.items():
        problems.extend(_pipeline_problems(pipeline_id, pipeline, top, built))
    problems.extend(_authenticator_problems(top))
    problems.extend(_storage_problems(processors, exporters, extensions))
    if problems:
        raise ConfigError(problems)
    warnings = _durability_warnings(top.service, exporters)
    return Config(receivers, processors, exporters, extensions, top.service, tuple(warnings))


def _build_extensions(
    sections: dict[str, Any], models: Mapping[str, type[Strict]], problems: list[str]
) -> dict[str, BaseModel]:
    """The ``extensions`` sections, each validated by its type's config model."""
    built: dict[str, BaseModel] = {}
    for ext_id, section in sections.items():
        model = models.get(_component_type(ext_id))
        if model is None:
            problems.append(_unknown_type("extensions", ext_id, models))
            continue
        try:
            built[ext_id] = model.model_validate(section if section is not None else {})
        except ValidationError as exc:
            problems.extend(_errors(exc, ("extensions", ext_id)))
    return built


def _service_extension_problems(top: _Document) -> list[str]:
    """``service.extensions`` entries that name no extension defined under ``extensions``."""
    return [
        f"service.extensions[{index}]: extension {ext_id!r} is not defined under extensions"
        for index, ext_id in enumerate(top.service.extensions)
        if ext_id not in top.extensions
    ]


def _pipeline_problems(
    pipeline_id: str, pipeline: PipelineConfig, top: _Document, built: Mapping[str, Mapping[str, Component[Any]]]
) -> list[str]:
    """One pipeline's faults: its signal, then each of its lists of component IDs."""
    where = format_path(("service", "pipelines", pipeline_id))
    signal_name = pipeline_id.split("/", 1)[0]
    if signal_name not in {s.value for s in Signal}:
        return [f"{where}: pipeline type must be metrics, logs or traces, not {signal_name!r}"]
    signal = Signal(signal_name)
    problems: list[str] = []
    for kind, declared, ids in (
        ("receivers", top.receivers, pipeline.receivers),
        ("processors", top.processors, pipeline.processors),
        ("exporters", top.exporters, pipeline.exporters),
    ):
        problems.extend(_reference_problems(f"{where}.{kind}", kind, ids, declared, built[kind], signal))
    problems.extend(_inline_problems(where, pipeline, built))
    return problems


def _inline_problems(where: str, pipeline: PipelineConfig, built: Mapping[str, Mapping[str, Component[Any]]]) -> list[str]:
    """A pipeline fed by an in-line receiver (``bridge``) answers the caller with its output:
    only in-line receivers feed it, and no processor of it holds requests for later."""
    receivers = [(r, built["receivers"].get(r)) for r in pipeline.receivers]
    inline = [r for r, c in receivers if c is not None and c.factory.inline]
    if not inline:
        return []
    problems = [
        f"{where}.receivers: {r!r} cannot share a pipeline with {inline[0]!r}, which answers its caller with the "
        "pipeline's output; give it a pipeline of its own"
        for r, c in receivers if c is not None and not c.factory.inline
    ]
    for index, processor_id in enumerate(pipeline.processors):
        component = built["processors"].get(processor_id)
        if component is not None and component.factory.holds_data:
            problems.append(
                f"{where}.processors[{index}]: {processor_id!r} holds requests to release them later, so in a pipeline "
                f"of {inline[0]!r} its data would bypass the caller; remove it (batch in the Collector, after the "
                "gputally processor)")
    return problems


def _reference_problems(
    where: str,
    kind: str,
    ids: list[str],
    declared: Mapping[str, Any],
    built: Mapping[str, Component[Any]],
    signal: Signal,
) -> list[str]:
    """A pipeline's list of ``kind`` IDs: each defined, listed once, and able to serve ``signal``."""
    problems: list[str] = []
    seen: set[str] = set()
    for index, component_id in enumerate(ids):
        if component_id not in declared:
            problems.append(f"{where}[{index}]: {kind[:-1]} {component_id!r} is not defined under {kind}")
            continue
        if component_id in seen:
            problems.append(f"{where}[{index}]: {component_id!r} is listed twice")
        seen.add(component_id)
        component = built.get(component_id)  # absent when its own section had faults
        if component is not None and signal not in component.factory.signals:
            problems.append(f"{where}[{index}]: {component_id!r} does not support {signal} pipelines")
    return problems


def _authenticator_problems(top: _Document) -> list[str]:
    """Every ``auth.authenticator`` (in receivers, exporters and the admin endpoint) must name
    a defined extension."""
    problems: list[str] = []
    for kind, sections in (("receivers", top.receivers), ("exporters", top.exporters)):
        for component_id, section in sections.items():
            _check_authenticators(section, (kind, component_id), top.extensions, problems)
    admin_auth = top.service.telemetry.metrics.auth
    if admin_auth is not None and admin_auth.authenticator not in top.extensions:
        problems.append(f"service.telemetry.metrics.auth.authenticator: extension {admin_auth.authenticator!r} "
                        "is not defined under extensions")
    return problems


def _storage_problems(
    processors: Mapping[str, Component[Any]], exporters: Mapping[str, Component[Any]],
    extensions: Mapping[str, BaseModel],
) -> list[str]:
    """Every ``storage`` key must name a ``file_storage`` extension defined under extensions."""
    problems: list[str] = []
    for kind, built in (("processors", processors), ("exporters", exporters)):
        for component_id, component in built.items():
            for path, storage_id in values_of(StorageID, component.config, (kind, component_id)):
                if not isinstance(extensions.get(storage_id), FileStorageConfig):
                    problems.append(f"{format_path(path)}: {storage_id!r} is not a file_storage extension "
                                    "defined under extensions")
    return problems


def _durable(component: Component[ExporterFactory[Any]]) -> bool | None:
    """The exporter's own answer (its factory's ``durable``); None when it has no queue."""
    durable = component.factory.durable
    return None if durable is None else durable(component.config)


def _durability_warnings(service: ServiceConfig, exporters: dict[str, Component[ExporterFactory[Any]]]) -> list[str]:
    """Combinations that can still lose acknowledged data in a crash although storage is set.

    A request is acknowledged once every pipeline of its receiver took it. When some of the
    exporters it reaches keep their queue on disk and others in memory, a crash loses what the
    in-memory ones hold although the sender was told it was kept: worth a warning.
    """
    warnings: list[str] = []
    reached: dict[tuple[str, str], set[str]] = {}
    for pipeline_id, pipeline in service.pipelines.items():
        signal = pipeline_id.split("/", 1)[0]
        for receiver_id in pipeline.receivers:
            reached.setdefault((receiver_id, signal), set()).update(pipeline.exporters)
    for (receiver_id, signal), exporter_ids in sorted(reached.items()):
        durable = sorted(e for e in exporter_ids if e in exporters and _durable(exporters[e]) is True)
        volatile = sorted(e for e in exporter_ids if e in exporters and _durable(exporters[e]) is False)
        if durable and volatile:
            for exporter_id in volatile:
                line = (f"exporters.{exporter_id}.sending_queue.storage: not set, but {receiver_id}'s {signal} also go "
                        f"to {', '.join(durable)} (on disk or sent inline): a crash loses what {exporter_id} queued in memory "
                        "after the sender was acknowledged")
                if line not in warnings:
                    warnings.append(line)
    return warnings


def _check_authenticators(
    section: Any, path: tuple[Any, ...], defined: dict[str, Any], problems: list[str]
) -> None:
    """Every ``auth.authenticator``, at any depth of a section, must name a defined extension."""
    if not isinstance(section, dict):
        return
    auth = section.get("auth")
    if isinstance(auth, dict) and isinstance(auth.get("authenticator"), str):
        name = auth["authenticator"]
        if name not in defined:
            where = format_path((*path, "auth", "authenticator"))
            problems.append(f"{where}: extension {name!r} is not defined under extensions")
    for key, value in section.items():
        _check_authenticators(value, (*path, key), defined, problems)


def load_config(
    source: Path | str, *, registry: Registry | None = None, environ: dict[str, str] | None = None
) -> Config:
    """Load, expand and validate a config file (``Path``) or YAML text (``str``)."""
    document = load_yaml(source, environ=environ)
    return validate(document, registry or Registry.discover())


def load_sources(
    sources: ConfigSources,
    *,
    default_text: str,
    environ: Mapping[str, str],
    registry: Registry | None = None,
    skip_env: bool = False,
) -> Config:
    """Load and merge several ``--config`` sources and ``--set`` values, then validate. With
    ``skip_env`` an unset variable is left as written and named in the config's warnings."""
    skipped: list[str] | None = [] if skip_env else None
    document = resolve(sources, default_text=default_text, environ=environ, skipped=skipped)
    config = validate(document, registry or Registry.discover())
    return replace(config, warnings=(*config.warnings, *(skipped or ())))


def check_input_files(config: Config) -> list[str]:
    """One line per file the config names that ``serve`` could not read (missing, unreadable,
    a directory, a device, or too large), and per ``file_storage`` directory it could not
    keep files in, each naming the key the user wrote."""
    found: list[tuple[tuple[Any, ...], Path]] = []
    for kind in ("receivers", "processors", "exporters"):
        for component_id, component in getattr(config, kind).items():
            found.extend(input_paths(component.config, (kind, component_id)))
    found.extend(input_paths(config.service, ("service",)))
    for ext_id, ext in config.extensions.items():
        if isinstance(ext, BearerTokenAuthConfig) and ext.filename is not None:
            found.append((("extensions", ext_id, "filename"), ext.filename))
        found.extend(input_paths(ext, ("extensions", ext_id)))
    problems = []
    for key_path, file in found:
        problem = check_input_file(file, key=format_path(key_path))
        if problem is not None and problem not in problems:
            problems.append(problem)
    for ext_id, ext in config.extensions.items():
        if isinstance(ext, FileStorageConfig) and (problem := directory_problem(ext.directory)) is not None:
            problems.append(f"{format_path(('extensions', ext_id, 'directory'))}: {problem}")
    return problems
