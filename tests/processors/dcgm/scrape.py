"""A dcgm-exporter scrape, both as the exporter serves it and as otelcol's prometheus receiver
turns it into OTLP.

`request` builds the ExportMetricsServiceRequest that the receiver (contrib v0.161.0 and
v0.165.1 alike) makes of `exposition`: one resource per scrape target (``service.name`` = job,
``service.instance.id`` = target, ``server.port``, ``url.scheme``; no ``server.address`` is
written), one scope named after the receiver, every series a data point whose attributes are
its labels sorted by name (empty labels left out, as Prometheus does), HELP as description,
``prometheus.type`` in the metric's metadata, counters as cumulative monotonic sums without a
start time, and the receiver's own ``up``/``scrape_*`` gauges.
``testdata/prometheusreceiver-0.161.0.json`` is what the real receiver sent for `exposition`
(`test_scrape.py` holds the two together; `test_otelcol.py` does it again live).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as m

from gputally.otlp.batch import Batch, Signal

SCOPE = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
SCOPE_VERSION = "0.161.0"  # the collector's own version: the harness's pinned otelcol
JOB = "dcgm-exporter"
TARGET = "10.0.3.17:9400"
SCRAPE_TIME = 1_795_988_798_105_000_000
RECEIVER_METRICS = (
    # name, unit, HELP as the receiver writes it
    ("up", "", "The scraping was successful"),
    ("scrape_duration_seconds", "s", "Duration of the scrape"),
    ("scrape_samples_scraped", "", "The number of samples the target exposed"),
    ("scrape_samples_post_metric_relabeling", "", "The number of samples remaining after metric relabeling was applied"),
    ("scrape_series_added", "", "The approximate number of new series in this scrape"),
)


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # "gauge" or "counter"
    help: str


FAMILIES = (
    Family("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    Family("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    Family("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    Family("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    Family("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    Family("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
)


@dataclass(frozen=True)
class Series:
    """One GPU (or one MIG instance of it) as dcgm-exporter labels its series."""

    index: int | str
    uuid: str
    pci_bus_id: str
    values: Sequence[float]
    """One per family of `FAMILIES`, in order."""
    model: str = "NVIDIA H200"
    hostname: str | None = "gpu-7"
    driver: str = "570.124.06"
    device: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)
    """pod/namespace/container (Kubernetes mapping), GPU_I_ID/GPU_I_PROFILE (MIG), ..."""

    def labels(self) -> dict[str, str]:
        """Labels in dcgm-exporter's order; empty values as the exporter writes them."""
        out = {
            "gpu": str(self.index),
            "UUID": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "device": self.device if self.device is not None else f"nvidia{self.index}",
            "modelName": self.model,
        }
        if self.hostname is not None:
            out["Hostname"] = self.hostname
        out["DCGM_FI_DRIVER_VERSION"] = self.driver
        out.update(self.extra)
        return out


GPU0_UUID = "GPU-1e06c3a4-7d0b-2f5e-9a81-3c4b5d6e7f80"
GPU1_UUID = "GPU-5b2f9d10-8c4e-6a73-b1d2-e3f405162738"
NOTEBOOK = {"container": "notebook", "namespace": "notebooks", "pod": "jupyter-alice-0"}
IDLE = {"container": "", "namespace": "", "pod": ""}  # dcgm-exporter writes them empty

GPU0 = Series(0, GPU0_UUID, "00000000:19:00.0", (1980, 97, 612.5, 98304, 0.93, 912345678), extra=NOTEBOOK)
GPU1 = Series(1, GPU1_UUID, "00000000:3B:00.0", (345, 0, 74.25, 0, 0, 412345678), extra=IDLE)
TWO_GPUS = (GPU0, GPU1)


def exposition(series: Iterable[Series], families: Sequence[Family] = FAMILIES) -> str:
    """The Prometheus text dcgm-exporter serves on ``/metrics``."""
    series = list(series)
    lines: list[str] = []
    for position, family in enumerate(families):
        lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for gpu in series:
            labels = ",".join(f'{k}="{v}"' for k, v in gpu.labels().items())
            lines.append(f"{family.name}{{{labels}}} {_number(gpu.values[position])}")
    return "\n".join(lines) + "\n"


