"""Shape 3, gputally as a stage inside an existing collector, as shipped in
collector-config/pipeline-stage/, end to end, in both variants:

bridge (otelcol.yaml, gputally.yaml): the collector's metrics pipeline calls gputally in line

    dcgm-exporter-style /metrics --scrape--> otelcol metrics [memory_limiter, gputally, batch]
        <--bridge--> gputally metrics/bridge (dcgm, slurm) --> the backend (a file exporter)
    an application's OTLP --> the same pipeline, back from gputally untouched

loopback (loopback/): for a collector without the gputally processor

    dcgm-exporter-style /metrics --scrape--> otelcol prometheus/dcgm --> gputally (dcgm, slurm)
        --> otelcol otlp/gputally --> the backend (a file exporter)
    an application's OTLP --> otelcol otlp --> the same backend, never through gputally

The Slurm cluster is real; one job holds one of its two (fake) GPUs through GRES. The scrape
target stands in for dcgm-exporter (no DCGM without a GPU): its exposition has the labels and
metric types dcgm-exporter writes.
"""

from __future__ import annotations

import asyncio
import re
import stat
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from harness.otelcol.collector import Otelcol
from harness.processes import Ports, start_on_ports
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


async def serve_dcgm(body: str) -> tuple[web.AppRunner, int]:
    """A stand-in dcgm-exporter serving ``body`` at /metrics on port 0; it and its port."""
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


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


@pytest.mark.parametrize("variant", ["bridge", "loopback"])
async def test_collector_sends_dcgm_metrics_through_gputally_and_back_attributed(
    otelcol: Callable[..., Otelcol], slurm_cluster: SlurmCluster, tmp_path: Path, variant: str,
) -> None:
    cluster = slurm_cluster
    job = cluster.sbatch("sleep 300\n", "--gres=gpu:1", "--job-name=dcgm-shape", "--account=chemistry")
    try:
        cluster.wait_job_state(job, ["RUNNING"])
        detail = cluster.run(["scontrol", "show", "job", "-d", "--oneliner", str(job)]).stdout
        gres_index = int(re.search(r"IDX:(\d+)", detail).group(1))  # type: ignore[union-attr]
        await _run_stage(otelcol, cluster, job, gres_index, tmp_path, variant)
    finally:
        cluster.run(["scancel", str(job)], check=False)


def telemetry(ports: Ports) -> dict[str, Any]:
    """The collector's own metrics, read by the test: on a picked port (it cannot take 0)."""
    return {"level": "detailed", "readers": [
        {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports["telemetry"]}}}}]}


def stage_config(variant: str, cluster: SlurmCluster, return_port: int) -> dict[str, Any]:
    """The variant's shipped gputally.yaml, listening on port 0; the loopback's exporter sends
    to the collector's ``return_port``."""
    slurm = {
        "processors.slurm.cli": {"slurm_conf": str(cluster.slurm_conf)},
        "processors.slurm.gres": {"conf": str(cluster.gres_conf)},
        "processors.slurm.cache": {"refresh_interval": "1s"},
        "service.telemetry.metrics.address": "127.0.0.1:0",
    }
    if variant == "bridge":
        return override(shipped("pipeline-stage", "gputally.yaml"), {
            **slurm, "receivers.bridge.endpoint": "127.0.0.1:0"})
    return override(shipped("pipeline-stage", "loopback/gputally.yaml"), {
        **slurm,
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "exporters.otlp.endpoint": f"127.0.0.1:{return_port}",
    })


def collector_config(variant: str, stage_port: int, ports: Ports, out: Path, dcgm_port: int) -> dict[str, Any]:
    """The variant's shipped otelcol.yaml (its backend a file), its receivers on port 0 but
    the loopback's otlp/gputally (gputally is told it first), scraping ``dcgm_port``."""
    front = {
        "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
        "receivers.otlp.protocols.http.endpoint": "127.0.0.1:0",
        "service.telemetry.metrics": telemetry(ports),
    }
    if variant == "bridge":
        collector = file_backend(override(shipped("pipeline-stage", "otelcol.yaml"), {
            **front, "processors.gputally.endpoint": f"127.0.0.1:{stage_port}"}), out, ["metrics", "traces", "logs"])
    else:
        collector = file_backend(override(shipped("pipeline-stage", "loopback/otelcol.yaml"), {
            **front,
            "receivers.otlp/gputally.protocols.grpc.endpoint": f"127.0.0.1:{ports['return']}",
            "exporters.otlp/gputally.endpoint": f"127.0.0.1:{stage_port}",
        }), out, ["metrics", "traces", "logs", "metrics/gpu-attributed"])
    (scrape,) = collector["receivers"]["prometheus/dcgm"]["config"]["scrape_configs"]
    scrape.update(scrape_interval="500ms", scrape_timeout="400ms",
                  static_configs=[{"targets": [f"127.0.0.1:{dcgm_port}"]}])
    return collector


