"""What the bridge costs: a Collector with gputally in line, against the loopback and otelcol alone.

The load of bench/vs_otelcol.py (bench/gpu_node_request.py's 340-point request of an 8-GPU
node, 8 calls in flight over one connection, its `Load`), offered at a fixed ``--rate``
(default 1,000 requests/s) and then in a closed loop, through three arrangements that all
insert one resource attribute (``k8s.cluster.name``) and deliver to one sink:

  bridge    otelcol: otlp -> gputally processor -> otlp exporter -> sink
                                  | bridge API (loopback TCP)
            gputally serve: bridge -> metrics/bridge [attributes (resource insert)]
  loopback  otelcol: otlp -> otlp/gputally exporter --OTLP--> gputally serve: otlp ->
            [attributes] -> otlp exporter --OTLP--> otelcol: otlp/back -> otlp exporter -> sink
            (collector-config/pipeline-stage/loopback/)
  otelcol   otelcol alone: otlp -> resource (insert) -> otlp exporter -> sink

pts/CPU-s: points delivered per CPU-second of otelcol and gputally together (user + system
from /proc/PID/stat through psutil, counted until the sink had every point). Latency, per
request: "call", what the sender waits for its answer (the bridge's call is inside it; the
loopback's second hop is not: its otelcol answers once its exporter queued the request);
"e2e", from the send until the sink received it (every point of request ``i`` is stamped
with time ``BASE + i``, and the sink, a process of its own on gputally's native gRPC server,
notes when each stamp first arrives; both read CLOCK_MONOTONIC). "added" is a
scenario's e2e percentile minus otelcol alone's. The table has the median of the rounds.
Figures only: nothing here asserts a timing.

Three modes: the fixed ``--rate``; a closed loop (``--in-flight`` calls, each sent again once
answered); one call at a time (the latency a stage adds when nothing queues). "harness" is
the CPU of the load generator and the sink per request, and "busy" the share of the servers'
and harness's CPUs in use: added latency at a fixed rate is mostly queueing for CPU once
"busy" nears 100 %. "h.busy" is the harness's share of its own CPUs: near 100 %, the load
generator, not the servers, sets the pace. Below the table, the bridge stage's own time, as
the processor's ``otelcol_processor_gputally_call_duration`` histogram saw it (encode, call,
decode: no queueing in otelcol's receiver or exporter), to its bucket bounds (the rounds'
highest); every scenario's otelcol runs with the same telemetry. On 6 CPUs or more the
harness gets the last two to itself, out of the servers' way; ``--server-cpus`` and
``--harness-cpus`` set the split. The load generator is gputally's own gRPC client
(``--client grpc`` for grpc.aio, which costs about 100 us more a request here).

    tests/harness/otelcol/build.sh
    .venv/bin/python bench/bridge.py [--seconds 8] [--rounds 2] [--rate 1000] [--no-closed-loop]
        [--no-one-at-a-time] [--client native|grpc] [--server-cpus 0-5 --harness-cpus 6,7]
        [--workers N] [--whole-batch | --also-whole]

The bridge's processor takes patch answers (its default); ``--whole-batch`` makes it ask for
whole batches, ``--also-whole`` adds that arrangement as a fourth scenario, "whole", in the
same rounds. ``--workers N`` runs gputally on N processes and gives the processor as many
connections (the loopback's exporter keeps its one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from gpu_node_request import gpu_node_request  # noqa: E402
from pipeline_throughput import METHOD, free_port, wait_port  # noqa: E402
from vs_otelcol import Load, find_otelcol, server_cpu, spawn  # noqa: E402

SCENARIOS = ("bridge", "loopback", "otelcol")
NOW_NS = 1_795_977_093_000_000_000
"""gpu_node_request's point time, replaced in each request by ``BASE + i``."""
BASE = NOW_NS & ~0xFFFF_FFFF
"""Its high 32 bits, kept: the sink finds a stamp as a point's time field (tag 0x19, fixed64)
whose high half is this, and reads ``i`` from the low half."""
STAMP = re.compile(rb"\x19(.{4})" + re.escape(struct.pack("<I", BASE >> 32)), re.S)
INSERT = {"key": "k8s.cluster.name", "value": "bench"}


