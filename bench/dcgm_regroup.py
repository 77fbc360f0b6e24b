"""Cost of the dcgm processor on one 8-GPU node's dcgm-exporter scrape, as otelcol's prometheus
receiver sends it (one scrape resource; every series a point labelled UUID, gpu, device, ...).

Times ``process()`` + serialize on fresh decodes of the request (every point moves to its GPU's
resource), against a plain decode + re-encode, and the pass-through of a request with no dcgm
point (the probes' own data, recognised from its bytes). Prints requests/s, points/s and
microseconds per point.

    .venv/bin/python bench/dcgm_regroup.py [--seconds 5] [--families 24]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from gputally.otlp.batch import Batch, Signal
from gputally.processors.dcgm.config import DcgmConfig
from gputally.processors.dcgm.processor import DcgmProcessor

sys.path.insert(0, str(Path(__file__).parent))
from timing import repeat_for  # noqa: E402

GPUS = 8


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def scrape(families: int) -> tuple[bytes, int]:
    """The receiver's request for ``families`` gauge families of dcgm-exporter over 8 GPUs."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.extend([kv("service.name", "dcgm-exporter"), kv("service.instance.id", "10.0.3.17:9400"),
                                   kv("server.port", "9400"), kv("url.scheme", "http")])
    sm = rm.scope_metrics.add()
    sm.scope.name = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
    for f in range(families):
        metric = sm.metrics.add(name=f"DCGM_FI_DEV_FIELD_{f}", description="A dcgm-exporter field.")
        for gpu in range(GPUS):
            point = metric.gauge.data_points.add(as_double=gpu * 1.5 + f, time_unix_nano=1_795_988_798_105_000_000)
            point.attributes.extend([
                kv("DCGM_FI_DRIVER_VERSION", "570.124.06"), kv("Hostname", "gpu-7"),
                kv("UUID", f"GPU-{gpu:08x}-1e06-4c1d-9a57-57f3c7773bd4"), kv("device", f"nvidia{gpu}"),
                kv("gpu", str(gpu)), kv("modelName", "NVIDIA H200"), kv("pci_bus_id", f"00000000:{0x19 + gpu:02X}:00.0"),
            ])
    for name in ("up", "scrape_duration_seconds", "scrape_samples_scraped"):
        sm.metrics.add(name=name).gauge.data_points.add(as_double=1, time_unix_nano=1_795_988_798_105_000_000)
    return request.SerializeToString(), families * GPUS + 3


def probe_request(points: int) -> bytes:
    """A probe's request of about the same size, which dcgm must pass through untouched."""
    request = ExportMetricsServiceRequest()
    for gpu in range(GPUS):
        rm = request.resource_metrics.add()
        rm.resource.attributes.extend([kv("hw.id", f"GPU-{gpu:08x}"), kv("hw.type", "gpu"), kv("host.name", "gpu-7")])
        metric = rm.scope_metrics.add().metrics.add(name="hw.gpu.utilization")
        for i in range(points // GPUS):
            metric.gauge.data_points.add(as_double=i / 100, time_unix_nano=1_000 + i)
    return request.SerializeToString()


async def main(seconds: float, families: int) -> None:
    raw, points = scrape(families)
    probe_raw = probe_request(points)
    processor = DcgmProcessor(DcgmConfig())

    async def baseline() -> None:
        batch = Batch.decode(Signal.METRICS, raw)
        batch.mutable()
        batch.serialize()

    async def regrouped() -> None:
        batch = await processor.process(Batch.decode(Signal.METRICS, raw))
        assert batch is not None
        batch.serialize()

    async def passed_through() -> None:
        batch = await processor.process(Batch.decode(Signal.METRICS, probe_raw))
        assert batch is not None
        batch.serialize()

    for label, run in (("decode + re-encode only", baseline), ("dcgm regroup + serialize", regrouped),
                       ("dcgm pass-through (probe data)", passed_through)):
        count, elapsed = await repeat_for(seconds, run)
        print(f"{label:31s} {count / elapsed:8.0f} requests/s  {count * points / elapsed:10.0f} points/s  "
              f"{elapsed / count / points * 1e6:6.2f} us/point")
    print(f"request: {GPUS} GPUs x {families} dcgm families + 3 receiver gauges = {points} points, {len(raw)} bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--families", type=int, default=24)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.families))