async def _run_stage(otelcol: Callable[..., Otelcol], cluster: SlurmCluster, job: int, gres_index: int,
                     tmp_path: Path, variant: str) -> None:
    # NVML orders GPUs by PCI bus, gres.conf by its File= lines: give them different orders.
    minors = tuple(sorted(cluster.gpu_minors))
    job_minor = cluster.gpu_minors[gres_index]
    job_uuid = UUIDS[minors.index(job_minor)]

    dcgm, dcgm_port = await serve_dcgm(dcgm_exposition(cluster.node, minors))
    out = tmp_path / "backend.json"
    stages: list[GputallyProcess] = []

    def start(ports: Ports) -> Otelcol:
        """gputally first: the bridge variant's first scrape must find it (on_error: pass
        would send that batch on unattributed), and the loopback's exporter retries until the
        collector listens; the loopback's gputally is told the collector's return port, so
        both start again when another process took it (or the telemetry's)."""
        stage = GputallyProcess(stage_config(variant, cluster, ports["return"]), tmp_path / "gputally",
                                env=cluster.env()).start()
        stages[:] = [stage]
        receiver = "bridge" if variant == "bridge" else "otlp"
        config = collector_config(variant, stage.port("grpc", receiver), ports, out, dcgm_port)
        try:
            return otelcol(lambda _: config, name="collector", ports=ports)
        except BaseException:  # PortTaken (started again), or the test fails
            stage.stop()
            raise

    collector = start_on_ports(start, what="the pipeline-stage collector and gputally")
    (stage,) = stages
    front_port = collector.port("otlp")
    counters_url = f"http://127.0.0.1:{collector.ports['telemetry']}/metrics"

    def accepted(receiver: str) -> int:
        key = f'otelcol_receiver_accepted_metric_points{{receiver="{receiver}",'
        return int(sum(v for k, v in prometheus_counters(counters_url, key[:-1]).items() if k.startswith(key)))

    def bridge_calls(outcome: str) -> float:
        found = prometheus_counters(counters_url, "otelcol_processor_gputally_calls")
        return sum(v for k, v in found.items() if f'outcome="{outcome}"' in k)

    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front_port}") as channel:
            await channel.unary_unary(METRICS_EXPORT)(app_request().SerializeToString(), timeout=5)
        await wait_until(lambda: any(a.get("slurm.job.id") == str(job) for a, _ in file_resources(out)),
                         f"the job's GPU attributed\n{stage.log_tail()}", timeout=30)
        await dcgm.cleanup()  # dcgm-exporter goes away: scrapes now only say up=0
        if variant == "loopback":  # everything the scrapes produced went to gputally and came back
            await wait_until(lambda: accepted("prometheus/dcgm") == accepted("otlp/gputally") > 0,
                             "gputally to return every scraped point", timeout=30)
        scraped = accepted("prometheus/dcgm")
        assert scraped > 0
        await wait_until(lambda: _gpu_stage_points(out) >= scraped, "the backend to write every point", timeout=10)
        if variant == "bridge":  # every batch went through gputally, in line, none failed
            assert bridge_calls("ok") > 0 and bridge_calls("error") == 0
    finally:
        # The collector first, as its pod goes: a scrape still in it reaches a gputally that
        # is still there (on_error: pass would send it on unattributed).
        stopped = await asyncio.to_thread(collector.stop)
        assert await asyncio.to_thread(stage.stop) == 0, stage.log_tail()
    assert stopped == 0, collector.log_tail()

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
    # The application's metric came through untouched: past gputally (bridge), or by a
    # pipeline of its own (loopback).
    (app,) = [(a, rm) for a, rm in resources if a.get("service.name") == "checkout"]
    assert set(app[0]) == {"service.name"}
    assert [m["name"] for m in metrics_of(app[1])] == ["http.server.active_requests"]



