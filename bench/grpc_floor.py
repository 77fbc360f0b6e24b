"""What grpc.aio alone costs per request, next to the Collector's whole forward (issue 17).

The floor under a Python OTLP/gRPC server: a server whose handler does nothing, measured on
bench/vs_otelcol.py's load (the 340-point node request, ``--in-flight`` calls, ``--rate``
requests a second), pinned to one core as there. Five servers:

  grpc.aio receive only   a grpc.aio server answering every Export with an empty response
  grpc.aio receive + send the same handler awaiting one grpc.aio call to the sink per request:
                          what forwarding costs on grpcio before any of gputally's own work
  native receive only     the same two on gputally's own gRPC (gputally.h2: server, channel)
  native receive + send
  otelcol forward         the test otelcol (receiver, exporter, no processor): the reference

Each row is points per CPU-second of the server (all threads) and its context switches per
request. When "receive + send" costs more CPU than otelcol's whole forward, no server on that
transport can forward at the Collector's points per core, however little it does.

    .venv/bin/python bench/grpc_floor.py [--rate 1000] [--seconds 8] [--rounds 3] [--scheduling batch|normal]
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
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from pipeline_throughput import METHOD, free_port, wait_port  # noqa: E402
from vs_otelcol import Context, Load, Sink, context_switches, find_otelcol, server_cpu, spawn  # noqa: E402

_BARE = textwrap.dedent("""
    import asyncio, os, sys
    import grpc
    from gputally.util.scheduling import use_batch_scheduling

    PORT, SINK, METHOD, SCHEDULING = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    if SCHEDULING == "batch":
        use_batch_scheduling()

    async def main():
        call = None
        if SINK:
            channel = grpc.aio.insecure_channel(SINK)
            call = channel.unary_unary(METHOD)

        async def export(request, context):
            if call is not None:
                await call(request, timeout=10)
            return b""

        server = grpc.aio.server()
        service, method = METHOD.strip("/").split("/")
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            service, {method: grpc.unary_unary_rpc_method_handler(export)})])
        server.add_insecure_port(f"127.0.0.1:{PORT}")
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())
""")

_NATIVE = textwrap.dedent("""
    import asyncio, sys
    from gputally.h2 import Channel, Method, Server
    from gputally.util.scheduling import use_batch_scheduling

    PORT, SINK, METHOD, SCHEDULING = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    if SCHEDULING == "batch":
        use_batch_scheduling()

    async def main():
        channel = Channel(SINK) if SINK else None

        async def export(request, metadata):
            if channel is not None:
                await channel.unary(METHOD, request, timeout=10)
            return b""

        server = Server({METHOD: Method(export)}, max_receive_message_length=64 << 20)
        await server.listen_tcp("127.0.0.1", PORT)
        await asyncio.Event().wait()

    asyncio.run(main())
""")

ROWS = ("grpc.aio receive only", "grpc.aio receive + send", "native receive only", "native receive + send",
        "otelcol forward")


def run(row: str, args: argparse.Namespace, ctx: Context) -> dict[str, Any]:
    ports = {"grpc": free_port(), "sink": free_port()}
    cpus = list(range(os.cpu_count() or 1))
    server_cpus, other_cpus = cpus[-1:], cpus[:-1] or cpus
    with tempfile.TemporaryDirectory() as tmp:
        sink = Sink(argparse.Namespace(python_sink=False, otelcol=args.otelcol), ports["sink"], other_cpus, Path(tmp))
        if row == "otelcol forward":
            path = Path(tmp) / "config.yaml"
            path.write_text(json.dumps({
                "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{ports['grpc']}"}}}},
                "exporters": {"otlp": {"endpoint": f"127.0.0.1:{ports['sink']}", "tls": {"insecure": True},
                                       "compression": "none",
                                       "sending_queue": {"num_consumers": 8, "queue_size": 5000}}},
                "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}},
                            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "warn"}}},
            }))
            command = [str(args.otelcol), "--config", str(path)]
        else:
            target = f"127.0.0.1:{ports['sink']}" if row.endswith("receive + send") else ""
            script = _NATIVE if row.startswith("native") else _BARE
            command = [sys.executable, "-c", script, str(ports["grpc"]), target, METHOD, args.scheduling]
        proc = spawn(command, server_cpus, stderr=subprocess.DEVNULL)
        psutil.Process().cpu_affinity(other_cpus)
        try:
            wait_port(ports["grpc"], 30)
            ps = psutil.Process(proc.pid)
            asyncio.run(Load(args.rate).grpc(ports["grpc"], ctx.payload, 1.0, args.in_flight))
            cpu0, switches0 = server_cpu(ps), context_switches(ps)
            load = asyncio.run(Load(args.rate).grpc(ports["grpc"], ctx.payload, args.seconds, args.in_flight))
            time.sleep(0.2)  # the last calls' sends
            cpu, switches = server_cpu(ps) - cpu0, context_switches(ps) - switches0
        finally:
            proc.terminate()
            proc.wait(30)
            sink.stop()
    return {"points_per_cpu_s": load.sent * ctx.points / cpu, "us_per_request": cpu / load.sent * 1e6,
            "switches_per_request": switches / max(load.sent, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second offered")
    parser.add_argument("--scheduling", choices=("batch", "normal"), default="batch",
                        help="the Python servers' policy (as gputally's service.scheduling)")
    parser.add_argument("--otelcol", type=Path)
    args = parser.parse_args()
    args.otelcol = args.otelcol or find_otelcol()
    ctx = Context()
    print(f"request: {ctx.points} points, {len(ctx.payload)} bytes; {args.rate:,.0f} requests/s offered, "
          f"{args.in_flight} in flight; server pinned to one of {os.cpu_count()} CPUs; Python servers under "
          f"{args.scheduling} scheduling; {args.rounds} rounds of {args.seconds:.0f} s, rows alternating")
    results: dict[str, list[dict[str, Any]]] = {row: [] for row in ROWS}
    for round_ in range(args.rounds):
        for row in ROWS if round_ % 2 == 0 else ROWS[::-1]:
            r = run(row, args, ctx)
            results[row].append(r)
            print(f"  round {round_ + 1} {row:23} {r['points_per_cpu_s']:>10,.0f} pts/CPU-s "
                  f"{r['us_per_request']:6.0f} us/request {r['switches_per_request']:5.1f} cs/request", flush=True)
    print(f"{'server':23} {'pts/CPU-s':>10} {'us/request':>10} {'cs/request':>10}   (medians of the rounds)")
    for row in ROWS:
        print(f"{row:23} {statistics.median(r['points_per_cpu_s'] for r in results[row]):>10,.0f} "
              f"{statistics.median(r['us_per_request'] for r in results[row]):>10.0f} "
              f"{statistics.median(r['switches_per_request'] for r in results[row]):>10.1f}")


if __name__ == "__main__":
    main()
