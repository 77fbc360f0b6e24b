"""A minimal OTLP/gRPC metrics backend for benchmarks: counts points, answers at once.

Run: python bench/sink.py --report /tmp/sink.json  (totals rewritten every 0.1 s); it listens on
--port (0, the default: a port the kernel picks) and prints "ready PORT" once it does.
     [--keep-first /tmp/first.bin]  (the first request's bytes, as received: what the server sent)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal

import grpc

from gputally.otlp.census import census_metrics

METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


async def main(port: int, report: str, keep_first: str | None = None) -> None:
    totals = {"requests": 0, "points": 0}

    async def export(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if keep_first and not totals["requests"]:
            with open(keep_first + ".tmp", "wb") as out:
                out.write(request)
            os.replace(keep_first + ".tmp", keep_first)
        totals["requests"] += 1
        totals["points"] += census_metrics(request).items
        return b""

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.metrics.v1.MetricsService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print(f"ready {port}", flush=True)
    while not stop.is_set():  # totals on disk every 0.1 s, so a benchmark can watch delivery
        write(report, totals)
        try:
            await asyncio.wait_for(stop.wait(), 0.1)
        except TimeoutError:
            pass
    await server.stop(1)
    write(report, totals)


def write(report: str, totals: dict[str, int]) -> None:
    with open(report + ".tmp", "w") as out:
        json.dump(totals, out)
    os.replace(report + ".tmp", report)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--report", required=True)
    parser.add_argument("--keep-first", help="write the first request's bytes to this file")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.report, args.keep_first))