class Stamped:
    """The request, each call's copy stamped with the next number; the send time of each."""

    def __init__(self) -> None:
        self.template = gpu_node_request(now_ns=NOW_NS).SerializeToString()
        self.old = struct.pack("<Q", NOW_NS)
        self.points = self.template.count(self.old)
        self.sent_at: list[float] = []

    def __call__(self) -> bytes:
        self.sent_at.append(time.perf_counter())
        return self.template.replace(self.old, struct.pack("<Q", BASE + len(self.sent_at) - 1))


def sink_main(port: int, report: Path) -> None:
    """The sink: answers every call at once, notes each stamp's first arrival; writes its
    counts every 0.1 s and, on SIGTERM, the arrival times to ``report``."""
    from gputally.h2 import Method, Server

    arrived: dict[int, float] = {}
    totals = {"requests": 0, "points": 0}

    async def export(request: bytes, metadata: object) -> bytes:
        now = time.perf_counter()
        totals["requests"] += 1
        stamps = STAMP.findall(request)
        totals["points"] += len(stamps)
        for low in set(stamps):  # a request's points share one stamp
            arrived.setdefault(int.from_bytes(low, "little"), now)
        return b""

    async def main() -> None:
        server = Server({METHOD: Method(export)}, max_receive_message_length=64 << 20)
        await server.listen_tcp("127.0.0.1", port)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        while not stop.is_set():
            write(report.with_suffix(".counts"), {**totals, "stamps": len(arrived)})
            try:
                await asyncio.wait_for(stop.wait(), 0.1)
            except TimeoutError:
                pass
        await server.shutdown(1.0)
        write(report, {**totals, "arrived": arrived})

    asyncio.run(main())


def write(path: Path, data: dict[str, Any]) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(data))
    os.replace(path.with_suffix(".tmp"), path)


