"""Shape 3, gputally as a stage inside an existing collector, as shipped in
collector-config/pipeline-stage/, end to end:

    dcgm-exporter-style /metrics --scrape--> otelcol prometheus/dcgm --> gputally (dcgm, slurm)
        --> otelcol otlp/gputally --> the backend (a file exporter)
    an application's OTLP --> otelcol otlp --> the same backend, untouched

The Slurm cluster is real; one job holds one of its two (fake) GPUs through GRES. The scrape
target stands in for dcgm-exporter (no DCGM without a GPU): its exposition has the labels and
metric types dcgm-exporter writes.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc
from aiohttp import web
from harness.otelcol.collector import Otelcol
from harness.processes import free_port
from harness.slurm.cluster import SlurmCluster
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from tests.otelcol.shapes import (
    METRICS_EXPORT,
    GputallyProcess,
    file_backend,
    file_resources,
    metrics_of,
    override,
    points_of,
    prometheus_counters,
    shipped,
    wait_until,
)

UUIDS = ("GPU-5a1c0e2d-3f4b-4c6d-8e9f-0a1b2c3d4e5f", "GPU-6b2d1f3e-4a5c-4d7e-9fa0-1b2c3d4e5f60")
DCGM_METRICS = {  # name -> (type, value per GPU)
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", (87, 0)),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", (683.8, 91.2)),
    "DCGM_FI_DEV_FB_USED": ("gauge", (13364, 0)),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("counter", (38481635, 9034120)),
}


def dcgm_exposition(node: str, minors: tuple[int, ...]) -> str:
    """What dcgm-exporter serves for two GPUs: NVML index ``i`` is the GPU with ``minors[i]``."""
    lines = []
    for name, (kind, values) in DCGM_METRICS.items():
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        for index, (uuid, value) in enumerate(zip(UUIDS, values)):
            labels = (f'gpu="{index}",UUID="{uuid}",pci_bus_id="00000000:{0x19 + index:02X}:00.0",'
                      f'device="nvidia{minors[index]}",modelName="NVIDIA H200",Hostname="{node}",'
                      f'DCGM_FI_DRIVER_VERSION="580.159.04"')
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


async def serve_dcgm(port: int, body: str) -> web.AppRunner:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


def app_request() -> ExportMetricsServiceRequest:
    """An application's metric, which must not pass through gputally."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    attribute = rm.resource.attributes.add(key="service.name")
    attribute.value.string_value = "checkout"
    metric = rm.scope_metrics.add().metrics.add(name="http.server.active_requests", unit="{request}")
    metric.sum.aggregation_temporality = 2
    metric.sum.data_points.add(as_int=7, time_unix_nano=1_700_000_000_000_000_000)
    return request


async def test_collector_sends_dcgm_metrics_through_gputally_and_back_attributed(
    otelcol: Callable[..., Otelcol], slurm_cluster: SlurmCluster, tmp_path: Path,
) -> None:
    cluster = slurm_cluster
    job = cluster.sbatch("sleep 300\n", "--gres=gpu:1", "--job-name=dcgm-shape", "--account=chemistry")
    try:
        cluster.wait_job_state(job, ["RUNNING"])
        detail = cluster.run(["scontrol", "show", "job", "-d", "--oneliner", str(job)]).stdout
        gres_index = int(re.search(r"IDX:(\d+)", detail).group(1))  # type: ignore[union-attr]
        await _run_stage(otelcol, cluster, job, gres_index, tmp_path)
    finally:
        cluster.run(["scancel", str(job)], check=False)


