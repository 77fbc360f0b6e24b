"""A 60-second backend outage under steady GPU-node load: is every point delivered?

Sends one 340-point GPU-node request every `--period` seconds to `gputally serve`, stops
the sink for `--outage` seconds in the middle, restarts it, waits for the queue to drain and
prints what was sent, what arrived, and the largest queue seen.

    .venv/bin/python bench/backend_outage.py [--outage 60] [--period 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).parent))
from gpu_node_request import gpu_node_request  # noqa: E402
from pipeline_throughput import METHOD, free_port, start_sink, wait_port  # noqa: E402


def exporter_figures(admin: int) -> dict[str, float]:
    """gputally's own exporter metrics, by name (without labels)."""
    figures: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if (line.startswith("gputally_exporter_") and "_created" not in line
                    and 'signal="logs"' not in line and 'signal="traces"' not in line):
                name = line.split("{", 1)[0]
                figures[name] = figures.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return figures


def queue_size(admin: int) -> float:
    return exporter_figures(admin).get("gputally_exporter_queue_size", 0.0)


async def main(args: argparse.Namespace) -> None:
    payload = gpu_node_request().SerializeToString()
    points_per_request = 340
    grpc_port, admin_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        reports = [Path(tmp) / "sink1.json", Path(tmp) / "sink2.json"]
        sink, sink_port = start_sink(reports[0])  # back after the outage on the same port
        config = Path(tmp) / "config.yaml"
        config.write_text(json.dumps({
            "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{grpc_port}"}}}},
            "exporters": {"otlp": {
                "endpoint": f"127.0.0.1:{sink_port}", "tls": {"insecure": True},
                "retry_on_failure": {"initial_interval": "1s", "max_interval": "5s", "max_elapsed_time": "5m"},
                "sending_queue": {"queue_size": args.queue_size},
            }},
            "service": {
                "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}},
                "telemetry": {"metrics": {"address": f"127.0.0.1:{admin_port}"}},
            },
        }))
        server = subprocess.Popen([str(Path(sys.executable).parent / "gputally"), "serve", "--config", str(config)],
                                  stderr=subprocess.DEVNULL)
        wait_port(grpc_port)
        sent = refused = 0
        max_queue = 0.0
        started = time.monotonic()
        total = args.before + args.outage + args.after
        down = False
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            call = channel.unary_unary(METHOD)
            while (elapsed := time.monotonic() - started) < total:
                if not down and args.before <= elapsed < args.before + args.outage:
                    sink.terminate()
                    sink.wait()
                    down = True
                    print(f"t={elapsed:5.1f}s backend down", flush=True)
                elif down and elapsed >= args.before + args.outage:
                    sink, _ = start_sink(reports[1], sink_port)
                    down = False
                    print(f"t={elapsed:5.1f}s backend up again", flush=True)
                try:
                    await call(payload, timeout=5)
                    sent += 1
                except grpc.aio.AioRpcError as exc:
                    refused += 1
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                max_queue = max(max_queue, queue_size(admin_port))
                await asyncio.sleep(args.period)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                figures = exporter_figures(admin_port)
                done = figures.get("gputally_exporter_sent_items_total", 0) + figures.get(
                    "gputally_exporter_send_failed_items_total", 0)
                if done >= sent * points_per_request:
                    break
                await asyncio.sleep(0.5)
        server.terminate()
        server.wait(60)
        sink.terminate()
        sink.wait()
        received = sum(json.loads(r.read_text())["points"] for r in reports if r.exists())
    print(f"accepted {sent * points_per_request} points in {sent} requests "
          f"({refused} requests refused with RESOURCE_EXHAUSTED for the sender to retry)")
    print("gputally's own count: " + ", ".join(f"{k.removeprefix('gputally_exporter_')}={v:.0f}" for k, v in figures.items()))
    print(f"backend received {received} points; lost {sent * points_per_request - received}; "
          f"largest queue {max_queue:.0f} of {args.queue_size} batches")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage", type=float, default=60.0)
    parser.add_argument("--before", type=float, default=5.0)
    parser.add_argument("--after", type=float, default=5.0)
    parser.add_argument("--period", type=float, default=0.1, help="seconds between requests")
    parser.add_argument("--queue-size", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
