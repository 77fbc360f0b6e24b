"""Memory of `gputally serve` in gateway mode with N pods cached by the k8s processor.

Starts a real kube-apiserver (tests/harness/kube; build it first with
tests/harness/kube/build.sh), creates N realistic pods (ReplicaSet owners, labels, a kubectl
last-applied annotation, two running containers each) through the API, then starts
`gputally serve` with the k8s processor in gateway mode against it and reports the
server's RSS once every pod is cached and every owner resolved, and after a few seconds of
load; and the same server without the k8s processor, for comparison.

    .venv/bin/python bench/k8s_memory.py [--pods 10000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc
import psutil
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

sys.path.insert(0, str(Path(__file__).parent))
from k8s_setup import cluster, container_id, populate, wait_metric  # noqa: E402
from k8s_throughput import node_request  # noqa: E402
from pipeline_throughput import METHOD, free_port, load, start_sink, wait_port  # noqa: E402

SETUP = Path(__file__).parent / "k8s_setup.py"


def config(
    grpc_port: int, admin_port: int, sink_port: int, kubeconfig: Path | None, page_size: int
) -> dict[str, object]:
    processors = {}
    if kubeconfig is not None:
        processors["k8s"] = {"mode": "gateway", "kubeconfig": str(kubeconfig), "watch": {"page_size": page_size},
                             "extract": {"labels": ["app", "team"], "annotations": ["cost-center"]}}
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}}}},
        "processors": processors,
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{sink_port}", "tls": {"insecure": True},
                               "compression": "none", "sending_queue": {"num_consumers": 8, "queue_size": 5000}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(processors), "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": f"127.0.0.1:{admin_port}"}},
        },
    }


def cluster_requests(pods: list[dict[str, Any]], per_request: int = 100) -> list[bytes]:
    """Requests naming every pod once: one GPU-process resource per pod (its cgroup), three points each."""
    requests = []
    for start in range(0, len(pods), per_request):
        request = ExportMetricsServiceRequest()
        for n, pod in enumerate(pods[start:start + per_request]):
            uid = pod["metadata"]["uid"]
            rm = request.resource_metrics.add()
            for key, value in (
                ("hw.id", f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, pod['spec']['nodeName']).hex[:8]}-0000"),
                ("host.name", pod["spec"]["nodeName"]),
                ("process.linux.cgroup", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                 f"{uid.replace('-', '_')}.slice/cri-containerd-{container_id(uid + 'main')}.scope"),
            ):
                rm.resource.attributes.add(key=key).value.string_value = value
            rm.resource.attributes.add(key="process.pid").value.int_value = 1000 + n
            scope = rm.scope_metrics.add()
            for name in ("hw.gpu.memory.usage", "hw.gpu.utilization", "hw.gpu.memory.utilization"):
                metric = scope.metrics.add(name=name)
                metric.gauge.data_points.add(as_double=0.5, time_unix_nano=1)
        requests.append(request.SerializeToString())
    return requests


def measure(
    kubeconfig: Path | None, *, pods: list[dict[str, Any]], replicasets: int, seconds: float, page_size: int = 500
) -> dict[str, float]:
    grpc_port, admin_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        sink, sink_port = start_sink(Path(tmp) / "sink.json")
        path.write_text(json.dumps(config(grpc_port, admin_port, sink_port, kubeconfig, page_size)))
        started = time.monotonic()
        server = subprocess.Popen([sys.executable, str(SETUP), "serve", str(path)], stderr=subprocess.DEVNULL)
        proc = psutil.Process(server.pid)
        peak = 0.0
        try:
            wait_port(grpc_port)
            result: dict[str, float] = {}
            if kubeconfig is not None:
                labels = {"processor": "k8s", "state": "live"}
                wait_metric(admin_port, "gputally_k8s_pods_cached", lambda v: v >= len(pods), 300, labels)
                result["sync_s"] = time.monotonic() - started
            result["rss_synced_mib"] = proc.memory_info().rss / 2**20
            asyncio.run(send_all(grpc_port, cluster_requests(pods)))  # every pod attributed once
            if kubeconfig is not None:
                wait_metric(admin_port, "gputally_k8s_owners_cached", lambda v: v >= replicasets, 300)
                attributed = {"processor": "k8s", "signal": "metrics", "source": "cgroup"}
                wait_metric(admin_port, "gputally_k8s_attribution_total", lambda v: v >= len(pods), 60, attributed)
            result["rss_attributed_mib"] = proc.memory_info().rss / 2**20
            payload = node_request().SerializeToString()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                asyncio.run(load(grpc_port, payload, 1.0, 8, 1))
                peak = max(peak, proc.memory_info().rss / 2**20)
            result["rss_after_load_mib"] = proc.memory_info().rss / 2**20
            result["rss_peak_mib"] = max(peak, result["rss_attributed_mib"])
            return result
        finally:
            server.terminate()
            server.wait(30)
            sink.terminate()
            sink.wait(30)


async def send_all(port: int, requests: list[bytes]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        export = channel.unary_unary(METHOD)
        for request in requests:
            await export(request, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--replicasets", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--seconds", type=float, default=5.0, help="load after sync (requests of the throughput bench)")
    parser.add_argument("--page-size", type=int, nargs="+", default=[500], help="list page sizes to measure")
    args = parser.parse_args()
    control_plane = cluster()
    try:
        t0 = time.monotonic()
        pods = populate(control_plane.admin_client(), pods=args.pods, namespaces=20, nodes=args.nodes,
                        replicasets=args.replicasets)
        print(f"created {args.pods} pods, {args.replicasets} ReplicaSets in {time.monotonic() - t0:.0f} s "
              f"(real kube-apiserver + etcd, tests/harness/kube)")
        rows = [("serve, no processor", measure(None, pods=pods, replicasets=0, seconds=args.seconds))]
        for page_size in args.page_size:
            rows.append((f"+ k8s gateway, {args.pods} pods, pages of {page_size}", measure(
                control_plane.limited_kubeconfig, pods=pods, replicasets=args.replicasets, seconds=args.seconds,
                page_size=page_size)))
    finally:
        control_plane.stop()
    print("RSS synced: every pod cached; attributed: every pod's process sent once (owners resolved, encodings")
    print("cached); after load / peak: then the throughput bench's node request for --seconds")
    print(f"{'server':44} {'synced in':>9} {'synced':>8} {'attributed':>11} {'after load':>11} {'peak':>8}")
    for name, r in rows:
        synced = f"{r['sync_s']:.1f}s" if "sync_s" in r else "-"
        print(f"{name:44} {synced:>9} {r['rss_synced_mib']:>6.1f}Mi {r['rss_attributed_mib']:>9.1f}Mi "
              f"{r['rss_after_load_mib']:>9.1f}Mi {r['rss_peak_mib']:>6.1f}Mi")


if __name__ == "__main__":
    main()
