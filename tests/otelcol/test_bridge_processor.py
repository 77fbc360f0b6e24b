"""The test otelcol carries gputally's bridge processor (collector/gputallyprocessor, built in
by tests/harness/otelcol/build.sh), and the real binary talks to gputally's own bridge
receiver: the two sides of the contract meet here. (tests/otelcol/test_bridge.py runs the
same pair with k8s and slurm, and kills gputally mid-stream.)"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
import yaml
from harness.otelcol.collector import Otelcol, validate
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from gputally.pipeline.config import validate as validate_gputally
from gputally.pipeline.registry import Registry
from gputally.pipeline.service import Service
from support.otlp import OtlpSink
from tests.otelcol.shapes import METRICS_EXPORT


def test_the_test_otelcol_lists_the_gputally_processor(otelcol_binary: Path) -> None:
    result = subprocess.run([str(otelcol_binary), "components"], capture_output=True, text=True, timeout=60,
                            check=True)
    processors = {entry["name"]: entry for entry in yaml.safe_load(result.stdout)["processors"]}
    assert "gputally" in processors, sorted(processors)
    stability = processors["gputally"]["stability"]
    assert {signal: stability[signal] for signal in ("metrics", "logs", "traces")} == {
        "metrics": "Alpha", "logs": "Alpha", "traces": "Alpha"}


def bridge_config(bridge_port: int, sink: str, **processor: Any) -> dict[str, Any]:
    """An otelcol whose ``otlp`` receiver (port 0: ``collector.port()``) feeds its gputally
    processor, which calls gputally's bridge on ``bridge_port``."""
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}},
        "processors": {"gputally": {"endpoint": f"127.0.0.1:{bridge_port}", "tls": {"insecure": True},
                                    "pipeline": "metrics/bridge", **processor}},
        "exporters": {"otlp": {"endpoint": sink, "tls": {"insecure": True}, "retry_on_failure": {"enabled": False}}},
        "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": ["gputally"],
                                              "exporters": ["otlp"]}}},
    }


def test_otelcol_validates_the_processor_config(otelcol_binary: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(bridge_config(4320, "127.0.0.1:4317", on_error="fail")))
    result = validate(otelcol_binary, good)
    assert result.returncode == 0, result.stderr

    bad_config = bridge_config(4320, "127.0.0.1:4317", on_error="retry", timeout="0s")
    del bad_config["processors"]["gputally"]["pipeline"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bad_config))
    result = validate(otelcol_binary, bad)
    assert result.returncode != 0
    for message in ("pipeline: required", 'on_error: must be pass, drop or fail, got "retry"',
                    "timeout: must be positive"):
        assert message in result.stderr, result.stderr


def gputally_bridge() -> dict[str, Any]:
    """gputally's own bridge (on port 0): one pipeline that names every resource's pod."""
    return {
        "receivers": {"bridge": {"endpoint": "127.0.0.1:0"}},
        "processors": {"attributes/pod": {"actions": [
            {"key": "k8s.pod.name", "value": "trainer-0", "action": "insert", "context": "resource"}]}},
        "exporters": {"debug": {}},
        "service": {"pipelines": {"metrics/bridge": {"receivers": ["bridge"], "processors": ["attributes/pod"],
                                                     "exporters": ["debug"]}},
                    "telemetry": {"metrics": {"address": None}}},
    }


@contextlib.asynccontextmanager
async def serving(config: dict[str, Any]) -> AsyncIterator[int]:
    """gputally with ``config`` in a real ``Service``, in this test's event loop; the port its
    bridge receiver got."""
    service = Service(validate_gputally(config, Registry.discover()))
    await service.start()
    try:
        yield int(service.receivers["bridge"].listening()["grpc"].rpartition(":")[2])
    finally:
        await service.shutdown()


@pytest.fixture
async def bridge() -> AsyncIterator[int]:
    """gputally's bridge receiver (:func:`gputally_bridge`), serving; its port."""
    async with serving(gputally_bridge()) as port:
        yield port


def add_pipeline(config: dict[str, Any], name: str, **processor: Any) -> None:
    """A second pipeline in the otelcol ``config``: an OTLP receiver ``otlp/NAME`` (port 0)
    into its own gputally processor, the first one's settings changed by ``processor``."""
    config["receivers"][f"otlp/{name}"] = {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}}}
    config["processors"][f"gputally/{name}"] = {**config["processors"]["gputally"], **processor}
    config["service"]["pipelines"][f"metrics/{name}"] = {
        "receivers": [f"otlp/{name}"], "processors": [f"gputally/{name}"], "exporters": ["otlp"]}


