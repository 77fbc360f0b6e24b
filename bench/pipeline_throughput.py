"""Throughput and latency of `gputally serve` for a GPU node's requests, per scenario.

Starts a sink (bench/sink.py), then `gputally serve` with a generated config forwarding to
it, then sends the 340-point request of bench/gpu_node_request.py with N requests in
flight for a fixed time. Prints, per scenario: points/s through the pipeline, points per
second of server CPU (the "per core" figure), p50/p99 latency, server RSS, and whether the
sink received every point.

    .venv/bin/python bench/pipeline_throughput.py [--seconds 10] [--in-flight 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from gpu_node_request import gpu_node_request  # noqa: E402

METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
SCENARIOS = {
    "forward (no processor)": [],
    "resource attribute insert": [
        {"key": "k8s.cluster.name", "value": "bench", "action": "insert", "context": "resource"}
    ],
    "attribute on every point": [{"key": "k8s.cluster.name", "value": "bench", "action": "insert", "context": "point"}],
}


def free_port() -> int:
    """A port for a server that must be told it up front (``serve --workers`` sharing one): a
    race with any other process binding one, acceptable in a benchmark run on a quiet machine.
    Servers that can, bind port 0 (`start_sink`)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sink(report: Path, port: int = 0, **popen: Any) -> tuple[subprocess.Popen[bytes], int]:
    """bench/sink.py counting into ``report``, listening (on ``port``, 0: one of its own); it
    and its port."""
    sink = subprocess.Popen([sys.executable, str(Path(__file__).parent / "sink.py"), "--port", str(port),
                             "--report", str(report)], stdout=subprocess.PIPE, **popen)
    assert sink.stdout is not None
    said = sink.stdout.readline().split()  # b"ready PORT"
    if said[:1] != [b"ready"]:
        sink.kill()
        raise RuntimeError(f"bench/sink.py did not start: {said}")
    return sink, int(said[1])


def write_config(path: Path, grpc_port: int, sink_port: int, actions: list[dict[str, object]]) -> None:
    processors = {"attributes/bench": {"actions": actions}} if actions else {}
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}}}},
        "processors": processors,
        "exporters": {
            "otlp": {
                "endpoint": f"127.0.0.1:{sink_port}",
                "tls": {"insecure": True},
                "compression": "none",
                "sending_queue": {"num_consumers": 8, "queue_size": 5000},
            }
        },
        "service": {
            "pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(processors), "exporters": ["otlp"]}},
            "telemetry": {"metrics": {"address": None}},
        },
    }
    path.write_text(json.dumps(config))  # JSON is YAML


def wait_delivered(report: Path, points: int, timeout: float = 120.0) -> None:
    """Wait until the sink has counted ``points`` (or give up: the table's ``lost`` says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if json.loads(report.read_text())["points"] >= points:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


def wait_port(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


async def load(port: int, payload: bytes | Callable[[], bytes], seconds: float, in_flight: int,
               channels: int) -> tuple[int, list[float]]:
    """Send for ``seconds`` with ``in_flight`` calls outstanding: the same bytes each time, or
    what ``payload()`` returns for each call (a fresh timestamp, for stateful processors)."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # one TCP connection per channel
    chans = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(channels)]
    calls = [c.unary_unary(METHOD) for c in chans]
    latencies: list[float] = []
    sent = 0
    deadline = time.perf_counter() + seconds

    async def worker(index: int) -> None:
        nonlocal sent
        call = calls[index % len(calls)]
        while time.perf_counter() < deadline:
            body = payload() if callable(payload) else payload
            started = time.perf_counter()
            await call(body, timeout=10)
            latencies.append(time.perf_counter() - started)
            sent += 1

    await asyncio.gather(*(worker(i) for i in range(in_flight)))
    for c in chans:
        await c.close()
    return sent, latencies