def _gpu_stage_points(out: Path) -> int:
    """Points in the output that came through gputally: everything but the application's."""
    return sum(len(points_of(m)) for a, rm in file_resources(out) if a.get("service.name") != "checkout"
               for m in metrics_of(rm))


async def test_gputally_in_the_collectors_pod_over_a_unix_socket(otelcol: Callable[..., Otelcol],
                                                                  tmp_path: Path) -> None:
    """The in-pod arrangement (README: gputally as a container of the collector's pod): the
    shipped configs with the bridge on a unix socket in a shared directory (the pod's emptyDir
    here a temporary one), slurm left out (no cluster needed to show the transport). A scrape
    goes to gputally and back regrouped by dcgm, and the application's OTLP comes back as sent."""
    shared = tmp_path / "run-gputally"  # the emptyDir both containers mount
    shared.mkdir()
    socket = shared / "bridge.sock"
    endpoint = f"unix://{socket}"
    stage = GputallyProcess(override(shipped("pipeline-stage", "gputally.yaml"), {
        "receivers.bridge.endpoint": endpoint,
        "processors.slurm": None,
        "service.pipelines.metrics/bridge.processors": ["memory_limiter", "dcgm"],
        "service.telemetry.metrics.address": "127.0.0.1:0",
    }), tmp_path / "gputally")
    stage.start()
    out = tmp_path / "backend.json"
    dcgm, dcgm_port = await serve_dcgm(dcgm_exposition("gpu-node-1", (0, 1)))
    collector: Otelcol | None = None
    try:
        await wait_until(socket.exists, f"the bridge's socket\n{stage.log_tail()}", timeout=10)
        # Owner and group may connect: the collector's container through the pod's fsGroup.
        assert stat.S_IMODE(socket.stat().st_mode) == 0o660

        def config(ports: Ports) -> dict[str, Any]:
            found = file_backend(override(shipped("pipeline-stage", "otelcol.yaml"), {
                "receivers.otlp.protocols.grpc.endpoint": "127.0.0.1:0",
                "receivers.otlp.protocols.http.endpoint": "127.0.0.1:0",
                "processors.gputally.endpoint": endpoint,
                "service.telemetry.metrics": telemetry(ports),
            }), out, ["metrics", "traces", "logs"])
            (scrape,) = found["receivers"]["prometheus/dcgm"]["config"]["scrape_configs"]
            scrape.update(scrape_interval="500ms", scrape_timeout="400ms",
                          static_configs=[{"targets": [f"127.0.0.1:{dcgm_port}"]}])
            return found

        collector = otelcol(config, name="collector")
        front = collector.port("otlp")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front}") as channel:
            await channel.unary_unary(METRICS_EXPORT)(app_request().SerializeToString(), timeout=5)
        await wait_until(lambda: len({a.get("hw.id") for a, _ in file_resources(out)} - {None}) == len(UUIDS)
                         and any(a.get("service.name") == "checkout" for a, _ in file_resources(out)),
                         "both GPUs and the application's metric at the backend", timeout=20)
        calls = prometheus_counters(f"http://127.0.0.1:{collector.ports['telemetry']}/metrics",
                                    "otelcol_processor_gputally_calls")
        assert sum(v for k, v in calls.items() if 'outcome="ok"' in k) > 0, calls
        assert not sum(v for k, v in calls.items() if 'outcome="error"' in k), calls
    finally:
        await dcgm.cleanup()
        # The collector first (as in _run_stage): no scrape is left to pass gputally by.
        stopped = None if collector is None else await asyncio.to_thread(collector.stop)
        assert await asyncio.to_thread(stage.stop) == 0, stage.log_tail()
    assert collector is not None and stopped == 0, collector.log_tail()

    for attributes, rm in file_resources(out):
        if attributes.get("service.name") == "checkout":
            assert set(attributes) == {"service.name"}
        elif "hw.id" in attributes:  # dcgm's resource per GPU: the batch went through gputally
            assert attributes["hw.id"] in UUIDS and attributes["host.name"] == "gpu-node-1"
            assert {m["name"] for m in metrics_of(rm)} <= set(DCGM_METRICS)
        else:  # the scrape's own series (up, scrape_*), dcgm's labels all gone from the GPUs'
            assert not {m["name"] for m in metrics_of(rm)} & set(DCGM_METRICS)
