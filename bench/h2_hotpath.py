"""CPU per unary call of gputally's own HTTP/2 + gRPC stack (gputally.h2), A/B across source trees.

The hot path of a valid call and nothing else: a ``gputally.h2`` server whose Export handler
answers an empty response at once, in a process of its own pinned to the last CPU, and a
client pinned to the first that sends bench/gpu_node_request.py's 340-point request (about
40 KB) over one connection, with ``grpc-timeout`` as bench/vs_otelcol.py's load sends it:

  sequential   one call at a time (every call its own read, task and write)
  concurrent   ``--in-flight`` calls outstanding (several requests a read, as vs_otelcol's 8)

The client is grpc.aio (``--client grpcio``, the load generator of bench/vs_otelcol.py, whose
header blocks change every call: grpc-timeout is a fresh literal) or the tree's own
``gputally.h2.Channel`` (``--client native``, the otlp exporter's side, whose CPU is reported
too). Each ``--tree`` is a checkout whose ``src/`` is put first on the server's (and the native
client's) PYTHONPATH, so ``gputally.h2`` comes from it; the trees run interleaved, round by
round, in alternating order, and the medians of the rounds are printed. CPU is the server
process's own ``time.process_time`` (asked over a control method before and after each phase,
so loop start-up and imports are not counted), and the client's, in microseconds per call.

``--profile DIR`` also runs one more, profiled, round per tree and prints the server's 25
costliest functions (cProfile, by own time) during the concurrent phase.

    git worktree add /tmp/h2-old 7ae40e9
    .venv/bin/python bench/h2_hotpath.py --tree /tmp/h2-old --tree . [--rounds 5] [--calls 3000]
                                         [--in-flight 8] [--client grpcio|native] [--profile DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from gpu_node_request import gpu_node_request  # noqa: E402
from pipeline_throughput import METHOD, free_port, wait_port  # noqa: E402
from vs_otelcol import spawn  # noqa: E402

CONTROL = "/bench.Control/Run"

_SERVER = textwrap.dedent("""
    import asyncio, cProfile, sys, time
    from gputally.h2 import Method, Server

    PORT, METHOD, CONTROL, PROFILE = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    profiler = cProfile.Profile(time.process_time)  # CPU, not the wall time epoll waits

    async def export(request, metadata):
        return b""

    async def control(request, metadata):
        if request == b"profile-start":
            profiler.enable()
        elif request == b"profile-stop":
            profiler.disable()
            profiler.dump_stats(PROFILE)
        return repr(time.process_time()).encode()

    async def main():
        server = Server({METHOD: Method(export), CONTROL: Method(control)}, max_receive_message_length=64 << 20)
        await server.listen_tcp("127.0.0.1", PORT)
        await asyncio.Event().wait()

    asyncio.run(main())
""")

_CLIENT = textwrap.dedent("""
    import asyncio, json, sys, time

    PORT, METHOD, CONTROL, PAYLOAD, KIND = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    CALLS, IN_FLIGHT, WARMUP, PROFILE = int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]), sys.argv[9] == "1"
    payload = open(PAYLOAD, "rb").read()

    async def main():
        target = f"127.0.0.1:{PORT}"
        if KIND == "grpcio":
            import grpc
            channel = grpc.aio.insecure_channel(target)
            export, ctl = channel.unary_unary(METHOD), channel.unary_unary(CONTROL)
            async def call():
                await export(payload, timeout=10)
            async def control(what):
                return float(await ctl(what, timeout=10))
        else:
            from gputally.h2 import Channel
            channel = Channel(target)
            async def call():
                await channel.unary(METHOD, payload, timeout=10)
            async def control(what):
                return float(await channel.unary(CONTROL, what, timeout=10))

        async def phase(in_flight):
            left = [CALLS]
            async def worker():
                while left[0] > 0:
                    left[0] -= 1
                    await call()
            server0, client0 = await control(b"cpu"), time.process_time()
            await asyncio.gather(*(worker() for _ in range(in_flight)))
            client1, server1 = time.process_time(), await control(b"cpu")
            return {"server_us": (server1 - server0) / CALLS * 1e6, "client_us": (client1 - client0) / CALLS * 1e6}

        for _ in range(WARMUP):
            await call()
        result = {"sequential": await phase(1)}
        if PROFILE:
            await control(b"profile-start")
        result["concurrent"] = await phase(IN_FLIGHT)
        if PROFILE:
            await control(b"profile-stop")
        print(json.dumps(result))

    asyncio.run(main())
""")


def run(tree: Path, args: argparse.Namespace, payload: Path, profile: Path | None) -> dict[str, Any]:
    """One server and one client from ``tree``: CPU microseconds per call, per phase."""
    port = free_port()
    cpus = list(range(os.cpu_count() or 1))
    server_cpus, client_cpus = cpus[-1:], cpus[:-1] or cpus
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    server = spawn([sys.executable, "-c", _SERVER, str(port), METHOD, CONTROL, str(profile or "")], server_cpus,
                   env=env)
    try:
        wait_port(port, 30)
        client = spawn([sys.executable, "-c", _CLIENT, str(port), METHOD, CONTROL, str(payload), args.client,
                        str(args.calls), str(args.in_flight), str(args.warmup), "1" if profile else "0"],
                       client_cpus, env=env, stdout=subprocess.PIPE)
        out, _ = client.communicate(timeout=600)
        if client.returncode:
            raise RuntimeError(f"the client for {tree} failed ({client.returncode})")
        return json.loads(out)
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to measure (repeatable; default .)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000, help="calls per phase")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--client", choices=("grpcio", "native"), default="grpcio")
    parser.add_argument("--profile", type=Path, help="also profile the server; stats files go here")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in (args.tree or [Path(".")])]
    labels = [f"{i}:{tree.name}" for i, tree in enumerate(trees)]
    phases = ("sequential", "concurrent")
    sides = ("server_us", "client_us") if args.client == "native" else ("server_us",)
    print(f"{args.calls} calls a phase, {args.in_flight} in flight when concurrent, {args.client} client, "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    results: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as tmp:
        payload = Path(tmp) / "request.bin"
        payload.write_bytes(gpu_node_request().SerializeToString())
        for round_ in range(args.rounds):
            order = list(zip(labels, trees, strict=True))
            for label, tree in order if round_ % 2 == 0 else order[::-1]:
                r = run(tree, args, payload, None)
                results[label].append(r)
                figures = "  ".join(f"{phase} {side[:-3]} {r[phase][side]:6.1f}" for phase in phases for side in sides)
                print(f"  round {round_ + 1} {label:24} {figures}  (load {os.getloadavg()[0]:.2f})", flush=True)
        print(f"\nCPU us per call, medians of {args.rounds} rounds:")
        for label in labels:
            figures = "  ".join(f"{phase} {side[:-3]} {statistics.median(r[phase][side] for r in results[label]):6.1f}"
                                for phase in phases for side in sides)
            print(f"  {label:24} {figures}")
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            for label, tree in zip(labels, trees, strict=True):
                stats_path = args.profile / f"{label.replace(':', '-')}.prof"
                run(tree, args, payload, stats_path)
                print(f"\nserver profile, {label}, concurrent phase ({stats_path}):")
                pstats.Stats(str(stats_path)).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
