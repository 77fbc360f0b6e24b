"""Every series selector in the alert rules matches what a real Prometheus holds when it is
fed what gputally sends: the probe's and the usage processor's OTLP shapes through the OTLP
receiver, and gputally's own /metrics (the real self-telemetry registries) by scraping.

The promtool unit tests check the rules' logic on series written by hand; this test checks
that those hand-written names and labels are the ones Prometheus really makes (unit and type
suffixes, dots to underscores, promoted resource attributes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from harness.processes import free_port
from harness.prometheus import otlp
from harness.prometheus.server import Binaries, Prometheus, default_config
from prometheus_client import CollectorRegistry, generate_latest

from gputally.otlp.batch import Signal
from gputally.processors.k8s.metrics import K8sCollector
from gputally.processors.slurm.processor import _metrics as slurm_metrics
from gputally.telemetry import SelfTelemetry

RULES = Path(__file__).resolve().parents[2] / "collector-config" / "alerts" / "gputally.rules.yaml"


def self_metrics() -> bytes:
    """gputally's /metrics with one child of every family the rules use."""
    telemetry = SelfTelemetry()
    registry: CollectorRegistry = telemetry.registry
    receiver = telemetry.for_receiver("otlp", "grpc")
    receiver.refused(Signal.METRICS, "backpressure").inc(3)
    exporter = telemetry.for_exporter("otlp")
    exporter.queue_size.set(9)
    exporter.queue_capacity.set(10)
    exporter.enqueue_failed[Signal.METRICS].inc(5)
    exporter.send_failed[Signal.METRICS].inc(2)

    class Store(list):  # type: ignore[type-arg]
        deleted_count = 0
        synced = False

    runtime = SimpleNamespace(
        store=Store(),
        reflector=SimpleNamespace(stats=SimpleNamespace(restarts={"error": 1}, events=0)),
        attributions={("metrics", "pending"): 4},
        problems=SimpleNamespace(counts={("apiserver", "unreachable"): 7}),
        podresources=None,
        owners={},
    )
    registry.register(K8sCollector({"k8s": runtime}))  # type: ignore[dict-item]
    slurm = slurm_metrics(registry)
    slurm.backend_errors.labels(processor="slurm", backend="rest").inc()
    return generate_latest(registry)


@pytest.fixture
def metrics_endpoint() -> Iterator[str]:
    body = self_metrics()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-endpoint", daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(5)
    server.server_close()


GPU = {"hw.id": "GPU-a", "hw.model": "NVIDIA H200", "hw.type": "gpu", "host.name": "node-1", "gputally.gpu.index": 0}
OWNER = {
    **GPU,
    "gputally.usage.owner.kind": "slurm.job",
    "gputally.usage.owner.id": "4242",
    "slurm.job.id": "4242",
    "slurm.job.user": "alice",
}


def probe_and_usage_request() -> bytes:
    """A probe cycle's GPU resource (as in README "NVIDIA probe" -> "Metrics") and an owner's
    usage counters, with one point for every attribute value the rules select on."""
    gpu = otlp.resource(
        GPU,
        otlp.counter("hw.errors", "{error}", [
            otlp.point(1, {"error.type": "xid", "gputally.gpu.xid": "79"}),
            otlp.point(1, {"error.type": "ecc_uncorrected"}),
        ]),
        otlp.updowncounter("hw.status", "1", [
            otlp.point(v, {"hw.state": s}) for s, v in (("ok", 0), ("degraded", 0), ("failed", 1))
        ]),
        otlp.gauge("gputally.gpu.memory.remap.pending", "1", [otlp.point(1)]),
        otlp.gauge("gputally.gpu.memory.remap.failed", "1", [otlp.point(0)]),
        otlp.gauge("gputally.gpu.clock.throttled", "1", [
            otlp.point(1, {"gputally.gpu.clock.event_reason": r}) for r in ("hw_thermal_slowdown", "sw_power_cap")
        ]),
        otlp.gauge("gputally.gpu.collection.duration", "s", [otlp.point(0.02)]),
        scope="gputally.probes.nvml",
    )
    usage = otlp.resource(
        OWNER,
        otlp.counter("gputally.usage.allocated.time", "s", [otlp.point(600)]),
        otlp.counter("gputally.usage.idle.time", "s", [otlp.point(590)]),
        scope="gputally.processors.usage",
    )
    per_gpu = otlp.resource(  # the usage processor's one resource per GPU: the GPU's attributes
        {k: v for k, v in GPU.items() if k != "hw.type"},
        otlp.counter("gputally.usage.unattributed.time", "s", [
            otlp.point(v, {"gputally.usage.unattributed.reason": r}) for r, v in (("no_cgroup", 30), ("no_metadata", 0))
        ]),
        scope="gputally.processors.usage",
    )
    return otlp.request(gpu, usage, per_gpu, engine_resource())