def run_scenario(name: str, actions: list[dict[str, object]], args: argparse.Namespace, payload: bytes, points: int) -> dict[str, object]:
    grpc_port = free_port()  # the workers share it
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "sink.json"
        config = Path(tmp) / "config.yaml"
        sink, sink_port = start_sink(report)
        write_config(config, grpc_port, sink_port, actions)
        sink_proc = psutil.Process(sink.pid)
        gputally = Path(sys.executable).parent / "gputally"
        server = subprocess.Popen(
            [str(gputally), "serve", "--config", str(config), "--workers", str(args.workers)],
            stderr=subprocess.DEVNULL,
        )
        if args.pin:
            # The server gets its own core(s); load generator and sink share the rest.
            server_cpus = set(range(os.cpu_count() or 1)[-args.workers:])
            others = set(range(os.cpu_count() or 1)) - server_cpus
            psutil.Process(server.pid).cpu_affinity(sorted(server_cpus))
            sink_proc.cpu_affinity(sorted(others))
            psutil.Process().cpu_affinity(sorted(others))
        try:
            wait_port(grpc_port)
            proc = psutil.Process(server.pid)
            procs = [proc, *proc.children()] if args.workers > 1 else [proc]
            warm, _ = asyncio.run(load(grpc_port, payload, 1.0, args.in_flight, args.channels))
            wait_delivered(report, warm * points)
            cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
            t0 = time.perf_counter()
            sent, latencies = asyncio.run(load(grpc_port, payload, args.seconds, args.in_flight, args.channels))
            wall = time.perf_counter() - t0
            rss = sum(p.memory_info().rss for p in procs)
            wait_delivered(report, (warm + sent) * points)
            delivered_wall = time.perf_counter() - t0
            cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - cpu0
        finally:
            server.terminate()
            server.wait(30)
            sink.terminate()
            sink.wait(30)
        received = json.loads(report.read_text())["points"]
    latencies.sort()
    total_sent = sent * points
    return {
        "scenario": name,
        "points_per_s": total_sent / wall,
        "delivered_per_s": total_sent / delivered_wall,
        "points_per_cpu_s": total_sent / cpu if cpu else float("nan"),
        "server_cpu": cpu / delivered_wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1e3,
        "rss_mib": rss / 2**20,
        # every point sent (warm-up included) must have reached the sink after the drain
        "lost": (warm + sent) * points - received,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--channels", type=int, default=1, help="client connections (use >1 with --workers)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--only", help="run only scenarios whose name contains this")
    parser.add_argument("--pin", action="store_true",
                        help="pin the server to the last --workers CPUs and load generator + sink to the others")
    args = parser.parse_args()
    request = gpu_node_request()
    payload = request.SerializeToString()
    from gputally.otlp.census import census_metrics

    points = census_metrics(payload).items
    print(f"request: {points} points, {len(payload)} bytes; {args.in_flight} in flight on {args.channels} connection(s); "
          f"{args.workers} worker(s); {os.cpu_count()} CPUs on this machine; {args.seconds:.0f}s per scenario"
          + ("; server pinned to its own CPU(s)" if args.pin else ""))
    print("accepted/s: points the server took per second; delivered/s: the same points over the time until the")
    print("sink had them all; pts/CPU-s: points per second of server CPU (user+sys, all threads) = the per-core figure")
    print(f"{'scenario':28} {'accepted/s':>10} {'delivered/s':>11} {'pts/CPU-s':>10} {'srv CPU':>8} {'p50 ms':>7} {'p99 ms':>7} {'RSS MiB':>8} {'lost':>5}")
    for name, actions in SCENARIOS.items():
        if args.only and args.only not in name:
            continue
        r = run_scenario(name, actions, args, payload, points)
        print(f"{name:28} {r['points_per_s']:>10,.0f} {r['delivered_per_s']:>11,.0f} {r['points_per_cpu_s']:>10,.0f} {r['server_cpu']:>8.2f} "
              f"{r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} {r['rss_mib']:>8.1f} {r['lost']:>5}")


if __name__ == "__main__":
    main()