async def _run_stage(otelcol: Callable[..., Otelcol], cluster: SlurmCluster, job: int, gres_index: int,
                     tmp_path: Path) -> None:
    # NVML orders GPUs by PCI bus, gres.conf by its File= lines: give them different orders.
    minors = tuple(sorted(cluster.gpu_minors))
    job_minor = cluster.gpu_minors[gres_index]
    job_uuid = UUIDS[minors.index(job_minor)]

    dcgm_port, stage_port, return_port, telemetry_port = free_port(), free_port(), free_port(), free_port()
    dcgm = await serve_dcgm(dcgm_port, dcgm_exposition(cluster.node, minors))
    out = tmp_path / "backend.json"
    front_port = free_port()
    config = override(shipped("pipeline-stage", "otelcol.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{front_port}",
        "receivers.otlp.protocols.http.endpoint": f"127.0.0.1:{free_port()}",
        "receivers.otlp/gputally.protocols.grpc.endpoint": f"127.0.0.1:{return_port}",
        "exporters.otlp/gputally.endpoint": f"127.0.0.1:{stage_port}",
        "service.telemetry.metrics": {"level": "detailed", "readers": [
            {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": telemetry_port}}}},
        ]},
    })
    (scrape,) = config["receivers"]["prometheus/dcgm"]["config"]["scrape_configs"]
    scrape.update(scrape_interval="500ms", scrape_timeout="400ms",
                  static_configs=[{"targets": [f"127.0.0.1:{dcgm_port}"]}])
    collector = otelcol(file_backend(config, out, ["metrics", "traces", "logs", "metrics/gpu-attributed"]),
                        wait_for=front_port, name="collector")

    stage = GputallyProcess(override(shipped("pipeline-stage", "gputally.yaml"), {
        "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{stage_port}",
        "exporters.otlp.endpoint": f"127.0.0.1:{return_port}",
        "processors.slurm.cli": {"slurm_conf": str(cluster.slurm_conf)},
        "processors.slurm.gres": {"conf": str(cluster.gres_conf)},
        "processors.slurm.cache": {"refresh_interval": "1s"},
        "service.telemetry.metrics.address": f"127.0.0.1:{free_port()}",
    }), tmp_path / "gputally", env=cluster.env())
    stage.start(stage_port)
    counters_url = f"http://127.0.0.1:{telemetry_port}/metrics"

    def accepted(receiver: str) -> int:
        key = f'otelcol_receiver_accepted_metric_points{{receiver="{receiver}",'
        return int(sum(v for k, v in prometheus_counters(counters_url, key[:-1]).items() if k.startswith(key)))

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front_port}") as channel:
            await channel.unary_unary(METRICS_EXPORT)(app_request().SerializeToString(), timeout=5)
        await wait_until(lambda: any(a.get("slurm.job.id") == str(job) for a, _ in file_resources(out)),
                         f"the job's GPU attributed\n{stage.log_tail()}", timeout=30)
        await dcgm.cleanup()  # dcgm-exporter goes away: scrapes now only say up=0
        # Everything the scrapes produced went to gputally and came back.
        await wait_until(lambda: accepted("prometheus/dcgm") == accepted("otlp/gputally") > 0,
                         "gputally to return every scraped point", timeout=30)
        scraped = accepted("prometheus/dcgm")
        await wait_until(lambda: _gpu_stage_points(out) >= scraped, "the backend to write every point", timeout=10)
    finally:
        assert await asyncio.to_thread(stage.stop) == 0, stage.log_tail()
    assert await asyncio.to_thread(collector.stop) == 0, collector.log_tail()

    # Counted while it ran: scrapes after that (up=0 now) came later, so at least as many.
    assert _gpu_stage_points(out) >= scraped
    resources = file_resources(out)
    gpus = [(a, rm) for a, rm in resources if "hw.id" in a]
    per_scrape: Counter[tuple[int, str, str]] = Counter()
    for attributes, rm in gpus:
        assert attributes["host.name"] == cluster.node and attributes["hw.type"] == "gpu"
        assert attributes["hw.name"] == f"nvidia{minors[int(attributes['gputally.gpu.index'])]}"
        for metric in metrics_of(rm):
            assert metric["name"] in DCGM_METRICS
            for point in points_of(metric):
                assert not {"UUID", "gpu", "device", "Hostname"} & {kv["key"] for kv in point.get("attributes", [])}
                per_scrape[(int(point["timeUnixNano"]), attributes["hw.id"], metric["name"])] += 1
    assert per_scrape and set(per_scrape.values()) == {1}  # nothing twice
    # Nothing lost: every successful scrape (up == 1) has all its GPU points. (The scrape that
    # dcgm-exporter's shutdown cut short can say up=0 and still deliver its samples.)
    successful = {int(p["timeUnixNano"]) for a, rm in resources if "hw.id" not in a
                  for m in metrics_of(rm) if m["name"] == "up" for p in points_of(m) if p.get("asDouble") == 1}
    per_time = Counter(t for t, _, _ in per_scrape)
    assert successful and successful <= set(per_time) and len(set(per_time) - successful) <= 1
    assert set(per_time.values()) == {len(UUIDS) * len(DCGM_METRICS)}
    attributed = [a for a, _ in gpus if "slurm.job.id" in a]
    assert attributed and {a["hw.id"] for a in attributed} == {job_uuid}
    for attributes in attributed:
        assert attributes["slurm.job.id"] == str(job) and attributes["slurm.job.source"] == "gres"
        assert attributes["slurm.job.account"] == "chemistry" and attributes["slurm.job.name"] == "dcgm-shape"
    # The application's metric took the untouched pipeline.
    (app,) = [(a, rm) for a, rm in resources if a.get("service.name") == "checkout"]
    assert set(app[0]) == {"service.name"}
    assert [m["name"] for m in metrics_of(app[1])] == ["http.server.active_requests"]



def _gpu_stage_points(out: Path) -> int:
    """Points in the output that came through gputally: everything but the application's."""
    return sum(len(points_of(m)) for a, rm in file_resources(out) if a.get("service.name") != "checkout"
               for m in metrics_of(rm))
