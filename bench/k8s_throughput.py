"""Throughput of `gputally serve` with the k8s processor, next to the spine without it.

The request is bench/gpu_node_request.py's 8-GPU node (340 points, 18 resources), with each
process's cgroup naming a pod that exists in a real kube-apiserver (tests/harness/kube) and
each GPU allocated to a pod through a PodResources server on a unix socket, so every resource
is attributed (10 by cgroup, 8 by PodResources) on every request. Scenarios run one after
the other on the same machine, each in a fresh server process, with the figures of
bench/pipeline_throughput.py.

    .venv/bin/python bench/k8s_throughput.py [--seconds 10] [--in-flight 8] [--pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

sys.path.insert(0, str(Path(__file__).parent))
from gpu_node_request import GPUS, gpu_node_request  # noqa: E402
from k8s_setup import FakeKubelet, cluster, container_id, wait_metric  # noqa: E402
from pipeline_throughput import free_port, load, wait_delivered, wait_port  # noqa: E402

SETUP = Path(__file__).parent / "k8s_setup.py"
NODE = "gpu-node-001"


def node_request(pods: list[tuple[str, str]] | None = None) -> ExportMetricsServiceRequest:
    """The 8-GPU node request; with ``pods`` ((uid, container id) per process), cgroups naming them."""
    request = gpu_node_request(node=NODE)
    if pods:
        processes = [rm for rm in request.resource_metrics
                     if any(kv.key == "process.pid" for kv in rm.resource.attributes)]
        for rm, (uid, cid) in zip(processes, pods, strict=False):
            for kv in rm.resource.attributes:
                if kv.key == "process.linux.cgroup":
                    kv.value.string_value = (
                        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                        f"{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"
                    )
    return request


def setup_pods(admin: Any, count: int) -> tuple[str, list[dict[str, Any]]]:
    from harness.kube.cluster import create_deployment_with_replicaset, create_namespace, create_pod, set_pod_status

    ns = create_namespace(admin).metadata.name
    _, replicaset = create_deployment_with_replicaset(admin, ns, "trainer")
    pods = []
    for i in range(count):
        pod = create_pod(admin, ns, f"trainer-{i}", owner=replicaset, node_name=NODE, labels={"app": "trainer"})
        cid = container_id(pod.metadata.uid + "main")
        set_pod_status(admin, ns, pod.metadata.name, container_ids={"main": f"containerd://{cid}"})
        pods.append({"name": pod.metadata.name, "uid": pod.metadata.uid, "cid": cid})
    return ns, pods


def server_config(grpc_port: int, admin_port: int, sink_port: int, scenario: str, kubeconfig: Path,
                  socket: Path) -> dict[str, Any]:
    processors: dict[str, Any] = {}
    if scenario == "resource attribute insert":
        processors["attributes/bench"] = {"actions": [
            {"key": "k8s.cluster.name", "value": "bench", "action": "insert", "context": "resource"}]}
    elif scenario.startswith("k8s"):
        processors["k8s"] = {"mode": "node", "node_name": NODE, "kubeconfig": str(kubeconfig),
                             "pod_resources": {"socket": str(socket)}, "extract": {"labels": ["app"]}}
    if scenario.endswith("+ usage"):
        processors["usage"] = {"settle": 0, "emit_interval": "10s"}
    return {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}}}},
        "processors": processors,
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{sink_port}", "tls": {"insecure": True}, "compression": "none",
                               "sending_queue": {"num_consumers": 8, "queue_size": 5000}}},
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(processors), "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": f"127.0.0.1:{admin_port}"}},
        },
    }


def run(scenario: str, args: argparse.Namespace, payload: bytes | Callable[[], bytes], points: int,
        kubeconfig: Path, socket: Path) -> dict[str, Any]:
    grpc_port, admin_port, sink_port = free_port(), free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        report, config = Path(tmp) / "sink.json", Path(tmp) / "config.yaml"
        config.write_text(json.dumps(server_config(grpc_port, admin_port, sink_port, scenario, kubeconfig, socket)))
        sink = subprocess.Popen([sys.executable, str(Path(__file__).parent / "sink.py"), "--port", str(sink_port),
                                 "--report", str(report)], stdout=subprocess.PIPE)
        assert sink.stdout is not None
        sink.stdout.readline()
        server = subprocess.Popen([sys.executable, str(SETUP), "serve", str(config)], stderr=subprocess.DEVNULL)
        if args.pin:
            cpus = list(range(os.cpu_count() or 1))
            psutil.Process(server.pid).cpu_affinity(cpus[-1:])
            psutil.Process(sink.pid).cpu_affinity(cpus[:-1] or cpus)
            psutil.Process().cpu_affinity(cpus[:-1] or cpus)
        try:
            wait_port(grpc_port)
            if scenario.startswith("k8s"):
                wait_metric(admin_port, "gputally_k8s_synced", lambda v: v == 1, 60)
                wait_metric(admin_port, "gputally_k8s_device_allocations", lambda v: v >= GPUS, 60)
            proc = psutil.Process(server.pid)
            warm, _ = asyncio.run(load(grpc_port, payload, 1.0, args.in_flight, 1))
            wait_delivered(report, warm * points)
            cpu0 = sum(proc.cpu_times()[:2])
            t0 = time.perf_counter()
            sent, latencies = asyncio.run(load(grpc_port, payload, args.seconds, args.in_flight, 1))
            wall = time.perf_counter() - t0
            rss = proc.memory_info().rss
            wait_delivered(report, (warm + sent) * points)
            delivered_wall = time.perf_counter() - t0
            cpu = sum(proc.cpu_times()[:2]) - cpu0
            attributed = {
                source: _sample(admin_port, source)
                for source in ("cgroup", "podresources", "none")
            } if scenario.startswith("k8s") else {}
        finally:
            server.terminate()
            server.wait(30)
            sink.terminate()
            sink.wait(30)
        received = json.loads(report.read_text())["points"]
    latencies.sort()
    return {
        "points_per_s": sent * points / wall,
        "delivered_per_s": sent * points / delivered_wall,
        "points_per_cpu_s": sent * points / cpu if cpu else float("nan"),
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
        "rss_mib": rss / 2**20,
        "lost": (warm + sent) * points - received,
        "attributed": attributed,
        "requests": warm + sent,
    }


def _sample(admin_port: int, source: str) -> float:
    from k8s_setup import metric

    return metric(admin_port, "gputally_k8s_attribution_total", {"source": source}) or 0.0


def interleaved(scenarios: list[str], args: argparse.Namespace,
                payload_for: Callable[[bytes], bytes | Callable[[], bytes]], title: str) -> dict[str, dict[str, Any]]:
    """Each scenario ``args.rounds`` times, interleaved, on the attributed 8-GPU node (10 pods in a
    real API server, 8 GPUs allocated through a PodResources socket); the best round of each.
    ``payload_for`` turns the request's bytes into what the load generator sends."""
    from gputally.otlp.census import census_metrics

    control_plane = cluster()
    best: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        socket = Path(tmp) / "kubelet.sock"
        try:
            ns, pods = setup_pods(control_plane.admin_client(), 10)
            kubelet = FakeKubelet(socket, [
                (ns, pods[g]["name"], "main", f"GPU-1e061ec2-3930-fe87-1e34-cb91101c1b{g:02d}") for g in range(GPUS)
            ])
            payload = node_request([(p["uid"], p["cid"]) for p in pods]).SerializeToString()
            points = census_metrics(payload).items
            print(f"request: {points} points, {len(payload)} bytes, 18 resources{title}; {args.in_flight} in flight; "
                  f"{os.cpu_count()} CPUs; {args.seconds:.0f} s per scenario; best of {args.rounds} round(s)"
                  + ("; server pinned to its own CPU" if args.pin else ""))
            for _ in range(args.rounds):
                for name in scenarios:
                    result = run(name, args, payload_for(payload), points, control_plane.limited_kubeconfig, socket)
                    if name not in best or result["points_per_cpu_s"] > best[name]["points_per_cpu_s"]:
                        best[name] = result
            kubelet.stop()
        finally:
            control_plane.stop()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--pin", action="store_true",
                        help="server on the last CPU; load generator and sink on the rest")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the scenarios, interleaved, and keep the best")
    args = parser.parse_args()
    scenarios = ["forward (no processor)", "resource attribute insert", "k8s (node mode)"]
    best = interleaved(scenarios, args, lambda payload: payload, "")
    print(f"{'scenario':28} {'accepted/s':>10} {'delivered/s':>11} {'pts/CPU-s':>10} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'RSS MiB':>8} {'lost':>5}")
    for name in scenarios:
        r = best[name]
        print(f"{name:28} {r['points_per_s']:>10,.0f} {r['delivered_per_s']:>11,.0f} {r['points_per_cpu_s']:>10,.0f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['rss_mib']:>8.1f} {r['lost']:>5}")
    k8s = best["k8s (node mode)"]
    resources = k8s["attributed"]
    print("k8s resources attributed per request: " + ", ".join(
        f"{source} {count / k8s['requests']:.1f}" for source, count in resources.items()))
    for base in ("forward (no processor)", "resource attribute insert"):
        ratio = k8s["points_per_cpu_s"] / best[base]["points_per_cpu_s"]
        print(f"k8s vs {base}: {ratio:.1%} of its points per CPU-second")


if __name__ == "__main__":
    main()
