"""The test input is the real thing: `scrape.request` equals what otelcol's prometheus receiver
sent for the same dcgm-exporter page (recorded in testdata/ with the harness's otelcol)."""

from __future__ import annotations

from pathlib import Path

from google.protobuf.json_format import Parse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from .scrape import GPU0, TWO_GPUS, exposition, normalized, request

RECORDED = Path(__file__).parent / "testdata" / "prometheusreceiver-0.161.0.json"


def recorded() -> ExportMetricsServiceRequest:
    return Parse(RECORDED.read_text(), ExportMetricsServiceRequest())


def test_the_built_request_is_what_the_receiver_sent() -> None:
    assert normalized(request(TWO_GPUS)) == normalized(recorded())


def test_the_recording_has_the_receivers_shape() -> None:
    [rm] = recorded().resource_metrics
    assert [kv.key for kv in rm.resource.attributes] == ["service.name", "service.instance.id", "server.port",
                                                          "url.scheme"]
    [sm] = rm.scope_metrics
    assert sm.scope.name == "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
    kinds = {metric.name: metric.WhichOneof("data") for metric in sm.metrics}
    assert kinds["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "sum" and kinds["up"] == "gauge"
    labels = [kv.key for kv in sm.metrics[[m.name for m in sm.metrics].index("DCGM_FI_DEV_GPU_UTIL")]
              .gauge.data_points[0].attributes]
    assert labels == sorted(labels) and "UUID" in labels and "Hostname" in labels


def test_the_exposition_is_dcgm_exporters_format() -> None:
    text = exposition([GPU0])
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter\n" in text
    assert (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1e06c3a4-7d0b-2f5e-9a81-3c4b5d6e7f80",pci_bus_id="00000000:19:00.0",'
        'device="nvidia0",modelName="NVIDIA H200",Hostname="gpu-7",DCGM_FI_DRIVER_VERSION="570.124.06",'
        'container="notebook",namespace="notebooks",pod="jupyter-alice-0"} 97\n'
    ) in text