def otelcol_config(scenario: str, ports: dict[str, int], *, workers: int = 1, whole: bool = False) -> dict[str, Any]:
    def otlp(port: int) -> dict[str, Any]:
        return {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{port}", "max_recv_msg_size_mib": 64}}}

    def exporter(port: int) -> dict[str, Any]:
        return {"endpoint": f"127.0.0.1:{port}", "tls": {"insecure": True}, "compression": "none",
                "sending_queue": {"num_consumers": 8, "queue_size": 5000}}

    receivers, exporters = {"otlp": otlp(ports["front"])}, {"otlp": exporter(ports["sink"])}
    processors: dict[str, Any] = {}
    pipelines: dict[str, Any] = {"metrics": {"receivers": ["otlp"], "processors": [], "exporters": ["otlp"]}}
    # Telemetry on in every scenario alike: the bridge's gives stage_buckets the processor's
    # call_duration histogram, and the others pay the same for theirs.
    pull = {"exporter": {"prometheus": {"host": "127.0.0.1", "port": ports["telemetry"]}}}
    metrics = {"level": "normal", "readers": [{"pull": pull}]}
    if scenario in ("bridge", "whole"):
        processors["gputally"] = {"endpoint": f"127.0.0.1:{ports['gputally']}", "tls": {"insecure": True},
                                  "pipeline": "metrics/bridge", "accept_patch": not whole and scenario != "whole",
                                  "connections": workers}
        pipelines["metrics"]["processors"] = ["gputally"]
    elif scenario == "loopback":
        receivers["otlp/back"] = otlp(ports["back"])
        exporters["otlp/gputally"] = exporter(ports["gputally"])
        pipelines = {"metrics": {"receivers": ["otlp"], "exporters": ["otlp/gputally"]},
                     "metrics/back": {"receivers": ["otlp/back"], "exporters": ["otlp"]}}
    else:
        processors["resource/bench"] = {"attributes": [{**INSERT, "action": "insert"}]}
        pipelines["metrics"]["processors"] = ["resource/bench"]
    return {"receivers": receivers, "processors": processors, "exporters": exporters,
            "service": {"pipelines": pipelines, "telemetry": {"metrics": metrics, "logs": {"level": "warn"}}}}


def gputally_config(scenario: str, ports: dict[str, int]) -> dict[str, Any]:
    processors = {"attributes/bench": {"actions": [{**INSERT, "action": "insert", "context": "resource"}]}}
    if scenario in ("bridge", "whole"):
        return {"receivers": {"bridge": {"endpoint": f"127.0.0.1:{ports['gputally']}"}}, "processors": processors,
                "exporters": {"debug": {}},
                "service": {"pipelines": {"metrics/bridge": {"receivers": ["bridge"], "processors": list(processors),
                                                             "exporters": ["debug"]}},
                            "telemetry": {"metrics": {"address": None}}}}
    return {"receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"127.0.0.1:{ports['gputally']}"}}}},
            "processors": processors,
            "exporters": {"otlp": {"endpoint": f"127.0.0.1:{ports['back']}", "tls": {"insecure": True},
                                   "compression": "none", "sending_queue": {"num_consumers": 8, "queue_size": 5000}}},
            "service": {"pipelines": {"metrics": {"receivers": ["otlp"], "processors": list(processors),
                                                  "exporters": ["otlp"]}},
                        "telemetry": {"metrics": {"address": None}}}}


def sink_counts(report: Path) -> dict[str, int]:
    try:
        return dict(json.loads(report.with_suffix(".counts").read_text()))
    except (OSError, ValueError):
        return {"requests": 0, "points": 0, "stamps": 0}


BUCKET = re.compile(r"^otelcol_processor_gputally_call_duration_bucket\{([^}]*)\} (\S+)$", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def stage_buckets(port: int) -> dict[float, float]:
    """The processor's own call_duration histogram (successful calls) from otelcol's telemetry:
    calls at or under each bucket's bound in ms, cumulative."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    buckets: dict[float, float] = {}
    for labels, count in BUCKET.findall(text):
        found = dict(LABEL.findall(labels))
        if found.get("outcome") == "ok":  # summed over signals and any other label
            le = float(found["le"])
            buckets[le] = buckets.get(le, 0.0) + float(count)
    return buckets


def stage_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, float]:
    """Of the calls between two scrapes: the share done within 1 ms, and the bucket bounds
    (ms) that hold the 50th and 99th percentiles."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    if not total:
        return {"stage_within_1ms": float("nan"), "stage_p50_le": float("nan"), "stage_p99_le": float("nan")}

    def bound(q: float) -> float:
        return next(le for le, count in counts.items() if count >= q * total)

    return {"stage_within_1ms": counts.get(1.0, 0.0) / total, "stage_p50_le": bound(0.5), "stage_p99_le": bound(0.99)}


def cpu_split(args: argparse.Namespace) -> tuple[list[int], list[int]]:
    """The servers' CPUs and the harness's (load generator and sink)."""
    cpus = sorted(psutil.Process().cpu_affinity())
    servers = args.server_cpus or (cpus[:-2] if len(cpus) >= 6 else cpus)
    harness = args.harness_cpus or (cpus[-2:] if len(cpus) >= 6 else cpus)
    return servers, harness


def cpu_list(text: str) -> list[int]:
    """``0-3,6`` as [0, 1, 2, 3, 6]."""
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(int(len(ordered) * q) - 1, 0)] if ordered else float("nan")


class CpuTimes(NamedTuple):
    user: float
    system: float
    children_user: float
    children_system: float


class Tree:
    """A server and the worker processes it forked (``gputally serve --workers``), whose CPU
    counts with it while they live (reaped children's count through ``server_cpu`` already)."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.children = self.process.children(recursive=True)

    def cpu_times(self) -> Any:
        total = [0.0, 0.0, 0.0, 0.0]
        for process in (self.process, *self.children):
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            for i, value in enumerate((times.user, times.system, times.children_user, times.children_system)):
                total[i] += value
        return CpuTimes(*total)


def run(scenario: str, args: argparse.Namespace, rate: float, in_flight: int) -> dict[str, Any]:
    """Fresh processes; 1 s of warm-up, then ``args.seconds`` of load, counted until delivered."""
    ports = {name: free_port() for name in ("front", "gputally", "back", "sink", "telemetry")}
    cpus, harness_cpus = cpu_split(args)
    me = psutil.Process()
    saved_affinity = me.cpu_affinity()
    stamped = Stamped()

    def send(seconds: float) -> Load:
        return asyncio.run(getattr(Load(rate), args.client)(ports["front"], stamped, seconds, in_flight))

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "arrivals.json"
        sink = spawn([sys.executable, __file__, "--sink", str(ports["sink"]), str(report)], harness_cpus)
        processes: list[subprocess.Popen[bytes]] = [sink]
        try:
            wait_port(ports["sink"], 30)
            if scenario != "otelcol":
                path = Path(tmp) / "gputally.yaml"
                path.write_text(json.dumps(gputally_config(scenario, ports)))
                processes.append(spawn([str(Path(sys.executable).parent / "gputally"), "serve", "--config", str(path),
                                        "--workers", str(args.workers)],
                                       cpus, stderr=None if args.verbose else subprocess.DEVNULL))
                wait_port(ports["gputally"], 30)
            path = Path(tmp) / "otelcol.yaml"
            path.write_text(json.dumps(otelcol_config(scenario, ports, workers=args.workers, whole=args.whole_batch)))
            processes.append(spawn([str(args.otelcol), "--config", str(path)], cpus,
                                   stderr=None if args.verbose else subprocess.DEVNULL))
            wait_port(ports["front"], 30)
            servers = [Tree(p.pid) for p in processes[1:]]
            harness = [me, psutil.Process(sink.pid)]
            me.cpu_affinity(harness_cpus)
            warm = send(1.0).sent
            first = len(stamped.sent_at)
            deadline = time.monotonic() + 30
            while sink_counts(report)["stamps"] < warm and time.monotonic() < deadline:
                time.sleep(0.05)
            stage0 = stage_buckets(ports["telemetry"]) if scenario in ("bridge", "whole") else {}
            cpu0 = [server_cpu(p) for p in servers]
            harness0 = [server_cpu(p) for p in harness]
            t0 = time.perf_counter()
            load = send(args.seconds)
            wall = time.perf_counter() - t0
            harness_cpu = sum(server_cpu(p) - before for p, before in zip(harness, harness0, strict=True))
            busy_cpu = sum(server_cpu(p) - before for p, before in zip(servers, cpu0, strict=True)) + harness_cpu
            deadline = time.monotonic() + 60
            while sink_counts(report)["stamps"] < warm + load.sent and time.monotonic() < deadline:
                time.sleep(0.05)
            cpus_used = [server_cpu(p) - before for p, before in zip(servers, cpu0, strict=True)]
            cpu = sum(cpus_used)
            stage = stage_summary(stage0, stage_buckets(ports["telemetry"])) if scenario in ("bridge", "whole") else {}
        finally:
            me.cpu_affinity(saved_affinity)
            for process in reversed(processes):
                process.send_signal(signal.SIGTERM)
                process.wait(30)
        result = json.loads(report.read_text())
    arrived = {int(k): v for k, v in result["arrived"].items()}
    e2e = [arrived[i] - stamped.sent_at[i] for i in range(first, len(stamped.sent_at)) if i in arrived]
    points = load.sent * stamped.points
    return {
        "points_per_cpu_s": points / cpu if cpu else float("nan"),
        "req_per_s": load.sent / wall,
        "call_p50": statistics.median(load.latencies) * 1e3, "call_p99": percentile(load.latencies, 0.99) * 1e3,
        "e2e_p50": statistics.median(e2e) * 1e3 if e2e else float("nan"), "e2e_p99": percentile(e2e, 0.99) * 1e3,
        "lost": warm + load.sent - len(arrived), "refused": load.refused,
        "cpu_us_per_request": cpu / max(load.sent, 1) * 1e6,
        "harness_us_per_request": harness_cpu / max(load.sent, 1) * 1e6,
        "busy": busy_cpu / (wall * len(set(cpus) | set(harness_cpus))),
        "harness_busy": harness_cpu / (wall * len(harness_cpus)),
        **stage,
        # processes[1:] is [gputally, otelcol] or [otelcol]
        "gputally_us_per_request": cpus_used[0] / max(load.sent, 1) * 1e6 if len(cpus_used) == 2 else 0.0,
        "otelcol_us_per_request": cpus_used[-1] / max(load.sent, 1) * 1e6,
    }


def report(mode: str, results: dict[str, list[dict[str, Any]]]) -> None:
    med = {s: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for s, runs in results.items()}
    base = med["otelcol"]
    print(f"\n{mode}: median of {len(results['otelcol'])} round(s)")
    print(f"{'scenario':10} {'pts/CPU-s':>10} {'us CPU/req (g+o)':>18} {'harness':>7} {'busy':>5} {'h.busy':>6} {'req/s':>7} "
          f"{'call p50/p99 ms':>16} {'e2e p50/p99 ms':>15} {'added p50/p99 ms':>17} {'lost':>5} {'refused':>7}")
    for scenario, m in med.items():
        added = (f"{m['e2e_p50'] - base['e2e_p50']:+.2f}/{m['e2e_p99'] - base['e2e_p99']:+.2f}"
                 if scenario != "otelcol" else "-")
        split = f"{m['cpu_us_per_request']:,.0f} ({m['gputally_us_per_request']:,.0f}+{m['otelcol_us_per_request']:,.0f})"
        print(f"{scenario:10} {m['points_per_cpu_s']:>10,.0f} {split:>18} {m['harness_us_per_request']:>7,.0f} "
              f"{m['busy']:>5.0%} {m['harness_busy']:>6.0%} {m['req_per_s']:>7,.0f} "
              f"{m['call_p50']:>7.2f}/{m['call_p99']:<8.2f} {m['e2e_p50']:>6.2f}/{m['e2e_p99']:<8.2f} {added:>17} "
              f"{m['lost']:>5.0f} {m['refused']:>7.0f}")
    stage = {**med["bridge"], **{k: max((r[k] for r in results["bridge"] if not math.isnan(r[k])), default=math.nan)
                                 for k in ("stage_p50_le", "stage_p99_le")}}
    print(f"the bridge stage itself (the processor's call_duration, in otelcol): {stage['stage_within_1ms']:.1%} "
          f"of calls within 1 ms; p50 <= {stage['stage_p50_le']:g} ms, p99 <= {stage['stage_p99_le']:g} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second offered (fixed schedule)")
    parser.add_argument("--in-flight", type=int, default=8)
    parser.add_argument("--no-closed-loop", action="store_true", help="skip the closed loop")
    parser.add_argument("--no-one-at-a-time", action="store_true", help="skip the one-call-at-a-time mode")
    parser.add_argument("--client", choices=("native", "grpc"), default="native",
                        help="the load generator's gRPC: gputally.h2 (the cheaper) or grpc.aio")
    parser.add_argument("--server-cpus", type=cpu_list, help="CPUs for otelcol and gputally, as 0-3,6")
    parser.add_argument("--harness-cpus", type=cpu_list, help="CPUs for the load generator and the sink")
    parser.add_argument("--otelcol", type=Path, help="the otelcol binary (default: tests/harness/otelcol/build.sh's)")
    parser.add_argument("--verbose", action="store_true", help="let the servers' stderr through")
    parser.add_argument("--workers", type=int, default=1,
                        help="gputally serve --workers N; the bridge processor opens as many connections")
    parser.add_argument("--whole-batch", action="store_true",
                        help="the bridge processor asks for whole-batch answers (accept_patch: false)")
    parser.add_argument("--also-whole", action="store_true",
                        help="a fourth scenario, whole: the bridge with whole-batch answers, interleaved")
    parser.add_argument("--sink", nargs=2, metavar=("PORT", "REPORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sink:
        sink_main(int(args.sink[0]), Path(args.sink[1]))
        return
    args.otelcol = args.otelcol or find_otelcol()
    version = subprocess.run([str(args.otelcol), "--version"], capture_output=True, text=True).stdout.strip()
    servers, harness = cpu_split(args)
    print(f"request: {Stamped().points} points; {args.in_flight} in flight; {os.cpu_count()} CPUs, servers on "
          f"{servers}, harness on {harness}; {args.seconds:.0f} s per run; {args.rounds} round(s), "
          f"scenarios alternating; {version}")
    modes = [(f"fixed rate, {args.rate:,.0f} requests/s offered", args.rate, args.in_flight)]
    if not args.no_closed_loop:
        modes.append(("closed loop (each call sent again once answered)", 0.0, args.in_flight))
    if not args.no_one_at_a_time:
        modes.append(("one at a time (closed loop, 1 in flight)", 0.0, 1))
    for mode, rate, in_flight in modes:
        scenarios = (*SCENARIOS, "whole") if args.also_whole else SCENARIOS
        results: dict[str, list[dict[str, Any]]] = {s: [] for s in scenarios}
        for round_ in range(args.rounds):
            order = scenarios if round_ % 2 == 0 else scenarios[::-1]
            for scenario in order:
                r = run(scenario, args, rate, in_flight)
                results[scenario].append(r)
                stage = f"stage p99 <= {r['stage_p99_le']:g} ms " if scenario in ("bridge", "whole") else ""
                print(f"  {mode.split(',')[0]:10} round {round_ + 1} {scenario:8} {r['points_per_cpu_s']:>10,.0f} pts/CPU-s "
                      f"{r['req_per_s']:6,.0f} req/s call p50 {r['call_p50']:.2f} p99 {r['call_p99']:.2f} ms "
                      f"e2e p50 {r['e2e_p50']:.2f} p99 {r['e2e_p99']:.2f} ms busy {r['busy']:.0%} (harness {r['harness_busy']:.0%}) {stage}"
                      f"lost {r['lost']} refused {r['refused']}", flush=True)
        report(mode, results)


if __name__ == "__main__":
    main()