def engine_resource() -> Any:
    """An inference engine's resource as the probe sends it (docs/accounts.md, "Engine points"),
    attributed to a pod, with the metrics the inference rules read."""
    from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

    model = {"gen_ai.request.model": "llama-70b"}
    rm = otlp.resource(
        {"gputally.inference.engine": "vllm", "host.name": "node-1", "process.pid": 4101, "server.port": 8000,
         "k8s.pod.uid": "u1", "k8s.namespace.name": "llm", "k8s.pod.name": "vllm-0"},
        otlp.gauge("gputally.inference.kv_cache.usage", "1", [otlp.point(0.97, model)]),
        otlp.gauge("gputally.inference.requests.waiting", "{request}", [otlp.point(3, model)]),
        otlp.gauge("gputally.inference.up", "1", [otlp.point(1)]),
        scope="gputally.probes.engines",
    )
    metric = rm.scope_metrics[0].metrics.add(name="gen_ai.server.time_to_first_token", unit="s")
    metric.histogram.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    now = time.time_ns()
    point = metric.histogram.data_points.add(start_time_unix_nano=now - 3600 * 10**9, time_unix_nano=now, count=3,
                                             sum=1.5, bucket_counts=[1, 2, 0], explicit_bounds=[0.5, 2.0])
    point.attributes.add(key="gen_ai.request.model").value.string_value = "llama-70b"
    return rm


def selectors(node: Any) -> Iterator[dict[str, Any]]:
    """The series selectors (vector and matrix) in a /api/v1/parse_query syntax tree."""
    if isinstance(node, dict):
        if node.get("type") in ("vectorSelector", "matrixSelector"):
            yield node
        for value in node.values():
            yield from selectors(value)
    elif isinstance(node, list):
        for value in node:
            yield from selectors(value)


def as_promql(selector: dict[str, Any]) -> str:
    matchers = ", ".join(f'{m["name"]}{m["type"]}"{m["value"]}"' for m in selector["matchers"])
    return "{" + matchers + "}"


def test_every_selector_in_the_rules_matches_what_gputally_sends(
    prometheus_binaries: Binaries, metrics_endpoint: str, tmp_path: Path
) -> None:
    config = default_config()
    config["scrape_configs"] = [{
        "job_name": "gputally", "scrape_interval": "1s", "static_configs": [{"targets": [metrics_endpoint]}],
    }]
    with Prometheus(prometheus_binaries.prometheus, tmp_path / "prometheus", config=config) as prom:
        prom.start()
        prom.post_otlp(probe_and_usage_request())
        deadline = time.monotonic() + 30
        while not prom.query("gputally_k8s_synced"):
            assert time.monotonic() < deadline, f"gputally's /metrics was not scraped:\n{prom.log_tail()}"
            time.sleep(0.3)

        rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
        unmatched: dict[str, list[str]] = {}
        checked = 0
        for rule in rules:
            for selector in selectors(prom.api("parse_query", query=rule["expr"])):
                checked += 1
                promql = as_promql(selector)
                if not prom.series(promql):
                    unmatched.setdefault(rule["alert"], []).append(promql)
        assert checked >= len(rules), checked
        assert unmatched == {}, f"selectors that match nothing Prometheus made of gputally's data: {unmatched}"