def _number(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else repr(float(number))


def _kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _metadata(metric: m.Metric, type_: str) -> None:
    metric.metadata.append(_kv("prometheus.type", type_))


def request(
    *targets: Sequence[Series],
    families: Sequence[Family] = FAMILIES,
    job: str = JOB,
    instances: Sequence[str] = (TARGET, "10.0.3.18:9400", "10.0.3.19:9400"),
    receiver_values: Callable[[str, Sequence[Series]], float] | None = None,
) -> ExportMetricsServiceRequest:
    """What the prometheus receiver sends for one scrape of each target (default: `TWO_GPUS`)."""
    out = ExportMetricsServiceRequest()
    for target, instance in zip(targets or (TWO_GPUS,), instances, strict=False):
        resource_metrics = out.resource_metrics.add()
        port = instance.rsplit(":", 1)[1]
        resource_metrics.resource.attributes.extend(
            [_kv("service.name", job), _kv("service.instance.id", instance), _kv("server.port", port),
             _kv("url.scheme", "http")]
        )
        scope = resource_metrics.scope_metrics.add()
        scope.scope.name, scope.scope.version = SCOPE, SCOPE_VERSION
        samples = len(families) * len(target)
        for name, unit, description in RECEIVER_METRICS:
            metric = scope.metrics.add(name=name, unit=unit, description=description)
            value = receiver_values(name, target) if receiver_values else _receiver_value(name, samples)
            metric.gauge.data_points.add(time_unix_nano=SCRAPE_TIME, as_double=value)
            _metadata(metric, "gauge")
        for position, family in enumerate(families if target else ()):  # no series, no family
            metric = scope.metrics.add(name=family.name, description=family.help)
            if family.type == "counter":
                metric.sum.aggregation_temporality = m.AGGREGATION_TEMPORALITY_CUMULATIVE
                metric.sum.is_monotonic = True
                points = metric.sum.data_points
            else:
                points = metric.gauge.data_points
            for gpu in target:
                labels = {k: v for k, v in gpu.labels().items() if v}
                points.add(
                    time_unix_nano=SCRAPE_TIME,
                    as_double=float(gpu.values[position]),
                    attributes=[_kv(k, labels[k]) for k in sorted(labels)],
                )
            _metadata(metric, family.type)
    return out


def _receiver_value(name: str, samples: int) -> float:
    return {"up": 1.0, "scrape_duration_seconds": 0.0015}.get(name, float(samples))


def batch(*targets: Sequence[Series], **options: Any) -> Batch:
    """The request as gputally's receiver hands it on: decoded, its bytes kept."""
    return Batch.decode(Signal.METRICS, request(*targets, **options).SerializeToString())


# --- reading what came out ------------------------------------------------------------------


def value(any_value: AnyValue) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def attrs(message: Any) -> dict[str, Any]:
    """Attributes as a dict; fails on a duplicated key, which OTLP forbids."""
    out: dict[str, Any] = {}
    for kv in message.attributes:
        assert kv.key not in out, f"duplicate attribute {kv.key!r}"
        out[kv.key] = value(kv.value)
    return out


def points(message: Any) -> Iterator[tuple[Any, Any, Any, m.Metric, Any]]:
    """(resource_metrics, scope_metrics, metric kind, metric, point) for every data point."""
    for rm in message.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind:
                    for point in getattr(metric, kind).data_points:
                        yield rm, sm, kind, metric, point


def normalized(message: ExportMetricsServiceRequest) -> ExportMetricsServiceRequest:
    """``message`` without what differs from scrape to scrape: the target's address and port,
    timestamps, the receiver's own measurements, and the order of the metrics in a scope."""
    out = ExportMetricsServiceRequest()
    out.CopyFrom(message)
    for rm in out.resource_metrics:
        for kv in rm.resource.attributes:
            if kv.key in ("service.instance.id", "server.port"):
                kv.value.string_value = "<target>"
        for sm in rm.scope_metrics:
            ordered = sorted(sm.metrics, key=lambda metric: metric.name)
            del sm.metrics[:]
            sm.metrics.extend(ordered)
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                for point in getattr(metric, kind).data_points:
                    point.time_unix_nano = 0
                    if metric.name in {name for name, _, _ in RECEIVER_METRICS}:
                        point.as_double = 0.0
    return out
