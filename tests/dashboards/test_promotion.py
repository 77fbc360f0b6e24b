"""The documented promotion list keeps every series distinct (issue 29, item 5).

The probe's resources have no ``service.name``: in Prometheus a resource is only the
attributes promoted to labels, so two resources that differ in an attribute left off the list
write one series (and Prometheus keeps one of their samples). The probe's recorded requests
(the three-workload H200, its three processes included) go through ``gputally serve`` into a
real Prometheus configured with the list the READMEs document; it must hold as many series as
distinct (metric, point attributes, resource attributes) sets were sent. The same requests
into a Prometheus whose list lacks ``process.pid`` give fewer: the check sees a collapse.
"""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from harness.prometheus.server import PROMOTED_RESOURCE_ATTRIBUTES, Binaries, HarnessError, Prometheus, default_config
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.otelcol.shapes import METRICS_EXPORT, GputallyProcess
from tests.processors.usage.series import probe_requests, recording

REPO = Path(__file__).resolve().parents[2]
DOCUMENTED = (REPO / "collector-config" / "dashboards" / "README.md", REPO / "collector-config" / "alerts" / "README.md")
_BLOCK = re.compile(r"<!-- promote-resource-attributes -->\s*```yaml\n(.*?)```", re.DOTALL)


def documented(path: Path) -> list[str]:
    """The promotion list in ``path``'s marked YAML block."""
    (block,) = _BLOCK.findall(path.read_text())
    return list(yaml.safe_load(textwrap.dedent(block))["otlp"]["promote_resource_attributes"])


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


def sent_identities(requests: Iterable[ExportMetricsServiceRequest]) -> set[tuple[Any, ...]]:
    """Every distinct (metric, point attributes, resource attributes) the requests hold."""
    found: set[tuple[Any, ...]] = set()
    for request in requests:
        for rm in request.resource_metrics:
            resource = frozenset((kv.key, _value(kv.value)) for kv in rm.resource.attributes)
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    for point in getattr(metric, kind).data_points:
                        found.add((metric.name, frozenset((kv.key, _value(kv.value)) for kv in point.attributes),
                                   resource))
    return found


def held_series(prometheus: Prometheus, start: float, end: float) -> list[dict[str, str]]:
    """The probe's series Prometheus holds (``hw_*`` and ``gputally_gpu_*``)."""
    return prometheus.series('{__name__=~"hw_.+|gputally_gpu_.+"}', start=start, end=end)


@pytest.fixture
def started(prometheus_binaries: Binaries, tmp_path: Path) -> Iterator[Any]:
    servers: list[Prometheus] = []

    def start(name: str, promoted: list[str]) -> Prometheus:
        config = default_config()
        config["otlp"]["promote_resource_attributes"] = promoted
        server = Prometheus(prometheus_binaries.prometheus, tmp_path / name, config=config)
        try:
            server.start()
        except HarnessError as exc:
            pytest.fail(str(exc), pytrace=False)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def test_the_readmes_document_one_list() -> None:
    dashboards, alerts = (documented(path) for path in DOCUMENTED)
    assert dashboards == alerts
    assert {"hw.id", "host.name", "process.pid", "gputally.usage.owner.id"} <= set(dashboards)
    # The tests' Prometheus promotes no resource attribute the READMEs leave off (the currency
    # is a point attribute: promoting it changes nothing).
    assert set(PROMOTED_RESOURCE_ATTRIBUTES) - {"gputally.usage.currency"} <= set(dashboards)


async def test_the_documented_promotion_list_keeps_every_series_distinct(started: Any, tmp_path: Path) -> None:
    begin = time.time() - 120
    requests = await probe_requests(recording(), base_ns=int(begin * 1e9) + 60 * 10**9)
    sent = sent_identities(requests)
    processes = {dict(r)["process.pid"] for _, _, r in sent if "process.pid" in dict(r)}
    assert len(processes) == 3, processes  # trainer, notebook, the Slurm job's holder

    prometheus = started("documented", documented(DOCUMENTED[0]))
    gateway = GputallyProcess({
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "exporters": {"otlphttp": {"endpoint": prometheus.otlp_url.removesuffix("/v1/metrics"), "compression": "none"}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlphttp"]}},
                    "telemetry": {"metrics": {"address": "127.0.0.1:0"}}},
    }, tmp_path / "gputally")
    port = gateway.start().port("grpc")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary(METRICS_EXPORT)
            for request in requests:
                await export(request.SerializeToString(), timeout=10)
    finally:
        assert await asyncio.to_thread(gateway.stop) == 0, gateway.log_tail()  # drains to Prometheus
    end = time.time() + 60
    held = held_series(prometheus, begin, end)
    by_name: dict[str, int] = {}
    for labels in held:
        by_name[labels["__name__"]] = by_name.get(labels["__name__"], 0) + 1
    sent_by_name: dict[str, int] = {}
    for name, _, _ in sent:
        sent_by_name[name] = sent_by_name.get(name, 0) + 1
    assert len(held) == len(sent), (len(held), len(sent), sorted(by_name.items()), sorted(sent_by_name.items()))
    process_series = [s for s in held if "process_pid" in s]
    assert {s["process_pid"] for s in process_series} == {str(p) for p in processes}
    print(f"\n{len(sent)} distinct (metric, point attributes, resource) sent, {len(held)} series held, "
          f"{len(process_series)} of them per process")

    # The same requests with process.pid left off the list: the processes' series collapse.
    short = started("without-pid", [a for a in documented(DOCUMENTED[0]) if a != "process.pid"])
    for request in requests:
        try:
            short.post_otlp(request.SerializeToString())
        except HarnessError:
            pass  # Prometheus refuses the duplicate samples of the collapsed series
    collapsed = held_series(short, begin, end)
    assert len(collapsed) < len(sent), (len(collapsed), len(sent))
    print(f"without process.pid: {len(collapsed)} series for the same {len(sent)}")