async def export(port: int) -> None:
    """:func:`metrics_request` into the otelcol receiver on ``port``."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.unary_unary(METRICS_EXPORT)(metrics_request().SerializeToString(), timeout=10)


async def delivered_resource(otlp_sink: OtlpSink) -> dict[str, str]:
    """The resource attributes of the one request the sink got, once it got it."""
    await otlp_sink.wait_for(lambda: len(otlp_sink.received_metrics()) == 1)
    (delivered,) = otlp_sink.messages()
    return {kv.key: kv.value.string_value for kv in delivered.resource_metrics[0].resource.attributes}


def metrics_request() -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    attribute = rm.resource.attributes.add(key="host.name")
    attribute.value.string_value = "gpu-node-1"
    metric = rm.scope_metrics.add().metrics.add(name="gpu.utilization")
    metric.gauge.data_points.add(as_double=0.87, time_unix_nano=1_700_000_000_000_000_000)
    return request


async def test_otelcol_sends_batches_through_gputallys_bridge(
    otelcol: Callable[..., Otelcol], otlp_sink: OtlpSink, bridge: int,
) -> None:
    config = bridge_config(bridge, otlp_sink.endpoint, on_error="fail")
    add_pipeline(config, "unknown", pipeline="metrics/nope")  # gputally has no such pipeline
    collector = otelcol(config)
    front_port, unknown_port = collector.port("otlp"), collector.port("otlp/unknown")

    await export(front_port)
    assert await delivered_resource(otlp_sink) == {"host.name": "gpu-node-1", "k8s.pod.name": "trainer-0"}
    (delivered,) = otlp_sink.messages()
    assert delivered.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].as_double == 0.87

    # Under on_error: fail gputally's status reaches the sender: the otlp receiver answers with
    # the code it carries (NOT_FOUND for an unknown pipeline: not retryable by OTLP's rules).
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await export(unknown_port)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
    details = refused.value.details() or ""
    assert 'gputally ProcessMetrics (pipeline "metrics/nope")' in details
    assert "no pipeline 'metrics/nope' lists receiver bridge" in details
    assert len(otlp_sink.received_metrics()) == 1


async def test_a_processor_that_compresses_is_answered(
    otelcol: Callable[..., Otelcol], otlp_sink: OtlpSink, bridge: int,
) -> None:
    """``compression: gzip``, which Collector users often copy from their exporters' settings:
    gputally's bridge inflates the batch and answers in the same call."""
    collector = otelcol(bridge_config(bridge, otlp_sink.endpoint, on_error="fail", compression="gzip"))

    await export(collector.port("otlp"))
    assert await delivered_resource(otlp_sink) == {"host.name": "gpu-node-1", "k8s.pod.name": "trainer-0"}


async def test_mutual_tls_and_a_bearer_token_between_the_two_sides(
    otelcol: Callable[..., Otelcol], otlp_sink: OtlpSink, tmp_path: Path,
) -> None:
    """The processor's own client settings (configgrpc: ``tls`` with a client certificate,
    ``headers``) against the bridge's ``tls`` with ``client_ca_file`` and ``auth``: the batch
    goes through with the right token and comes back UNAUTHENTICATED with a wrong one."""
    ca = trustme.CA()
    files = {name: tmp_path / f"{name}.pem" for name in ("ca", "server", "server-key", "client", "client-key")}
    ca.cert_pem.write_to_path(str(files["ca"]))
    for who, cert in (("server", ca.issue_cert("localhost")), ("client", ca.issue_cert("otelcol@example.com"))):
        cert.cert_chain_pems[0].write_to_path(str(files[who]))
        cert.private_key_pem.write_to_path(str(files[f"{who}-key"]))
    gputally = gputally_bridge()
    gputally["extensions"] = {"bearertokenauth": {"token": "s3cret"}}
    gputally["receivers"]["bridge"] |= {
        "endpoint": "localhost:0", "auth": {"authenticator": "bearertokenauth"},
        "tls": {"cert_file": str(files["server"]), "key_file": str(files["server-key"]),
                "client_ca_file": str(files["ca"])}}
    async with serving(gputally) as port:
        tls = {"ca_file": str(files["ca"]), "cert_file": str(files["client"]), "key_file": str(files["client-key"])}
        config = bridge_config(port, otlp_sink.endpoint, on_error="fail", endpoint=f"localhost:{port}",
                               tls=tls, headers={"authorization": "Bearer s3cret"})
        add_pipeline(config, "wrong", headers={"authorization": "Bearer guess"})
        collector = otelcol(config)
        front_port, wrong_port = collector.port("otlp"), collector.port("otlp/wrong")

        await export(front_port)
        assert await delivered_resource(otlp_sink) == {"host.name": "gpu-node-1", "k8s.pod.name": "trainer-0"}

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await export(wrong_port)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value.details()
        assert len(otlp_sink.received_metrics()) == 1
